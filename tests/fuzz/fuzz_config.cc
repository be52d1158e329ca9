// libFuzzer harness: config.json -> ModelSpec -> Plan, the path strata-plan and strata-server take from a
// checkpoint directory (planner/checkpoint_check.cc's LoadModelSpec without the file read, then PlaceSpec
// as strata-plan runs it). The input is the text of config.json. A spec that is accepted also goes through
// everything that consumes a spec: its byte total, the checkpoint tensors it expects, its module-tree JSON
// (which must read back as the same tree) and a plan with a KV reserve on a two-GPU machine.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "base/json.h"
#include "nlohmann/json.hpp"
#include "planner/device.h"
#include "planner/model_spec.h"
#include "planner/plan.h"

namespace {

using namespace strata::planner;
using json = nlohmann::json;

void PlanSpec(const ModelSpec& spec, Strategy strategy, int64_t kv_cache_tokens, bool explain) {
  PlanRequest request;
  request.device_map.strategy = strategy;
  // Budgets by hand, as --max-memory gives them: PlaceSpec must never look at this machine's GPUs.
  request.max_memory =
      MaxMemory{{Device::Gpu(0), 2e9}, {Device::Gpu(1), 2e9}, {Device::Cpu(), 8e9}, {Device::Disk(), 1e12}};
  request.kv_cache_tokens = kv_cache_tokens;
  request.explain = explain;
  absl::StatusOr<Plan> plan = PlaceSpec(spec, request);
  if (!plan.ok()) return;
  (void)PlanToJson(*plan).dump();
  (void)PlanToTable(spec, *plan);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As LoadModelSpec reads the file (planner/checkpoint_check.cc's ReadJsonFile): depth first, then parse.
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!strata::base::CheckJsonDepth(text, strata::base::kMaxJsonDepth, "config.json").ok()) return 0;
  json config;
  try {
    config = json::parse(text);
  } catch (const json::exception&) {
    return 0;  // LoadModelSpec: "config.json: invalid JSON"
  }
  absl::StatusOr<DType> dtype = ConfigDType(config);
  if (!dtype.ok()) return 0;
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, *dtype);
  if (!spec.ok()) return 0;

  // ModelSpecFromConfig checks the sum of the spec's bytes: SpecBytes of an accepted spec cannot fail.
  if (!SpecBytes(*spec).ok()) std::abort();
  (void)CheckpointTensors(*spec);
  // The round trip only for specs of up to 256 layers: the 4096 layers a config.json may ask for make 15 MB
  // of module-tree JSON, seconds under ASan, which would only time nlohmann-json and trip -timeout.
  if (spec->num_hidden_layers <= 256) {
    const json tree = ModuleTreeToJson(*spec);
    absl::StatusOr<ModelSpec> reread = ModelSpecFromModuleTree(tree, std::nullopt);
    if (!reread.ok() || ModuleTreeToJson(*reread) != tree) std::abort();
  }

  PlanSpec(*spec, Strategy::kBalancedLow0, /*kv_cache_tokens=*/4096, /*explain=*/true);
  PlanSpec(*spec, Strategy::kSequential, /*kv_cache_tokens=*/0, /*explain=*/false);
  return 0;
}
