#pragma once
// Shared by the engine tests: a tiny random Llama checkpoint written once per process, loaded as a
// two-stage plan on two logical GPUs that are both the CPU, and a collector of streamed chunks.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/executor/loaded_model.h"

namespace strata::runtime {

inline constexpr int64_t kVocab = 96, kHidden = 32, kInter = 64, kHeads = 4, kKvHeads = 2, kLayers = 3;

// A Llama's sizes; the defaults are the engine tests' tiny model.
struct LlamaDims {
  int64_t vocab = kVocab, hidden = kHidden, inter = kInter, heads = kHeads, kv_heads = kKvHeads, layers = kLayers;
  int64_t max_positions = 256;
  // experts > 0: a Qwen3-MoE (q/k norms, every layer's MLP a sparse block of `experts` experts, top_k of them per
  // token, each of width moe_inter) instead of a Llama.
  int64_t experts = 0, top_k = 2, moe_inter = 32;
};

// The directories this process wrote, removed when it exits (ctest runs each test in a process of its own: without
// this every run left one checkpoint per test in the temporary directory).
struct TempDirs {
  std::vector<std::filesystem::path> paths;
  ~TempDirs() {
    std::error_code ignored;
    for (const auto& p : paths) std::filesystem::remove_all(p, ignored);
  }
};
inline TempDirs& ProcessTempDirs() {
  static TempDirs dirs;
  return dirs;
}

// A Llama (or, with dims.experts, Qwen3-MoE) checkpoint (config.json + model.safetensors) with random weights
// scaled so that the top logits are well apart, in a directory of this process named `name` (removed at exit).
inline std::filesystem::path WriteLlama(const LlamaDims& dims, const std::string& name) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("strata_" + name + "_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  ProcessTempDirs().paths.push_back(d);
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", dims.hidden},
                           {"intermediate_size", dims.inter},
                           {"num_hidden_layers", dims.layers},
                           {"num_attention_heads", dims.heads},
                           {"num_key_value_heads", dims.kv_heads},
                           {"vocab_size", dims.vocab},
                           {"max_position_embeddings", dims.max_positions},
                           {"rms_norm_eps", 1e-5},
                           {"rope_theta", 10000.0},
                           {"tie_word_embeddings", false},
                           {"hidden_act", "silu"},
                           {"torch_dtype", "float32"}};
  if (dims.experts > 0) {
    config["architectures"] = {"Qwen3MoeForCausalLM"};
    config["model_type"] = "qwen3_moe";
    config["head_dim"] = dims.hidden / dims.heads;
    config["num_experts"] = dims.experts;
    config["num_experts_per_tok"] = dims.top_k;
    config["moe_intermediate_size"] = dims.moe_inter;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = nlohmann::json::array();
    config["norm_topk_prob"] = true;
  }
  std::ofstream(d / "config.json") << config.dump();
  const int64_t head_dim = dims.hidden / dims.heads;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {dims.vocab, dims.hidden}}};
  for (int64_t l = 0; l < dims.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    shapes.push_back({p + "input_layernorm.weight", {dims.hidden}});
    shapes.push_back({p + "self_attn.q_proj.weight", {dims.heads * head_dim, dims.hidden}});
    shapes.push_back({p + "self_attn.k_proj.weight", {dims.kv_heads * head_dim, dims.hidden}});
    shapes.push_back({p + "self_attn.v_proj.weight", {dims.kv_heads * head_dim, dims.hidden}});
    shapes.push_back({p + "self_attn.o_proj.weight", {dims.hidden, dims.heads * head_dim}});
    shapes.push_back({p + "post_attention_layernorm.weight", {dims.hidden}});
    if (dims.experts > 0) {
      shapes.push_back({p + "self_attn.q_norm.weight", {head_dim}});
      shapes.push_back({p + "self_attn.k_norm.weight", {head_dim}});
      shapes.push_back({p + "mlp.gate.weight", {dims.experts, dims.hidden}});
      for (int64_t e = 0; e < dims.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        shapes.push_back({x + "gate_proj.weight", {dims.moe_inter, dims.hidden}});
        shapes.push_back({x + "up_proj.weight", {dims.moe_inter, dims.hidden}});
        shapes.push_back({x + "down_proj.weight", {dims.hidden, dims.moe_inter}});
      }
    } else {
      shapes.push_back({p + "mlp.gate_proj.weight", {dims.inter, dims.hidden}});
      shapes.push_back({p + "mlp.up_proj.weight", {dims.inter, dims.hidden}});
      shapes.push_back({p + "mlp.down_proj.weight", {dims.hidden, dims.inter}});
    }
  }
  shapes.push_back({"model.norm.weight", {dims.hidden}});
  shapes.push_back({"lm_head.weight", {dims.vocab, dims.hidden}});
  at::manual_seed(0);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [tensor, shape] : shapes) {
    at::Tensor t = shape.size() == 1 ? at::ones(shape) : at::randn(shape) * 0.3;
    const size_t begin = data.size();
    data.append(static_cast<const char*>(t.contiguous().data_ptr()), t.nbytes());
    header[tensor] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::ofstream out(d / "model.safetensors", std::ios::binary);
  uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << text << data;
  return d;
}

// The engine tests' tiny Llama, written once per process.
inline std::filesystem::path WriteTinyLlama() {
  static const std::filesystem::path dir = WriteLlama(LlamaDims{}, "engine_test");
  return dir;
}

// `dir`'s checkpoint on `map` (hf_device_map JSON), its plan GPUs run on `physical`, in float32, with budgets every
// test plan fits in.
// kv_blocks > 0: a KV pool of that many blocks instead (a small one makes the scheduler preempt).
inline std::unique_ptr<LoadedModel> LoadPlan(const std::filesystem::path& dir, const std::string& map,
                                             const planner::PhysicalDeviceMap& physical, int64_t max_batch,
                                             int64_t max_context = 64, int64_t kv_blocks = 0) {
  ServingRequest r;
  r.model_dir = dir;
  auto choice = planner::ParseDeviceMapChoice(map);
  EXPECT_TRUE(choice.ok()) << choice.status();
  if (!choice.ok()) return nullptr;
  r.device_map = *choice;
  r.physical = physical;
  r.dtype = planner::DType::kFloat32;
  r.max_memory = *planner::ParseMaxMemory("0=1GiB,1=1GiB,cpu=1GiB,disk=1GiB");
  r.serving.max_batch = max_batch;
  r.serving.max_context = max_context;
  auto options = PlanLoad(r);
  EXPECT_TRUE(options.ok()) << options.status();
  if (!options.ok()) return nullptr;
  if (kv_blocks > 0) options->kv_blocks = kv_blocks;
  auto model = LoadedModel::Load(*options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

// The engine tests' two stages: the embedding and layer 0 on plan GPU 0, the rest on plan GPU 1.
inline constexpr char kTwoStageMap[] = R"({"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1,
    "model.layers.2": 1, "model.norm": 1, "lm_head": 1})";

// The tiny Llama as the two-stage plan on two logical GPUs that both run on `device` (the CPU by default;
// {true, 0} puts both stages on cuda:0).
inline std::unique_ptr<LoadedModel> Load(int64_t max_batch, planner::PhysicalDevice device = {false, 0}) {
  return LoadPlan(WriteTinyLlama(), kTwoStageMap, {{0, device}, {1, device}}, max_batch);
}

// Collects every request's chunks; Wait() returns once all have finished.
struct Collector {
  std::mutex mutex;
  std::condition_variable done;
  std::map<int, std::vector<GenerationChunk>> chunks;
  int finished = 0;

  ChunkCallback For(int index) {
    return [this, index](GenerationChunk chunk) {
      std::lock_guard lock(mutex);
      if (chunk.finish) ++finished;
      chunks[index].push_back(std::move(chunk));
      done.notify_all();
    };
  }
  void Wait(int count) {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(done.wait_for(lock, std::chrono::seconds(60), [&] { return finished >= count; }));
  }
  std::vector<int32_t> Ids(int index) {
    std::vector<int32_t> ids;
    for (const auto& c : chunks[index]) {
      for (const auto& t : c.tokens) ids.push_back(t.id);
    }
    return ids;
  }
  FinishReason Reason(int index) { return *chunks[index].back().finish; }
};

// The engine publishes its counts after it processed a micro-batch, which is after the callbacks of
// that micro-batch ran: wait (bounded) until no sequence runs and no KV block is in use.
inline EngineStats StatsWhenIdle(Engine& engine) {
  auto idle = [](const EngineStats& s) { return s.active == 0 && s.kv_used == 0; };
  for (int tries = 0; tries < 500 && !idle(engine.Stats()); ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return engine.Stats();
}

}  // namespace strata::runtime
