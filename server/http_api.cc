#include "server/http_api.h"

#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/chat_prompt.h"
#include "server/generate_validation.h"
#include "server/http_generation.h"
#include "server/http_responses.h"

namespace strata::server {

using openai::Json;

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(HttpApiOptions options, InferenceService* service) {
  std::unique_ptr<HttpApi> api(new HttpApi(std::move(options), service));
  const_cast<int64_t&>(api->created_) = UnixSeconds();
  HttpApi* raw = api.get();
  absl::StatusOr<std::unique_ptr<HttpServer>> http =
      HttpServer::Start(api->options_.address, api->options_.http,
                        [raw](std::shared_ptr<HttpExchange> exchange) { raw->Handle(exchange); });
  if (!http.ok()) return http.status();
  api->http_ = *std::move(http);
  return api;
}

HttpApi::~HttpApi() {
  // Closing the port cuts every exchange (its client counted gone), so an admission still queued on the
  // pool returns at once; one running finishes against this object first.
  http_.reset();
  while (pool_jobs_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

openai::ApiContext HttpApi::Context(const ServedModel& model) const {
  openai::ApiContext context;
  context.model_name = options_.model_name;
  context.limits = model.limits();
  context.api = options_.limits;
  context.tokenizer = model.tokenizer();
  context.chat_template = model.chat_template();
  context.parse_tool_calls = options_.tool_call_parser.has_value();
  return context;
}

void HttpApi::Handle(const std::shared_ptr<HttpExchange>& exchange) {
  const HttpRequest& request = exchange->request();
  const std::string& path = request.path;
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  auto wrong_method = [&](const char* allowed) {
    openai::ApiError error;
    error.status = 405;
    error.message = absl::StrCat(request.method, " ", path, ": use ", allowed);
    HttpResponse response = ErrorResponse(error);
    response.headers.emplace_back("Allow", allowed);
    exchange->Respond(std::move(response));
  };
  if (path == "/health") {
    if (!get) return wrong_method("GET");
    HttpResponse response;
    response.status = serving_.load() ? 200 : 503;
    response.content_type = "text/plain";
    exchange->Respond(std::move(response));
    return;
  }
  // Every other route needs a key when the server has them.
  if (options_.api_keys != nullptr) {
    const absl::Status verdict = CheckAuthorization(
        *options_.api_keys,
        [&] {
          std::vector<absl::string_view> values;
          for (std::string_view value : request.Header("authorization"))
            values.emplace_back(value.data(), value.size());
          return values;
        }(),
        KeyCarrier::kHttpHeader);
    if (!verdict.ok()) {
      if (Metrics* metrics = service_->metrics()) metrics->RecordUnauthenticated(Api::kHttp);
      exchange->Respond(ErrorResponse(absl::UnauthenticatedError(verdict.message())));
      return;
    }
  }
  if (path == "/v1/models") {
    if (!get) return wrong_method("GET");
    absl::StatusOr<ServedModel*> model = service_->ModelForGeneration();
    Json entry = {{"id", options_.model_name}, {"object", "model"},           {"created", created_},
                  {"owned_by", "strata"},      {"root", options_.model_name}, {"parent", nullptr}};
    if (model.ok()) entry["max_model_len"] = (*model)->limits().max_context;
    exchange->Respond(JsonResponse({{"object", "list"}, {"data", Json::array({entry})}}));
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!post) return wrong_method("POST");
    Generate(exchange, path == "/v1/completions" ? openai::Route::kCompletions : openai::Route::kChatCompletions);
    return;
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (!post) return wrong_method("POST");
    Tokenize(exchange, path == "/detokenize");
    return;
  }
  openai::ApiError error;
  error.status = 404;
  error.message = absl::StrCat(path,
                               ": not found; strata serves /v1/completions, /v1/chat/completions, /v1/models, "
                               "/tokenize, /detokenize and /health");
  error.code = "not_found";
  exchange->Respond(ErrorResponse(error));
}

void HttpApi::Refuse(HttpExchange& exchange, const absl::Status& status, std::chrono::steady_clock::time_point start) {
  RecordHttpRequest(service_->metrics(), status.code(), start);
  exchange.Respond(ErrorResponse(status));
}

void HttpApi::Generate(const std::shared_ptr<HttpExchange>& exchange, openai::Route route) {
  const auto start = std::chrono::steady_clock::now();
  auto refuse = [&](const absl::Status& status) { Refuse(*exchange, status, start); };
  absl::StatusOr<ServedModel*> model = service_->ModelForGeneration();
  if (!model.ok()) return refuse(model.status());
  if (static_cast<int64_t>(exchange->request().body.size()) <= kInlineAdmissionBytes) {
    Admit(exchange, route, *model, start);
  } else {
    pool_jobs_.fetch_add(1);
    service_->admission_pool().Post([this, exchange, route, model = *model, start] {
      if (!exchange->client_gone()) Admit(exchange, route, model, start);
      pool_jobs_.fetch_sub(1);
    });
  }
}

void HttpApi::Admit(const std::shared_ptr<HttpExchange>& exchange, openai::Route route, ServedModel* model,
                    std::chrono::steady_clock::time_point start) {
  auto open = std::make_unique<OpenStream>(&service_->open_streams_counter());
  auto refuse = [&](const absl::Status& status) { Refuse(*exchange, status, start); };
  const int64_t max_streams = service_->limits().max_streams;
  if (open->open_at_start() > max_streams) {
    return refuse(absl::ResourceExhaustedError(absl::StrCat(
        open->open_at_start() - 1, " generations are open, the server's limit is ", max_streams, " (--max-streams)")));
  }
  absl::StatusOr<Json> body = openai::ParseJsonObject(exchange->request().body, options_.limits.max_json_depth);
  if (!body.ok()) return refuse(body.status());
  if (!openai::MayHaveConstraint(*body)) return AdmitParsed(exchange, route, model, start, std::move(open), *body);
  // Its grammar may take up to --max-grammar-compile-seconds to compile: not on the HTTP server's thread, nor on
  // the admission pool's. (The pool's jobs are copied: the move-only parts travel in a shared holder.)
  pool_jobs_.fetch_add(1);
  auto moved = std::make_shared<std::pair<std::unique_ptr<OpenStream>, Json>>(std::move(open), *std::move(body));
  service_->grammar_pool().Post([this, exchange, route, model, start, moved] {
    if (!exchange->client_gone()) AdmitParsed(exchange, route, model, start, std::move(moved->first), moved->second);
    pool_jobs_.fetch_sub(1);
  });
}

void HttpApi::AdmitParsed(const std::shared_ptr<HttpExchange>& exchange, openai::Route route, ServedModel* model,
                          std::chrono::steady_clock::time_point start, std::unique_ptr<OpenStream> open,
                          const Json& body) {
  Metrics* metrics = service_->metrics();
  auto refuse = [&](const absl::Status& status) { Refuse(*exchange, status, start); };
  absl::StatusOr<openai::ApiRequest> request = openai::ReadApiRequest(route, body, Context(*model));
  if (!request.ok()) return refuse(request.status());
  const char* structured_kind = request->structured_kind;
  auto generation = std::make_shared<HttpGeneration>(
      exchange, *std::move(request), model->tokenizer(), metrics, std::move(open), start, options_.tool_call_parser,
      options_.reasoning_parser, options_.prefix_cache, &service_->admission_pool());
  const absl::Status submitted = service_->SubmitUnlessDraining(
      model, [&] { return generation->Submit(model->engine(), &service_->in_flight()); });
  if (!submitted.ok()) return refuse(submitted);
  if (structured_kind != nullptr) service_->RecordStructuredRequest(structured_kind);
}

void HttpApi::Tokenize(const std::shared_ptr<HttpExchange>& exchange, bool detokenize) {
  absl::StatusOr<ServedModel*> model = service_->ModelForGeneration();
  if (!model.ok()) return exchange->Respond(ErrorResponse(model.status()));
  const openai::ApiContext context = Context(**model);
  absl::StatusOr<Json> request = openai::ParseJsonObject(exchange->request().body, context.api.max_json_depth);
  if (!request.ok()) return exchange->Respond(ErrorResponse(request.status()));
  const tokenizer::Tokenizer* tokenizer = context.tokenizer;
  if (tokenizer == nullptr) {
    return exchange->Respond(ErrorResponse(absl::FailedPreconditionError("the model has no tokenizer.json")));
  }
  if (detokenize) {
    auto tokens = request->find("tokens");
    if (tokens == request->end() || !tokens->is_array()) {
      return exchange->Respond(ErrorResponse(absl::InvalidArgumentError("tokens: missing: a list of token ids")));
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i < tokens->size(); ++i) {
      const Json& id = (*tokens)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= context.limits.vocab_size) {
        return exchange->Respond(ErrorResponse(absl::InvalidArgumentError(
            absl::StrCat("tokens[", i, "]: not a token id in [0, ", context.limits.vocab_size, ")"))));
      }
      ids.push_back(id.get<int32_t>());
    }
    return exchange->Respond(JsonResponse({{"prompt", tokenizer->Decode(ids, /*skip_special_tokens=*/false)}}));
  }
  std::string text;
  bool add_special_tokens = true;
  if (request->contains("messages")) {
    absl::StatusOr<std::string> rendered = RenderChat(*request, context.chat_template, context.limits.max_messages);
    if (!rendered.ok()) return exchange->Respond(ErrorResponse(rendered.status()));
    text = *std::move(rendered);
    add_special_tokens = false;
  } else {
    auto prompt = request->find("prompt");
    if (prompt == request->end() || !prompt->is_string()) {
      return exchange->Respond(
          ErrorResponse(absl::InvalidArgumentError("prompt: missing: a string (or give messages)")));
    }
    text = prompt->get<std::string>();
  }
  if (auto add = request->find("add_special_tokens"); add != request->end()) {
    if (!add->is_boolean()) {
      return exchange->Respond(ErrorResponse(absl::InvalidArgumentError("add_special_tokens: must be a boolean")));
    }
    add_special_tokens = add->get<bool>();
  }
  if (static_cast<int64_t>(text.size()) > context.limits.max_prompt_bytes) {
    return exchange->Respond(ErrorResponse(
        absl::InvalidArgumentError(absl::StrCat("prompt: ", text.size(), " bytes, more than the server's limit of ",
                                                context.limits.max_prompt_bytes, " bytes"))));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, add_special_tokens);
  if (!ids.ok()) return exchange->Respond(ErrorResponse(absl::InvalidArgumentError(ids.status().message())));
  exchange->Respond(JsonResponse({{"count", ids->size()},
                                  {"max_model_len", context.limits.max_context},
                                  {"tokens", *ids},
                                  {"token_strs", nullptr}}));
}

}  // namespace strata::server
