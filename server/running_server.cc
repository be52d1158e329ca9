#include "server/running_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <iostream>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.pb.h"

namespace strata::server {
namespace {

// Plaintext, TLS, or TLS that requires a client certificate signed by --tls-client-ca.
std::shared_ptr<grpc::ServerCredentials> GrpcCredentials(const std::optional<ServerTls>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(tls->client_ca.empty()
                                            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = tls->client_ca;
  ssl.pem_key_cert_pairs.push_back({tls->private_key, tls->certificate_chain});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> RunningServer::Start(const ServerOptions& options) {
  std::unique_ptr<RunningServer> running(new RunningServer(options));
  const int tokenize_threads = options.limits.tokenize_threads > 0
                                   ? options.limits.tokenize_threads
                                   : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 4);
  running->service_ =
      std::make_unique<InferenceService>(ServiceLimits{options.limits.max_message_bytes, options.limits.max_streams,
                                                       options.limits.max_stream_buffer_bytes, tokenize_threads});
  if (options.security.api_keys != nullptr)
    running->service_->RequireApiKeys(options.security.api_keys, options.security.auth_open_methods);

  // Reflection resolves grpc.health.v1.Health from the generated pool: referencing a descriptor of that
  // file links it in (an object of a static library nothing refers to is left out).
  (void)grpc::health::v1::HealthCheckResponse::descriptor();
  // Both are process-wide settings read when a builder is made, so they come first.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.endpoints.listen.ToString(), GrpcCredentials(options.security.tls), &port);
  int health_port = 0;
  if (options.endpoints.health_listen) {
    builder.AddListeningPort(options.endpoints.health_listen->ToString(), grpc::InsecureServerCredentials(),
                             &health_port);
    running->service_->RequireTls();
  }
  // gRPC sets SO_REUSEPORT by default, which lets a second server bind a port that is already served
  // and split its traffic; a port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(options.limits.max_streams_per_connection));
  // gRPC drops a message above its limit before any handler sees it (uncounted), so its limit is twice
  // --max-message-bytes: up to there the service refuses and counts the message (RESOURCE_EXHAUSTED).
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(2 * options.limits.max_message_bytes, INT32_MAX)));
  builder.RegisterService(running->service_.get());
  running->server_ = builder.BuildAndStart();
  // On failure `running` shuts down what did start as it goes out of scope.
  if (running->server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", options.endpoints.listen.ToString(), " (port in use?)"));
  }
  if (options.endpoints.health_listen && health_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve health checks on ", options.endpoints.health_listen->ToString(), " (port in use?)"));
  }
  running->grpc_address_ = ListenAddress{options.endpoints.listen.host, port};
  // At once: gRPC's default health service starts with "" SERVING and the service unknown (NOT_FOUND).
  running->MarkNotServing();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Start(options.endpoints.metrics_listen);
  if (!metrics.ok()) return metrics.status();
  running->metrics_ = *std::move(metrics);
  running->service_->SetMetrics(running->metrics_.get());
  if (options.endpoints.http_listen) {
    HttpApiOptions http;
    http.address = *options.endpoints.http_listen;
    http.http.max_connections = static_cast<unsigned>(std::min<int64_t>(options.limits.max_streams + 256, 65536));
    http.http.max_connections_per_peer = static_cast<unsigned>(options.endpoints.http_max_connections_per_peer);
    http.http.read_timeout_seconds = static_cast<unsigned>(options.endpoints.http_read_timeout_seconds);
    http.http.on_drop = [metrics = running->metrics_.get()](ConnectionDrop drop) {
      metrics->RecordHttpConnectionDropped(ConnectionDropName(drop));
    };
    http.http.max_body_bytes = static_cast<size_t>(options.limits.max_message_bytes);
    http.http.max_stream_buffer_bytes = static_cast<size_t>(options.limits.max_stream_buffer_bytes);
    http.http.tls = options.security.tls;
    http.model_name = options.serving.served_model_name;
    http.api_keys = options.security.api_keys;
    http.tool_call_parser = options.serving.tool_call_parser;
    http.reasoning_parser = options.serving.reasoning_parser;
    http.prefix_cache = options.serving.prefix_cache;
    http.limits.max_response_tokens = options.limits.max_response_tokens;
    absl::StatusOr<std::unique_ptr<HttpApi>> api = HttpApi::Start(std::move(http), running->service_.get());
    if (!api.ok()) return api.status();
    running->http_ = *std::move(api);
  }
  return running;
}

void RunningServer::MarkNotServing() {
  std::lock_guard lock(health_mutex_);
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(v1::InferenceService::service_full_name(), false);
  health->SetServingStatus("", false);
  if (metrics_ != nullptr) metrics_->SetServing(false);
  if (http_ != nullptr) http_->SetServing(false);
}

void RunningServer::MarkDeviceLost() {
  {
    std::lock_guard lock(health_mutex_);
    device_lost_ = true;
  }
  MarkNotServing();
}

void RunningServer::SetServing() {
  std::lock_guard lock(health_mutex_);
  if (health_shut_down_ || device_lost_) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(v1::InferenceService::service_full_name(), true);
  health->SetServingStatus("", true);
  if (metrics_ != nullptr) metrics_->SetServing(true);
  if (http_ != nullptr) http_->SetServing(true);
}

void RunningServer::ShutDownHealth() {
  std::lock_guard lock(health_mutex_);
  health_shut_down_ = true;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) health->Shutdown();
  if (metrics_ != nullptr) metrics_->SetServing(false);
  if (http_ != nullptr) http_->SetServing(false);
}

void RunningServer::ServePlan(ServedPlan plan) {
  plan_ = std::make_unique<ServedPlan>(std::move(plan));
  metrics_->RecordPlan(plan_->plan);
  service_->ServePlan(plan_.get());
  SetServing();
}

void RunningServer::ServeModel(std::unique_ptr<ServedModel> model) {
  model_ = std::move(model);
  metrics_->RecordPlan(model_->plan().plan);
  Metrics* metrics = metrics_.get();
  model_->engine().SetMicroBatchObserver([metrics](int64_t rows) { metrics->ObserveBatchSize(rows); });
  model_->engine().SetMaskObserver([metrics](double seconds) { metrics->ObserveGrammarMask(seconds); });
  if (const std::string method = model_->engine().Stats().spec_method; method != "none") {
    prometheus::Histogram* accepted_length = &metrics->SpeculationAcceptedLength(method);
    model_->engine().SetSpeculationObserver(
        [accepted_length](int64_t, int64_t accepted) { accepted_length->Observe(static_cast<double>(accepted)); });
  }
  SampleGauges();
  sampler_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_sampling_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stopping_; })) {
      lock.unlock();
      SampleGauges();
      lock.lock();
    }
  });
  service_->ServeModel(model_.get());
  SetServing();
}

void RunningServer::SampleGauges() {
  const runtime::EngineStats stats = model_->engine().Stats();
  metrics_->RecordEngine(stats);
  if (structured::Compiler* compiler = model_->grammar_compiler())
    metrics_->RecordGrammarCompiler(compiler->TakeStats());
  metrics_->SetOpenStreams(service_->open_streams());
  metrics_->RecordDeviceMemory(runtime::MeasureDeviceMemory(model_->model()));
  ApplyReadinessRule(stats);
}

void RunningServer::ApplyReadinessRule(const runtime::EngineStats& stats) {
  const int64_t limit = options_.lifecycle.not_serving_after_errors;
  if (limit == 0 || stats.device_lost) return;
  if (!failing_ && stats.failed_in_a_row >= limit) {
    failing_ = true;
    std::cerr << "strata-server: " << stats.failed_in_a_row << " requests in a row ended INTERNAL: NOT_SERVING "
              << "until a generation succeeds (a probe every "
              << std::chrono::duration<double>(options_.lifecycle.ready_probe_interval).count() << " s)" << std::endl;
    MarkNotServing();
    last_probe_ = std::chrono::steady_clock::now();  // the first probe after one interval
  } else if (failing_ && stats.failed_in_a_row == 0) {
    failing_ = false;
    std::cerr << "strata-server: a generation succeeded: SERVING again" << std::endl;
    SetServing();
  }
  if (failing_ && !probe_running_->load() &&
      std::chrono::steady_clock::now() - last_probe_ >= options_.lifecycle.ready_probe_interval) {
    StartProbe();
  }
}

void RunningServer::StartProbe() {
  // One greedy token of a one-token prompt: a forward pass through every stage and the sampler. Token 0
  // is in every vocabulary. It goes through the engine like any request (the queue limit included).
  runtime::GenerationRequest probe;
  probe.prompt = {0};
  probe.sampling.max_new_tokens = 1;
  probe.request_id = "strata-readiness-probe";
  last_probe_ = std::chrono::steady_clock::now();
  probe_running_->store(true);
  absl::StatusOr<std::shared_ptr<runtime::RequestHandle>> handle =
      model_->engine().Submit(std::move(probe), [running = probe_running_](runtime::GenerationChunk chunk) {
        if (chunk.finish) running->store(false);
      });
  if (!handle.ok()) probe_running_->store(false);
}

int64_t RunningServer::BeginDrain(std::function<void()> on_drained) {
  // Health's Shutdown sets every status NOT_SERVING and ignores later changes: a load or a ServeModel
  // racing with the drain cannot make it SERVING again.
  ShutDownHealth();
  return service_->BeginDrain(std::move(on_drained));
}

DrainCounts RunningServer::EndDrain() {
  InFlightGenerations& in_flight = service_->in_flight();
  in_flight.CutAll();
  // A cancelled request leaves the engine within one iteration; its call ends when the client has read
  // what came before. A client that stops reading is left to Shutdown's deadline.
  in_flight.WaitEmpty(std::chrono::seconds(5));
  return in_flight.counts();
}

RunningServer::~RunningServer() { Shutdown(); }

void RunningServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    // Health first, so that load balancers watching it stop sending calls before the port closes.
    ShutDownHealth();
    // No new generations; running ones end CANCELLED, which finishes their calls.
    service_->Stop();
  }
  if (sampler_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    stop_sampling_.notify_all();
    sampler_.join();
  }
  if (model_ != nullptr) model_->StopEngine();
  // Its generations ended with the engine; connections still open (slow readers) are closed.
  http_.reset();
  // Whole HTTP responses still being built (server/http_api.cc) use the metrics and the in-flight set.
  if (service_ != nullptr) {
    service_->admission_pool().WaitIdle();
    // Requests waiting for their grammars (the admission pool hands some on to it): they use the model's compiler.
    service_->grammar_pool().WaitIdle();
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
  model_.reset();
  if (service_ != nullptr) service_->SetMetrics(nullptr);
  metrics_.reset();
}

}  // namespace strata::server
