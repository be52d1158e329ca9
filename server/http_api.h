#pragma once
// strata's OpenAI-compatible HTTP API (--http-listen): POST /v1/completions and /v1/chat/completions
// (streamed as Server-Sent Events or whole), GET /v1/models, POST /tokenize and /detokenize (vLLM's
// shapes), GET /health. It serves from the gRPC service's state (server/inference_service.h): the same
// engine, load, drain, --max-streams count, admission pool and metrics; the request bodies are checked
// by server/openai_protocol.h into the same runtime requests gRPC's are. HTTP is libmicrohttpd
// (server/http_server.h).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "chat_template/reasoning.h"
#include "chat_template/tool_calls.h"
#include "server/api_keys.h"
#include "server/http_server.h"
#include "server/inference_service.h"
#include "server/openai_protocol.h"

namespace strata::server {

class OpenStream;  // server/http_generation.h

struct HttpApiOptions {
  ListenAddress address;
  HttpServerOptions http;
  // The model's name in requests and /v1/models: --served-model-name, else --model as given (vLLM's rule).
  std::string model_name;
  // Bearer keys every route but /health needs (null: none).
  std::shared_ptr<const ApiKeys> api_keys;
  openai::ApiLimits limits;
  std::optional<chat_template::ToolCallFormat> tool_call_parser;   // --tool-call-parser
  std::optional<chat_template::ReasoningFormat> reasoning_parser;  // --reasoning-parser
  // The engine reuses prompt prefixes (--prefix-cache): n samples of a prompt then prefill it once.
  bool prefix_cache = true;
};

class HttpApi {
 public:
  // Binds the address and serves from `service`'s state, which must outlive this object.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(HttpApiOptions options, InferenceService* service);
  // Closes the port; exchanges still open are cut (each generation cancelled).
  ~HttpApi();

  // What /health answers: 200 while serving, 503 otherwise (loading, draining, out of rotation).
  void SetServing(bool serving) { serving_.store(serving); }
  int port() const { return http_->port(); }
  ListenAddress address() const { return ListenAddress{options_.address.host, port()}; }

 private:
  HttpApi(HttpApiOptions options, InferenceService* service) : options_(std::move(options)), service_(service) {}
  void Handle(const std::shared_ptr<HttpExchange>& exchange);
  void Generate(const std::shared_ptr<HttpExchange>& exchange, openai::Route route);
  // Counts the request against --max-streams and parses its body; one that may carry a structured-output
  // constraint goes on to the grammar pool (its grammar may take seconds to compile).
  void Admit(const std::shared_ptr<HttpExchange>& exchange, openai::Route route, ServedModel* model,
             std::chrono::steady_clock::time_point start);
  // Checks the parsed body and hands the request to the engine, or refuses it.
  void AdmitParsed(const std::shared_ptr<HttpExchange>& exchange, openai::Route route, ServedModel* model,
                   std::chrono::steady_clock::time_point start, std::unique_ptr<OpenStream> open,
                   const openai::Json& body);
  void Tokenize(const std::shared_ptr<HttpExchange>& exchange, bool detokenize);
  // Answers a generation request with `status`'s error, counted in the request metrics.
  void Refuse(HttpExchange& exchange, const absl::Status& status, std::chrono::steady_clock::time_point start);
  openai::ApiContext Context(const ServedModel& model) const;

  const HttpApiOptions options_;
  InferenceService* const service_;
  const int64_t created_ = 0;
  std::atomic<bool> serving_{false};
  // Admissions posted to the admission or the grammar pool and not yet done: waited for at the end.
  std::atomic<int64_t> pool_jobs_{0};
  std::unique_ptr<HttpServer> http_;
};

}  // namespace strata::server
