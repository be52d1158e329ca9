// strata-plan: where every module of a Hugging Face checkpoint would live, with transformers'
// device_map semantics. Exit codes: 0 ok, 2 bad input (message on stderr), 1 anything else.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"
#include "planner/experts_on.h"
#include "planner/model_spec.h"
#include "planner/placement_flags.h"
#include "planner/plan.h"
#include "planner/quantized_spec.h"

ABSL_FLAG(std::string, inventory, "",
          "plan for this machine instead of the one found here: each GPU's free memory and the host's available "
          "memory, 0=79GiB,1=79GiB,cpu=200GiB (GPUs 0..n-1, cpu required; 0=79GiB@8.9 states GPU 0's compute "
          "capability, which --quantized-sizing transformers reads for FP8); budgets ignored with --max-memory. Give "
          "it once per node to plan for a group of nodes as one machine: their GPUs node-major (node 1's GPU 0 is "
          "GPU n of the plan), cpu and disk on node 0's host");
ABSL_FLAG(bool, json, false, "machine-readable plan (device_map in hf_device_map form)");
ABSL_FLAG(bool, explain, false, "say why each module went where it went");
ABSL_FLAG(bool, print_module_tree, false, "print the model's module tree JSON instead of a plan");
ABSL_FLAG(std::string, experts_on, "",
          "MoE models: put the experts of the layers that do not fit the GPUs on this device (e.g. cpu) instead of "
          "the whole layer, counting from the last layer (planner/README.md, Experts apart)");
ABSL_FLAG(int32_t, bench, 0, "time N plannings; print {\"bench_runs\", \"median_us\", \"min_us\"}");

namespace {

using strata::cli::Flag;

constexpr strata::planner::PlacementFlagSet kPlacementFlags{.module_tree = true, .kv_cache_tokens = true};

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-plan (--model DIR | --module-tree FILE) [options]

Plans where each module of a model lives (GPUs, cpu, disk) exactly as transformers'
from_pretrained(device_map=..., max_memory=...) would, and beyond it.
)";
    command.flags = strata::planner::PlacementFlagSpecs(kPlacementFlags);
    command.flags.insert(command.flags.end(),
                         {Flag(FLAGS_inventory, "SPEC").Repeatable(),
                          Flag(FLAGS_experts_on, "DEVICE").ShowDefault("none"), Flag(FLAGS_json), Flag(FLAGS_explain),
                          Flag(FLAGS_print_module_tree), Flag(FLAGS_bench, "N").ShowDefault("none")});
    return command;
  }();
  return command;
}

int BadInput(absl::string_view message) {
  std::cerr << "strata-plan: " << message << "\n";
  return 2;
}

// A check of a flag's value failed: exit 2 with the message naming the flag.
template <typename T>
int BadFlag(const absl::Flag<T>& flag, const absl::Status& status) {
  return BadInput(strata::cli::FlagError(flag, status).message());
}

// --bench N: N plannings timed, {"bench_runs", "median_us", "min_us"} printed.
int Bench(const strata::planner::ModelSpec& spec, const strata::planner::PlanRequest& request, int runs) {
  std::vector<double> micros;
  for (int i = 0; i < runs; ++i) {
    auto start = std::chrono::steady_clock::now();
    absl::StatusOr<strata::planner::Plan> plan = strata::planner::PlaceSpec(spec, request);
    auto stop = std::chrono::steady_clock::now();
    if (!plan.ok()) return BadInput(plan.status().message());
    micros.push_back(std::chrono::duration<double, std::micro>(stop - start).count());
  }
  std::sort(micros.begin(), micros.end());
  nlohmann::ordered_json out = {{"bench_runs", runs}, {"median_us", micros[micros.size() / 2]}, {"min_us", micros[0]}};
  std::cout << out.dump() << "\n";
  return 0;
}

// The plan on stdout: JSON with --json, else the machine, the quantization and the table (and --explain's why).
void PrintPlan(const strata::planner::ModelSpec& spec, const strata::planner::Plan& plan, bool explain) {
  using namespace strata::planner;
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json json = PlanToJson(plan);
    if (spec.quantization) json["quantization"] = QuantizationToJson(spec);
    if (explain) json["explanation"] = plan.explanation;
    std::cout << json.dump(1) << "\n";
    return;
  }
  if (plan.inventory) std::cout << "machine: " << InventoryToString(*plan.inventory) << "\n";
  if (spec.quantization) std::cout << "quantization: " << QuantizationSummary(spec) << "\n";
  std::cout << PlanToTable(spec, plan);
  if (explain) {
    std::cout << "\nwhy:\n";
    for (const std::string& line : plan.explanation) std::cout << "  " << line << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::planner;
  absl::StatusOr<strata::cli::ParsedArgs> parsed = strata::cli::Parse(Command(), argc, argv);
  if (!parsed.ok()) return BadInput(absl::StrCat(parsed.status().message(), " (see --help)"));
  if (parsed->help) {
    std::cout << strata::cli::Help(Command());
    return 0;
  }
  absl::StatusOr<strata::planner::Placement> placement = strata::planner::ParsePlacement(*parsed, kPlacementFlags);
  if (!placement.ok()) return BadInput(placement.status().message());
  const bool explain = absl::GetFlag(FLAGS_explain);
  absl::StatusOr<ModelSpec> spec = placement->model_dir ? LoadModelSpec(*placement->model_dir, placement->dtype)
                                                        : LoadModuleTree(*placement->module_tree, placement->dtype);
  if (!spec.ok()) return BadInput(spec.status().message());
  PlanRequest request;
  request.device_map = placement->device_map;
  request.explain = explain;
  request.max_memory = placement->max_memory;
  if (const std::vector<std::string> nodes = parsed->Values(FLAGS_inventory); !nodes.empty()) {
    std::vector<MachineInventory> machines;
    for (size_t n = 0; n < nodes.size(); ++n) {
      absl::StatusOr<MachineInventory> inventory = ParseInventory(nodes[n]);
      if (!inventory.ok()) {
        if (nodes.size() == 1) return BadFlag(FLAGS_inventory, inventory.status());
        return BadInput(absl::StrCat("--inventory (node ", n, "): ", inventory.status().message()));
      }
      machines.push_back(*std::move(inventory));
    }
    absl::StatusOr<MachineInventory> group = GroupInventory(machines);
    if (!group.ok()) return BadFlag(FLAGS_inventory, group.status());
    request.inventory = *std::move(group);
  } else if (!request.max_memory) {
    // Discovered once, here, rather than by PlaceSpec on every --bench run.
    absl::StatusOr<MachineInventory> inventory = DiscoverInventory();
    if (!inventory.ok()) {
      std::cerr << "strata-plan: cannot find this machine's memory: " << inventory.status().message() << "\n";
      return 1;
    }
    request.inventory = *std::move(inventory);
  }
  request.kv_cache_tokens = placement->kv_cache_tokens;
  request.runtime_reserve = placement->runtime_reserve;
  request.quantized_sizing = placement->quantized_sizing;
  if (absl::Status s = ApplyQuantizedSizing(*spec, request); !s.ok()) {
    std::cerr << "strata-plan: cannot find this machine's GPUs: " << s.message() << "\n";
    return 1;
  }

  if (absl::GetFlag(FLAGS_print_module_tree)) {
    std::cout << ModuleTreeToJson(*spec).dump(1) << "\n";
    return 0;
  }

  if (parsed->Given(FLAGS_bench)) {
    const int runs = absl::GetFlag(FLAGS_bench);
    if (runs <= 0) return BadInput(absl::StrCat("--bench: expected a positive number of runs, got \"", runs, "\""));
    return Bench(*spec, request, runs);
  }

  absl::StatusOr<Plan> plan;
  if (const std::string text = absl::GetFlag(FLAGS_experts_on); !text.empty()) {
    absl::StatusOr<Device> device = ParseDevice(text);
    if (!device.ok()) return BadFlag(FLAGS_experts_on, device.status());
    absl::StatusOr<ExpertsOnPlan> apart = PlaceSpecWithExpertsOn(*spec, request, *device);
    if (!apart.ok()) return BadInput(apart.status().message());
    if (!apart->moved.empty()) {
      std::cerr << "strata-plan: experts of " << apart->moved.size() << " layers on " << device->ToString() << " ("
                << apart->moved.front() << " .. " << apart->moved.back() << ")\n";
    }
    plan = std::move(apart->plan);
  } else {
    plan = PlaceSpec(*spec, request);
  }
  if (!plan.ok()) return BadInput(plan.status().message());
  for (const std::string& warning : plan->warnings) std::cerr << "strata-plan: warning: " << warning << "\n";
  PrintPlan(*spec, *plan, explain);
  return 0;
}
