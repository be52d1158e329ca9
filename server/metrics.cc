#include "server/metrics.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::server {
namespace {

// Latency buckets from 1 ms to about 1 minute.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

// The codes a Generate call of strata's can end with: each has its series from the start (at 0), so that
// rate() and increase() see the first failure (they ignore a series' first sample).
constexpr grpc::StatusCode kGenerateCodes[] = {grpc::StatusCode::OK,
                                               grpc::StatusCode::CANCELLED,
                                               grpc::StatusCode::INVALID_ARGUMENT,
                                               grpc::StatusCode::DEADLINE_EXCEEDED,
                                               grpc::StatusCode::RESOURCE_EXHAUSTED,
                                               grpc::StatusCode::FAILED_PRECONDITION,
                                               grpc::StatusCode::UNAVAILABLE,
                                               grpc::StatusCode::INTERNAL,
                                               grpc::StatusCode::UNAUTHENTICATED};

}  // namespace

const char* ApiName(Api api) { return api == Api::kHttp ? "http" : "grpc"; }

namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "OTHER";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const ListenAddress& address) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = MetricsEndpoint::Start(address, registry);
  if (!endpoint.ok()) return endpoint.status();
  ListenAddress bound = address;
  bound.port = (*endpoint)->port();
  return std::unique_ptr<Metrics>(new Metrics(std::move(bound), std::move(registry), *std::move(endpoint)));
}

Metrics::DeviceGauges Metrics::RegisterDeviceGauges(prometheus::Registry& registry) {
  return {
      .budget_bytes = prometheus::BuildGauge()
                          .Name("strata_device_budget_bytes")
                          .Help("Memory budget of a device (max_memory after balancing), in bytes")
                          .Register(registry),
      .planned_bytes = prometheus::BuildGauge()
                           .Name("strata_device_planned_bytes")
                           .Help("Bytes of weights the plan places on a device")
                           .Register(registry),
      .kv_cache_bytes = prometheus::BuildGauge()
                            .Name("strata_device_kv_cache_bytes")
                            .Help("KV cache bytes the plan reserves on a device")
                            .Register(registry),
      .runtime_reserve_bytes = prometheus::BuildGauge()
                                   .Name("strata_device_runtime_reserve_bytes")
                                   .Help("GPU bytes the plan keeps for what serving allocates besides weights and "
                                         "KV cache (--runtime-reserve)")
                                   .Register(registry),
      .memory_bytes = prometheus::BuildGauge()
                          .Name("strata_device_memory_bytes")
                          .Help("Measured memory of a device: kind allocated, reserved, total or free "
                                "(CUDA allocator and cudaMemGetInfo; process RSS and host memory for cpu)")
                          .Register(registry),
  };
}

Metrics::RequestMetrics Metrics::RegisterRequestMetrics(prometheus::Registry& registry) {
  auto& duration = prometheus::BuildHistogram()
                       .Name("strata_request_duration_seconds")
                       .Help("Generate calls and HTTP generation requests (label api) from arrival to their end")
                       .Register(registry);
  auto& time_to_first_token = prometheus::BuildHistogram()
                                  .Name("strata_time_to_first_token_seconds")
                                  .Help("From a request's arrival to its first generated token (label api)")
                                  .Register(registry);
  auto& inter_token_latency = prometheus::BuildHistogram()
                                  .Name("strata_inter_token_latency_seconds")
                                  .Help("Between consecutive generated tokens of one request (label api)")
                                  .Register(registry);
  auto per_api = [](prometheus::Family<prometheus::Histogram>& family) {
    return std::array<prometheus::Histogram*, 2>{&family.Add({{"api", ApiName(Api::kGrpc)}}, LatencyBuckets()),
                                                 &family.Add({{"api", ApiName(Api::kHttp)}}, LatencyBuckets())};
  };
  return {
      .total = prometheus::BuildCounter()
                   .Name("strata_requests_total")
                   .Help("Generate calls and HTTP generation requests by api and final status code (gRPC's "
                         "canonical names; HTTP statuses mapped to them), and other calls refused UNAUTHENTICATED")
                   .Register(registry),
      .duration = per_api(duration),
      .time_to_first_token = per_api(time_to_first_token),
      .inter_token_latency = per_api(inter_token_latency),
      .prompt_tokens = prometheus::BuildCounter()
                           .Name("strata_prompt_tokens_total")
                           .Help("Prompt tokens of accepted Generate calls")
                           .Register(registry)
                           .Add({}),
      .generated_tokens = prometheus::BuildCounter()
                              .Name("strata_generated_tokens_total")
                              .Help("Tokens generated")
                              .Register(registry)
                              .Add({}),
  };
}

Metrics::SchedulerGauges Metrics::RegisterSchedulerGauges(prometheus::Registry& registry) {
  return {
      .queue_depth = prometheus::BuildGauge()
                         .Name("strata_queue_depth")
                         .Help("Requests waiting to run (as strata_requests_waiting)")
                         .Register(registry)
                         .Add({}),
      .active_sequences = prometheus::BuildGauge()
                              .Name("strata_active_sequences")
                              .Help("Sequences running, holding KV blocks (as strata_requests_running)")
                              .Register(registry)
                              .Add({}),
      .requests_waiting = prometheus::BuildGauge()
                              .Name("strata_requests_waiting")
                              .Help("Requests waiting to run: not yet admitted, or preempted and waiting to be "
                                    "recomputed (vLLM: vllm:num_requests_waiting)")
                              .Register(registry)
                              .Add({}),
      .requests_running = prometheus::BuildGauge()
                              .Name("strata_requests_running")
                              .Help("Requests running, holding KV blocks (vLLM: vllm:num_requests_running)")
                              .Register(registry)
                              .Add({}),
  };
}

Metrics::KvCacheMetrics Metrics::RegisterKvCacheMetrics(prometheus::Registry& registry) {
  return {
      .usage_ratio = prometheus::BuildGauge()
                         .Name("strata_kv_cache_usage_ratio")
                         .Help("Fraction of the device's KV blocks held by running requests; cached prefix "
                               "blocks count as free (vLLM: vllm:kv_cache_usage_perc)")
                         .Register(registry),
      .blocks = prometheus::BuildGauge()
                    .Name("strata_kv_cache_blocks")
                    .Help("KV blocks of the device's pool by state: used (held by running requests), "
                          "cached (a prompt prefix no request holds, evicted when needed), free")
                    .Register(registry),
      .capacity_tokens = prometheus::BuildGauge()
                             .Name("strata_kv_cache_capacity_tokens")
                             .Help("Tokens the device's KV pool holds (blocks x block tokens)")
                             .Register(registry),
      .preemptions_total = prometheus::BuildCounter()
                               .Name("strata_preemptions_total")
                               .Help("Running requests preempted for lack of KV blocks, to be recomputed "
                                     "(vLLM: vllm:num_preemptions)")
                               .Register(registry)
                               .Add({}),
      .prefix_queries_total = prometheus::BuildCounter()
                                  .Name("strata_prefix_cache_queries_total")
                                  .Help("Prompt tokens looked up in the prefix cache at admission (vLLM: "
                                        "vllm:prefix_cache_queries)")
                                  .Register(registry)
                                  .Add({}),
      .prefix_hits_total = prometheus::BuildCounter()
                               .Name("strata_prefix_cache_hits_total")
                               .Help("Prompt tokens found in the prefix cache, not computed again (vLLM: "
                                     "vllm:prefix_cache_hits)")
                               .Register(registry)
                               .Add({}),
  };
}

Metrics::PipelineMetrics Metrics::RegisterPipelineMetrics(prometheus::Registry& registry) {
  return {
      .batch_size = prometheus::BuildHistogram()
                        .Name("strata_batch_size")
                        .Help("Rows of each micro-batch the engine runs")
                        .Register(registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256}),
      .stage_busy_seconds = prometheus::BuildCounter()
                                .Name("strata_stage_busy_seconds_total")
                                .Help("Wall time a pipeline stage spent running micro-batches (on CUDA: issuing them)")
                                .Register(registry),
      .transfer_bytes = prometheus::BuildCounter()
                            .Name("strata_stage_transfer_bytes_total")
                            .Help("A group of nodes: bytes sent from node `from` to node `to` (activations and each "
                                  "micro-batch's inputs on their way to the next stage, results to the leader)")
                            .Register(registry),
      .transfer_messages = prometheus::BuildCounter()
                               .Name("strata_stage_transfer_messages_total")
                               .Help("A group of nodes: messages sent from node `from` to node `to` (heartbeats not "
                                     "counted)")
                               .Register(registry),
      .transfer_seconds = prometheus::BuildCounter()
                              .Name("strata_stage_transfer_seconds_total")
                              .Help("A group of nodes: time spent sending from node `from` to node `to`")
                              .Register(registry),
      .refused_connections = prometheus::BuildCounter()
                                 .Name("strata_group_refused_connections_total")
                                 .Help("A group of nodes: connections the leader's data port refused (no group "
                                       "secret, garbage, silence past the handshake's 10 s)")
                                 .Register(registry)
                                 .Add({}),
  };
}

Metrics::PlanGauges Metrics::RegisterPlanGauges(prometheus::Registry& registry) {
  return {
      .inventory_free_bytes = prometheus::BuildGauge()
                                  .Name("strata_device_inventory_free_bytes")
                                  .Help("Free memory the plan's default budgets came from, at start-up (GPUs: "
                                        "cudaMemGetInfo; cpu: MemAvailable); absent with --max-memory")
                                  .Register(registry),
      .inventory_total_bytes = prometheus::BuildGauge()
                                   .Name("strata_device_inventory_total_bytes")
                                   .Help("Total memory of each visible GPU at start-up (cudaMemGetInfo)")
                                   .Register(registry),
      .warnings = prometheus::BuildGauge()
                      .Name("strata_plan_warnings")
                      .Help("Warnings about the served plan (e.g. GPUs in the budgets holding no decoder "
                            "layer); GetDeviceMap lists them")
                      .Register(registry)
                      .Add({}),
  };
}

Metrics::HealthMetrics Metrics::RegisterHealthMetrics(prometheus::Registry& registry) {
  return {
      .serving = prometheus::BuildGauge()
                     .Name("strata_serving")
                     .Help("1 while the gRPC health service says SERVING; 0 while the weights load, during a "
                           "drain and after a lost device")
                     .Register(registry)
                     .Add({}),
      .engine_errors_total = prometheus::BuildCounter()
                                 .Name("strata_engine_errors_total")
                                 .Help("Micro-batches whose forward pass or sampling failed, by stage; their requests "
                                       "ended INTERNAL")
                                 .Register(registry),
      .nonfinite_logits_total = prometheus::BuildCounter()
                                    .Name("strata_nonfinite_logits_total")
                                    .Help("Rows whose logits were not finite (NaN or inf), by the stage that computed "
                                          "them; each ended its request INTERNAL")
                                    .Register(registry),
      .open_streams = prometheus::BuildGauge()
                          .Name("strata_open_streams")
                          .Help("Generate calls open: validating, waiting, generating or being read (--max-streams)")
                          .Register(registry)
                          .Add({}),
      .requests_failed_in_a_row = prometheus::BuildGauge()
                                      .Name("strata_requests_failed_in_a_row")
                                      .Help("Requests that ended INTERNAL since the last forward pass that produced a "
                                            "token; at --not-serving-after-errors health turns NOT_SERVING")
                                      .Register(registry)
                                      .Add({}),
      .http_connections_dropped_total =
          prometheus::BuildCounter()
              .Name("strata_http_connections_dropped_total")
              .Help("HTTP API connections refused at accept (reason connection_limit, peer_limit: "
                    "--http-max-connections-per-peer) or closed before their request was whole (read_timeout: "
                    "--http-read-timeout)")
              .Register(registry),
  };
}

Metrics::StructuredMetrics Metrics::RegisterStructuredMetrics(prometheus::Registry& registry) {
  return {
      .requests_total = prometheus::BuildCounter()
                            .Name("strata_structured_requests_total")
                            .Help("Generation requests admitted with a structured-output constraint, by kind "
                                  "(json_schema, json_object, regex, choice, grammar, structural_tag; tool_calls: "
                                  "tool_choice \"required\" or a named function)")
                            .Register(registry),
      .compile_seconds = prometheus::BuildHistogram()
                             .Name("strata_grammar_compile_seconds")
                             .Help("Grammar compiles (cache misses) from start to end, including those that ran past "
                                   "--max-grammar-compile-seconds and finished in the background")
                             .Register(registry)
                             .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                                              0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      .compiles_total = prometheus::BuildCounter()
                            .Name("strata_grammar_compiles_total")
                            .Help("Grammar compiles started: constraints not found in the compiler's cache")
                            .Register(registry)
                            .Add({}),
      .cache_hits_total = prometheus::BuildCounter()
                              .Name("strata_grammar_cache_hits_total")
                              .Help("Constraints served by a grammar already compiled (or compiling) for the "
                                    "same constraint")
                              .Register(registry)
                              .Add({}),
      .compile_timeouts_total = prometheus::BuildCounter()
                                    .Name("strata_grammar_compile_timeouts_total")
                                    .Help("Requests refused (400 / INVALID_ARGUMENT) because their grammar did not "
                                          "compile within --max-grammar-compile-seconds")
                                    .Register(registry)
                                    .Add({}),
      .refusals_total = prometheus::BuildCounter()
                            .Name("strata_grammar_refusals_total")
                            .Help("Constraints the compiler refused: invalid, unsupported, too large or too deep "
                                  "(each request answered 400 / INVALID_ARGUMENT naming its field)")
                            .Register(registry)
                            .Add({}),
      .mask_seconds = prometheus::BuildHistogram()
                          .Name("strata_grammar_mask_seconds")
                          .Help("Filling one constrained row's token mask for one step (on the mask thread, while "
                                "the micro-batch's forward pass runs)")
                          .Register(registry)
                          .Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
                                                                           0.001, 0.0025, 0.005, 0.01, 0.025, 0.1}),
      .forced_tokens_total = prometheus::BuildCounter()
                                 .Name("strata_grammar_forced_tokens_total")
                                 .Help("Tokens --jump-forward appended without a forward pass of their own (the "
                                       "grammar allowed no other)")
                                 .Register(registry)
                                 .Add({}),
  };
}

Metrics::SpeculativeMetrics Metrics::RegisterSpeculativeMetrics(prometheus::Registry& registry) {
  return SpeculativeMetrics{
      .proposed_tokens_total = prometheus::BuildCounter()
                                   .Name("strata_spec_proposed_tokens_total")
                                   .Help("Tokens proposed by speculative decoding and verified by a forward pass")
                                   .Register(registry),
      .accepted_tokens_total = prometheus::BuildCounter()
                                   .Name("strata_spec_accepted_tokens_total")
                                   .Help("Proposed tokens the model agreed with (each saved a forward pass of its own)")
                                   .Register(registry),
      .accepted_length = prometheus::BuildHistogram()
                             .Name("strata_spec_accepted_length")
                             .Help("Proposed tokens accepted per verified proposal")
                             .Register(registry),
  };
}

Metrics::Metrics(ListenAddress address, std::shared_ptr<prometheus::Registry> registry,
                 std::unique_ptr<MetricsEndpoint> endpoint)
    : address_(std::move(address)),
      registry_(std::move(registry)),
      endpoint_(std::move(endpoint)),
      devices_(RegisterDeviceGauges(*registry_)),
      requests_(RegisterRequestMetrics(*registry_)),
      scheduler_(RegisterSchedulerGauges(*registry_)),
      kv_cache_(RegisterKvCacheMetrics(*registry_)),
      pipeline_(RegisterPipelineMetrics(*registry_)),
      plan_(RegisterPlanGauges(*registry_)),
      health_(RegisterHealthMetrics(*registry_)),
      structured_(RegisterStructuredMetrics(*registry_)),
      speculative_(RegisterSpeculativeMetrics(*registry_)) {
  using structured::ConstraintKind;
  for (ConstraintKind kind : {ConstraintKind::kJsonSchema, ConstraintKind::kJsonObject, ConstraintKind::kRegex,
                              ConstraintKind::kChoice, ConstraintKind::kGrammar, ConstraintKind::kStructuralTag}) {
    structured_.requests_total.Add({{"kind", structured::ConstraintKindName(kind)}});
  }
  structured_.requests_total.Add({{"kind", "tool_calls"}});
  for (const char* reason : {"connection_limit", "peer_limit", "read_timeout"}) {
    health_.http_connections_dropped_total.Add({{"reason", reason}});
  }
  for (Api api : {Api::kGrpc, Api::kHttp}) {
    for (grpc::StatusCode code : kGenerateCodes) requests_.total.Add({{"api", ApiName(api)}, {"code", CodeName(code)}});
  }
}

void Metrics::RecordPlan(const planner::Plan& plan) {
  for (const planner::DeviceUsage& usage : plan.devices) {
    const prometheus::Labels labels{{"device", usage.device.ToString()}};
    devices_.budget_bytes.Add(labels).Set(usage.budget_bytes);
    devices_.planned_bytes.Add(labels).Set(static_cast<double>(usage.planned_bytes));
    devices_.kv_cache_bytes.Add(labels).Set(static_cast<double>(usage.kv_cache_bytes));
    devices_.runtime_reserve_bytes.Add(labels).Set(static_cast<double>(usage.runtime_reserve.total()));
  }
  if (plan.inventory) {
    for (size_t i = 0; i < plan.inventory->gpus.size(); ++i) {
      const prometheus::Labels labels{{"device", std::to_string(i)}};
      plan_.inventory_free_bytes.Add(labels).Set(static_cast<double>(plan.inventory->gpus[i].free_bytes));
      plan_.inventory_total_bytes.Add(labels).Set(static_cast<double>(plan.inventory->gpus[i].total_bytes));
    }
    plan_.inventory_free_bytes.Add({{"device", "cpu"}}).Set(static_cast<double>(plan.inventory->host_available_bytes));
  }
  plan_.warnings.Set(static_cast<double>(plan.warnings.size()));
}

void Metrics::RecordRequest(Api api, grpc::StatusCode code, double seconds) {
  requests_.total.Add({{"api", ApiName(api)}, {"code", CodeName(code)}}).Increment();
  requests_.duration[static_cast<int>(api)]->Observe(seconds);
}
void Metrics::RecordUnauthenticated(Api api) {
  requests_.total.Add({{"api", ApiName(api)}, {"code", CodeName(grpc::StatusCode::UNAUTHENTICATED)}}).Increment();
}
void Metrics::RecordPromptTokens(int64_t tokens) { requests_.prompt_tokens.Increment(static_cast<double>(tokens)); }
void Metrics::RecordGeneratedTokens(int64_t tokens) {
  requests_.generated_tokens.Increment(static_cast<double>(tokens));
}
void Metrics::ObserveTimeToFirstToken(Api api, double seconds) {
  requests_.time_to_first_token[static_cast<int>(api)]->Observe(seconds);
}
void Metrics::ObserveInterTokenLatency(Api api, double seconds) {
  requests_.inter_token_latency[static_cast<int>(api)]->Observe(seconds);
}
void Metrics::ObserveBatchSize(int64_t rows) { pipeline_.batch_size.Observe(static_cast<double>(rows)); }

void Metrics::RecordEngine(const runtime::EngineStats& stats) {
  scheduler_.queue_depth.Set(static_cast<double>(stats.queued));
  scheduler_.active_sequences.Set(static_cast<double>(stats.active));
  scheduler_.requests_waiting.Set(static_cast<double>(stats.queued));
  scheduler_.requests_running.Set(static_cast<double>(stats.active));
  // Every KV pool has the same blocks, indexed alike (one block table serves all stages).
  for (const std::string& device : stats.kv_devices) {
    const double blocks = static_cast<double>(stats.kv_blocks);
    kv_cache_.usage_ratio.Add({{"device", device}}).Set(blocks > 0 ? static_cast<double>(stats.kv_used) / blocks : 0);
    kv_cache_.capacity_tokens.Add({{"device", device}}).Set(blocks * static_cast<double>(stats.kv_block_tokens));
    for (auto [state, count] :
         {std::pair{"used", stats.kv_used}, std::pair{"cached", stats.kv_cached}, std::pair{"free", stats.kv_free}}) {
      kv_cache_.blocks.Add({{"device", device}, {"state", state}}).Set(static_cast<double>(count));
    }
  }
  for (auto [counter, total] : {std::pair{&kv_cache_.preemptions_total, stats.preemptions},
                                std::pair{&kv_cache_.prefix_queries_total, stats.prefix_queried_tokens},
                                std::pair{&kv_cache_.prefix_hits_total, stats.prefix_hit_tokens},
                                std::pair{&structured_.forced_tokens_total, stats.forced_tokens}}) {
    const double delta = static_cast<double>(total) - counter->Value();
    if (delta > 0) counter->Increment(delta);
  }
  if (stats.spec_method != "none" && !stats.spec_method.empty()) {
    const prometheus::Labels method{{"method", stats.spec_method}};
    for (auto [family, total] : {std::pair{&speculative_.proposed_tokens_total, stats.spec_proposed_tokens},
                                 std::pair{&speculative_.accepted_tokens_total, stats.spec_accepted_tokens}}) {
      prometheus::Counter& counter = family->Add(method);
      const double delta = static_cast<double>(total) - counter.Value();
      if (delta > 0) counter.Increment(delta);
    }
  }
  health_.requests_failed_in_a_row.Set(static_cast<double>(stats.failed_in_a_row));
  for (size_t s = 0; s < stats.stages.size(); ++s) {
    const prometheus::Labels labels{{"stage", std::to_string(s)}, {"device", stats.stages[s].device}};
    // Every stage's error series exist from the first sample, at 0 (see kGenerateCodes).
    health_.engine_errors_total.Add(labels);
    health_.nonfinite_logits_total.Add(labels);
    prometheus::Counter& counter = pipeline_.stage_busy_seconds.Add(labels);
    // Counters only go up: add what accumulated since the last sample.
    const double delta = stats.stages[s].busy_seconds - counter.Value();
    if (delta > 0) counter.Increment(delta);
  }
  if (const double refused = static_cast<double>(stats.refused_connections) - pipeline_.refused_connections.Value();
      refused > 0) {
    pipeline_.refused_connections.Increment(refused);
  }
  for (const runtime::LinkTransfer& t : stats.transfers) {
    const prometheus::Labels labels{{"from", std::to_string(t.from)}, {"to", std::to_string(t.to)}};
    for (auto [family, total] : {std::pair{&pipeline_.transfer_bytes, static_cast<double>(t.bytes)},
                                 std::pair{&pipeline_.transfer_messages, static_cast<double>(t.messages)},
                                 std::pair{&pipeline_.transfer_seconds, t.seconds}}) {
      prometheus::Counter& counter = family->Add(labels);
      const double delta = total - counter.Value();
      if (delta > 0) counter.Increment(delta);
    }
  }
  for (auto [family, counts] : {std::pair{&health_.engine_errors_total, &stats.errors},
                                std::pair{&health_.nonfinite_logits_total, &stats.nonfinite_logits}}) {
    for (const runtime::StageErrors& e : *counts) {
      prometheus::Counter& counter = family->Add({{"stage", e.stage}, {"device", e.device}});
      const double delta = static_cast<double>(e.count) - counter.Value();
      if (delta > 0) counter.Increment(delta);
    }
  }
}

void Metrics::RecordDeviceMemory(const std::vector<runtime::DeviceMemory>& devices) {
  for (const runtime::DeviceMemory& d : devices) {
    for (auto [kind, value] : {std::pair{"allocated", d.allocated_bytes}, std::pair{"reserved", d.reserved_bytes},
                               std::pair{"total", d.total_bytes}, std::pair{"free", d.free_bytes}}) {
      devices_.memory_bytes.Add({{"device", d.device}, {"kind", kind}}).Set(static_cast<double>(value));
    }
  }
}

void Metrics::SetOpenStreams(int64_t streams) { health_.open_streams.Set(static_cast<double>(streams)); }

void Metrics::SetServing(bool serving) {
  health_.serving.Set(serving ? 1.0 : 0.0);
  endpoint_->SetServing(serving);
}

void Metrics::RecordHttpConnectionDropped(const char* reason) {
  health_.http_connections_dropped_total.Add({{"reason", reason}}).Increment();
}

void Metrics::RecordStructuredRequest(const char* kind) {
  structured_.requests_total.Add({{"kind", kind}}).Increment();
}

void Metrics::RecordGrammarCompiler(const structured::CompilerStats& stats) {
  for (double seconds : stats.compile_seconds) structured_.compile_seconds.Observe(seconds);
  // The compiler counts since its creation: add what accumulated since the last sample.
  for (auto [counter, total] : {std::pair{&structured_.compiles_total, stats.compiles},
                                std::pair{&structured_.cache_hits_total, stats.cache_hits},
                                std::pair{&structured_.compile_timeouts_total, stats.timeouts},
                                std::pair{&structured_.refusals_total, stats.failures}}) {
    const double delta = static_cast<double>(total) - counter->Value();
    if (delta > 0) counter->Increment(delta);
  }
}

void Metrics::ObserveGrammarMask(double seconds) { structured_.mask_seconds.Observe(seconds); }

prometheus::Histogram& Metrics::SpeculationAcceptedLength(const std::string& method) {
  return speculative_.accepted_length.Add({{"method", method}},
                                          prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64});
}

}  // namespace strata::server
