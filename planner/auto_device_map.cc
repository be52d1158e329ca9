#include "planner/auto_device_map.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::planner::internal {
namespace {

std::string Join(absl::string_view prefix, absl::string_view local) {
  return prefix.empty() ? std::string(local) : absl::StrCat(prefix, ".", local);
}

// An item of infer_auto_device_map's `modules_to_treat`: a module, or a parameter or buffer that a
// split exposed. Exactly one of the pointers is set.
struct Item {
  std::string name;
  const ModuleSpec* module = nullptr;
  const TensorSpec* tensor = nullptr;
};

bool IsNoSplit(const ModelSpec& spec, const ModuleSpec& module) {
  return std::find(spec.no_split_classes.begin(), spec.no_split_classes.end(), module.class_name) !=
         spec.no_split_classes.end();
}

// What a split puts in the module's place: its direct parameters, then its children. Buffers are not
// listed (upstream uses named_parameters(recurse=False) + named_children()).
std::vector<Item> SplitItems(const std::string& name, const ModuleSpec& module) {
  std::vector<Item> items;
  items.reserve(module.parameters.size() + module.children.size());
  for (const TensorSpec& p : module.parameters) items.push_back({Join(name, p.name), nullptr, &p});
  for (const ModuleSpec& c : module.children) items.push_back({c.name, &c, nullptr});
  return items;
}

// get_max_layer_size: the largest "layer" among `items`, a layer being a module without children or
// of a no-split class (or a bare tensor); returns its size and every name that reaches it.
template <typename Range>
std::pair<int64_t, std::vector<std::string>> MaxLayerSize(const ModelSpec& spec, const ModuleSizes& sizes,
                                                          const Range& items, bool modules_only) {
  int64_t max_size = 0;
  std::vector<std::string> names;
  std::deque<Item> expanded;  // children of split modules, kept alive while scanned
  // Depth-first in list order, like the upstream worklist that prepends children.
  std::vector<const Item*> work;
  for (auto it = items.rbegin(); it != items.rend(); ++it) {
    if (modules_only && it->module == nullptr) continue;
    work.push_back(&*it);
  }
  while (!work.empty()) {
    const Item* item = work.back();
    work.pop_back();
    if (item->module != nullptr && !item->module->children.empty() && !IsNoSplit(spec, *item->module)) {
      const auto& children = item->module->children;
      for (auto c = children.rbegin(); c != children.rend(); ++c) {
        expanded.push_back({c->name, &*c, nullptr});
        work.push_back(&expanded.back());
      }
      continue;
    }
    int64_t size = sizes.Of(item->name);
    if (size > max_size) {
      max_size = size;
      names.assign(1, item->name);
    } else if (size == max_size) {
      names.push_back(item->name);
    }
  }
  return {max_size, std::move(names)};
}

// Upstream tests membership with substring search on dotted names ("name." in "param."), not a
// prefix test; reproduced as is.
bool InModule(absl::string_view param, absl::string_view name) {
  return absl::StrContains(absl::StrCat(param, "."), absl::StrCat(name, "."));
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

ModuleSizes::ModuleSizes(const ModelSpec& spec) { Add(spec.root, spec); }

int64_t ModuleSizes::Add(const ModuleSpec& module, const ModelSpec& spec) {
  int64_t own = 0;
  auto add_tensor = [&](const TensorSpec& t) {
    std::string full = module.ChildName(t.name);
    if (spec.tied_weights.count(full)) return;
    own += t.bytes();
    sizes_[full] += t.bytes();
  };
  for (const TensorSpec& p : module.parameters) add_tensor(p);
  for (const TensorSpec& b : module.buffers) add_tensor(b);
  // Upstream's "leaves" are the owners of tensors whose names have a dot (the root's own tensors are
  // not leaves).
  if (!module.name.empty()) biggest_leaf_ = std::max(biggest_leaf_, own);
  int64_t total = own;
  for (const ModuleSpec& child : module.children) total += Add(child, spec);
  sizes_[module.name] += total;
  return total;
}

int64_t ModuleSizes::Of(absl::string_view name) const {
  auto it = sizes_.find(std::string(name));
  return it == sizes_.end() ? 0 : it->second;
}

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
        biggest_no_split = std::max(biggest_no_split, sizes.Of(m->name));
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
        return absl::InvalidArgumentError(absl::StrCat(
            "balanced_low_0: max_memory must list GPUs 0..", num_devices - 1, " (GPU ", i, " is missing)"));
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

absl::StatusOr<DeviceMap> InferAutoDeviceMap(const ModelSpec& spec, const ModuleSizes& sizes,
                                             const MaxMemory& max_memory, std::vector<std::string>* trace) {
  std::vector<Device> devices;
  std::vector<double> budgets;
  for (const DeviceBudget& b : max_memory) {
    devices.push_back(b.device);
    budgets.push_back(b.bytes);
  }
  if (std::find(devices.begin(), devices.end(), Device::Disk()) == devices.end()) {
    devices.push_back(Device::Disk());
    budgets.push_back(std::numeric_limits<double>::infinity());
  }
  // Devices that keep room to bring back the largest offloaded layer: the first GPU and the CPU.
  std::vector<Device> main_devices;
  for (const Device& d : devices) {
    if (d.is_gpu()) {
      main_devices.push_back(d);
      break;
    }
  }
  main_devices.push_back(Device::Cpu());
  auto is_main = [&](const Device& d) {
    return std::find(main_devices.begin(), main_devices.end(), d) != main_devices.end();
  };

  // Tied groups as upstream forms them: for each shared target, the sorted list of its aliases and
  // itself.
  std::map<std::string, std::vector<std::string>> groups_by_target;
  for (const auto& [key, target] : spec.tied_weights) groups_by_target[target].push_back(key);
  std::vector<std::vector<std::string>> tied_groups;
  for (auto& [target, keys] : groups_by_target) {
    keys.push_back(target);
    std::sort(keys.begin(), keys.end());
    tied_groups.push_back(keys);
  }

  std::deque<Item> todo;
  const ModuleSpec& root = spec.root;
  for (const TensorSpec& p : root.parameters) todo.push_back({p.name, nullptr, &p});
  for (const ModuleSpec& c : root.children) todo.push_back({c.name, &c, nullptr});
  for (const TensorSpec& b : root.buffers) todo.push_back({b.name, nullptr, &b});

  std::vector<std::pair<std::string, Device>> assigned;
  std::vector<int64_t> used(devices.size(), 0);
  size_t current = 0;
  auto [max_layer_size, max_layer_names] = MaxLayerSize(spec, sizes, todo, /*modules_only=*/false);

  while (!todo.empty()) {
    Item item = std::move(todo.front());
    todo.pop_front();
    const std::string& name = item.name;
    // The largest remaining layer may have been this one: if none of its holders remain, rescan.
    std::erase_if(max_layer_names, [&](const std::string& n) {
      return n == name || absl::StartsWith(n, absl::StrCat(name, "."));
    });
    if (max_layer_names.empty()) {
      std::tie(max_layer_size, max_layer_names) = MaxLayerSize(spec, sizes, todo, /*modules_only=*/true);
    }
    const int64_t module_size = sizes.Of(name);

    // Tied parameters outside this item whose partner is inside it must land on the same device.
    std::vector<std::string> tied_params;
    for (const auto& group : tied_groups) {
      bool any = false, all = true;
      for (const std::string& k : group) {
        const bool inside = InModule(k, name);
        any = any || inside;
        all = all && inside;
      }
      if (!any || all) continue;
      for (const std::string& k : group)
        if (!InModule(k, name)) tied_params.push_back(k);
    }

    const Device device = devices[current];
    const bool unlimited = device.kind == Device::Kind::kDisk;
    double current_max = budgets[current];
    int64_t reserved = 0;
    if (is_main(device)) {
      current_max -= static_cast<double>(max_layer_size);
      reserved = max_layer_size;
    }

    // get_module_size_with_ties: add the queued modules that hold the tied parameters.
    int64_t size_with_ties = module_size;
    std::vector<std::string> tied_names;
    std::vector<const Item*> tied_items;
    for (const std::string& param : tied_params) {
      auto holder = std::find_if(todo.begin(), todo.end(), [&](const Item& queued) {
        return absl::StartsWith(param, absl::StrCat(queued.name, "."));
      });
      if (holder == todo.end()) {
        return absl::InternalError(absl::StrCat("tied parameter ", param, " (tied to ", name,
                                                ") belongs to no module still to place"));
      }
      if (std::find(tied_names.begin(), tied_names.end(), holder->name) == tied_names.end()) {
        tied_names.push_back(holder->name);
        tied_items.push_back(&*holder);
        size_with_ties += sizes.Of(holder->name);
      }
    }

    const double free = current_max - static_cast<double>(used[current]);
    if (unlimited || static_cast<double>(used[current] + size_with_ties) <= current_max) {
      used[current] += size_with_ties;
      assigned.push_back({name, device});
      if (trace) {
        std::string line = absl::StrCat(name, " -> ", device.ToString(), ": fits (", FormatBytes(module_size));
        if (!tied_names.empty()) absl::StrAppend(&line, " with tied ", absl::StrJoin(tied_names, ", "));
        if (!unlimited) absl::StrAppend(&line, ", ", FormatBytes(std::max(0.0, free)), " free");
        if (reserved > 0) absl::StrAppend(&line, " after reserving ", FormatBytes(reserved), " for the largest layer");
        trace->push_back(line + ")");
      }
      for (const std::string& tied : tied_names) {
        auto it = std::find_if(todo.begin(), todo.end(), [&](const Item& q) { return q.name == tied; });
        if (it != todo.end()) todo.erase(it);
        assigned.push_back({tied, device});
        if (trace) trace->push_back(absl::StrCat(tied, " -> ", device.ToString(), ": tied to ", name));
      }
      continue;
    }

    // The item fits without its tied partners: try to split a partner instead of moving on.
    if (!tied_params.empty() && static_cast<double>(used[current] + module_size) <= current_max) {
      bool split = false;
      for (size_t t = 0; t < tied_names.size(); ++t) {
        const ModuleSpec* tied_module = tied_items[t]->module;
        if (tied_module == nullptr || tied_module->children.empty() || IsNoSplit(spec, *tied_module)) continue;
        std::vector<Item> parts = SplitItems(tied_names[t], *tied_module);
        auto it = std::find_if(todo.begin(), todo.end(), [&](const Item& q) { return q.name == tied_names[t]; });
        it = todo.erase(it);
        todo.insert(it, parts.begin(), parts.end());
        todo.push_front(item);
        std::tie(max_layer_size, max_layer_names) = MaxLayerSize(spec, sizes, todo, /*modules_only=*/true);
        if (trace) trace->push_back(absl::StrCat("split ", tied_names[t], ": its tie to ", name, " does not fit"));
        split = true;
        break;
      }
      if (split) continue;
    }

    // Split the item into its parameters and children, unless it is a leaf or of a no-split class.
    if (item.module != nullptr && !item.module->children.empty() && !IsNoSplit(spec, *item.module)) {
      std::vector<Item> parts = SplitItems(name, *item.module);
      todo.insert(todo.begin(), parts.begin(), parts.end());
      std::tie(max_layer_size, max_layer_names) = MaxLayerSize(spec, sizes, todo, /*modules_only=*/true);
      if (trace) {
        trace->push_back(absl::StrCat("split ", name, ": ", FormatBytes(size_with_ties), " does not fit in the ",
                                      FormatBytes(std::max(0.0, free)), " left on ", device.ToString()));
      }
      continue;
    }

    // Neither it nor its partners can be split: the device is full, go to the next one. The reserve
    // kept for the largest layer counts as used.
    if (trace) {
      trace->push_back(absl::StrCat(
          "next device after ", device.ToString(), ": ", name, " (", FormatBytes(size_with_ties),
          item.module != nullptr && IsNoSplit(spec, *item.module)
              ? absl::StrCat(", no-split class ", item.module->class_name)
              : std::string(", cannot be split"),
          ") does not fit in ", FormatBytes(std::max(0.0, free))));
    }
    used[current] += reserved;
    ++current;
    if (current >= devices.size()) return absl::InternalError(absl::StrCat("no device left for ", name));
    todo.push_front(std::move(item));
  }

  std::map<std::string, Device> cleaned(assigned.begin(), assigned.end());
  Clean(cleaned, "");
  DeviceMap result(cleaned.begin(), cleaned.end());
  DefinitionOrder(spec).Sort(result);
  return result;
}

DefinitionOrder::DefinitionOrder(const ModelSpec& spec) { Visit(spec.root); }

void DefinitionOrder::Visit(const ModuleSpec& module) {
  index_.emplace(module.name, static_cast<int>(index_.size()));
  for (const TensorSpec& p : module.parameters) index_.emplace(module.ChildName(p.name), static_cast<int>(index_.size()));
  for (const ModuleSpec& c : module.children) Visit(c);
  for (const TensorSpec& b : module.buffers) index_.emplace(module.ChildName(b.name), static_cast<int>(index_.size()));
}

int DefinitionOrder::Of(absl::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? -1 : it->second;
}

void DefinitionOrder::Sort(DeviceMap& map) const {
  std::stable_sort(map.begin(), map.end(), [&](const auto& a, const auto& b) {
    int ia = Of(a.first), ib = Of(b.first);
    if (ia < 0) ia = std::numeric_limits<int>::max();
    if (ib < 0) ib = std::numeric_limits<int>::max();
    return ia < ib;
  });
}

}  // namespace strata::planner::internal
