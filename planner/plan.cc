#include "planner/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/auto_device_map.h"
#include "planner/manual_device_map.h"
#include "planner/quantized_spec.h"

namespace strata::planner {
namespace {

using internal::DeviceResolver;
using internal::ModuleSizes;

// Bytes placed on each device: every parameter and buffer (tied aliases excluded, as upstream counts
// them) goes where its covering entry says. Tensors no entry covers (non-persistent buffers a manual
// map left out) are charged to `fallback`. Walks the tree once, handing each module's device down.
std::map<Device, int64_t> PlannedBytes(const ModelSpec& spec, const ModuleSizes& sizes, const DeviceMap& map,
                                       const Device& fallback) {
  std::unordered_map<std::string, Device> entries(map.begin(), map.end());
  std::map<Device, int64_t> planned;
  size_t matched = 0;
  // Keys naming tensors are rare (a split exposing a module's own parameters); look tensors up only
  // when some key did not name a module.
  auto walk = [&](auto& self, const ModuleSpec& m, std::optional<Device> inherited, bool tensor_keys) -> void {
    if (auto it = entries.find(m.name); it != entries.end()) {
      inherited = it->second;
      ++matched;
    }
    auto charge = [&](const TensorSpec& t) {
      std::optional<Device> device = inherited;
      if (tensor_keys) {
        if (auto it = entries.find(m.ChildName(t.name)); it != entries.end()) device = it->second;
      }
      planned[device.value_or(fallback)] += sizes.Of(t);
    };
    for (const TensorSpec& p : m.parameters) charge(p);
    for (const TensorSpec& b : m.buffers) charge(b);
    for (const ModuleSpec& c : m.children) self(self, c, inherited, tensor_keys);
  };
  walk(walk, spec.root, std::nullopt, false);
  if (matched < entries.size()) {
    planned.clear();
    walk(walk, spec.root, std::nullopt, true);
  }
  return planned;
}

bool HasTensors(const ModuleSpec& module) {
  if (!module.parameters.empty() || !module.buffers.empty()) return true;
  return std::any_of(module.children.begin(), module.children.end(), HasTensors);
}

// Decoder layers are the no-split modules; each holds one layer of KV cache.
std::vector<std::string> DecoderLayers(const ModelSpec& spec) {
  std::vector<std::string> layers;
  for (const ModuleSpec* m : NoSplitModules(spec)) layers.push_back(m->name);
  return layers;
}

// The KV cache each GPU must hold for `tokens` tokens: K and V of every decoder layer it runs. Layers
// offloaded to cpu/disk while GPUs exist run on the first GPU, so their cache lives there.
std::map<Device, int64_t> KvCacheBytes(const ModelSpec& spec, const DeviceMap& map, const MaxMemory& max_memory,
                                       int64_t tokens) {
  std::map<Device, int64_t> kv;
  if (tokens <= 0) return kv;
  const int64_t per_layer = tokens * spec.KvElementsPerToken() * DTypeSize(spec.dtype);
  std::optional<Device> first_gpu;
  for (const DeviceBudget& b : max_memory)
    if (b.device.is_gpu() && !first_gpu) first_gpu = b.device;
  if (!first_gpu) return kv;
  DeviceResolver resolver(map);
  for (const std::string& layer : DecoderLayers(spec)) {
    auto entry = resolver.Find(layer);
    if (!entry) continue;
    kv[entry->second.is_gpu() ? entry->second : *first_gpu] += per_layer;
  }
  return kv;
}

// What a placement leaves for the accounting per device.
struct PlacedBudgets {
  MaxMemory placed_with;                                  // the budgets the placement ran with
  std::map<Device, int64_t> kv_reserve;                   // the KV cache reserved on each device
  std::map<Device, RuntimeReserveParts> runtime_reserve;  // what serving allocates besides (runtime_reserve.h)

  // Everything taken from `device`'s budget before placing.
  double Reserved(const Device& device) const {
    double bytes = 0;
    if (auto it = kv_reserve.find(device); it != kv_reserve.end()) bytes += static_cast<double>(it->second);
    if (auto it = runtime_reserve.find(device); it != runtime_reserve.end())
      bytes += static_cast<double>(it->second.total());
    return bytes;
  }
};

// A plan whose budgets list GPUs but whose decoder layers all run from cpu or disk is valid, and almost
// never what the person wanted: say which budgets and which KV reserve left the GPUs without a layer.
std::optional<std::string> NoLayerOnAGpuWarning(const ModelSpec& spec, const DeviceMap& map,
                                                const MaxMemory& max_memory, const PlacedBudgets& placed,
                                                int64_t kv_cache_tokens) {
  std::vector<std::string> gpus;
  for (const DeviceBudget& b : max_memory) {
    if (!b.device.is_gpu()) continue;
    std::string text = absl::StrCat("GPU ", b.device.ToString(), " budget ", FormatBytes(b.bytes));
    if (kv_cache_tokens > 0) {
      auto kv = placed.kv_reserve.find(b.device);
      absl::StrAppend(&text, " (KV reserve ", FormatBytes(kv == placed.kv_reserve.end() ? 0 : kv->second), ")");
    }
    if (auto runtime = placed.runtime_reserve.find(b.device); runtime != placed.runtime_reserve.end()) {
      absl::StrAppend(&text, " (runtime reserve ", FormatBytes(static_cast<double>(runtime->second.total())), ")");
    }
    gpus.push_back(std::move(text));
  }
  const std::vector<std::string> layers = DecoderLayers(spec);
  if (gpus.empty() || layers.empty()) return std::nullopt;
  DeviceResolver resolver(map);
  std::map<Device, int> where;
  for (const std::string& layer : layers) {
    auto entry = resolver.Find(layer);
    if (!entry) continue;
    if (entry->second.is_gpu()) return std::nullopt;
    ++where[entry->second];
  }
  std::vector<std::string> counts;
  for (const auto& [device, n] : where) counts.push_back(absl::StrCat(n, " on ", device.ToString()));
  std::string warning =
      absl::StrCat("no decoder layer is on a GPU (", absl::StrJoin(counts, ", "), "): ", absl::StrJoin(gpus, ", "));
  if (!placed.runtime_reserve.empty()) {
    absl::StrAppend(&warning,
                    "; the runtime reserve (--runtime-reserve) is what serving allocates besides weights and KV cache: "
                    "lower --max-batch-tokens or --max-batch to shrink it");
  }
  if (kv_cache_tokens > 0) {
    absl::StrAppend(&warning, "; the KV reserve is for ", kv_cache_tokens,
                    " tokens: give the GPUs more memory or reserve fewer KV tokens");
  } else {
    absl::StrAppend(&warning,
                    "; the GPU budgets are too small for a decoder layer (with the room kept for "
                    "offloaded layers): give the GPUs more memory");
  }
  return warning;
}

std::vector<Stage> Stages(const ModelSpec& spec, const DeviceMap& map) {
  DeviceMap sorted = map;
  internal::SortByDefinition(spec, sorted);
  std::vector<Stage> stages;
  for (const auto& [name, device] : sorted) {
    if (stages.empty() || !(stages.back().device == device)) stages.push_back({device, {}});
    stages.back().modules.push_back(name);
  }
  return stages;
}

// The KV cache request against the model: tokens >= 0, a model that says how large a KV cache is, and
// a whole cache whose bytes fit in int64.
absl::Status CheckKvCacheRequest(const ModelSpec& spec, const PlanRequest& request) {
  if (request.kv_cache_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_tokens: must be >= 0, got ", request.kv_cache_tokens));
  }
  if (request.kv_cache_tokens > 0 && (spec.num_key_value_heads <= 0 || spec.head_dim <= 0)) {
    return absl::InvalidArgumentError(
        "kv_cache_tokens: the model description has no num_key_value_heads/head_dim to size a KV cache with");
  }
  if (request.kv_cache_tokens > 0) {
    // The whole model's KV cache, with checked arithmetic: each device's share is a part of it, so
    // KvCacheBytes cannot overflow once this fits.
    int64_t total = request.kv_cache_tokens;
    for (int64_t factor : {int64_t{spec.kv_latent ? 1 : 2}, spec.num_key_value_heads, spec.head_dim,
                           DTypeSize(spec.dtype), static_cast<int64_t>(DecoderLayers(spec).size())}) {
      absl::StatusOr<int64_t> next = CheckedMul(total, factor, "kv_cache_tokens: the KV cache's bytes");
      if (!next.ok()) return next.status();
      total = *next;
    }
  }
  return absl::OkStatus();
}

// The request's max_memory or, without one, the defaults from the machine's inventory (the request's,
// or discovered now), which the plan keeps.
absl::StatusOr<MaxMemory> ResolveMaxMemory(const PlanRequest& request, Plan& plan) {
  if (request.max_memory) {
    // A group's budgets: the plan keeps the group's inventory all the same, for each device's node.
    if (request.inventory && request.inventory->nodes() > 1) plan.inventory = request.inventory;
    return *request.max_memory;
  }
  if (request.inventory) {
    plan.inventory = request.inventory;
  } else {
    absl::StatusOr<MachineInventory> discovered = DiscoverInventory();
    if (!discovered.ok()) return discovered.status();
    plan.inventory = *std::move(discovered);
  }
  return DefaultMaxMemory(*plan.inventory, plan.strategy);
}

// A manual map, validated against the budgets less its KV cache.
absl::Status PlaceManual(const ModelSpec& spec, const ModuleSizes& sizes, const PlanRequest& request,
                         const MaxMemory& max_memory, Plan& plan, PlacedBudgets& placed) {
  if (request.device_map.manual.empty()) return absl::InvalidArgumentError("device_map: the map is empty");
  plan.device_map = request.device_map.manual;
  placed.placed_with = max_memory;
  placed.kv_reserve = KvCacheBytes(spec, plan.device_map, max_memory, request.kv_cache_tokens);
  placed.runtime_reserve = RuntimeReserveBytes(spec, plan.device_map, request.runtime_reserve);
  for (DeviceBudget& b : placed.placed_with) b.bytes -= placed.Reserved(b.device);
  std::optional<MaxMemory> limits;
  if (request.max_memory) limits = placed.placed_with;
  Device fallback = plan.device_map.front().second;
  absl::Status valid =
      internal::ValidateManualMap(spec, plan.device_map, limits, PlannedBytes(spec, sizes, plan.device_map, fallback));
  if (!valid.ok()) return valid;
  plan.explanation.push_back("manual map: validated (every checkpoint tensor covered once, tied weights together)");
  return absl::OkStatus();
}

// transformers' placement for the strategy (balanced budgets unless sequential, then
// infer_auto_device_map), with the KV cache reserved on the devices its layers land on.
absl::Status PlaceAuto(const ModelSpec& spec, const ModuleSizes& sizes, const PlanRequest& request,
                       const MaxMemory& max_memory, Plan& plan, PlacedBudgets& placed) {
  std::map<Device, int64_t>& kv_reserve = placed.kv_reserve;
  // The reserves depend on where the layers go, and the placement on the reserves: start with none
  // and grow them (never shrink, so this ends) until the placement no longer changes the need.
  for (int round = 0;; ++round) {
    MaxMemory budgets = max_memory;
    for (DeviceBudget& b : budgets) b.bytes = std::max(0.0, b.bytes - placed.Reserved(b.device));
    std::vector<std::string> trace;
    std::vector<std::string>* explain = request.explain ? &trace : nullptr;
    if (plan.strategy == Strategy::kSequential) {
      placed.placed_with = budgets;
    } else {
      absl::StatusOr<MaxMemory> balanced =
          internal::BalancedMaxMemory(spec, sizes, budgets, plan.strategy == Strategy::kBalancedLow0, explain);
      if (!balanced.ok()) return balanced.status();
      placed.placed_with = *std::move(balanced);
    }
    absl::StatusOr<DeviceMap> map = internal::InferAutoDeviceMap(spec, sizes, placed.placed_with, explain);
    if (!map.ok()) return map.status();
    plan.device_map = *std::move(map);
    plan.explanation = std::move(trace);
    if (request.kv_cache_tokens == 0 && request.runtime_reserve.kind == RuntimeReserve::Kind::kNone) break;
    bool grew = false;
    for (const auto& [device, bytes] : KvCacheBytes(spec, plan.device_map, max_memory, request.kv_cache_tokens)) {
      if (bytes > kv_reserve[device]) {
        kv_reserve[device] = bytes;
        grew = true;
      }
    }
    for (const auto& [device, parts] : RuntimeReserveBytes(spec, plan.device_map, request.runtime_reserve)) {
      RuntimeReserveParts& kept = placed.runtime_reserve[device];
      if (parts.total() > kept.total()) {
        kept = parts;
        grew = true;
      }
    }
    if (!grew) break;
    if (round > 64) return absl::InternalError("kv_cache_tokens: KV reserve did not settle");
  }
  for (const auto& [device, parts] : placed.runtime_reserve) {
    plan.explanation.push_back(absl::StrCat("runtime reserve: ", parts.Describe(), " kept on GPU ", device.ToString()));
  }
  if (request.kv_cache_tokens > 0) {
    for (const auto& [device, bytes] : kv_reserve) {
      plan.explanation.push_back(absl::StrCat("kv cache: ", FormatBytes(bytes), " reserved on GPU ", device.ToString(),
                                              " for ", request.kv_cache_tokens, " tokens"));
    }
  }
  if (std::optional<std::string> warning =
          NoLayerOnAGpuWarning(spec, plan.device_map, max_memory, placed, request.kv_cache_tokens)) {
    plan.warnings.push_back(*std::move(warning));
  }
  return absl::OkStatus();
}

// plan.devices: each device's budget, planned bytes and KV reserve, in device order; the KV capacity each GPU
// leaves room for (against `max_memory`, before balancing shrank it) and the plan's, its tightest.
void AccountDevices(const ModelSpec& spec, const ModuleSizes& sizes, const MaxMemory& max_memory, PlacedBudgets& placed,
                    Plan& plan) {
  const MaxMemory& placed_with = placed.placed_with;
  std::map<Device, int64_t>& kv_reserve = placed.kv_reserve;
  const std::map<Device, int64_t> planned = PlannedBytes(spec, sizes, plan.device_map, plan.device_map.front().second);
  for (const DeviceBudget& b : placed_with) {
    auto it = planned.find(b.device);
    auto runtime = placed.runtime_reserve.find(b.device);
    plan.devices.push_back({b.device, b.bytes, it == planned.end() ? 0 : it->second, kv_reserve[b.device],
                            runtime == placed.runtime_reserve.end() ? RuntimeReserveParts{} : runtime->second});
  }
  // Devices the map uses that max_memory did not list: disk (always allowed, unlimited) and, for
  // manual maps without max_memory, whatever the map names.
  for (const auto& [device, bytes] : planned) {
    // clang before 16 cannot capture a structured binding (the fuzz build uses Debian's clang 14).
    const Device& used = device;
    bool listed =
        std::any_of(placed_with.begin(), placed_with.end(), [&](const DeviceBudget& b) { return b.device == used; });
    if (!listed) plan.devices.push_back({device, std::numeric_limits<double>::infinity(), bytes, 0, {}});
  }
  std::stable_sort(plan.devices.begin(), plan.devices.end(),
                   [](const DeviceUsage& a, const DeviceUsage& b) { return a.device < b.device; });
  if (spec.num_key_value_heads <= 0 || spec.head_dim <= 0) return;
  const std::map<Device, int64_t> per_token = KvCacheBytes(spec, plan.device_map, max_memory, 1);
  for (DeviceUsage& d : plan.devices) {
    auto kv = per_token.find(d.device);
    auto limit =
        std::find_if(max_memory.begin(), max_memory.end(), [&](const DeviceBudget& b) { return b.device == d.device; });
    if (kv == per_token.end() || kv->second <= 0 || limit == max_memory.end() || std::isinf(limit->bytes)) continue;
    // In doubles: a saturated runtime reserve (huge serving limits) must not overflow the sum.
    const double room =
        limit->bytes - static_cast<double>(d.planned_bytes) - static_cast<double>(d.runtime_reserve.total());
    const double tokens = room / static_cast<double>(kv->second);
    d.kv_capacity_tokens = room <= 0        ? 0
                           : tokens >= 9e18 ? std::numeric_limits<int64_t>::max()
                                            : static_cast<int64_t>(tokens);
    if (!plan.kv_capacity || d.kv_capacity_tokens < plan.kv_capacity->tokens) {
      plan.kv_capacity = KvCapacity{d.kv_capacity_tokens, d.device};
    }
  }
}

}  // namespace

absl::string_view StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kAuto:
      return "auto";
    case Strategy::kBalanced:
      return "balanced";
    case Strategy::kBalancedLow0:
      return "balanced_low_0";
    case Strategy::kSequential:
      return "sequential";
    case Strategy::kManual:
      return "manual";
  }
  return "?";
}

absl::Status ApplyQuantizedSizing(ModelSpec& spec, const PlanRequest& request) {
  if (!spec.quantization) return absl::OkStatus();
  bool keeps_fp8 = false;
  const QuantizationConfig& q = spec.quantization->config;
  if (request.quantized_sizing == QuantizedSizing::kTransformers && q.method == QuantMethod::kFp8 && !q.dequantize) {
    if (request.inventory) {
      keeps_fp8 = TransformersKeepsFp8(*request.inventory);
    } else {
      absl::StatusOr<MachineInventory> machine = DiscoverInventory();
      if (!machine.ok()) return machine.status();
      keeps_fp8 = TransformersKeepsFp8(*machine);
    }
  }
  SizeQuantizedSpec(spec, request.quantized_sizing, keeps_fp8);
  return absl::OkStatus();
}

absl::StatusOr<PlannedModel> LoadAndPlace(const ModelSource& source, std::optional<DType> dtype,
                                          const PlanRequest& request) {
  PlannedModel out;
  if (source.model_dir.has_value()) {
    absl::StatusOr<ModelSpec> spec = LoadModelSpec(*source.model_dir, dtype, source.spec_options);
    if (!spec.ok()) {
      return absl::Status(spec.status().code(),
                          absl::StrCat("--model ", source.model_dir->string(), ": ", spec.status().message()));
    }
    out.spec = *std::move(spec);
  } else if (source.module_tree.has_value()) {
    absl::StatusOr<ModelSpec> spec = LoadModuleTree(*source.module_tree, dtype);
    if (!spec.ok()) {
      return absl::Status(spec.status().code(),
                          absl::StrCat("--module-tree ", source.module_tree->string(), ": ", spec.status().message()));
    }
    out.spec = *std::move(spec);
  } else {
    return absl::InvalidArgumentError("give --model DIR or --module-tree FILE");
  }
  if (absl::Status s = ApplyQuantizedSizing(out.spec, request); !s.ok()) return s;
  absl::StatusOr<Plan> plan = PlaceSpec(out.spec, request);
  if (!plan.ok()) {
    // The planner names the module or device; say which flag the plan came from.
    return absl::Status(plan.status().code(), absl::StrCat("cannot place the model with --device-map ",
                                                           std::string(StrategyName(request.device_map.strategy)), ": ",
                                                           plan.status().message()));
  }
  out.plan = *std::move(plan);
  return out;
}

absl::StatusOr<Plan> PlaceSpec(const ModelSpec& spec, const PlanRequest& request) {
  if (absl::Status kv = CheckKvCacheRequest(spec, request); !kv.ok()) return kv;
  if (!HasTensors(spec.root)) {
    return absl::InvalidArgumentError("model: the module tree holds no parameters or buffers: nothing to place");
  }
  Plan plan;
  plan.strategy = request.device_map.strategy;
  absl::StatusOr<MaxMemory> max_memory = ResolveMaxMemory(request, plan);
  if (!max_memory.ok()) return max_memory.status();
  const ModuleSizes sizes(spec);

  PlacedBudgets placed;
  absl::Status status = plan.strategy == Strategy::kManual
                            ? PlaceManual(spec, sizes, request, *max_memory, plan, placed)
                            : PlaceAuto(spec, sizes, request, *max_memory, plan, placed);
  if (!status.ok()) return status;

  if (plan.device_map.empty()) return absl::InternalError("device map: the placement produced no entries");
  AccountDevices(spec, sizes, *max_memory, placed, plan);
  plan.stages = Stages(spec, plan.device_map);
  return plan;
}

}  // namespace strata::planner
