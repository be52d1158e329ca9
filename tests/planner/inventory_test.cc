// The machine inventory and the budgets transformers derives from it when no max_memory is given.
// tests/parity/test_inventory_parity.py checks the same rules against transformers at scale.
#include "planner/inventory.h"

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "planner/plan.h"

namespace strata::planner {
namespace {

constexpr int64_t kGiB = 1073741824;

TEST(ParseInventory, ReadsGpusAndHost) {
  absl::StatusOr<MachineInventory> inventory = ParseInventory("1=40GiB, 0=79GiB,cpu=200GiB");
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  ASSERT_EQ(inventory->gpus.size(), 2u);
  EXPECT_EQ(inventory->gpus[0].free_bytes, 79 * kGiB);
  EXPECT_EQ(inventory->gpus[0].total_bytes, 79 * kGiB);
  EXPECT_EQ(inventory->gpus[1].free_bytes, 40 * kGiB);
  EXPECT_FALSE(inventory->gpus[1].integrated);
  EXPECT_EQ(inventory->host_available_bytes, 200 * kGiB);
}

TEST(ParseInventory, HostAloneIsAMachineWithoutGpus) {
  absl::StatusOr<MachineInventory> inventory = ParseInventory("cpu=64GiB");
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  EXPECT_TRUE(inventory->gpus.empty());
  EXPECT_EQ(inventory->host_available_bytes, 64 * kGiB);
}

TEST(ParseInventory, ErrorsNameTheEntry) {
  struct Case {
    const char* spec;
    const char* mentions;
  };
  for (const Case& c : {Case{"0=1GiB,2=1GiB,cpu=4GiB", "\"2\""}, Case{"1=1GiB,cpu=4GiB", "GPU 0 is missing"},
                        Case{"0=1XB,cpu=4GiB", "1XB"}, Case{"0=1GiB", "cpu"}, Case{"0=1GiB,cpu=1GiB,disk=1TB", "disk"},
                        Case{"gpu0=1GiB,cpu=1GiB", "gpu0"}, Case{"0=1GiB,0=2GiB,cpu=1GiB", "given twice"},
                        Case{"0,cpu=1GiB", "\"0\""}, Case{"", "no devices"}}) {
    absl::StatusOr<MachineInventory> inventory = ParseInventory(c.spec);
    ASSERT_FALSE(inventory.ok()) << c.spec;
    EXPECT_NE(inventory.status().message().find("inventory: "), std::string::npos) << inventory.status();
    EXPECT_NE(inventory.status().message().find(c.mentions), std::string::npos) << c.spec << ": " << inventory.status();
  }
}

MachineInventory Machine(std::vector<int64_t> gpus_free, int64_t host) {
  MachineInventory inventory;
  for (int64_t free : gpus_free) inventory.gpus.push_back({free, free, false});
  inventory.host_available_bytes = host;
  return inventory;
}

TEST(DefaultMaxMemory, NoGpusGivesNinetyPercentOfTheHost) {
  for (Strategy strategy : {Strategy::kAuto, Strategy::kSequential, Strategy::kManual}) {
    MaxMemory m = DefaultMaxMemory(Machine({}, 1000), strategy);
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].device, Device::Cpu());
    EXPECT_EQ(m[0].bytes, 1000 * 0.90);
  }
}

TEST(DefaultMaxMemory, OneGpuKeepsTenPercentUnlessSequential) {
  MaxMemory balanced = DefaultMaxMemory(Machine({1000}, 2000), Strategy::kBalancedLow0);
  ASSERT_EQ(balanced.size(), 2u);
  EXPECT_EQ(balanced[0].device, Device::Gpu(0));
  EXPECT_EQ(balanced[0].bytes, 1000 * 0.9);
  EXPECT_EQ(balanced[1].device, Device::Cpu());
  EXPECT_EQ(balanced[1].bytes, 2000 * 0.90);
  MaxMemory sequential = DefaultMaxMemory(Machine({1000}, 2000), Strategy::kSequential);
  EXPECT_EQ(sequential[0].bytes, 1000);
  EXPECT_EQ(DefaultMaxMemory(Machine({1000}, 2000), Strategy::kManual)[0].bytes, 1000);
}

TEST(DefaultMaxMemory, SeveralGpusGetAllTheirFreeMemory) {
  MaxMemory m = DefaultMaxMemory(Machine({1000, 3000, 2000}, 500), Strategy::kAuto);
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].bytes, 1000);
  EXPECT_EQ(m[1].bytes, 3000);
  EXPECT_EQ(m[2].bytes, 2000);
  EXPECT_EQ(m[3].device, Device::Cpu());
  EXPECT_EQ(m[3].bytes, 500 * 0.90);
}

TEST(DefaultMaxMemory, OneGpuWithMemoryScalesTheFirstGpuAsUpstreamDoes) {
  // get_balanced_memory counts the GPUs with memory (one: GPU 1) but scales the first GPU listed.
  MaxMemory m = DefaultMaxMemory(Machine({0, 1000}, 500), Strategy::kBalanced);
  EXPECT_EQ(m[0].bytes, 0);
  EXPECT_EQ(m[1].bytes, 1000);
}

TEST(DefaultMaxMemory, IntegratedGpuLeavesNoCpuBudget) {
  MachineInventory machine = Machine({1000, 1000}, 500);
  machine.gpus[1].integrated = true;
  MaxMemory m = DefaultMaxMemory(machine, Strategy::kAuto);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_TRUE(m[0].device.is_gpu() && m[1].device.is_gpu());
}

TEST(MemAvailableBytes, ReadsTheKernelsKibibytes) {
  EXPECT_EQ(*internal::MemAvailableBytes("MemTotal:  100 kB\nMemFree:  5 kB\nMemAvailable:   2048 kB\n"), 2048 * 1024);
  EXPECT_FALSE(internal::MemAvailableBytes("MemTotal:  100 kB\n").ok());
  EXPECT_FALSE(internal::MemAvailableBytes("MemAvailable: lots\n").ok());
}

TEST(DiscoverInventory, FindsThisMachine) {
  absl::StatusOr<MachineInventory> inventory = DiscoverInventory();
  ASSERT_TRUE(inventory.ok()) << inventory.status();
  EXPECT_GT(inventory->host_available_bytes, 0);
  for (const GpuMemory& gpu : inventory->gpus) {  // none on a machine without a CUDA driver
    EXPECT_GT(gpu.total_bytes, 0);
    EXPECT_LE(gpu.free_bytes, gpu.total_bytes);
  }
}

ModelSpec SmallLlama() {
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"model_type", "llama"},
                           {"hidden_size", 64},
                           {"intermediate_size", 128},
                           {"num_hidden_layers", 8},
                           {"num_attention_heads", 4},
                           {"num_key_value_heads", 2},
                           {"vocab_size", 100},
                           {"tie_word_embeddings", false}};
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(config, DType::kFloat32);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

absl::StatusOr<Plan> PlanOn(const MachineInventory& machine, const std::string& strategy, int64_t kv_tokens = 0) {
  PlanRequest request;
  request.device_map = *ParseDeviceMapChoice(strategy);
  request.inventory = machine;
  request.kv_cache_tokens = kv_tokens;
  return PlaceSpec(SmallLlama(), request);
}

TEST(PlanWithInventory, BudgetsComeFromTheMachineAndThePlanRecordsIt) {
  absl::StatusOr<Plan> plan = PlanOn(Machine({kGiB, kGiB}, 4 * kGiB), "sequential");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->inventory.has_value());
  EXPECT_EQ(plan->inventory->gpus.size(), 2u);
  EXPECT_EQ(plan->device_map.size(), 1u);
  EXPECT_EQ(plan->device_map[0].second, Device::Gpu(0));
  EXPECT_EQ(plan->devices[0].budget_bytes, static_cast<double>(kGiB));
  EXPECT_TRUE(plan->warnings.empty());
  nlohmann::ordered_json json = PlanToJson(*plan);
  EXPECT_EQ(json["inventory"]["gpus"][1]["free_bytes"], kGiB);
  EXPECT_EQ(json["inventory"]["cpu_available_bytes"], 4 * kGiB);
  EXPECT_TRUE(json["warnings"].empty());
}

TEST(PlanWithInventory, MaxMemoryWinsOverTheInventory) {
  PlanRequest request;
  request.device_map = *ParseDeviceMapChoice("sequential");
  request.inventory = Machine({kGiB}, kGiB);
  request.max_memory = *ParseMaxMemory("cpu=1GiB");
  absl::StatusOr<Plan> plan = PlaceSpec(SmallLlama(), request);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->inventory.has_value());
  EXPECT_EQ(plan->device_map[0].second, Device::Cpu());
  EXPECT_FALSE(PlanToJson(*plan).contains("inventory"));
}

TEST(PlanWarnings, GpusTooSmallForALayerAreNamed) {
  absl::StatusOr<Plan> plan = PlanOn(Machine({1000, 2000}, 4 * kGiB), "auto");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->warnings.size(), 1u);
  const std::string& w = plan->warnings[0];
  EXPECT_NE(w.find("no decoder layer is on a GPU (8 on cpu)"), std::string::npos) << w;
  EXPECT_NE(w.find("GPU 0 budget 1000 B"), std::string::npos) << w;
  EXPECT_NE(w.find("GPU 1 budget 2000 B"), std::string::npos) << w;
  EXPECT_EQ(PlanToJson(*plan)["warnings"][0], w);
}

TEST(PlanWarnings, KvReserveThatPushesEveryLayerOffTheGpusIsNamed) {
  // Without the reserve the model fits the GPU; a KV cache for many tokens leaves it no room.
  ASSERT_TRUE(PlanOn(Machine({8 << 20}, 4 * kGiB), "sequential")->warnings.empty());
  absl::StatusOr<Plan> plan = PlanOn(Machine({8 << 20}, 4 * kGiB), "sequential", 100000);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->warnings.size(), 1u);
  const std::string& w = plan->warnings[0];
  EXPECT_NE(w.find("GPU 0 budget 8.0 MiB (KV reserve "), std::string::npos) << w;
  EXPECT_NE(w.find("100000 tokens"), std::string::npos) << w;
}

TEST(PlanWarnings, NoneWithoutGpusOrWithALayerOnAGpu) {
  EXPECT_TRUE(PlanOn(Machine({}, 4 * kGiB), "auto")->warnings.empty());
  EXPECT_TRUE(PlanOn(Machine({kGiB, kGiB}, 4 * kGiB), "balanced")->warnings.empty());
}

}  // namespace
}  // namespace strata::planner

namespace strata::planner {
namespace {

TEST(GroupInventory, NodesAreOneMachineNodeMajorWithTheLeadersHost) {
  MachineInventory leader = *ParseInventory("0=10GiB,1=20GiB,cpu=100GiB");
  leader.cuda_driver_version = 13000;
  MachineInventory worker = *ParseInventory("0=30GiB,cpu=7GiB");
  worker.cuda_driver_version = 12080;
  absl::StatusOr<MachineInventory> group = GroupInventory({leader, worker});
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->gpus.size(), 3u);
  EXPECT_EQ(group->gpus[2].free_bytes, int64_t{30} << 30);
  EXPECT_EQ(group->gpu_nodes, (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(group->nodes(), 2);
  EXPECT_EQ(group->NodeOf(2), 1);
  EXPECT_EQ(group->host_available_bytes, int64_t{100} << 30);  // cpu and disk entries live on the leader's host
  EXPECT_EQ(group->cuda_driver_version, 12080);                // the lowest: what every node can run
  EXPECT_EQ(InventoryToString(*group),
            "node 0: 0=10.00 GiB free of 10.00 GiB, 1=20.00 GiB free of 20.00 GiB, node 1: 2=30.00 GiB free of "
            "30.00 GiB, cpu=100.00 GiB available (node 0, the leader's host)");
  // One node is a machine like any other.
  absl::StatusOr<MachineInventory> one = GroupInventory({leader});
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->gpu_nodes.empty());
  EXPECT_EQ(one->nodes(), 1);
  EXPECT_FALSE(GroupInventory({}).ok());
}

TEST(GroupInventory, AGroupPlansAsTheUnionOfItsGpus) {
  const ModelSpec spec = SmallLlama();
  MachineInventory node = *ParseInventory("0=200KB,1=200KB,cpu=10MB");
  for (const char* strategy : {"auto", "balanced", "balanced_low_0", "sequential"}) {
    PlanRequest group_request, union_request;
    group_request.device_map = union_request.device_map = *ParseDeviceMapChoice(strategy);
    group_request.inventory = *GroupInventory({node, node});
    union_request.inventory = *ParseInventory("0=200KB,1=200KB,2=200KB,3=200KB,cpu=10MB");
    absl::StatusOr<Plan> group = PlaceSpec(spec, group_request);
    absl::StatusOr<Plan> whole = PlaceSpec(spec, union_request);
    ASSERT_TRUE(group.ok() && whole.ok()) << strategy;
    EXPECT_EQ(group->device_map, whole->device_map) << strategy;
    const nlohmann::ordered_json json = PlanToJson(*group);
    for (const auto& d : json["devices"]) {
      const std::string device = d["device"];
      EXPECT_EQ(d["node"], device == "2" || device == "3" ? 1 : 0) << strategy << " " << device;
    }
    EXPECT_NE(PlanToTable(spec, *group).find("(node 1)"), std::string::npos) << strategy;
    EXPECT_FALSE(PlanToJson(*whole)["devices"][0].contains("node"));
  }
}

}  // namespace
}  // namespace strata::planner
