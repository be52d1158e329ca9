#include "planner/runtime_reserve.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/auto_device_map.h"
#include "planner/manual_device_map.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

// The layer's tensors: 2-D weights (linear layers: [out, in]) and 3-D expert parameters ([experts, out, in]).
void Widths(const ModuleSpec& m, int64_t& linear_outs, int64_t& widest, int64_t& expert_widths, int64_t& experts) {
  for (const TensorSpec& t : m.parameters) {
    if (t.shape.size() == 2 && t.name == "weight" && m.class_name != "Embedding") {
      linear_outs += t.shape[0];
      widest = std::max(widest, t.shape[0]);
    } else if (t.shape.size() == 3) {
      expert_widths += t.shape[1] + t.shape[2];
      experts = std::max(experts, t.shape[0]);
    }
  }
  for (const ModuleSpec& c : m.children) Widths(c, linear_outs, widest, expert_widths, experts);
}

// [vocab, hidden] of the output projection: the 2-D parameter with the most rows outside the decoder layers
// (lm_head, or the embedding it is tied to).
std::pair<int64_t, int64_t> VocabAndHidden(const ModelSpec& spec) {
  std::set<const ModuleSpec*> layers;
  for (const ModuleSpec* m : NoSplitModules(spec)) layers.insert(m);
  std::pair<int64_t, int64_t> best{0, 0};
  auto walk = [&](auto& self, const ModuleSpec& m) -> void {
    if (layers.count(&m)) return;
    for (const TensorSpec& t : m.parameters) {
      if (t.shape.size() == 2 && t.shape[0] > best.first) best = {t.shape[0], t.shape[1]};
    }
    for (const ModuleSpec& c : m.children) self(self, c);
  };
  walk(walk, spec.root);
  return best;
}

// a x b x ..., saturating at int64's largest value (the limits are checked by their flags, not for this product).
int64_t Mul(std::initializer_list<int64_t> factors) {
  double product = 1;
  for (int64_t f : factors) product *= static_cast<double>(f);
  return product >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(product);
}

int64_t Add(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}

// Where an entry executes: its GPU, or for "cpu" and "disk" the lowest-numbered GPU of the map (the runtime's
// main device); nullopt when the map has no GPU.
std::optional<Device> ExecutesOn(const Device& device, const std::optional<Device>& main) {
  if (device.is_gpu()) return device;
  return main;
}

bool NoSplit(const ModelSpec& spec, const ModuleSpec& m) {
  return std::find(spec.no_split_classes.begin(), spec.no_split_classes.end(), m.class_name) !=
         spec.no_split_classes.end();
}

bool HasNoSplitInside(const ModelSpec& spec, const ModuleSpec& m) {
  for (const ModuleSpec& c : m.children) {
    if (NoSplit(spec, c) || HasNoSplitInside(spec, c)) return true;
  }
  return false;
}

// The module named `name` ("" is the root), or null.
const ModuleSpec* FindModule(const ModuleSpec& root, const std::string& name) {
  if (root.name == name) return &root;
  for (const ModuleSpec& c : root.children) {
    if (name == c.name || name.rfind(c.name + ".", 0) == 0) {
      if (const ModuleSpec* found = FindModule(c, name)) return found;
    }
  }
  return nullptr;
}

// The largest unit the runtime fetches at once inside `m`: a decoder layer, or a module that holds none (the
// embedding, the final norm, the head).
int64_t LargestUnit(const ModelSpec& spec, const internal::ModuleSizes& sizes, const ModuleSpec& m) {
  if (NoSplit(spec, m) || !HasNoSplitInside(spec, m)) return sizes.Of(m);
  int64_t largest = 0;
  for (const ModuleSpec& c : m.children) largest = std::max(largest, LargestUnit(spec, sizes, c));
  return largest;
}

}  // namespace

// LayerActivationBytesPerToken with the model's hidden size already found (RuntimeReserveBytes reads every layer).
int64_t LayerBytesPerToken(const ModelSpec& spec, const ModuleSpec& layer, int64_t hidden);

absl::StatusOr<RuntimeReserve> ParseRuntimeReserve(absl::string_view text) {
  RuntimeReserve reserve;
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "auto") {
    reserve.kind = RuntimeReserve::Kind::kAuto;
    return reserve;
  }
  if (lower == "none") return reserve;
  absl::StatusOr<int64_t> bytes = ParseMemorySize(text);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not auto, none or a size such as 2GiB (", bytes.status().message(), ")"));
  }
  if (*bytes < 0) return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is negative"));
  reserve.kind = RuntimeReserve::Kind::kFixed;
  reserve.bytes = *bytes;
  return reserve;
}

int64_t SamplerWorkBytes(int64_t rows, int64_t vocab, int64_t penalty_slots) {
  return Add(Add(Mul({rows, vocab, kSamplerBytesPerLogit}), Mul({vocab, kSamplerBytesPerVocab})),
             Mul({penalty_slots, vocab + 1, 5}));
}

int64_t ScoreWorkBytes(int64_t rows, int64_t vocab) { return Mul({rows, vocab, kScoreBytesPerLogit}); }

int64_t RuntimeReserveParts::total() const {
  return Add(Add(Add(Add(Add(workspaces, activations), attention), sampler), offload), fixed);
}

std::string RuntimeReserveParts::Describe() const {
  std::vector<std::string> parts;
  auto add = [&](const char* name, int64_t bytes) {
    if (bytes > 0) parts.push_back(absl::StrCat(name, " ", FormatBytes(static_cast<double>(bytes))));
  };
  add("workspaces", workspaces);
  add("activations", activations);
  add("attention", attention);
  add("sampler", sampler);
  add("offload", offload);
  add("fixed", fixed);
  return absl::StrCat(FormatBytes(static_cast<double>(total())), " (", absl::StrJoin(parts, ", "), ")");
}

int64_t LayerActivationBytesPerToken(const ModelSpec& spec, const ModuleSpec& layer) {
  return LayerBytesPerToken(spec, layer, VocabAndHidden(spec).second);
}

int64_t LayerBytesPerToken(const ModelSpec& spec, const ModuleSpec& layer, int64_t hidden) {
  int64_t linear_outs = 0, widest = 0, expert_widths = 0, experts = 0;
  Widths(layer, linear_outs, widest, expert_widths, experts);
  const int64_t element = DTypeSize(spec.dtype);
  // Residual and normed copy; every linear output, the widest once more (act(gate) before the product).
  int64_t bytes = (2 * hidden + linear_outs + widest) * element;
  bytes += 2 * hidden * 4;  // RMSNorm's float32 upcast of its input and output
  if (experts > 0) {
    int64_t top_k = experts;
    if (spec.decoder.ok() && spec.decoder->moe.top_k > 0) top_k = spec.decoder->moe.top_k;
    // Each routed copy of a token: its gathered input and output (H each), the experts' outputs and the
    // activation (gate_up 2I, act I): every 3-D parameter's out + in. Router: float32 logits and weights.
    bytes += top_k * expert_widths * element + 2 * experts * 4 + top_k * 16;
  }
  return bytes;
}

std::map<Device, RuntimeReserveParts> RuntimeReserveBytes(const ModelSpec& spec,
                                                          const std::vector<std::pair<std::string, Device>>& map,
                                                          const RuntimeReserve& reserve) {
  std::map<Device, RuntimeReserveParts> out;
  if (reserve.kind == RuntimeReserve::Kind::kNone || map.empty()) return out;
  std::optional<Device> main;
  for (const auto& [name, device] : map) {
    if (device.is_gpu() && (!main || device.index < main->index)) main = device;
  }
  if (!main) return out;
  DeviceMap sorted = map;
  internal::SortByDefinition(spec, sorted);
  // Streams: one per stage executing on the GPU, and the device's current stream (sampling, copies).
  std::map<Device, int64_t> streams;
  std::optional<Device> previous;
  int64_t stages = 0;
  for (const auto& [name, device] : sorted) {
    const Device runs = *ExecutesOn(device, main);
    if (!previous || !(*previous == runs)) {
      ++streams[runs];
      ++stages;
    }
    previous = runs;
  }
  if (reserve.kind == RuntimeReserve::Kind::kFixed) {
    for (const auto& [device, n] : streams) out[device].fixed = reserve.bytes;
    return out;
  }
  const ServingLimits& limits = reserve.limits;
  const int64_t element = DTypeSize(spec.dtype);
  const int64_t tokens =
      limits.max_batch_tokens > 0 ? limits.max_batch_tokens : Mul({limits.max_batch, limits.max_context});
  const int64_t rows = std::min(limits.max_batch, tokens);
  const auto [vocab, hidden] = VocabAndHidden(spec);
  const int64_t kv_width = spec.num_key_value_heads * spec.head_dim;
  const int64_t heads =
      spec.head_dim > 0 ? std::max(spec.num_key_value_heads, (hidden + spec.head_dim - 1) / spec.head_dim) : 0;

  for (const auto& [device, n] : streams) {
    RuntimeReserveParts& parts = out[device];
    parts.workspaces = Mul({n + 1, kWorkspaceBytesPerStream});
    // Activations held between stages: each micro-batch in flight, its input and its output.
    // Micro-batches in flight: as many as asked, 0 meaning one per stage (the server's default).
    const int64_t in_flight = limits.micro_batches > 0 ? limits.micro_batches : stages;
    if (stages > 1) parts.activations = Mul({2, in_flight, tokens, hidden, element});
  }
  internal::DeviceResolver resolver(map);
  std::map<Device, int64_t> widest_layer;
  std::set<Device> attends;
  for (const ModuleSpec* layer : NoSplitModules(spec)) {
    std::optional<std::pair<std::string, Device>> entry = resolver.Find(layer->name);
    if (!entry) continue;
    const Device runs = *ExecutesOn(entry->second, main);
    widest_layer[runs] = std::max(widest_layer[runs], LayerBytesPerToken(spec, *layer, hidden));
    attends.insert(runs);
  }
  for (const auto& [device, per_token] : widest_layer) {
    out[device].activations = Add(out[device].activations, Mul({tokens, per_token}));
  }
  for (const Device& device : attends) {
    if (kv_width == 0) continue;
    // The largest attention group: every running sequence decoding against its whole context (keys and values
    // gathered from the pool, expanded to the query heads where SDPA's math path repeats them), and the
    // micro-batch's tokens against max_context keys: the mask (bool and its additive float form) and the
    // math path's float32 scores and probabilities.
    const int64_t gathered = Mul({2, rows, limits.max_context, heads, spec.head_dim, element});
    const int64_t scores = Mul({tokens, limits.max_context, 1 + element + 2 * heads * 4});
    out[device].attention = Add(gathered, scores);
  }
  // The logits: the lm_head's output rows (every token of a chunk when prompt log-probabilities may be asked),
  // the sampler's float32 work over the sampling rows, or the scores' over the chunk, and the penalty tables.
  std::optional<std::pair<std::string, Device>> last = sorted.empty() ? std::nullopt : std::optional(sorted.back());
  if (last && vocab > 0) {
    const Device runs = *ExecutesOn(last->second, main);
    const int64_t logit_rows = limits.prompt_logprobs ? tokens : rows;
    int64_t work = SamplerWorkBytes(rows, vocab, limits.max_batch + 1);
    if (limits.prompt_logprobs) work = std::max(work, ScoreWorkBytes(tokens, vocab));
    out[runs].sampler = Add(Mul({logit_rows, vocab, element}), work);
  }
  // Offloaded entries: their stages on the main GPU and the largest unit (a decoder layer, or a module outside them).
  const internal::ModuleSizes sizes(spec);
  int64_t offload_stages = 0, largest_unit = 0;
  std::optional<Device> before;
  for (const auto& [name, device] : sorted) {
    if (!device.is_gpu() && !(before && *before == device)) ++offload_stages;
    before = device;
    if (!device.is_gpu()) {
      if (const ModuleSpec* module = FindModule(spec.root, name)) {
        largest_unit = std::max(largest_unit, LargestUnit(spec, sizes, *module));
      }
    }
  }
  if (offload_stages > 0) out[*main].offload = Mul({2 * offload_stages - 1, largest_unit});
  for (int gpu : reserve.runs_on_cpu) out.erase(Device::Gpu(gpu));
  return out;
}

}  // namespace strata::planner
