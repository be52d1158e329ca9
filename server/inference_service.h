#pragma once
// strata.v1.InferenceService: the gRPC face of the server (callback API). Generate is registered raw
// (ByteBuffer in and out) so that its validation can read the request bytes itself: see
// server/generate_validation.h.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/executor/device_memory.h"
#include "server/admission_pool.h"
#include "server/api_keys.h"
#include "server/in_flight_generations.h"
#include "server/metrics.h"
#include "server/served_model.h"
#include "server/served_plan.h"
#include "strata/v1/strata.grpc.pb.h"

namespace strata::server {

class GenerateReactor;

// The plan as the wire carries it, with each device's measured memory when `measured` is given.
v1::GetDeviceMapResponse DeviceMapResponse(const ServedPlan& served,
                                           const std::vector<runtime::DeviceMemory>* measured = nullptr);

using InferenceServiceBase = v1::InferenceService::WithCallbackMethod_GetDeviceMap<
    v1::InferenceService::WithRawCallbackMethod_Generate<v1::InferenceService::Service>>;

// What the service refuses (server/README.md, "Limits"), from the flags.
struct ServiceLimits {
  int64_t max_message_bytes = 4 << 20;        // a GenerateRequest's bytes
  int64_t max_streams = 1024;                 // Generate calls open at once
  int64_t max_stream_buffer_bytes = 1 << 20;  // response bytes a stream holds for a client that does not read
  int tokenize_threads = 1;                   // the admission pool's threads
  // The grammar pool's threads: requests with a structured-output constraint are checked there, each waiting for
  // its grammar (at most --max-grammar-compile-seconds), so that a slow compile holds up no other request.
  int grammar_threads = 4;
};

// Requests of at most this many bytes are validated (and tokenized) on the gRPC thread that received
// them: cheap, and never queued behind a large one. Larger ones go to the admission pool.
inline constexpr int64_t kInlineAdmissionBytes = 16 << 10;

class InferenceService final : public InferenceServiceBase {
 public:
  explicit InferenceService(const ServiceLimits& limits = {})
      : limits_(limits),
        pool_(std::make_unique<AdmissionPool>(limits.tokenize_threads)),
        grammar_pool_(std::make_unique<AdmissionPool>(limits.grammar_threads)) {}
  // The admission pools first (they may still refuse calls), while the service's state is intact; the admission
  // pool before the grammar pool, which its jobs may hand requests to.
  ~InferenceService() {
    pool_.reset();
    grammar_pool_.reset();
  }

  // Generate calls record into `metrics` (may be null) from now on.
  void SetMetrics(Metrics* metrics) {
    std::lock_guard lock(mutex_);
    metrics_ = metrics;
  }

  // Calls of strata's methods need "authorization: Bearer KEY" metadata with a key `keys` accepts, except
  // `open_methods` (full names, as flags.h spells them); the others end UNAUTHENTICATED, counted in
  // strata_requests_total. Called before the server starts, never after.
  void RequireApiKeys(std::shared_ptr<const ApiKeys> keys, std::set<std::string> open_methods) {
    api_keys_ = std::move(keys);
    open_methods_ = std::move(open_methods);
  }

  // Calls of strata's methods that did not come over TLS end UNAUTHENTICATED: the server has a plaintext
  // port for health probes besides its TLS one. Called before the server starts, never after.
  void RequireTls() { tls_only_ = true; }

  // The server only plans (no weights): GetDeviceMap answers, Generate is FAILED_PRECONDITION.
  void ServePlan(const ServedPlan* plan);
  // The model is loaded: both answer. `model` must outlive the service or a later Stop().
  void ServeModel(ServedModel* model);
  // The drain begins: new Generate calls are UNAVAILABLE ("the server is draining"), those in flight go on
  // (in_flight() counts them; `on_drained` is called when none is left) and GetDeviceMap still answers.
  // Returns the generations in flight.
  int64_t BeginDrain(std::function<void()> on_drained);
  InFlightGenerations& in_flight() { return in_flight_; }
  // Generate calls open now: validating, waiting, generating or being read.
  int64_t open_streams() const { return open_streams_.load(); }
  // New Generate calls are UNAVAILABLE from now on, and GetDeviceMap too once the model is gone (shutdown).
  void Stop();

  // The HTTP API (server/http_api.h) serves from this same state: the load, the plan-only server, the
  // drain, the open streams against --max-streams and the metrics.
  // The model a new generation may use, or why none: UNAVAILABLE while loading, draining or shutting
  // down; FAILED_PRECONDITION when the server only plans.
  absl::StatusOr<ServedModel*> ModelForGeneration();
  // Runs `submit` (which hands a validated request to `model`'s engine) under the service's mutex, unless
  // the drain has begun (UNAVAILABLE): a drain that begins counts what was submitted.
  absl::Status SubmitUnlessDraining(ServedModel* model, const std::function<absl::Status()>& submit);
  std::atomic<int64_t>& open_streams_counter() { return open_streams_; }
  AdmissionPool& admission_pool() { return *pool_; }
  // Where requests with a structured-output constraint are checked (their grammars compiled): both APIs.
  AdmissionPool& grammar_pool() { return *grammar_pool_; }
  // Counts an admitted request with a structured-output constraint of `kind` (strata_structured_requests_total).
  void RecordStructuredRequest(const char* kind);
  const ServiceLimits& limits() const { return limits_; }
  Metrics* metrics() {
    std::lock_guard lock(mutex_);
    return metrics_;
  }

  grpc::ServerUnaryReactor* GetDeviceMap(grpc::CallbackServerContext* context, const v1::GetDeviceMapRequest* request,
                                         v1::GetDeviceMapResponse* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;

 private:
  // Validates `wire` (off the mutex) and hands the request to the engine (under it), or refuses the call. A
  // request with a constraint goes on to the grammar pool first.
  void Admit(GenerateReactor* reactor, ServedModel* model, std::string_view wire);
  void AdmitParsed(GenerateReactor* reactor, ServedModel* model, const v1::GenerateRequest& request);

  const ServiceLimits limits_;
  std::unique_ptr<AdmissionPool> pool_;
  std::unique_ptr<AdmissionPool> grammar_pool_;
  std::atomic<int64_t> open_streams_{0};
  // OK, or UNAUTHENTICATED when `method` needs a key and the call does not carry a valid one (a check of
  // the call's own metadata, so it works the same over plaintext and TLS), or came in on the plaintext
  // health port.
  grpc::Status Authenticate(const grpc::CallbackServerContext& context, const char* method) const;

  std::shared_ptr<const ApiKeys> api_keys_;  // null: no key needed
  bool tls_only_ = false;
  std::set<std::string> open_methods_;
  Metrics* metrics_ = nullptr;
  std::mutex mutex_;
  const ServedPlan* plan_ = nullptr;
  ServedModel* model_ = nullptr;
  std::optional<v1::GetDeviceMapResponse> plan_response_;  // plan-only: built once
  bool draining_ = false;
  InFlightGenerations in_flight_;
};

}  // namespace strata::server
