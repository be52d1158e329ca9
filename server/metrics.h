#pragma once
// server::Metrics: the Prometheus registry and its /metrics endpoint (prometheus-cpp). The plan's
// gauges are set once; request metrics as requests go; engine and device gauges by RunningServer's
// sampler thread (a few times a second). Every method is thread-safe (prometheus-cpp's metrics are).

#include <grpcpp/grpcpp.h>

#include <array>
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
#include "structured/structured.h"

namespace strata::server {

// Which face of the server a request came in by: the `api` label of the request metrics.
enum class Api { kGrpc, kHttp };
const char* ApiName(Api api);  // "grpc", "http"

class Metrics {
 public:
  // Serves /metrics on `address`. Unavailable when the address cannot be bound (a port in use).
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const ListenAddress& address);

  // Publishes, per device of the plan, its budget, its planned bytes and its KV cache reserve.
  void RecordPlan(const planner::Plan& plan);

  // Generate calls and HTTP generation requests, by `api`: their final status (the HTTP API's as the
  // canonical code of its HTTP status: 400 INVALID_ARGUMENT, 429 RESOURCE_EXHAUSTED, ...), latencies.
  void RecordRequest(Api api, grpc::StatusCode code, double seconds);
  // A call of another strata method (GetDeviceMap) refused for want of a valid API key: counted under
  // strata_requests_total{code="UNAUTHENTICATED"} with Generate's refusals (a Generate call's own goes through
  // RecordRequest).
  void RecordUnauthenticated(Api api);
  void RecordPromptTokens(int64_t tokens);
  void RecordGeneratedTokens(int64_t tokens);
  void ObserveTimeToFirstToken(Api api, double seconds);
  void ObserveInterTokenLatency(Api api, double seconds);
  void ObserveBatchSize(int64_t rows);
  // The engine's state and each device's measured memory, as sampled now.
  void RecordEngine(const runtime::EngineStats& stats);
  void RecordDeviceMemory(const std::vector<runtime::DeviceMemory>& devices);

  // Generate calls open now (InferenceService::open_streams).
  void SetOpenStreams(int64_t streams);
  // What the gRPC health service says: 1 while SERVING, 0 while loading, draining or after a lost device.
  // Also the answer of GET /health on the metrics port (200 or 503).
  void SetServing(bool serving);
  // An HTTP API connection refused at accept or closed before its request was whole, by reason
  // (server/http_server.h's ConnectionDropName).
  void RecordHttpConnectionDropped(const char* reason);

  // Structured outputs: a request admitted with a constraint of `kind` (structured::ConstraintKindName, or
  // "tool_calls" for tool_choice's forced calls); the grammar compiler's counters and finished compiles since the
  // last sample (structured::Compiler::TakeStats); one constrained row's token mask, filled on the engine's mask
  // thread.
  void RecordStructuredRequest(const char* kind);
  void RecordGrammarCompiler(const structured::CompilerStats& stats);
  void ObserveGrammarMask(double seconds);
  // Speculative decoding: the histogram of accepted tokens per verified proposal of `method`
  // (runtime::SpeculativeMethodName), looked up once by the engine's observer. The proposed and accepted totals come
  // from the engine's stats.
  prometheus::Histogram& SpeculationAcceptedLength(const std::string& method);

  // The address /metrics is served on, with the port the system picked when asked for port 0.
  const ListenAddress& address() const { return address_; }

 private:
  Metrics(ListenAddress address, std::shared_ptr<prometheus::Registry> registry,
          std::unique_ptr<MetricsEndpoint> endpoint);

  ListenAddress address_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
  // Per device: the plan's budget, weights and KV cache reserve (RecordPlan), and its measured memory.
  struct DeviceGauges {
    prometheus::Family<prometheus::Gauge>& budget_bytes;
    prometheus::Family<prometheus::Gauge>& planned_bytes;
    prometheus::Family<prometheus::Gauge>& kv_cache_bytes;
    prometheus::Family<prometheus::Gauge>& runtime_reserve_bytes;
    prometheus::Family<prometheus::Gauge>& memory_bytes;
  };
  // Generate calls: their final codes, latencies and tokens.
  // Per api (index: Api): every series exists from the start.
  struct RequestMetrics {
    prometheus::Family<prometheus::Counter>& total;
    std::array<prometheus::Histogram*, 2> duration;
    std::array<prometheus::Histogram*, 2> time_to_first_token;
    std::array<prometheus::Histogram*, 2> inter_token_latency;
    prometheus::Counter& prompt_tokens;
    prometheus::Counter& generated_tokens;
  };
  // The engine's requests, waiting and running.
  struct SchedulerGauges {
    prometheus::Gauge& queue_depth;
    prometheus::Gauge& active_sequences;
    prometheus::Gauge& requests_waiting;
    prometheus::Gauge& requests_running;
  };
  // The KV pools, preemptions for want of blocks, and the prefix cache.
  struct KvCacheMetrics {
    prometheus::Family<prometheus::Gauge>& usage_ratio;
    prometheus::Family<prometheus::Gauge>& blocks;
    prometheus::Family<prometheus::Gauge>& capacity_tokens;
    prometheus::Counter& preemptions_total;
    prometheus::Counter& prefix_queries_total;
    prometheus::Counter& prefix_hits_total;
  };
  // The micro-batches the engine runs and the stages' busy time.
  struct PipelineMetrics {
    prometheus::Histogram& batch_size;
    prometheus::Family<prometheus::Counter>& stage_busy_seconds;
    // A group of nodes: what each link carried, {from, to} nodes.
    prometheus::Family<prometheus::Counter>& transfer_bytes;
    prometheus::Family<prometheus::Counter>& transfer_messages;
    prometheus::Family<prometheus::Counter>& transfer_seconds;
    prometheus::Counter& refused_connections;
  };
  // What the plan's default budgets came from, and the plan's warnings.
  struct PlanGauges {
    prometheus::Family<prometheus::Gauge>& inventory_free_bytes;
    prometheus::Family<prometheus::Gauge>& inventory_total_bytes;
    prometheus::Gauge& warnings;
  };
  // What health watches: serving or not, failed micro-batches and requests, open calls.
  struct HealthMetrics {
    prometheus::Gauge& serving;
    prometheus::Family<prometheus::Counter>& engine_errors_total;
    prometheus::Family<prometheus::Counter>& nonfinite_logits_total;
    prometheus::Gauge& open_streams;
    prometheus::Gauge& requests_failed_in_a_row;
    prometheus::Family<prometheus::Counter>& http_connections_dropped_total;
  };
  // Structured outputs: requests by kind, grammar compiles, the compiler's cache and the masks.
  struct StructuredMetrics {
    prometheus::Family<prometheus::Counter>& requests_total;
    prometheus::Histogram& compile_seconds;
    prometheus::Counter& compiles_total;
    prometheus::Counter& cache_hits_total;
    prometheus::Counter& compile_timeouts_total;
    prometheus::Counter& refusals_total;
    prometheus::Histogram& mask_seconds;
    prometheus::Counter& forced_tokens_total;
  };
  static DeviceGauges RegisterDeviceGauges(prometheus::Registry& registry);
  static RequestMetrics RegisterRequestMetrics(prometheus::Registry& registry);
  static SchedulerGauges RegisterSchedulerGauges(prometheus::Registry& registry);
  static KvCacheMetrics RegisterKvCacheMetrics(prometheus::Registry& registry);
  static PipelineMetrics RegisterPipelineMetrics(prometheus::Registry& registry);
  static PlanGauges RegisterPlanGauges(prometheus::Registry& registry);
  static HealthMetrics RegisterHealthMetrics(prometheus::Registry& registry);
  static StructuredMetrics RegisterStructuredMetrics(prometheus::Registry& registry);
  // Speculative decoding, by method.
  struct SpeculativeMetrics {
    prometheus::Family<prometheus::Counter>& proposed_tokens_total;
    prometheus::Family<prometheus::Counter>& accepted_tokens_total;
    prometheus::Family<prometheus::Histogram>& accepted_length;
  };
  static SpeculativeMetrics RegisterSpeculativeMetrics(prometheus::Registry& registry);

  DeviceGauges devices_;
  RequestMetrics requests_;
  SchedulerGauges scheduler_;
  KvCacheMetrics kv_cache_;
  PipelineMetrics pipeline_;
  PlanGauges plan_;
  HealthMetrics health_;
  StructuredMetrics structured_;
  SpeculativeMetrics speculative_;
};

}  // namespace strata::server
