// Hostile inputs to the planner (issue 10): each is an InvalidArgument naming what is wrong, never a
// crash, a truncation or an allocation sized by an attacker.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner/manual_device_map.h"
#include "planner/plan.h"

namespace strata::planner {
namespace {

using ::testing::HasSubstr;

TEST(Hardening, ModuleTreeWithoutTensorsIsAnErrorNotACrash) {
  // Before: MakePlan called front() on the empty device map the placement produced.
  nlohmann::json tree = {{"format", "strata.module_tree.v1"},
                         {"root", {{"class", "Empty"}, {"children", {{{"name", "inner"}, {"class", "Inner"}}}}}}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromModuleTree(tree, std::nullopt);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const char* strategy : {"auto", "balanced", "balanced_low_0", "sequential", R"({"": 0})"}) {
    PlanRequest request;
    request.device_map = *ParseDeviceMapChoice(strategy);
    request.max_memory = *ParseMaxMemory("0=1GiB,cpu=1GiB");
    absl::StatusOr<Plan> plan = MakePlan(*spec, request);
    ASSERT_FALSE(plan.ok()) << strategy;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(plan.status().message()), HasSubstr("no parameters or buffers"));
  }
}

TEST(Hardening, DeviceIndexPastIntIsAnErrorNotGpu0) {
  for (const char* text : {R"({"": 4294967296})", R"({"": 2147483648})", R"({"": 18446744073709551615})"}) {
    absl::StatusOr<DeviceMap> map = ParseDeviceMap(text);
    ASSERT_FALSE(map.ok()) << text << " parsed as GPU " << (*map)[0].second.index;
    EXPECT_THAT(std::string(map.status().message()), HasSubstr("unknown device")) << text;
  }
  absl::StatusOr<DeviceMap> largest = ParseDeviceMap(R"({"": 2147483647})");
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ((*largest)[0].second.index, 2147483647);
}

}  // namespace
}  // namespace strata::planner
