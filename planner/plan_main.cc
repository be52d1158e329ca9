// strata-plan: where every module of a Hugging Face checkpoint would live, with transformers'
// device_map semantics. Exit codes: 0 ok, 2 bad input (message on stderr), 1 anything else.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/model_spec.h"
#include "planner/plan.h"

namespace {

constexpr char kUsage[] = R"(usage: strata-plan (--model DIR | --module-tree FILE) [options]

Plans where each module of a model lives (GPUs, cpu, disk) exactly as transformers'
from_pretrained(device_map=..., max_memory=...) would, and beyond it.

  --model DIR            checkpoint directory: config.json (Llama, Mistral, Qwen2), and
                         *.safetensors headers checked against it when present
  --module-tree FILE     any architecture: a module tree JSON (tools/export_module_tree.py)
  --device-map S         auto | balanced | balanced_low_0 (default) | sequential |
                         a JSON map ('{"": 0}', '{"model": 0, "lm_head": "cpu"}') | @FILE
  --max-memory SPEC      0=20GiB,1=20GiB,cpu=64GiB,disk=1TB (accelerate's sizes);
                         default: what transformers takes from the machine (each
                         GPU's free memory, 90% of the available host memory;
                         90% of the GPU when one GPU has memory, unless sequential)
  --inventory SPEC       plan for this machine instead of the one found here:
                         each GPU's free memory and the host's available memory,
                         0=79GiB,1=79GiB,cpu=200GiB (GPUs 0..n-1, cpu required);
                         ignored with --max-memory
  --dtype D              float32 | float16 | bfloat16 (default: the checkpoint's dtype)
  --kv-cache-tokens N    reserve on each GPU the KV cache of its decoder layers for N tokens
  --json                 machine-readable plan (device_map in hf_device_map form)
  --explain              say why each module went where it went
  --print-module-tree    print the model's module tree JSON instead of a plan
  --bench N              time N plannings; print {"bench_runs", "median_us", "min_us"}
  --help                 this text
)";

struct Flags {
  std::string model;
  std::string module_tree;
  std::string device_map = "balanced_low_0";
  std::string max_memory;
  std::string inventory;
  std::string dtype;
  std::string kv_cache_tokens;
  std::string bench;
  bool json = false;
  bool explain = false;
  bool print_module_tree = false;
};

int BadInput(absl::string_view message) {
  std::cerr << "strata-plan: " << message << "\n";
  return 2;
}

// Returns an error message, or empty when the flags parsed.
std::string ParseFlags(int argc, char** argv, Flags& flags) {
  std::map<std::string, std::string*> with_value = {
      {"--model", &flags.model},           {"--module-tree", &flags.module_tree},
      {"--device-map", &flags.device_map}, {"--max-memory", &flags.max_memory},
      {"--inventory", &flags.inventory},   {"--dtype", &flags.dtype},
      {"--kv-cache-tokens", &flags.kv_cache_tokens}, {"--bench", &flags.bench}};
  std::map<std::string, bool*> switches = {
      {"--json", &flags.json}, {"--explain", &flags.explain}, {"--print-module-tree", &flags.print_module_tree}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> inline_value;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg.resize(eq);
    }
    if (auto it = switches.find(arg); it != switches.end() && !inline_value) {
      *it->second = true;
      continue;
    }
    auto it = with_value.find(arg);
    if (it == with_value.end()) return absl::StrCat("unknown argument \"", argv[i], "\" (see --help)");
    if (inline_value) {
      *it->second = *inline_value;
    } else {
      if (i + 1 >= argc) return absl::StrCat(arg, " needs a value");
      *it->second = argv[++i];
    }
  }
  if (flags.model.empty() == flags.module_tree.empty()) return "give exactly one of --model DIR or --module-tree FILE";
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::planner;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  Flags flags;
  if (std::string error = ParseFlags(argc, argv, flags); !error.empty()) return BadInput(error);

  std::optional<DType> dtype;
  if (!flags.dtype.empty()) {
    absl::StatusOr<DType> parsed = ParseDType(flags.dtype);
    if (!parsed.ok()) return BadInput(parsed.status().message());
    dtype = *parsed;
  }
  absl::StatusOr<ModelSpec> spec =
      flags.model.empty() ? LoadModuleTree(flags.module_tree, dtype) : LoadModelSpec(flags.model, dtype);
  if (!spec.ok()) return BadInput(spec.status().message());
  if (flags.print_module_tree) {
    std::cout << ModuleTreeToJson(*spec).dump(1) << "\n";
    return 0;
  }

  PlanRequest request;
  absl::StatusOr<DeviceMapChoice> choice = ParseDeviceMapChoice(flags.device_map);
  if (!choice.ok()) return BadInput(choice.status().message());
  request.device_map = *std::move(choice);
  request.explain = flags.explain;
  if (!flags.max_memory.empty()) {
    absl::StatusOr<MaxMemory> max_memory = ParseMaxMemory(flags.max_memory);
    if (!max_memory.ok()) return BadInput(max_memory.status().message());
    request.max_memory = *std::move(max_memory);
  }
  if (!flags.inventory.empty()) {
    absl::StatusOr<MachineInventory> inventory = ParseInventory(flags.inventory);
    if (!inventory.ok()) return BadInput(inventory.status().message());
    request.inventory = *std::move(inventory);
  } else if (!request.max_memory) {
    // Discovered once, here, rather than by MakePlan on every --bench run.
    absl::StatusOr<MachineInventory> inventory = DiscoverInventory();
    if (!inventory.ok()) {
      std::cerr << "strata-plan: cannot find this machine's memory: " << inventory.status().message() << "\n";
      return 1;
    }
    request.inventory = *std::move(inventory);
  }
  if (!flags.kv_cache_tokens.empty() && !absl::SimpleAtoi(flags.kv_cache_tokens, &request.kv_cache_tokens)) {
    return BadInput(absl::StrCat("--kv-cache-tokens: not an integer: \"", flags.kv_cache_tokens, "\""));
  }

  if (!flags.bench.empty()) {
    int runs = 0;
    if (!absl::SimpleAtoi(flags.bench, &runs) || runs <= 0) {
      return BadInput(absl::StrCat("--bench: expected a positive number of runs, got \"", flags.bench, "\""));
    }
    std::vector<double> micros;
    for (int i = 0; i < runs; ++i) {
      auto start = std::chrono::steady_clock::now();
      absl::StatusOr<Plan> plan = MakePlan(*spec, request);
      auto stop = std::chrono::steady_clock::now();
      if (!plan.ok()) return BadInput(plan.status().message());
      micros.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
    }
    std::sort(micros.begin(), micros.end());
    nlohmann::ordered_json out = {{"bench_runs", runs}, {"median_us", micros[micros.size() / 2]}, {"min_us", micros[0]}};
    std::cout << out.dump() << "\n";
    return 0;
  }

  absl::StatusOr<Plan> plan = MakePlan(*spec, request);
  if (!plan.ok()) return BadInput(plan.status().message());
  for (const std::string& warning : plan->warnings) std::cerr << "strata-plan: warning: " << warning << "\n";
  if (flags.json) {
    nlohmann::ordered_json json = PlanToJson(*plan);
    if (flags.explain) json["explanation"] = plan->explanation;
    std::cout << json.dump(1) << "\n";
    return 0;
  }
  if (plan->inventory) std::cout << "machine: " << InventoryToString(*plan->inventory) << "\n";
  std::cout << PlanToTable(*spec, *plan);
  if (flags.explain) {
    std::cout << "\nwhy:\n";
    for (const std::string& line : plan->explanation) std::cout << "  " << line << "\n";
  }
  return 0;
}
