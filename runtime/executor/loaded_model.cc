#include "runtime/executor/loaded_model.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/safetensors.h"
#include "planner/physical_devices.h"
#include "planner/quantization.h"
#include "runtime/executor/device_memory.h"
#include "runtime/executor/pipeline.h"
#include "runtime/executor/torch_info.h"

namespace strata::runtime {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

struct LoadedModel::Impl {
  LoadReport report;
  LoadOptions options;
  Checkpoint checkpoint;
  std::unique_ptr<Pipeline> pipeline;
  NodeGroup* group = nullptr;
};

LoadedModel::LoadedModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedModel::~LoadedModel() = default;
const LoadReport& LoadedModel::report() const { return impl_->report; }
void LoadedModel::SetGroup(NodeGroup* group) { impl_->group = group; }
NodeGroup* LoadedModel::group() const { return impl_->group; }
int64_t LoadedModel::vocab_size() const { return impl_->pipeline->config().vocab; }
int64_t LoadedModel::max_batch() const { return impl_->options.serving.max_batch; }
int64_t LoadedModel::max_context() const { return impl_->options.serving.max_context; }
int64_t LoadedModel::kv_blocks() const { return impl_->options.kv_blocks; }
int64_t LoadedModel::kv_block_tokens() const { return impl_->options.serving.kv_block_tokens; }

absl::StatusOr<std::pair<int64_t, int64_t>> KvPoolBlocks(int64_t max_batch, int64_t max_context,
                                                         int64_t kv_cache_tokens, int64_t kv_block_tokens) {
  if (kv_block_tokens < 1 || kv_block_tokens > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-block-tokens: ", kv_block_tokens, " is not in [1, 4096]"));
  }
  if (kv_cache_tokens < 0) return absl::InvalidArgumentError("--kv-cache-tokens: must not be negative");
  int64_t blocks = (kv_cache_tokens + kv_block_tokens - 1) / kv_block_tokens;
  if (kv_cache_tokens == 0) {
    absl::StatusOr<int64_t> dense =
        planner::CheckedMul(max_batch, (max_context + kv_block_tokens - 1) / kv_block_tokens,
                            "--max-batch x --max-context (KV cache blocks)");
    if (!dense.ok()) return dense.status();
    blocks = *dense;
  }
  if (blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-cache-tokens: ", blocks, " blocks of ", kv_block_tokens,
                                                   " tokens, more than the 2^30 a KV pool may have"));
  }
  return std::pair{blocks, kv_block_tokens};
}
bool LoadedModel::mtp() const { return impl_->options.spec.mtp_kept; }
int64_t LoadedModel::recompute_threshold() const { return impl_->pipeline->recompute_threshold(); }
Pipeline& LoadedModel::pipeline() { return *impl_->pipeline; }

absl::StatusOr<LoadOptions> PlanLoad(const ServingRequest& request) {
  if (request.serving.max_batch < 1) return absl::InvalidArgumentError("--max-batch: must be at least 1");
  if (request.serving.max_context < 1) return absl::InvalidArgumentError("--max-context: must be at least 1");
  const TorchInfo torch = QueryTorch();
  if (torch.cuda_load_failed) return absl::FailedPreconditionError(absl::StrCat("CUDA: ", torch.cuda_load));
  // Serving dtype: as asked; else the checkpoint's when a GPU will run it, float32 on the CPU.
  std::optional<planner::DType> dtype = request.dtype;
  if (!dtype) {
    bool gpu = request.physical.empty() ? torch.cuda_available : false;
    for (const auto& [index, device] : request.physical) gpu = gpu || device.cuda;
    if (!gpu) dtype = planner::DType::kFloat32;  // else LoadModelSpec takes the config's
  }
  if (dtype && *dtype != planner::DType::kFloat32 && *dtype != planner::DType::kFloat16 &&
      *dtype != planner::DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype: ", std::string(planner::DTypeName(*dtype)),
                                                   " is not a serving dtype (float32, float16, bfloat16)"));
  }
  LoadOptions options;
  options.model_dir = request.model_dir;
  options.physical = request.physical;
  options.serving = request.serving;
  absl::StatusOr<std::pair<int64_t, int64_t>> pool = KvPoolBlocks(
      request.serving.max_batch, request.serving.max_context, request.kv_cache_tokens, request.serving.kv_block_tokens);
  if (!pool.ok()) return pool.status();
  std::tie(options.kv_blocks, options.serving.kv_block_tokens) = *pool;
  planner::PlanRequest plan_request;
  plan_request.device_map = request.device_map;
  plan_request.max_memory = request.max_memory;
  plan_request.inventory = request.inventory;
  if (!request.max_memory && !request.inventory) {
    // What transformers reads when from_pretrained gets no max_memory: every visible GPU's free memory
    // and the host's available memory, queried once here.
    absl::StatusOr<planner::MachineInventory> inventory = planner::DiscoverInventory();
    if (!inventory.ok()) return inventory.status();
    plan_request.inventory = *std::move(inventory);
  }
  plan_request.kv_cache_tokens = options.kv_blocks * options.serving.kv_block_tokens;
  plan_request.runtime_reserve = request.runtime_reserve;
  if (request.gpu_nodes.empty()) {
    for (const auto& [gpu, device] : request.physical) {
      if (!device.cuda) plan_request.runtime_reserve.runs_on_cpu.insert(gpu);
    }
  } else {
    plan_request.runtime_reserve.runs_on_cpu = request.gpus_on_cpu;
  }
  options.gpu_nodes = request.gpu_nodes;
  options.node = request.node;
  plan_request.quantized_sizing = request.quantized_sizing;
  // The spec checks every checkpoint header against the expected tensors (missing, unexpected,
  // mis-shaped): the one list of what the model needs. The server plans with the same function.
  absl::StatusOr<planner::PlannedModel> planned = planner::LoadAndPlace(
      planner::ModelSource{request.model_dir, std::nullopt, {.mtp = request.mtp}}, dtype, plan_request);
  if (!planned.ok()) return planned.status();
  const planner::DType serving = planned->spec.dtype;
  if (serving != planner::DType::kFloat32 && serving != planner::DType::kFloat16 &&
      serving != planner::DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model ", request.model_dir.string(), ": ", (request.model_dir / "config.json").string(),
                     ": dtype ", std::string(planner::DTypeName(serving)),
                     " is not a serving dtype (float32, float16, bfloat16); pass --dtype"));
  }
  if (request.serving.fp8_scaled_mm) {
    bool blocks = false;
    if (planned->spec.quantization) {
      for (const auto& [name, q] : planned->spec.quantization->linears) {
        blocks = blocks || (q.layout == planner::QuantLayout::kFp8Block && q.block_n == 128 && q.block_k == 128);
      }
    }
    if (!blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--fp8-matmul scaled_mm: ", (request.model_dir / "config.json").string(),
          " has no FP8 layer of 128 x 128 blocks (quantization_config quant_method \"fp8\", weight_block_size "
          "[128, 128]) to run W8A8"));
    }
  }
  options.spec = std::move(planned->spec);
  options.plan = std::move(planned->plan);
  return options;
}

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadedModel::Load(const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.serving.max_batch < 1) return absl::InvalidArgumentError("--max-batch: must be at least 1");
  if (options.serving.max_context < 1) return absl::InvalidArgumentError("--max-context: must be at least 1");
  if (options.kv_blocks < 1 || options.serving.kv_block_tokens < 1) {
    return absl::InvalidArgumentError("--kv-cache-tokens: the KV pool needs at least one block");
  }
  // The forward pass's settings, as the planner read them from config.json: an error when config.json asks
  // for what the runtime does not implement, and for module trees.
  if (!options.spec.decoder.ok()) return options.spec.decoder.status();
  // What LibTorch's start-up touched of its code and serving does not run leaves the resident set before the weights
  // come in (device_memory.h).
  PageOutLibraryCode("libtorch_cpu.so");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  LoadReport& report = impl->report;
  report.spec = options.spec;
  report.plan = options.plan;
  report.dtype = std::string(planner::DTypeName(options.spec.dtype));
  absl::StatusOr<Checkpoint> checkpoint = Checkpoint::Open(options.model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  impl->checkpoint = *std::move(checkpoint);
  report.checkpoint_bytes = impl->checkpoint.total_bytes();

  PipelineOptions pipeline_options;
  pipeline_options.dtype = ToScalarType(options.spec.dtype);
  pipeline_options.kv_blocks = options.kv_blocks;
  pipeline_options.serving = options.serving;
  pipeline_options.physical = options.physical;
  pipeline_options.node = options.node;
  pipeline_options.gpu_nodes = options.gpu_nodes;
  try {
    absl::StatusOr<std::unique_ptr<Pipeline>> pipeline =
        Pipeline::Build(report.spec, report.plan, impl->checkpoint, pipeline_options);
    if (!pipeline.ok()) return pipeline.status();
    impl->pipeline = *std::move(pipeline);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading ", options.model_dir.string(), ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading ", options.model_dir.string(), ": ", e.what()));
  }
  const WeightLoadStats& stats = impl->pipeline->load_stats();
  report.copied_tensors = stats.copied;
  report.disk_tensors = stats.on_disk;
  report.packed_tensors = stats.packed;
  report.pinned_bytes = stats.pinned_bytes;
  for (const Stage& stage : impl->pipeline->stages()) {
    if (stage.offload) report.offload_slot_bytes += stage.offload->bytes();
  }
  report.fp8_scaled_mm_tensors = stats.fp8_scaled_mm;
  if (options.serving.fp8_scaled_mm && stats.fp8_scaled_mm == 0) {
    return absl::InvalidArgumentError(
        "--fp8-matmul scaled_mm: no layer runs W8A8: it needs block-wise FP8 weights (quant_method \"fp8\", 128 x 128 "
        "blocks, dimensions whole blocks) placed on a GPU");
  }
  report.huge_page_bytes = AnonHugePageBytes();
  report.kv_cache_bytes = impl->pipeline->kv_cache_bytes();
  for (const Stage& stage : impl->pipeline->stages()) {
    if (stage.kv.bytes() > 0 &&
        std::find(report.kv_devices.begin(), report.kv_devices.end(), stage.label) == report.kv_devices.end()) {
      report.kv_devices.push_back(stage.label);
    }
  }
  report.stages = impl->pipeline->Describe();
  if (!report.spec.ignored_tensors.empty()) {
    // Not the model's (DeepSeek-V3's multi-token-prediction layer): transformers skips them on load too.
    absl::StrAppend(&report.stages, "not loaded: ", report.spec.ignored_tensors.size(), " checkpoint tensors under ",
                    absl::StrJoin(report.spec.ignored_prefixes, ", "),
                    " (not part of the model: ", report.spec.ignored_tensors.front(), ", ...)\n");
  }
  report.seconds = SecondsSince(start);
  PageOutLibraryCode("libtorch_cpu.so");  // and what the load ran of it
  return std::unique_ptr<LoadedModel>(new LoadedModel(std::move(impl)));
}

}  // namespace strata::runtime
