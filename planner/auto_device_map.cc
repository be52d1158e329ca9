#include "planner/auto_device_map.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::planner::internal {
namespace {

// An item of infer_auto_device_map's `modules_to_treat`: a module, or a parameter or buffer that a
// split exposed. Exactly one of the pointers is set. A module's full name is its spec's; only
// tensors, rarely split out, carry a name of their own.
struct Item {
  const ModuleSpec* module = nullptr;
  const TensorSpec* tensor = nullptr;
  const std::string* name = nullptr;  // the module's own name, or a tensor name kept in a NameArena

  static Item Of(const ModuleSpec& m) { return {&m, nullptr, &m.name}; }
  int64_t size(const ModuleSizes& sizes) const { return module != nullptr ? sizes.Of(*module) : sizes.Of(*tensor); }
};

// Full names of the tensors splits expose, at stable addresses for the whole placement.
using NameArena = std::deque<std::string>;

Item TensorItem(const ModuleSpec& owner, const TensorSpec& t, NameArena& arena) {
  arena.push_back(owner.ChildName(t.name));
  return {nullptr, &t, &arena.back()};
}

// "`prefix`." starts `name`, without building the string.
bool IsUnder(absl::string_view name, absl::string_view prefix) {
  return name.size() > prefix.size() && name[prefix.size()] == '.' && absl::StartsWith(name, prefix);
}

bool IsNoSplit(const ModelSpec& spec, const ModuleSpec& module) {
  return std::find(spec.no_split_classes.begin(), spec.no_split_classes.end(), module.class_name) !=
         spec.no_split_classes.end();
}

// What a split puts in the module's place: its direct parameters, then its children. Buffers are not
// listed (upstream uses named_parameters(recurse=False) + named_children()).
std::vector<Item> SplitItems(const ModuleSpec& module, NameArena& arena) {
  std::vector<Item> items;
  items.reserve(module.parameters.size() + module.children.size());
  for (const TensorSpec& p : module.parameters) items.push_back(TensorItem(module, p, arena));
  for (const ModuleSpec& c : module.children) items.push_back(Item::Of(c));
  return items;
}

// get_max_layer_size: the largest "layer" among `items`, a layer being a module without children or
// of a no-split class (or a bare tensor); returns its size and every name that reaches it (as
// pointers to names that outlive the call: module specs' names, or the items' tensor names).
template <typename Range>
std::pair<int64_t, std::vector<const std::string*>> MaxLayerSize(const ModelSpec& spec, const ModuleSizes& sizes,
                                                                 const Range& items, bool modules_only) {
  int64_t max_size = 0;
  std::vector<const std::string*> names;
  auto consider = [&](int64_t size, const std::string* name) {
    if (size > max_size) {
      max_size = size;
      names.assign(1, name);
    } else if (size == max_size) {
      names.push_back(name);
    }
  };
  // Depth-first in list order, like the upstream worklist that prepends children.
  std::vector<const ModuleSpec*> work;
  for (const Item& item : items) {
    if (item.module == nullptr) {
      if (!modules_only) consider(sizes.Of(*item.tensor), item.name);
      continue;
    }
    work.push_back(item.module);
    while (!work.empty()) {
      const ModuleSpec* m = work.back();
      work.pop_back();
      if (!m->children.empty() && !IsNoSplit(spec, *m)) {
        for (auto c = m->children.rbegin(); c != m->children.rend(); ++c) work.push_back(&*c);
        continue;
      }
      consider(sizes.Of(*m), &m->name);
    }
  }
  return {max_size, std::move(names)};
}

// Upstream tests membership with substring search on dotted names ("name." in "param."), not a
// prefix test; reproduced as is.
bool InModule(absl::string_view param, absl::string_view name) {
  // (name + ".") occurs in (param + "."): an occurrence of name followed by "." or by the end.
  for (size_t at = param.find(name); at != absl::string_view::npos; at = param.find(name, at + 1)) {
    size_t after = at + name.size();
    if (after == param.size() || param[after] == '.') return true;
  }
  return false;
}

// clean_device_map: wherever every entry under a module is on one device (and there are several),
// replace them by the module itself. Content does not depend on the order modules are visited.
void Clean(std::map<std::string, Device>& map, const std::string& module_name) {
  const std::string prefix = module_name.empty() ? "" : module_name + ".";
  auto begin = map.lower_bound(prefix);
  auto end = begin;
  size_t count = 0;
  bool same = true;
  for (; end != map.end() && absl::StartsWith(end->first, prefix); ++end, ++count) {
    if (!(end->second == begin->second)) same = false;
  }
  if (count > 1 && same) {
    Device device = begin->second;
    map.erase(begin, end);
    map[module_name] = device;
    return;  // nothing is left under the module
  }
  std::set<std::string> children;
  for (auto it = begin; it != end; ++it) {
    if (it->first.size() <= module_name.size()) continue;
    size_t dot = it->first.find('.', prefix.size());
    children.insert(it->first.substr(0, dot));
  }
  for (const std::string& child : children) Clean(map, child);
}

}  // namespace

namespace {

// The tensor a full name designates, walking the tree by dotted components; null if none.
const TensorSpec* FindTensor(const ModuleSpec& root, absl::string_view name) {
  const ModuleSpec* module = &root;
  while (true) {
    size_t dot = name.find('.');
    absl::string_view head = name.substr(0, dot);
    if (dot == absl::string_view::npos) {
      for (const TensorSpec& p : module->parameters)
        if (p.name == head) return &p;
      for (const TensorSpec& b : module->buffers)
        if (b.name == head) return &b;
      return nullptr;
    }
    const ModuleSpec* next = nullptr;
    const size_t prefix = module->name.empty() ? 0 : module->name.size() + 1;
    for (const ModuleSpec& c : module->children) {
      if (absl::string_view(c.name).substr(prefix) == head) {
        next = &c;
        break;
      }
    }
    if (next == nullptr) return nullptr;
    module = next;
    name.remove_prefix(dot + 1);
  }
}

}  // namespace

ModuleSizes::ModuleSizes(const ModelSpec& spec) {
  for (const auto& [key, target] : spec.tied_weights) {
    if (const TensorSpec* t = FindTensor(spec.root, key)) tied_[t] = true;
  }
  total_ = Add(spec.root);
}

int64_t ModuleSizes::Add(const ModuleSpec& module) {
  int64_t own = 0;
  for (const TensorSpec& p : module.parameters) own += Of(p);
  for (const TensorSpec& b : module.buffers) own += Of(b);
  // Upstream's "leaves" are the owners of tensors whose names have a dot (the root's own tensors are
  // not leaves).
  if (!module.name.empty()) biggest_leaf_ = std::max(biggest_leaf_, own);
  int64_t total = own;
  for (const ModuleSpec& child : module.children) total += Add(child);
  module_sizes_[&module] = total;
  return total;
}

int64_t ModuleSizes::Of(const ModuleSpec& module) const {
  auto it = module_sizes_.find(&module);
  return it == module_sizes_.end() ? 0 : it->second;
}

int64_t ModuleSizes::Of(const TensorSpec& tensor) const { return tied_.count(&tensor) ? 0 : tensor.bytes(); }

absl::StatusOr<MaxMemory> BalancedMaxMemory(const ModelSpec& spec, const ModuleSizes& sizes, MaxMemory max_memory,
                                            bool low_zero, std::vector<std::string>* trace) {
  auto budget_of = [&](int gpu) -> double* {
    for (DeviceBudget& b : max_memory)
      if (b.device == Device::Gpu(gpu)) return &b.bytes;
    return nullptr;
  };
  std::vector<int> gpus;  // GPUs with memory, sorted (max_memory is sorted)
  for (const DeviceBudget& b : max_memory)
    if (b.device.is_gpu() && b.bytes > 0) gpus.push_back(b.device.index);
  const int num_devices = static_cast<int>(gpus.size());
  if (num_devices == 0) return max_memory;
  if (num_devices == 1) low_zero = false;  // nothing to keep GPU 0 light for

  const int64_t total = sizes.total();
  int64_t per_gpu = total / (low_zero ? num_devices - 1 : num_devices);

  // Each GPU also gets room for the largest unsplittable block (or the largest leaf, usually the
  // embedding), times 1.25, so that the fill does not spill the last layers to the CPU.
  int64_t biggest_no_split = 0;
  if (!spec.no_split_classes.empty()) {
    bool found = false;
    std::vector<const ModuleSpec*> stack = {&spec.root};
    while (!stack.empty()) {
      const ModuleSpec* m = stack.back();
      stack.pop_back();
      if (IsNoSplit(spec, *m)) {
        found = true;
        biggest_no_split = std::max(biggest_no_split, sizes.Of(*m));
      }
      for (const ModuleSpec& c : m->children) stack.push_back(&c);
    }
    if (!found) {
      // Upstream takes max() of an empty sequence here and fails.
      return absl::InvalidArgumentError(absl::StrCat("no module has a no-split class (",
                                                     absl::StrJoin(spec.no_split_classes, ", "),
                                                     "): cannot balance GPU memory"));
    }
  }
  const int64_t buffer =
      static_cast<int64_t>(1.25 * static_cast<double>(std::max(biggest_no_split, sizes.biggest_leaf())));
  per_gpu += buffer;

  // Every GPU but the last is capped at per_gpu; the last keeps its full budget in case the buffer
  // was not enough.
  for (size_t i = 0; i + 1 < gpus.size(); ++i) {
    double* budget = budget_of(gpus[i]);
    if (!(low_zero && gpus[i] == 0)) *budget = std::min(static_cast<double>(per_gpu), *budget);
  }
  if (trace) {
    trace->push_back(absl::StrCat("balance: model ", FormatBytes(total), " over ", num_devices,
                                  low_zero ? " GPUs, GPU 0 kept low" : " GPUs", "; per-GPU share ",
                                  FormatBytes(per_gpu - buffer), " + buffer ", FormatBytes(buffer),
                                  " (1.25 x largest no-split block or leaf)"));
  }
  if (low_zero) {
    // GPU 0 gets only what GPUs 1..n-1 cannot hold (upstream indexes GPUs 0..n-1 by number).
    double others = 0;
    for (int i = 1; i < num_devices; ++i) {
      double* budget = budget_of(i);
      if (budget == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("balanced_low_0: max_memory must list GPUs 0..", num_devices - 1,
                                                       " (GPU ", i, " is missing)"));
      }
      others += *budget;
    }
    double* zero = budget_of(0);
    if (zero == nullptr) return absl::InvalidArgumentError("balanced_low_0: max_memory does not list GPU 0");
    double min_zero = std::max(0.0, static_cast<double>(total) - others);
    *zero = std::min(min_zero, *zero);
    if (trace) {
      trace->push_back(absl::StrCat("balance: GPU 0 budget ", FormatBytes(*zero),
                                    " (what GPUs 1.. cannot hold, for batching and sampling buffers)"));
    }
  }
  return max_memory;
}

namespace {

// The devices infer_auto_device_map fills, in order, with their budgets: max_memory's, then an
// unlimited "disk" unless max_memory lists it.
struct FillOrder {
  std::vector<Device> devices;
  std::vector<double> budgets;
  // Devices that keep room to bring back the largest offloaded layer: the first GPU and the CPU.
  std::vector<Device> main_devices;

  bool IsMain(const Device& d) const {
    return std::find(main_devices.begin(), main_devices.end(), d) != main_devices.end();
  }
};

FillOrder MakeFillOrder(const MaxMemory& max_memory) {
  FillOrder order;
  for (const DeviceBudget& b : max_memory) {
    order.devices.push_back(b.device);
    order.budgets.push_back(b.bytes);
  }
  if (std::find(order.devices.begin(), order.devices.end(), Device::Disk()) == order.devices.end()) {
    order.devices.push_back(Device::Disk());
    order.budgets.push_back(std::numeric_limits<double>::infinity());
  }
  for (const Device& d : order.devices) {
    if (d.is_gpu()) {
      order.main_devices.push_back(d);
      break;
    }
  }
  order.main_devices.push_back(Device::Cpu());
  return order;
}

using TiedGroups = std::vector<std::vector<std::string>>;

// Tied groups as upstream forms them: for each shared target, the sorted list of its aliases and
// itself.
TiedGroups MakeTiedGroups(const ModelSpec& spec) {
  std::map<std::string, std::vector<std::string>> groups_by_target;
  for (const auto& [key, target] : spec.tied_weights) groups_by_target[target].push_back(key);
  TiedGroups tied_groups;
  for (auto& [target, keys] : groups_by_target) {
    keys.push_back(target);
    std::sort(keys.begin(), keys.end());
    tied_groups.push_back(keys);
  }
  return tied_groups;
}

// The tied parameters outside the item `name` whose partner is inside it, as pointers into
// `tied_groups`.
std::vector<const std::string*> TiedOutside(const TiedGroups& tied_groups, const std::string& name) {
  std::vector<const std::string*> tied_params;
  for (const auto& group : tied_groups) {
    bool any = false, all = true;
    for (const std::string& k : group) {
      const bool inside = InModule(k, name);
      any = any || inside;
      all = all && inside;
    }
    if (!any || all) continue;
    for (const std::string& k : group)
      if (!InModule(k, name)) tied_params.push_back(&k);
  }
  return tied_params;
}

// The item at the front of the queue, weighed against the current device.
struct Attempt {
  Item item;
  int64_t module_size = 0;
  std::vector<const std::string*> tied_params;
  std::vector<Item> tied_items;  // the queued items that hold tied_params
  int64_t size_with_ties = 0;    // module_size plus the tied items' sizes
  Device device;
  bool unlimited = false;  // the device is the disk
  double current_max = 0;  // the device's budget less the reserve
  int64_t reserved = 0;    // the reserve kept for the largest layer on a main device
  double free = 0;         // current_max less what the device already holds
};

// infer_auto_device_map's loop and its state: the items still to place (modules_to_treat), what is
// placed where, how full each device is, and the largest layer still to place.
class AutoPlacement {
 public:
  AutoPlacement(const ModelSpec& spec, const ModuleSizes& sizes, const MaxMemory& max_memory,
                std::vector<std::string>* trace);

  // Places every item, one turn per item at the front of the queue.
  absl::Status Run() {
    while (!todo_.empty()) {
      if (absl::Status status = PlaceFront(); !status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // The placement through clean_device_map, in definition order.
  DeviceMap Result() const;

 private:
  absl::Status PlaceFront();
  absl::StatusOr<Attempt> Weigh(const Item& item) const;
  void Assign(const Attempt& a);
  bool SplitTiedPartner(const Attempt& a);
  bool SplitItem(const Attempt& a);
  absl::Status NextDevice(const Attempt& a);

  void RescanMaxLayer() {
    std::tie(max_layer_size_, max_layer_names_) = MaxLayerSize(spec_, sizes_, todo_, /*modules_only=*/true);
  }
  std::deque<Item>::iterator Queued(absl::string_view queued_name) {
    return std::find_if(todo_.begin(), todo_.end(), [&](const Item& q) { return *q.name == queued_name; });
  }

  const ModelSpec& spec_;
  const ModuleSizes& sizes_;
  std::vector<std::string>* trace_;
  const FillOrder order_;
  const TiedGroups tied_groups_;
  NameArena arena_;
  std::deque<Item> todo_;
  std::vector<std::pair<const std::string*, Device>> assigned_;
  std::vector<int64_t> used_;
  size_t current_ = 0;
  int64_t max_layer_size_ = 0;
  std::vector<const std::string*> max_layer_names_;
};

AutoPlacement::AutoPlacement(const ModelSpec& spec, const ModuleSizes& sizes, const MaxMemory& max_memory,
                             std::vector<std::string>* trace)
    : spec_(spec),
      sizes_(sizes),
      trace_(trace),
      order_(MakeFillOrder(max_memory)),
      tied_groups_(MakeTiedGroups(spec)),
      used_(order_.devices.size(), 0) {
  const ModuleSpec& root = spec.root;
  for (const TensorSpec& p : root.parameters) todo_.push_back(TensorItem(root, p, arena_));
  for (const ModuleSpec& c : root.children) todo_.push_back(Item::Of(c));
  for (const TensorSpec& b : root.buffers) todo_.push_back(TensorItem(root, b, arena_));
  std::tie(max_layer_size_, max_layer_names_) = MaxLayerSize(spec, sizes, todo_, /*modules_only=*/false);
}

// One turn: the front item goes to the current device (with its tied partners), or is split (or a
// partner is), or the device is full and the item waits for the next one.
absl::Status AutoPlacement::PlaceFront() {
  const Item item = todo_.front();
  todo_.pop_front();
  const std::string& name = *item.name;
  // The largest remaining layer may have been this one: if none of its holders remain, rescan.
  std::erase_if(max_layer_names_, [&](const std::string* n) { return *n == name || IsUnder(*n, name); });
  if (max_layer_names_.empty()) RescanMaxLayer();

  absl::StatusOr<Attempt> attempt = Weigh(item);
  if (!attempt.ok()) return attempt.status();
  const Attempt& a = *attempt;
  if (a.unlimited || static_cast<double>(used_[current_] + a.size_with_ties) <= a.current_max) {
    Assign(a);
    return absl::OkStatus();
  }
  // The item fits without its tied partners: try to split a partner instead of moving on.
  if (!a.tied_params.empty() && static_cast<double>(used_[current_] + a.module_size) <= a.current_max &&
      SplitTiedPartner(a)) {
    return absl::OkStatus();
  }
  if (SplitItem(a)) return absl::OkStatus();
  return NextDevice(a);
}

// The item's size, with its tied partners, against the current device's room.
absl::StatusOr<Attempt> AutoPlacement::Weigh(const Item& item) const {
  Attempt a;
  a.item = item;
  const std::string& name = *item.name;
  a.module_size = item.size(sizes_);
  // Tied parameters outside this item whose partner is inside it must land on the same device.
  a.tied_params = TiedOutside(tied_groups_, name);

  a.device = order_.devices[current_];
  a.unlimited = a.device.kind == Device::Kind::kDisk;
  a.current_max = order_.budgets[current_];
  if (order_.IsMain(a.device)) {
    a.current_max -= static_cast<double>(max_layer_size_);
    a.reserved = max_layer_size_;
  }

  // get_module_size_with_ties: add the queued modules that hold the tied parameters.
  a.size_with_ties = a.module_size;
  for (const std::string* param : a.tied_params) {
    auto holder = std::find_if(todo_.begin(), todo_.end(), [&](const Item& q) { return IsUnder(*param, *q.name); });
    if (holder == todo_.end()) {
      return absl::InternalError(
          absl::StrCat("tied parameter ", *param, " (tied to ", name, ") belongs to no module still to place"));
    }
    if (std::none_of(a.tied_items.begin(), a.tied_items.end(),
                     [&](const Item& t) { return *t.name == *holder->name; })) {
      a.tied_items.push_back(*holder);
      a.size_with_ties += holder->size(sizes_);
    }
  }
  a.free = a.current_max - static_cast<double>(used_[current_]);
  return a;
}

// The item and its tied partners fit: all of them go to the current device.
void AutoPlacement::Assign(const Attempt& a) {
  const std::string& name = *a.item.name;
  used_[current_] += a.size_with_ties;
  assigned_.push_back({a.item.name, a.device});
  if (trace_) {
    std::string line = absl::StrCat(name, " -> ", a.device.ToString(), ": fits (", FormatBytes(a.module_size));
    if (!a.tied_items.empty()) {
      std::vector<std::string> names;
      for (const Item& t : a.tied_items) names.push_back(*t.name);
      absl::StrAppend(&line, " with tied ", absl::StrJoin(names, ", "));
    }
    if (!a.unlimited) absl::StrAppend(&line, ", ", FormatBytes(std::max(0.0, a.free)), " free");
    if (a.reserved > 0) absl::StrAppend(&line, " after reserving ", FormatBytes(a.reserved), " for the largest layer");
    trace_->push_back(line + ")");
  }
  for (const Item& tied : a.tied_items) {
    if (auto it = Queued(*tied.name); it != todo_.end()) todo_.erase(it);
    assigned_.push_back({tied.name, a.device});
    if (trace_) trace_->push_back(absl::StrCat(*tied.name, " -> ", a.device.ToString(), ": tied to ", name));
  }
}

// Splits the first tied partner that can be split, in its place in the queue, and puts the item back
// in front. False if none can.
bool AutoPlacement::SplitTiedPartner(const Attempt& a) {
  for (const Item& tied : a.tied_items) {
    const ModuleSpec* tied_module = tied.module;
    if (tied_module == nullptr || tied_module->children.empty() || IsNoSplit(spec_, *tied_module)) continue;
    std::vector<Item> parts = SplitItems(*tied_module, arena_);
    auto it = todo_.erase(Queued(*tied.name));
    todo_.insert(it, parts.begin(), parts.end());
    todo_.push_front(a.item);
    RescanMaxLayer();
    if (trace_) trace_->push_back(absl::StrCat("split ", *tied.name, ": its tie to ", *a.item.name, " does not fit"));
    return true;
  }
  return false;
}

// Split the item into its parameters and children, unless it is a leaf or of a no-split class.
bool AutoPlacement::SplitItem(const Attempt& a) {
  const Item& item = a.item;
  if (item.module == nullptr || item.module->children.empty() || IsNoSplit(spec_, *item.module)) return false;
  std::vector<Item> parts = SplitItems(*item.module, arena_);
  todo_.insert(todo_.begin(), parts.begin(), parts.end());
  RescanMaxLayer();
  if (trace_) {
    trace_->push_back(absl::StrCat("split ", *item.name, ": ", FormatBytes(a.size_with_ties), " does not fit in the ",
                                   FormatBytes(std::max(0.0, a.free)), " left on ", a.device.ToString()));
  }
  return true;
}

// Neither it nor its partners can be split: the device is full, go to the next one. The reserve
// kept for the largest layer counts as used.
absl::Status AutoPlacement::NextDevice(const Attempt& a) {
  const Item& item = a.item;
  const std::string& name = *item.name;
  if (trace_) {
    trace_->push_back(absl::StrCat("next device after ", a.device.ToString(), ": ", name, " (",
                                   FormatBytes(a.size_with_ties),
                                   item.module != nullptr && IsNoSplit(spec_, *item.module)
                                       ? absl::StrCat(", no-split class ", item.module->class_name)
                                       : std::string(", cannot be split"),
                                   ") does not fit in ", FormatBytes(std::max(0.0, a.free))));
  }
  used_[current_] += a.reserved;
  ++current_;
  if (current_ >= order_.devices.size()) return absl::InternalError(absl::StrCat("no device left for ", name));
  todo_.push_front(item);
  return absl::OkStatus();
}

DeviceMap AutoPlacement::Result() const {
  std::map<std::string, Device> cleaned;
  for (const auto& [name, device] : assigned_) cleaned.emplace(*name, device);
  Clean(cleaned, "");
  DeviceMap result(cleaned.begin(), cleaned.end());
  SortByDefinition(spec_, result);
  return result;
}

}  // namespace

absl::StatusOr<DeviceMap> InferAutoDeviceMap(const ModelSpec& spec, const ModuleSizes& sizes,
                                             const MaxMemory& max_memory, std::vector<std::string>* trace) {
  AutoPlacement placement(spec, sizes, max_memory, trace);
  if (absl::Status status = placement.Run(); !status.ok()) return status;
  return placement.Result();
}

namespace {

// Where a name sits in definition order, as the indices of its components: a module's parameters
// come first, then its children, then its buffers. Comparing paths lexicographically orders a
// module before everything inside it. Empty optional: the model has no such name.
std::optional<std::vector<int>> DefinitionPath(const ModuleSpec& root, absl::string_view name) {
  std::vector<int> path;
  const ModuleSpec* module = &root;
  while (!name.empty()) {
    size_t dot = name.find('.');
    absl::string_view head = name.substr(0, dot);
    const int params = static_cast<int>(module->parameters.size());
    const int children = static_cast<int>(module->children.size());
    const size_t prefix = module->name.empty() ? 0 : module->name.size() + 1;
    int found = -1;
    const ModuleSpec* next = nullptr;
    for (int c = 0; c < children && found < 0; ++c) {
      if (absl::string_view(module->children[c].name).substr(prefix) == head) {
        found = params + c;
        next = &module->children[c];
      }
    }
    for (int p = 0; p < params && found < 0; ++p)
      if (module->parameters[p].name == head) found = p;
    for (int b = 0; b < static_cast<int>(module->buffers.size()) && found < 0; ++b)
      if (module->buffers[b].name == head) found = params + children + b;
    if (found < 0) return std::nullopt;
    path.push_back(found);
    if (dot == absl::string_view::npos) break;
    if (next == nullptr) return std::nullopt;  // a tensor has nothing inside it
    module = next;
    name.remove_prefix(dot + 1);
  }
  return path;
}

}  // namespace

void SortByDefinition(const ModelSpec& spec, DeviceMap& map) {
  // Sort keys: {0, path...} for names of the model, {1} for the rest, which keep their order.
  std::vector<std::pair<std::vector<int>, size_t>> keys;
  keys.reserve(map.size());
  for (size_t i = 0; i < map.size(); ++i) {
    std::vector<int> key = {1};
    if (std::optional<std::vector<int>> path = DefinitionPath(spec.root, map[i].first)) {
      key = {0};
      key.insert(key.end(), path->begin(), path->end());
    }
    keys.push_back({std::move(key), i});
  }
  std::stable_sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  DeviceMap sorted;
  sorted.reserve(map.size());
  for (const auto& key : keys) sorted.push_back(std::move(map[key.second]));
  map = std::move(sorted);
}

}  // namespace strata::planner::internal
