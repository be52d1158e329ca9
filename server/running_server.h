#pragma once
// A started strata-server: the gRPC server (InferenceService, health checking, reflection) and the
// /metrics endpoint. It starts NOT_SERVING; ServePlan (plan only) or ServeModel (weights loaded) makes
// it SERVING. On SIGINT/SIGTERM main.cc drains it (BeginDrain, wait, EndDrain) and then shuts it down.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "server/flags.h"
#include "server/http_api.h"
#include "server/inference_service.h"
#include "server/metrics.h"
#include "server/served_model.h"
#include "server/served_plan.h"

namespace strata::server {

class RunningServer {
 public:
  // Binds both addresses and starts serving, NOT_SERVING: GetDeviceMap and Generate answer UNAVAILABLE
  // until ServePlan or ServeModel. Unavailable when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<RunningServer>> Start(const ServerOptions& options);

  ~RunningServer();  // Shuts down if Shutdown was not called.

  // Serves a plan without weights (Generate is FAILED_PRECONDITION), then reports SERVING.
  void ServePlan(ServedPlan plan);
  // Serves a loaded model, then reports SERVING; samples engine and device gauges for /metrics.
  void ServeModel(std::unique_ptr<ServedModel> model);

  // The graceful drain begins: health NOT_SERVING for good (both "" and the service, so readiness fails and
  // load balancers stop sending), new Generate calls UNAVAILABLE, GetDeviceMap answers on, generations in
  // flight go on. `on_drained` is called (on any thread, or here) once none is in flight. Returns how many
  // are in flight.
  int64_t BeginDrain(std::function<void()> on_drained);
  int64_t generations_in_flight() { return service_->in_flight().size(); }
  // The drain ends: generations still running are cut (each call ends UNAVAILABLE once the tokens before
  // are written) and waited for, a few seconds at most. What the drain did.
  DrainCounts EndDrain();

  // Marks every service NOT_SERVING, ends running generations (CANCELLED), finishes in-flight calls
  // (waiting a few seconds at most) and stops /metrics. Idempotent.
  void Shutdown();
  // Reports NOT_SERVING (health) while the server finishes what it answers: a device became unusable.
  // For good: the readiness rule never makes it SERVING again.
  void MarkDeviceLost();

  // The bound addresses, with the ports the system picked where port 0 was asked for.
  const ListenAddress& grpc_address() const { return grpc_address_; }
  const ListenAddress& metrics_address() const { return metrics_->address(); }
  // --http-listen's, when given.
  std::optional<ListenAddress> http_address() const {
    return http_ ? std::optional<ListenAddress>(http_->address()) : std::nullopt;
  }

 private:
  explicit RunningServer(const ServerOptions& options) : options_(options) {}
  void SetServing();
  void MarkNotServing();
  // The readiness rule (server/README.md, "Health"): NOT_SERVING after --not-serving-after-errors requests
  // in a row ended INTERNAL, a probe generation every --ready-probe-interval meanwhile, SERVING again once a
  // forward pass produces a token. Sampler thread.
  void ApplyReadinessRule(const runtime::EngineStats& stats);
  void StartProbe();
  // For good: health's Shutdown (every status NOT_SERVING, later changes ignored) and strata_serving 0.
  void ShutDownHealth();
  void SampleGauges();

  const ServerOptions options_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpApi> http_;  // --http-listen: serves from service_'s state
  ListenAddress grpc_address_;
  std::unique_ptr<ServedPlan> plan_;
  std::unique_ptr<ServedModel> model_;
  std::mutex mutex_;
  std::condition_variable stop_sampling_;
  bool stopping_ = false;
  std::thread sampler_;
  bool shut_down_ = false;
  // Orders SetServing against ShutDownHealth, so a load ending during a drain cannot report SERVING.
  std::mutex health_mutex_;
  bool health_shut_down_ = false;
  bool device_lost_ = false;
  // The readiness rule's state (sampler thread only): health was taken out of rotation by it; when the
  // last probe started; whether one is running (cleared by its callback on the engine's output thread).
  bool failing_ = false;
  std::chrono::steady_clock::time_point last_probe_;
  std::shared_ptr<std::atomic<bool>> probe_running_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace strata::server
