#include "runtime/executor/pipeline.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/inventory.h"
#include "runtime/executor/torch_info.h"
#include "runtime/model/moe.h"
#include "runtime/model/mtp.h"
#include "runtime/model/quantized_linear.h"

namespace strata::runtime {
namespace {

using planner::Device;

// The map entry that covers a tensor: the longest key that is "" or a dotted prefix of its name, as
// accelerate resolves a parameter's device from hf_device_map.
absl::StatusOr<Device> PlannedDevice(const planner::DeviceMap& map, const std::string& tensor) {
  const std::pair<std::string, Device>* best = nullptr;
  for (const auto& entry : map) {
    const std::string& key = entry.first;
    const bool covers =
        key.empty() || tensor == key ||
        (tensor.size() > key.size() && tensor.compare(0, key.size(), key) == 0 && tensor[key.size()] == '.');
    if (covers && (best == nullptr || key.size() > best->first.size())) best = &entry;
  }
  if (best == nullptr) return absl::InvalidArgumentError(absl::StrCat("device_map: no entry covers tensor ", tensor));
  return best->second;
}

c10::Stream CudaStreamFromPool(at::Device device) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}

c10::Stream CurrentStream(at::Device device) {
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStream(device);
}

}  // namespace

// Where the plan's devices execute: plan GPU i on --physical-devices' choice, else cuda:i, which must exist.
// "cpu" and "disk" entries execute on the main device: the first GPU of the plan when it is a CUDA device
// (weights fetched there on use), else the CPU.
struct Pipeline::Devices {
  const planner::PhysicalDeviceMap& physical;
  TorchInfo torch = QueryTorch();
  at::Device main = at::kCPU;

  absl::StatusOr<at::Device> Of(int gpu) const {
    planner::PhysicalDevice p{true, gpu};
    if (auto it = physical.find(gpu); it != physical.end()) p = it->second;
    if (!p.cuda) return at::Device(at::kCPU);
    if (!torch.cuda_available || p.index >= torch.cuda_device_count) {
      // The driver may see GPUs LibTorch cannot use (a driver older than the wheel's CUDA): say so, and what to do.
      if (absl::StatusOr<planner::MachineInventory> machine = planner::DiscoverInventory(); machine.ok()) {
        const int driver_gpus = static_cast<int>(machine->gpus.size());
        if (absl::Status s = CheckTorchSeesTheGpus(driver_gpus, machine->cuda_driver_version, torch); !s.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("device ", gpu, " of the plan runs on ", p.ToString(), ", but ", s.message()));
        }
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", gpu, " of the plan runs on ", p.ToString(), ", but ",
          torch.cuda_available ? absl::StrCat("only ", torch.cuda_device_count, " CUDA devices are visible")
                               : absl::StrCat("no CUDA device is visible (CUDA: ", torch.cuda_load, ")"),
          " (map it with --physical-devices, e.g. ", gpu, "=cpu)"));
    }
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(p.index));
  }

  // A group: "cpu" and "disk" entries are the leader's (node 0), so only the leader's GPUs can be their main
  // device, and only the leader needs one (`on_node_0` says which GPUs are its).
  absl::Status FindMain(const planner::DeviceMap& map, const std::function<bool(int)>& on_node_0) {
    std::optional<int> first_gpu;
    for (const auto& [module, device] : map) {
      if (device.is_gpu() && on_node_0(device.index) && (!first_gpu || device.index < *first_gpu)) {
        first_gpu = device.index;
      }
    }
    if (!first_gpu) return absl::OkStatus();
    absl::StatusOr<at::Device> d = Of(*first_gpu);
    if (!d.ok()) return d.status();
    main = *d;
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<Pipeline>> Pipeline::Build(const planner::ModelSpec& spec, const planner::Plan& plan,
                                                          const Checkpoint& checkpoint,
                                                          const PipelineOptions& options) {
  if (!spec.decoder.ok()) return spec.decoder.status();
  const planner::DecoderConfig& config = *spec.decoder;
  auto pipeline = std::make_unique<Pipeline>();
  pipeline->options_ = options;
  pipeline->config_ = config;
  if (config.rope.type == planner::RopeConfig::Type::kLongRope) {
    pipeline->recompute_threshold_ = static_cast<int64_t>(config.rope.original_max_positions);
  }
  Devices devices{options.physical};
  const std::vector<int>& gpu_nodes = options.gpu_nodes;
  auto on_node_0 = [&](int gpu) {
    return options.node == 0 && (gpu < 0 || static_cast<size_t>(gpu) >= gpu_nodes.size() || gpu_nodes[gpu] == 0);
  };
  if (absl::Status s = devices.FindMain(plan.device_map, on_node_0); !s.ok()) return s;
  WeightLoader loader(checkpoint, options.dtype, options.serving.fp8_scaled_mm);
  absl::StatusOr<std::vector<std::string>> labels = pipeline->LoadUnits(spec, plan, devices, loader);
  if (!labels.ok()) return labels.status();
  if (spec.mtp_kept) {
    if (absl::Status s = pipeline->LoadMtp(spec, plan, devices, loader, *labels); !s.ok()) return s;
  }
  pipeline->load_stats_ = loader.stats();
  pipeline->FormStages(config, *labels);
  return pipeline;
}

absl::StatusOr<std::vector<std::string>> Pipeline::LoadUnits(const planner::ModelSpec& spec, const planner::Plan& plan,
                                                             const Devices& devices, WeightLoader& loader) {
  const planner::DecoderConfig& config = *spec.decoder;
  const bool tied = spec.tied_weights.contains("lm_head.weight");
  absl::StatusOr<std::vector<UnitModule>> order = UnitModules(spec);
  if (!order.ok()) return order.status();
  if (static_cast<int64_t>(order->size()) != config.num_layers + 3) {
    return absl::InvalidArgumentError(absl::StrCat(spec.architecture, ": the module tree has ", order->size() - 3,
                                                   " decoder layers, the config ", config.num_layers));
  }
  std::vector<std::string> labels;
  for (const UnitModule& place : *order) {
    Unit unit;
    unit.kind = place.kind;
    unit.layer = place.layer;
    unit.module = place.module->name;
    if (unit.kind == UnitKind::kDecoderLayer) unit.window = config.sliding_window.at(static_cast<size_t>(unit.layer));
    std::string label;
    absl::StatusOr<std::vector<std::string>> names =
        UnitTensorNames(place, config_, spec.quantization ? &*spec.quantization : nullptr);
    if (!names.ok()) return names.status();
    // A group: another node's unit is a placeholder here (its stage runs there).
    absl::StatusOr<Device> first = PlannedDevice(plan.device_map, names->front());
    if (!first.ok()) return first.status();
    const int node = unit.kind == UnitKind::kLmHead && tied ? units_.front().node : NodeOf(*first);
    unit.node = node;
    if (node != options_.node) {
      labels.push_back(unit.kind == UnitKind::kLmHead && tied ? labels.front() : first->ToString());
      units_.push_back(std::move(unit));
      continue;
    }
    // The tied head shares the embedding's storage: reuse the loaded tensor, not a second copy.
    if (unit.kind == UnitKind::kLmHead && tied) {
      unit.weights.push_back(units_.front().weights.front());
      unit.device = units_.front().device;
      label = labels.front();
    } else {
      absl::StatusOr<std::string> loaded = LoadUnitWeights(spec, plan, devices, loader, *names, unit);
      if (!loaded.ok()) return loaded.status();
      label = *std::move(loaded);
    }
    if (unit.kind == UnitKind::kDecoderLayer) {
      if (absl::Status s = LoadExpertsOf(spec, plan, devices, loader, unit); !s.ok()) return s;
    }
    labels.push_back(label);
    units_.push_back(std::move(unit));
  }
  return labels;
}

absl::StatusOr<std::string> Pipeline::LoadUnitWeights(const planner::ModelSpec& spec, const planner::Plan& plan,
                                                      const Devices& devices, WeightLoader& loader,
                                                      const std::vector<std::string>& names, Unit& unit) {
  std::optional<at::Device> exec;
  std::string label;
  for (const std::string& name : names) {
    absl::StatusOr<Device> planned = PlannedDevice(plan.device_map, name);
    if (!planned.ok()) return planned.status();
    Residency residency = Residency::kResident;
    at::Device device = devices.main;
    if (planned->is_gpu()) {
      absl::StatusOr<at::Device> d = devices.Of(planned->index);
      if (!d.ok()) return d.status();
      device = *d;
    } else if (planned->kind == Device::Kind::kDisk) {
      residency = Residency::kDisk;
    } else if (devices.main.is_cuda()) {
      residency = Residency::kHost;
    }
    if (exec && *exec != device) {
      return absl::InvalidArgumentError(absl::StrCat("device_map: module ", unit.module, " would execute on both ",
                                                     exec->str(), " and ", device.str(), " (tensor ", name,
                                                     "); the runtime runs a module on one device"));
    }
    exec = device;
    if (label.empty()) label = planned->ToString();
    auto stored_name = spec.stored_names.find(name);  // Mixtral's router is stored under block_sparse_moe
    const planner::QuantizedLinear* packed = nullptr;
    if (spec.quantization) {
      if (auto it = spec.quantization->linears.find(name); it != spec.quantization->linears.end()) packed = &it->second;
    }
    const bool float32 = std::any_of(spec.keep_float32.begin(), spec.keep_float32.end(),
                                     [&](const std::string& n) { return name == n || name.ends_with("." + n); });
    const bool by_linear =
        name.starts_with(unit.module + ".") && ReadByLinear(unit.kind, name.substr(unit.module.size() + 1));
    absl::StatusOr<Weight> weight =
        packed != nullptr
            ? loader.LoadPacked(name, *packed, residency, device)
            : loader.Load(stored_name == spec.stored_names.end() ? name : stored_name->second, residency, device,
                          by_linear, float32 ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt);
    if (!weight.ok()) return weight.status();
    if (weight->packed != nullptr && !by_linear) {
      // A quantized weight its runner reads as a tensor (MLA's kv_b_proj, absorbed per head in decode): dense from
      // the start, dequantized once as transformers dequantizes it.
      const PackedLinear& p = *weight->packed;
      weight->stored = p.data.is_cpu() ? Dequantize(p, options_.dtype) : DequantizeWithAten(p, options_.dtype);
      weight->packed.reset();
    }
    unit.weights.push_back(*std::move(weight));
  }
  unit.device = *exec;
  return label;
}

// A sparse layer's experts load on their own planned device and execute there (moe.h): a GPU of the
// plan, else the CPU (cpu and disk experts run where their weights are, as llama.cpp's --n-cpu-moe).
absl::Status Pipeline::LoadExpertsOf(const planner::ModelSpec& spec, const planner::Plan& plan, const Devices& devices,
                                     WeightLoader& loader, Unit& unit) {
  const std::string experts_module = absl::StrCat(unit.module, ".mlp.experts");
  for (const planner::ExpertsStorage& storage : spec.per_expert_storage) {
    if (storage.module != experts_module) continue;
    absl::StatusOr<Device> planned = PlannedDevice(plan.device_map, experts_module + ".gate_up_proj");
    if (!planned.ok()) return planned.status();
    if (NodeOf(*planned) != unit.node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_map: the experts of ", unit.module, " are on device ", planned->ToString(), " of node ",
          NodeOf(*planned), ", their layer on node ", unit.node, "; experts apart from their layer stay on its node"));
    }
    at::Device device = at::kCPU;
    if (planned->is_gpu()) {
      absl::StatusOr<at::Device> d = devices.Of(planned->index);
      if (!d.ok()) return d.status();
      device = *d;
    }
    absl::StatusOr<std::vector<Weight>> experts =
        LoadExperts(loader, storage, device, spec.quantization ? &*spec.quantization : nullptr,
                    /*on_disk=*/planned->kind == Device::Kind::kDisk);
    if (!experts.ok()) return experts.status();
    unit.experts = *std::move(experts);
    unit.experts_label = planned->ToString();
  }
  return absl::OkStatus();
}

absl::Status Pipeline::LoadMtp(const planner::ModelSpec& spec, const planner::Plan& plan, const Devices& devices,
                               WeightLoader& loader, const std::vector<std::string>& labels) {
  absl::StatusOr<MtpUnitModule> found = FindMtpUnitModule(spec);
  if (!found.ok()) return found.status();
  // A group: the node of the last stage runs it (the rest of the group only passes BatchRow::mtp_next on).
  if (units_.back().node != options_.node) return absl::OkStatus();
  MtpLayer mtp;
  Unit& unit = mtp.layer;
  unit.kind = UnitKind::kDecoderLayer;
  unit.layer = found->index;
  unit.module = found->layer.name;
  unit.node = options_.node;
  absl::StatusOr<std::vector<std::string>> names =
      UnitTensorNames(UnitModule{UnitKind::kDecoderLayer, found->index, &found->layer}, config_,
                      spec.quantization ? &*spec.quantization : nullptr);
  if (!names.ok()) return names.status();
  absl::StatusOr<std::string> label = LoadUnitWeights(spec, plan, devices, loader, *names, unit);
  if (!label.ok()) return label.status();
  if (absl::Status s = LoadExpertsOf(spec, plan, devices, loader, unit); !s.ok()) return s;
  Unit extras;  // read as a decoder layer's: eh_proj by Linear
  extras.kind = UnitKind::kDecoderLayer;
  extras.module = unit.module;
  absl::StatusOr<std::string> extras_label = LoadUnitWeights(spec, plan, devices, loader, found->extras, extras);
  if (!extras_label.ok()) return extras_label.status();
  // It runs after the LM head, on its stage, from the final norm's output: all three on one device.
  const Unit& norm = units_.at(units_.size() - 2);
  const Unit& head = units_.back();
  const std::string& head_label = labels.back();
  const std::string& norm_label = labels.at(labels.size() - 2);
  if (*label != head_label || *extras_label != head_label || norm_label != head_label || unit.device != head.device ||
      extras.device != head.device || norm.device != head.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative mtp: the plan puts ", unit.module, " on device ", *label, ", ", norm.module, " on ", norm_label,
        " and ", head.module, " on ", head_label,
        "; the multi-token-prediction layer runs after the LM head from the final norm's output, on its device: "
        "place the three together"));
  }
  mtp.extras = std::move(extras.weights);
  mtp_ = std::move(mtp);
  return absl::OkStatus();
}

int Pipeline::NodeOf(const planner::Device& device) const {
  if (!device.is_gpu() || device.index < 0 || static_cast<size_t>(device.index) >= options_.gpu_nodes.size()) return 0;
  return options_.gpu_nodes[static_cast<size_t>(device.index)];
}

// Stages: consecutive units with the same plan device (and so the same executing device), each with its
// RoPE tables, stream and KV pool.
void Pipeline::FormStages(const planner::DecoderConfig& config, const std::vector<std::string>& labels) {
  const int64_t rotary_dim = config.rotary_dim > 0 ? config.rotary_dim : config_.head_dim;
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& unit = units_[i];
    if (stages_.empty() || stages_.back().label != labels[i] || stages_.back().device != unit.device ||
        stages_.back().node != unit.node) {
      Stage stage;
      stage.label = labels[i];
      stage.device = unit.device;
      stage.node = unit.node;
      stage.local = unit.node == options_.node;
      if (!stage.local) {  // another node's: a placeholder (no RoPE tables, stream or KV pool here)
        stage.units.push_back(i);
        stages_.push_back(std::move(stage));
        continue;
      }
      stage.inv_freq = RopeInvFreq(config.rope, rotary_dim).to(unit.device);
      if (config.sliding_rope) stage.inv_freq_sliding = RopeInvFreq(*config.sliding_rope, rotary_dim).to(unit.device);
      stage.rope = config.rope;
      if (config.rope.type == planner::RopeConfig::Type::kLongRope) {
        stage.inv_freq_long = LongRopeInvFreq(config.rope, rotary_dim, /*long_factors=*/true).to(unit.device);
      }
      if (unit.device.is_cuda()) {
        stage.stream = CudaStreamFromPool(unit.device);
        uses_cuda_ = true;
      }
      stages_.push_back(std::move(stage));
    }
    Stage& stage = stages_.back();
    if (!stage.local) {
      if (stage.units.back() != i) stage.units.push_back(i);
      continue;
    }
    stage.units.push_back(i);
    if (unit.kind == UnitKind::kDecoderLayer) AddKvLayer(stage, unit);
    if (unit.offloaded() && unit.device.is_cuda() && !stage.copy_stream) {
      stage.copy_stream = CudaStreamFromPool(unit.device);
    }
  }
  // The MTP layer's KV pool: one more layer of the last stage's (LoadMtp put it there).
  if (mtp_) AddKvLayer(stages_.back(), mtp_->layer);
  // Each stage with offloaded units gets its two slots, sized to its largest one, once.
  for (Stage& stage : stages_) {
    int64_t largest = 0;
    for (size_t i : stage.units) {
      if (units_[i].offloaded()) largest = std::max(largest, OffloadBuffers::SlotBytes(units_[i].weight_ptrs()));
    }
    if (largest == 0) continue;
    std::optional<c10::StreamGuard> on_stage_stream;
    if (stage.stream) on_stage_stream.emplace(*stage.stream);
    stage.offload = std::make_shared<OffloadBuffers>(stage.device, largest);
  }
}

void Pipeline::AddKvLayer(Stage& stage, const Unit& unit) {
  stage.windows.insert(unit.window);
  // The pool's zero fill is issued on the stage's stream, the one every later read and write of it uses: on the
  // default stream nothing would order it before them (pool streams do not wait for the default stream), and a late
  // fill could overwrite what the first request wrote.
  std::optional<c10::StreamGuard> on_stage_stream;
  if (stage.stream) on_stage_stream.emplace(*stage.stream);
  if (config_.mla.kv_lora_rank > 0) {  // MLA: one latent row per token, keys and values alike
    stage.kv.AddLatentLayer(unit.layer, unit.device, options_.dtype, options_.kv_blocks,
                            options_.serving.kv_block_tokens, config_.mla.kv_lora_rank + config_.mla.qk_rope_head_dim);
  } else {
    stage.kv.AddLayer(unit.layer, unit.device, options_.dtype, options_.kv_blocks, options_.serving.kv_block_tokens,
                      config_.num_kv_heads, config_.head_dim);
  }
}

void Pipeline::AwaitOutput(StageActivation& activation) {
  // Whoever reads the logits next runs on the device's current stream: order it after the last stage.
  if (activation.produced && activation.producer != nullptr) {
    activation.produced->block(CurrentStream(activation.producer->device));
  }
}

at::Tensor Pipeline::HostBuffer(at::IntArrayRef sizes, at::ScalarType dtype) const {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(uses_cuda_));
}

void Pipeline::DescribeBlocks(ForwardGroup& group) {
  const int64_t rows = group.blocks.size(0);
  const int64_t width = group.blocks.size(1);
  const int64_t* table = group.blocks.data_ptr<int64_t>();
  group.blocks_strided = rows > 0 && width > 0;
  group.first_block = rows > 0 && width > 0 ? table[0] : 0;
  group.block_stride = rows > 1 ? table[width] - table[0] : width;
  if (group.block_stride <= 0) group.blocks_strided = false;  // as_strided takes no negative strides
  for (int64_t r = 0; r < rows && group.blocks_strided; ++r) {
    for (int64_t i = 0; i < width; ++i) {
      if (table[r * width + i] != group.first_block + r * group.block_stride + i) {
        group.blocks_strided = false;
        break;
      }
    }
  }
}

namespace {

// Every input copy is non_blocking: host inputs are pinned when a stage is CUDA (asynchronous on this stage's
// stream), and a copy onto the CPU of a CPU tensor is a no-op.
at::Tensor OnDevice(const at::Tensor& t, at::Device device) { return t.to(device, /*non_blocking=*/true); }

// The previous stage's output (or the batch's ids) on `stage`'s device, ordered after its producer; runs under
// the stage's stream guard.
at::Tensor ReceiveHidden(const Stage& stage, const StageActivation& activation) {
  const Stage* previous = activation.producer;
  const at::Tensor source = activation.hidden;
  if (source.is_cuda() && !stage.stream) {
    // A CPU stage after a CUDA one: copy on the producer's stream (ordered after its work) into pinned
    // host memory, then wait for that copy's event alone; the CPU cannot start before the data is there.
    c10::StreamGuard producer(*previous->stream);
    at::Tensor hidden = source.to(stage.device, /*non_blocking=*/true);
    c10::Event copied(c10::DeviceType::CUDA);
    copied.record(*previous->stream);
    copied.synchronize();
    return hidden;
  }
  // Transfer between CUDA stages: this stream waits for the producer's event, then copies; the
  // producer's buffer is marked as used by this stream (record_stream), so the caching allocator
  // hands it out again only after this stream's work on it is done.
  if (stage.stream && activation.produced) activation.produced->block(*stage.stream);
  // A CPU stage's output reaches a CUDA stage from pinned memory (a host copy, then an asynchronous one): from
  // pageable memory the copy would hold this thread until CUDA had staged it.
  at::Tensor hidden = stage.stream && source.is_cpu() && !source.is_pinned()
                          ? OnDevice(source.pin_memory(), stage.device)
                          : OnDevice(source, stage.device);
  if (source.is_cuda() && stage.stream && previous != nullptr && previous->stream) {
    at::Tensor(source).record_stream(*stage.stream);
  }
  return hidden;
}

// longrope picks its factors by the sequence's length, row by row, so that a row's result does not depend on its
// batch. transformers' generate() recomputes a sequence's whole cache with the long factors when it grows past
// original_max_position_embeddings: the scheduler does (recompute_at). A decode row that crosses without it is an
// error, never a silent approximation.
void CheckLongRopeRows(const ForwardGroup& group, int64_t threshold) {
  // starts and last are host tensors (ForwardGroup): reading them does not wait for a device.
  const int64_t rows = group.lengths.defined() ? 0 : group.rows;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = group.starts.data_ptr<int64_t>()[r];
    const int64_t end = start + group.last.data_ptr<int64_t>()[r] + 1;
    if (start > 0 && start <= threshold && end > threshold) {
      throw std::invalid_argument(absl::StrCat(
          "longrope: a sequence grows past original_max_position_embeddings (", threshold, ") at position ", start,
          " after its first tokens were computed with the short factors; it must be recomputed from position 0 "
          "with the long factors (as transformers' generate() does), not decoded on"));
    }
  }
}

// One group's attention inputs on `stage`'s device: positions, block table, RoPE tables and masks.
AttentionGroup GroupAttention(const Stage& stage, const ForwardGroup& group, int64_t offset,
                              const PipelineOptions& options) {
  auto on_device = [&](const at::Tensor& t) { return OnDevice(t, stage.device); };
  AttentionGroup g;
  g.offset = offset;
  g.rows = group.rows;
  g.count = group.count;
  g.positions = on_device(group.starts).unsqueeze(1) +
                at::arange(group.count, at::TensorOptions().dtype(at::kLong).device(stage.device));
  g.kv.table = on_device(group.blocks);
  g.kv.block_tokens = options.serving.kv_block_tokens;
  g.kv.strided = group.blocks_strided;
  g.kv.first = group.first_block;
  g.kv.stride = group.block_stride;
  g.key_length = group.key_length;
  g.rope = RopeForPositions(stage.inv_freq, g.positions, options.dtype,
                            stage.rope.type == planner::RopeConfig::Type::kYarn ? stage.rope.attention_factor : 1.0);
  if (stage.inv_freq_long.defined()) {
    CheckLongRopeRows(group, static_cast<int64_t>(stage.rope.original_max_positions));
    at::Tensor seq_len =
        group.lengths.defined() ? on_device(group.lengths) : on_device(group.starts) + on_device(group.last) + 1;
    g.rope = LongRopeForPositions(stage.inv_freq, stage.inv_freq_long, stage.rope, g.positions, seq_len, options.dtype);
  }
  if (stage.inv_freq_sliding.defined()) {
    g.rope_sliding = RopeForPositions(stage.inv_freq_sliding, g.positions, options.dtype);
  }
  for (int64_t window : stage.windows) g.masks[window] = AttentionMask(g.positions, group.key_length, window);
  return g;
}

}  // namespace

void Pipeline::RunStage(size_t index, const ForwardBatch& batch, StageActivation& activation) {
  Stage& stage = stages_.at(index);
  if (!stage.local) {
    throw std::logic_error(
        absl::StrCat("stage ", index, " runs on node ", stage.node, ", not here (node ", options_.node, ")"));
  }
  std::optional<c10::StreamGuard> guard;
  if (stage.stream) guard.emplace(*stage.stream);
  at::Tensor hidden = ReceiveHidden(stage, activation);

  AttentionBatch attention;
  int64_t offset = 0;
  for (const ForwardGroup& group : batch.groups) {
    attention.groups.push_back(GroupAttention(stage, group, offset, options_));
    offset += group.rows * group.count;
  }
  const at::Tensor last = OnDevice(batch.last, stage.device);

  std::optional<int> ahead;  // the slot the next unit's weights are being copied into
  for (size_t k = 0; k < stage.units.size(); ++k) {
    const Unit& unit = units_[stage.units[k]];
    std::vector<WeightTensor> weights;
    std::optional<int> slot;
    if (stage.offload && unit.offloaded()) {
      slot = ahead ? *ahead : stage.offload->Fill(unit.weight_ptrs(), stage.copy_stream);
      ahead.reset();
      weights = stage.offload->Take(*slot, stage.stream);
    } else {
      for (const Weight& w : unit.weights) weights.push_back(w.Use());
    }
    // Offload on CUDA: copy the next unit's weights into the other slot while this one computes (the copy stream
    // first waits for the compute stream to be done with that slot's last unit).
    if (stage.offload && stage.copy_stream && k + 1 < stage.units.size()) {
      const Unit& next = units_[stage.units[k + 1]];
      if (next.offloaded()) ahead = stage.offload->Fill(next.weight_ptrs(), stage.copy_stream);
    }
    KvLayer* cache = unit.kind == UnitKind::kDecoderLayer ? &stage.kv.layer(unit.layer) : nullptr;
    // With an MTP layer the final norm keeps every fed token (RunMtp reads them all); the LM head reads `last`.
    const bool keep_normed = mtp_ && unit.kind == UnitKind::kFinalNorm;
    try {
      if (keep_normed) {
        const at::Tensor every = at::arange(hidden.size(1), at::TensorOptions().dtype(at::kLong).device(stage.device));
        activation.normed = RunUnit(unit, weights, config_, hidden, attention, cache, every);
        hidden =
            activation.normed.size(0) == last.size(0) ? activation.normed : activation.normed.index_select(0, last);
      } else {
        hidden = RunUnit(unit, weights, config_, hidden, attention, cache, last);
      }
    } catch (...) {
      // What was queued may still read the slot: the next fill must wait for it all the same.
      if (slot) stage.offload->Release(*slot, stage.stream);
      throw;
    }
    if (slot) stage.offload->Release(*slot, stage.stream);
  }
  activation.hidden = hidden;
  if (stage.stream) {
    activation.produced.emplace(c10::DeviceType::CUDA);
    activation.produced->record(*stage.stream);
  } else {
    activation.produced.reset();
  }
  activation.producer = &stage;
}

at::Tensor Pipeline::RunMtp(const ForwardBatch& batch, const at::Tensor& normed, const at::Tensor& next,
                            const at::Tensor& rows) {
  Stage& stage = stages_.back();
  AttentionBatch attention;
  std::vector<at::Tensor> positions;
  int64_t offset = 0;
  for (const ForwardGroup& group : batch.groups) {
    attention.groups.push_back(GroupAttention(stage, group, offset, options_));
    positions.push_back(attention.groups.back().positions.reshape({-1}));
    offset += group.rows * group.count;
  }
  std::vector<WeightTensor> extras;
  for (const Weight& w : mtp_->extras) extras.push_back(w.Use());
  const MtpWeights w{extras.at(0), extras.at(1), extras.at(2),
                     extras.at(3), extras.at(4), units_.back().weights.front().Use()};
  std::vector<WeightTensor> layer;
  for (const Weight& weight : mtp_->layer.weights) layer.push_back(weight.Use());
  const at::Tensor picked = OnDevice(rows, stage.device);
  at::Tensor x = MtpLayerInput(w, normed.select(1, 0), next, at::cat(positions), config_.rms_norm_eps);
  x = RunUnit(mtp_->layer, layer, config_, x, attention, &stage.kv.layer(mtp_->layer.layer), picked);
  if (rows.numel() == 0) return at::Tensor();  // a pass that samples nothing: the KV pool is what it was for
  return MtpProposals(w, x.select(0, 0).index_select(0, picked), config_.rms_norm_eps);
}

int64_t Pipeline::kv_cache_bytes() const {
  int64_t total = 0;
  for (const Stage& stage : stages_) total += stage.kv.bytes();
  return total;
}

std::string Pipeline::Describe() const {
  std::vector<std::string> lines;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const Stage& stage = stages_[s];
    std::vector<std::string> modules;
    for (size_t i : stage.units) modules.push_back(units_[i].module);
    std::string offload;
    if (stage.offload) {
      offload = absl::StrCat(", offloaded weights through 2 slots of ",
                             planner::FormatBytes(static_cast<double>(stage.offload->bytes() / 2)));
    }
    if (!stage.local) {
      lines.push_back(absl::StrCat("stage ", s, " (plan device ", stage.label, " on node ", stage.node,
                                   "): ", modules.front(), modules.size() > 1 ? " .. " + modules.back() : ""));
      continue;
    }
    lines.push_back(absl::StrCat("stage ", s, " (plan device ", stage.label, " on ", stage.device.str(),
                                 "): ", modules.front(), modules.size() > 1 ? " .. " + modules.back() : "", offload));
  }
  if (mtp_) {
    const Stage& last = stages_.back();
    lines.push_back(absl::StrCat("multi-token prediction: ", mtp_->layer.module, " after ", units_.back().module,
                                 " (plan device ", last.label, " on ", last.device.str(), ")"));
  }
  // Experts placed apart from their layer (moe.h): one line per layer, after the stages.
  for (const Stage& stage : stages_) {
    for (size_t i : stage.units) {
      const Unit& unit = units_[i];
      if (unit.experts.empty() || unit.experts_label == stage.label) continue;
      lines.push_back(absl::StrCat("experts of ", unit.module, " apart (plan device ", unit.experts_label, " on ",
                                   unit.experts.front().exec_device.str(), ")"));
    }
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace strata::runtime
