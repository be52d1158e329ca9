// The engine's decode loop on CUDA under LibTorch's sync-debug mode "error": once warmed up (the first
// steps may allocate and synchronise), a step must not make a synchronizing CUDA call from LibTorch
// (a blocking device-to-host copy, `.item()`, a stream synchronisation): each one would be raised as a
// c10::Error inside the executor and end the request with kError. Two logical stages on one GPU
// (`0=cuda:0,1=cuda:0`), so the stage-to-stage transfer (streams and events) is on the path; then the
// same for the plans of issue 25's item 6: "cpu" and "disk" entries behind a GPU (the offload slots, the
// pinned arena, a disk copy from the page cache), a CPU stage behind a GPU stage (its input waits for one
// event) and a GPU stage behind a CPU one (its input from pinned memory).
// Skips, saying why, where LibTorch has no CUDA or no device is visible.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/executor/loaded_model.h"
#include "runtime/executor/torch_info.h"
#include "tests/runtime/engine_fixture.h"

#ifdef STRATA_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace strata::runtime {
namespace {

#ifdef STRATA_TORCH_CUDA
// Sets LibTorch's process-wide sync-debug mode for its lifetime (engine threads see it too) and puts
// back what was there, also when an assertion returns early.
class SyncDebugModeScope {
 public:
  explicit SyncDebugModeScope(c10::cuda::SyncDebugMode mode)
      : previous_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(mode);
  }
  ~SyncDebugModeScope() { c10::cuda::warning_state().set_sync_debug_mode(previous_); }
  SyncDebugModeScope(const SyncDebugModeScope&) = delete;
  SyncDebugModeScope& operator=(const SyncDebugModeScope&) = delete;

 private:
  c10::cuda::SyncDebugMode previous_;
};

#endif  // STRATA_TORCH_CUDA

// Greedy requests of different prompt lengths and seeded sampling requests, submitted together.
std::vector<GenerationRequest> Requests() {
  std::vector<GenerationRequest> requests;
  const std::vector<std::vector<int32_t>> prompts = {{1, 5, 9}, {4}, {7, 7, 2, 3, 11, 40, 41}, {90, 3}};
  for (const auto& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.sampling.max_new_tokens = 12;
    r.sampling.top_logprobs = 2;
    requests.push_back(r);
  }
  for (uint64_t seed : {1234u, 99u}) {
    GenerationRequest r;
    r.prompt = {3, 1, 4, 1, 5};
    r.sampling.temperature = 1.3f;
    r.sampling.top_p = 0.9f;
    r.sampling.top_k = 30;
    r.sampling.repetition_penalty = 1.2f;
    r.sampling.seed = seed;
    r.sampling.max_new_tokens = 12;
    requests.push_back(r);
  }
  return requests;
}

void RunAll(Engine& engine, Collector& c, const std::vector<GenerationRequest>& requests) {
  for (size_t i = 0; i < requests.size(); ++i) {
    auto handle = engine.Submit(requests[i], c.For(static_cast<int>(i)));
    ASSERT_TRUE(handle.ok()) << handle.status();
  }
  c.Wait(static_cast<int>(requests.size()));
}

// The tiny Llama (or Qwen3-MoE) on `map`, its plan GPUs on `physical`.
std::unique_ptr<LoadedModel> LoadSyncPlan(const std::string& map, const planner::PhysicalDeviceMap& physical,
                                          bool moe) {
  static const std::filesystem::path tiny_moe = WriteLlama(LlamaDims{.experts = 6, .top_k = 2}, "cuda_sync_moe");
  return LoadPlan(moe ? tiny_moe : WriteTinyLlama(), map, physical, /*max_batch=*/8);
}

struct SyncPlan {
  const char* name;
  const char* map;
  bool first_on_cuda, second_on_cuda;  // plan GPUs 0 and 1
  bool moe = false;                    // the tiny Qwen3-MoE (float32 experts: the padded form) instead of the Llama
};

class CudaSyncPlans : public ::testing::TestWithParam<SyncPlan> {};

const char kOffload[] = R"({"model.embed_tokens": 0, "model.layers.0": "cpu", "model.layers.1": "disk",
    "model.layers.2": 0, "model.norm": 0, "lm_head": "cpu"})";
// Layer 1's experts apart on the CPU (llama.cpp's --n-cpu-moe), the rest on the GPU.
const char kCpuExperts[] = R"({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1.self_attn": 0,
    "model.layers.1.mlp.gate": 0, "model.layers.1.mlp.experts": "cpu", "model.layers.1.input_layernorm": 0,
    "model.layers.1.post_attention_layernorm": 0, "model.layers.2": 0, "model.norm": 0, "model.rotary_emb": 0,
    "lm_head": 0})";

INSTANTIATE_TEST_SUITE_P(Plans, CudaSyncPlans,
                         ::testing::Values(SyncPlan{"two_gpu_stages", kTwoStageMap, true, true},
                                           SyncPlan{"cpu_and_disk_entries", kOffload, true, true},
                                           SyncPlan{"cpu_stage_behind_a_gpu", kTwoStageMap, true, false},
                                           SyncPlan{"gpu_stage_behind_a_cpu", kTwoStageMap, false, true},
                                           SyncPlan{"moe_on_two_gpu_stages", kTwoStageMap, true, true, true},
                                           SyncPlan{"moe_cpu_experts_behind_a_gpu_layer", kCpuExperts, true, true,
                                                    true}),
                         [](const ::testing::TestParamInfo<SyncPlan>& info) { return std::string(info.param.name); });

// Each plan loads and decodes with its plan GPUs on the CPU, so that the GPU run cannot stumble on the plan itself.
TEST_P(CudaSyncPlans, PlanLoadsAndDecodesOnTheCpu) {
  const SyncPlan& plan = GetParam();
  auto model = LoadSyncPlan(plan.map, {{0, planner::PhysicalDevice{false, 0}}, {1, planner::PhysicalDevice{false, 0}}},
                            plan.moe);
  ASSERT_TRUE(model);
  auto engine = Engine::Start(*model, nullptr, {}, EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  const std::vector<GenerationRequest> requests = Requests();
  RunAll(**engine, c, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(c.Reason(static_cast<int>(i)), FinishReason::kLength) << c.chunks[static_cast<int>(i)].back().error;
  }
}

TEST_P(CudaSyncPlans, DecodeLoopMakesNoSynchronizingCallAfterWarmUp) {
#ifndef STRATA_TORCH_CUDA
  GTEST_SKIP() << "LibTorch was built without CUDA (no torch_cuda target): nothing to check";
#else
  if (!QueryTorch().cuda_available) {
    GTEST_SKIP() << "no CUDA device here; this test runs on a GPU machine (scripts/gpu-check.sh)";
  }
  const SyncPlan& plan = GetParam();
  auto model = LoadSyncPlan(
      plan.map,
      {{0, planner::PhysicalDevice{plan.first_on_cuda, 0}}, {1, planner::PhysicalDevice{plan.second_on_cuda, 0}}},
      plan.moe);
  ASSERT_TRUE(model);
  EngineOptions options;
  options.micro_batches = 2;
  auto engine = Engine::Start(*model, nullptr, {}, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<GenerationRequest> requests = Requests();

  // Warm-up, with synchronisation allowed: allocator growth, kernels' first launches.
  Collector warm;
  RunAll(**engine, warm, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(warm.Reason(static_cast<int>(i)), FinishReason::kLength)
        << "warm-up request " << i << ": " << warm.chunks[static_cast<int>(i)].back().error;
  }

  SyncDebugModeScope error_on_sync(c10::cuda::SyncDebugMode::L_ERROR);
  // The mode is seen by LibTorch itself (one static shared across the libraries): a deliberate
  // synchronizing call from this thread raises.
  EXPECT_THROW((void)at::ones({1}, at::TensorOptions().device(at::kCUDA)).sum().item<float>(), c10::Error)
      << "sync-debug mode L_ERROR did not take effect: the rest of this test would prove nothing";

  Collector c;
  RunAll(**engine, c, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const int index = static_cast<int>(i);
    EXPECT_EQ(c.Reason(index), FinishReason::kLength)
        << "request " << i << " (" << (requests[i].sampling.temperature > 0 ? "seeded sampling" : "greedy")
        << ") did not finish normally under sync-debug mode L_ERROR: " << c.chunks[index].back().error;
    // Same requests, same seeds: the same tokens as in the warm-up.
    EXPECT_EQ(c.Ids(index), warm.Ids(index)) << "request " << i;
  }
  EngineStats stats = StatsWhenIdle(**engine);
  EXPECT_TRUE(stats.errors.empty()) << "a stage failed under sync-debug mode L_ERROR: stage "
                                    << stats.errors.front().stage << " on " << stats.errors.front().device;
  EXPECT_FALSE(stats.device_lost);
#endif
}

}  // namespace
}  // namespace strata::runtime
