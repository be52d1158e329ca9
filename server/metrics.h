#pragma once
// server::Metrics: the Prometheus registry and its /metrics endpoint (prometheus-cpp). The plan's
// gauges are set once; request metrics as requests go; engine and device gauges by RunningServer's
// sampler thread (a few times a second). Every method is thread-safe (prometheus-cpp's metrics are).

#include <grpcpp/grpcpp.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/plan.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/device_memory.h"
#include "server/flags.h"
#include "server/metrics_endpoint.h"

namespace strata::server {

class Metrics {
 public:
  // Serves /metrics on `address`. Unavailable when the address cannot be bound (a port in use).
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const ListenAddress& address);

  // Publishes, per device of the plan, its budget, its planned bytes and its KV cache reserve.
  void RecordPlan(const planner::Plan& plan);

  // Generate requests.
  void RecordRequest(grpc::StatusCode code, double seconds);
  // A call of another strata method (GetDeviceMap) refused for want of a valid API key: counted under
  // strata_requests_total{code="UNAUTHENTICATED"} with Generate's refusals (a Generate call's own goes through
  // RecordRequest).
  void RecordUnauthenticated();
  void RecordPromptTokens(int64_t tokens);
  void RecordGeneratedTokens(int64_t tokens);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveBatchSize(int64_t rows);
  // The engine's state and each device's measured memory, as sampled now.
  void RecordEngine(const runtime::EngineStats& stats);
  void RecordDeviceMemory(const std::vector<runtime::DeviceMemory>& devices);

  // Generate calls open now (InferenceService::open_streams).
  void SetOpenStreams(int64_t streams);
  // What the gRPC health service says: 1 while SERVING, 0 while loading, draining or after a lost device.
  void SetServing(bool serving);

  // The address /metrics is served on, with the port the system picked when asked for port 0.
  const ListenAddress& address() const { return address_; }

 private:
  Metrics(ListenAddress address, std::shared_ptr<prometheus::Registry> registry,
          std::unique_ptr<MetricsEndpoint> endpoint);

  ListenAddress address_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
  prometheus::Family<prometheus::Gauge>& device_budget_bytes_;
  prometheus::Family<prometheus::Gauge>& device_planned_bytes_;
  prometheus::Family<prometheus::Gauge>& device_kv_cache_bytes_;
  prometheus::Family<prometheus::Gauge>& device_memory_bytes_;
  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Histogram& request_duration_;
  prometheus::Histogram& time_to_first_token_;
  prometheus::Histogram& inter_token_latency_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generated_tokens_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& active_sequences_;
  prometheus::Gauge& requests_waiting_;
  prometheus::Gauge& requests_running_;
  prometheus::Family<prometheus::Gauge>& kv_cache_usage_ratio_;
  prometheus::Family<prometheus::Gauge>& kv_cache_blocks_;
  prometheus::Family<prometheus::Gauge>& kv_cache_capacity_tokens_;
  prometheus::Counter& preemptions_total_;
  prometheus::Counter& prefix_cache_queries_total_;
  prometheus::Counter& prefix_cache_hits_total_;
  prometheus::Histogram& batch_size_;
  prometheus::Family<prometheus::Counter>& stage_busy_seconds_;
  prometheus::Family<prometheus::Gauge>& inventory_free_bytes_;
  prometheus::Family<prometheus::Gauge>& inventory_total_bytes_;
  prometheus::Gauge& plan_warnings_;
  prometheus::Gauge& serving_;
  prometheus::Family<prometheus::Counter>& engine_errors_total_;
  prometheus::Family<prometheus::Counter>& nonfinite_logits_total_;
  prometheus::Gauge& open_streams_;
  prometheus::Gauge& requests_failed_in_a_row_;
};

}  // namespace strata::server
