#include "runtime/executor/group_load.h"

#include <openssl/evp.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_reader.h"
#include "nlohmann/json.hpp"
#include "planner/inventory.h"
#include "runtime/executor/device_memory.h"
#include "runtime/executor/group_wire.h"

namespace strata::runtime {
namespace {

// The version every node of a group runs: strata's, and the layout of group_wire.h's messages.
constexpr const char* kGroupVersion = "strata " STRATA_VERSION ", group wire 1";

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

// This node's join: its GPUs' budgets from --max-memory (its own numbering, 0..n-1) or discovered.
absl::StatusOr<wire::JoinRequest> OwnJoin(const ServingRequest& request, int data_port) {
  wire::JoinRequest join;
  join.data_port = data_port;
  if (request.max_memory) {
    join.given = true;
    for (const planner::DeviceBudget& b : *request.max_memory) {
      if (b.device.is_gpu()) {
        if (b.device.index != static_cast<int>(join.gpu_bytes.size())) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--max-memory: a node of a group numbers its GPUs 0, 1, ... without gaps (GPU ", b.device.index, ")"));
        }
        join.gpu_bytes.push_back(static_cast<int64_t>(b.bytes));
        join.gpu_total_bytes.push_back(static_cast<int64_t>(b.bytes));
      } else if (b.device.kind == planner::Device::Kind::kCpu) {
        join.host_bytes = static_cast<int64_t>(b.bytes);
      }
    }
  } else {
    absl::StatusOr<planner::MachineInventory> machine =
        request.inventory ? absl::StatusOr<planner::MachineInventory>(*request.inventory)
                          : planner::DiscoverInventory();
    if (!machine.ok()) return machine.status();
    for (const planner::GpuMemory& gpu : machine->gpus) {
      join.gpu_bytes.push_back(gpu.free_bytes);
      join.gpu_total_bytes.push_back(gpu.total_bytes);
    }
    join.host_bytes = machine->host_available_bytes;
    join.cuda_driver_version = machine->cuda_driver_version;
  }
  for (size_t i = 0; i < join.gpu_bytes.size(); ++i) {
    auto it = request.physical.find(static_cast<int>(i));
    join.gpu_runs_on_cpu.push_back(it != request.physical.end() && !it->second.cuda);
  }
  return join;
}

absl::StatusOr<transport::Message> Expect(NodeGroup& group, int node, uint32_t kind) {
  absl::StatusOr<transport::Message> message = group.ReceiveDuringStart(node);
  if (!message.ok()) return message.status();
  if (message->kind != kind) {
    return absl::InternalError(absl::StrCat(group.Describe(node), " sent a ", wire::KindName(message->kind),
                                            " message where a ", wire::KindName(kind), " was due"));
  }
  return message;
}

// Worker pairs that neighbour each other in the stage order ({lower, higher} ranks; the leader's links exist).
std::vector<std::pair<int, int>> WorkerNeighbours(const planner::Plan& plan, const std::vector<int>& gpu_nodes) {
  std::vector<int> nodes;
  for (const planner::Stage& stage : plan.stages) {
    const planner::Device& d = stage.device;
    nodes.push_back(d.is_gpu() && static_cast<size_t>(d.index) < gpu_nodes.size() ? gpu_nodes[d.index] : 0);
  }
  std::vector<std::pair<int, int>> pairs;
  for (size_t s = 1; s < nodes.size(); ++s) {
    const int a = std::min(nodes[s - 1], nodes[s]);
    const int b = std::max(nodes[s - 1], nodes[s]);
    if (a == b || a == 0) continue;
    if (std::find(pairs.begin(), pairs.end(), std::make_pair(a, b)) == pairs.end()) pairs.emplace_back(a, b);
  }
  return pairs;
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> GroupFacts(const ServingRequest& request,
                                                                            int group_size) {
  // The model: config.json and the index (or the one safetensors file's header size and length) name the weights;
  // every node reads the same shared checkpoint, so a different one differs here.
  std::string model;
  for (const char* name : {"config.json", "model.safetensors.index.json"}) {
    const std::filesystem::path path = request.model_dir / name;
    std::error_code error;
    if (!std::filesystem::exists(path, error)) continue;
    absl::StatusOr<std::string> bytes = base::ReadRegularFile(path, uint64_t{64} << 20);
    if (!bytes.ok()) return bytes.status();
    absl::StrAppend(&model, name, "\n", *bytes, "\n");
  }
  std::vector<std::string> files;
  std::error_code error;
  for (std::filesystem::directory_iterator it(request.model_dir, error), end; !error && it != end;
       it.increment(error)) {
    if (it->path().extension() == ".safetensors") {
      files.push_back(absl::StrCat(it->path().filename().string(), " ", it->file_size(error)));
    }
  }
  std::sort(files.begin(), files.end());
  absl::StrAppend(&model, absl::StrJoin(files, "\n"), "\n");
  return std::vector<std::pair<std::string, std::string>>{
      {"strata version", kGroupVersion},
      {"model", absl::StrCat("sha256:", Sha256Hex(model))},
      {"dtype", request.dtype ? std::string(planner::DTypeName(*request.dtype)) : "the checkpoint's"},
      {"group size", std::to_string(group_size)},
  };
}

absl::StatusOr<LoadOptions> PlanForGroup(NodeGroup& group, ServingRequest request) {
  // The leader's links are all made: heartbeats keep them alive while it plans and loads (workers that load
  // sooner wait on them with their --group-deadline).
  group.StartHeartbeat();
  std::vector<wire::JoinRequest> joins;
  absl::StatusOr<wire::JoinRequest> own = OwnJoin(request, group.data_port());
  if (!own.ok()) return own.status();
  joins.push_back(*std::move(own));
  for (int r = 1; r < group.size(); ++r) {
    absl::StatusOr<transport::Message> message = Expect(group, r, wire::kJoin);
    if (!message.ok()) return message.status();
    absl::StatusOr<wire::JoinRequest> join = wire::DecodeJoin(message->bytes);
    if (!join.ok()) return absl::InternalError(absl::StrCat(group.Describe(r), ": ", join.status().message()));
    if (join->given != joins.front().given) {
      return absl::InvalidArgumentError(
          absl::StrCat(join->given ? group.Describe(r) : "node 0 (the leader)", " gives --max-memory and ",
                       join->given ? "node 0 (the leader)" : group.Describe(r),
                       " does not: a group's budgets are every node's --max-memory or every node's discovered memory"));
    }
    joins.push_back(*std::move(join));
  }
  // The union, node-major; cpu and disk are the leader's host's.
  std::vector<planner::MachineInventory> machines;
  std::vector<int> gpu_nodes;
  std::set<int> gpus_on_cpu;
  planner::MaxMemory budgets;
  for (size_t n = 0; n < joins.size(); ++n) {
    const wire::JoinRequest& join = joins[n];
    planner::MachineInventory machine;
    machine.host_available_bytes = join.host_bytes;
    machine.cuda_driver_version = join.cuda_driver_version;
    for (size_t i = 0; i < join.gpu_bytes.size(); ++i) {
      const int index = static_cast<int>(gpu_nodes.size());
      machine.gpus.push_back({join.gpu_bytes[i], join.gpu_total_bytes[i]});
      budgets.push_back({planner::Device::Gpu(index), static_cast<double>(join.gpu_bytes[i])});
      if (join.gpu_runs_on_cpu[i] != 0) gpus_on_cpu.insert(index);
      gpu_nodes.push_back(static_cast<int>(n));
    }
    machines.push_back(std::move(machine));
  }
  absl::StatusOr<planner::MachineInventory> union_machine = planner::GroupInventory(machines);
  if (!union_machine.ok()) return union_machine.status();
  if (request.max_memory) {
    for (const planner::DeviceBudget& b : *request.max_memory) {
      if (!b.device.is_gpu()) budgets.push_back(b);
    }
    request.max_memory = budgets;
  }
  request.inventory = *std::move(union_machine);
  request.gpu_nodes = gpu_nodes;
  request.gpus_on_cpu = gpus_on_cpu;
  request.node = 0;
  absl::StatusOr<LoadOptions> load = PlanLoad(request);
  auto fail_workers = [&](const absl::Status& status) {
    const std::string why = absl::StrCat("the leader could not plan the group: ", status.message());
    for (int r = 1; r < group.size(); ++r) {
      const absl::string_view part = why;
      (void)group.Send(r, wire::kFailed, {part});
    }
    return status;
  };
  if (!load.ok()) return fail_workers(load.status());

  wire::GroupPlan plan;
  plan.device_map_json = planner::PlanToJson(load->plan)["device_map"].dump();
  plan.gpu_nodes.assign(gpu_nodes.begin(), gpu_nodes.end());
  plan.dtype = std::string(planner::DTypeName(load->spec.dtype));
  plan.kv_blocks = load->kv_blocks;
  plan.kv_block_tokens = load->serving.kv_block_tokens;
  plan.max_batch = load->serving.max_batch;
  plan.max_context = load->serving.max_context;
  plan.mtp = request.mtp;
  plan.addresses.push_back("");
  for (int r = 1; r < group.size(); ++r) {
    const std::string host = group.AddressOf(r);
    plan.addresses.push_back(absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host, ":",
                                          joins[static_cast<size_t>(r)].data_port));
  }
  const std::string bytes = wire::EncodeGroupPlan(plan);
  for (int r = 1; r < group.size(); ++r) {
    const absl::string_view part = bytes;
    if (absl::Status s = group.Send(r, wire::kPlan, {part}); !s.ok()) return s;
  }
  return load;
}

absl::StatusOr<LoadOptions> TakeGroupPlan(NodeGroup& group, ServingRequest request) {
  absl::StatusOr<wire::JoinRequest> join = OwnJoin(request, group.data_port());
  if (!join.ok()) return join.status();
  const std::string join_bytes = wire::EncodeJoin(*join);
  const absl::string_view part = join_bytes;
  if (absl::Status s = group.Send(0, wire::kJoin, {part}); !s.ok()) return s;
  absl::StatusOr<transport::Message> message = Expect(group, 0, wire::kPlan);
  if (!message.ok()) return message.status();
  absl::StatusOr<wire::GroupPlan> plan = wire::DecodeGroupPlan(message->bytes);
  if (!plan.ok()) return absl::InternalError(absl::StrCat(group.Describe(0), ": ", plan.status().message()));
  absl::StatusOr<planner::DeviceMap> map = planner::ParseDeviceMap(plan->device_map_json);
  if (!map.ok()) return absl::InternalError(absl::StrCat("the leader's device map: ", map.status().message()));
  absl::StatusOr<planner::DType> dtype = planner::ParseDType(plan->dtype);
  if (!dtype.ok()) return absl::InternalError(absl::StrCat("the leader's dtype: ", dtype.status().message()));

  // This node's GPUs in the plan's numbering: its --physical-devices (own numbering) moved to its first index.
  std::vector<int> gpu_nodes(plan->gpu_nodes.begin(), plan->gpu_nodes.end());
  int first = -1;
  int count = 0;
  for (size_t g = 0; g < gpu_nodes.size(); ++g) {
    if (gpu_nodes[g] != group.rank()) continue;
    if (first < 0) first = static_cast<int>(g);
    ++count;
  }
  planner::PhysicalDeviceMap physical;
  for (int local = 0; local < count; ++local) {
    auto it = request.physical.find(local);
    physical[first + local] = it != request.physical.end() ? it->second : planner::PhysicalDevice{true, local};
  }
  // Every node reads the leader's map as a manual map (the budgets were the leader's to check): the same map, the
  // same stages; this node loads its own.
  planner::MachineInventory machine;
  for (size_t g = 0; g < gpu_nodes.size(); ++g) {
    machine.gpus.push_back({int64_t{1} << 50, int64_t{1} << 50});
  }
  machine.host_available_bytes = int64_t{1} << 50;
  machine.gpu_nodes = gpu_nodes;
  request.device_map = planner::DeviceMapChoice{planner::Strategy::kManual, *std::move(map)};
  request.max_memory.reset();
  request.inventory = machine;
  request.physical = physical;
  request.dtype = *dtype;
  request.serving.max_batch = plan->max_batch;
  request.serving.max_context = plan->max_context;
  request.kv_cache_tokens = plan->kv_blocks * plan->kv_block_tokens;
  request.serving.kv_block_tokens = plan->kv_block_tokens;
  request.gpu_nodes = gpu_nodes;
  request.node = group.rank();
  request.runtime_reserve = {};
  request.mtp = plan->mtp;  // the leader's plan has the layer: this node's spec must too
  absl::StatusOr<LoadOptions> load = PlanLoad(request);
  if (!load.ok()) return load.status();
  load->kv_blocks = plan->kv_blocks;
  load->serving.kv_block_tokens = plan->kv_block_tokens;
  std::vector<std::string> addresses(plan->addresses.begin(), plan->addresses.end());
  if (absl::Status s = group.LinkWorkers(WorkerNeighbours(load->plan, gpu_nodes), addresses); !s.ok()) return s;
  // Every link of this node is made: heartbeats from now on, through its load and while it waits for the leader's.
  group.StartHeartbeat();
  return load;
}

absl::Status AwaitGroupReady(NodeGroup& group) {
  for (int r = 1; r < group.size(); ++r) {
    absl::StatusOr<transport::Message> message = Expect(group, r, wire::kReady);
    if (!message.ok()) return message.status();
  }
  return absl::OkStatus();
}

absl::Status ServeGroupStages(NodeGroup& group, const LoadOptions& load, ExecutorOptions options,
                              const std::function<void()>& on_ready) {
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadedModel::Load(load);
  if (!model.ok()) {
    const std::string why = absl::StrCat("loading its stages: ", model.status().message());
    const absl::string_view part = why;
    (void)group.Send(0, wire::kFailed, {part});
    return model.status();
  }
  if (absl::Status s = group.Send(0, wire::kReady, {}); !s.ok()) return s;
  std::mutex mutex;
  std::condition_variable ended_cv;
  std::optional<absl::Status> ended;
  options.group = &group;
  options.on_group_lost = [&](const absl::Status& why) {
    std::lock_guard lock(mutex);
    if (!ended) ended = why;
    ended_cv.notify_all();
  };
  absl::StatusOr<std::unique_ptr<Executor>> executor = Executor::Start(**model, options);
  if (!executor.ok()) return executor.status();
  // Each heartbeat tells the leader this node's devices' memory (its /metrics and GetDeviceMap show every node's).
  LoadedModel& loaded = **model;
  group.SetMemoryReport([&loaded, rank = group.rank()] {
    std::vector<DeviceMemory> mine;
    for (DeviceMemory& m : MeasureDeviceMemory(loaded)) {
      absl::StatusOr<planner::Device> device = planner::ParseDevice(m.device);
      if (device.ok() && planner::NodeOf(loaded.report().plan, *device) == rank) mine.push_back(std::move(m));
    }
    return mine;
  });
  if (on_ready) on_ready();
  // Results of the micro-batches whose last stage (or failure) was here go to the leader.
  while (true) {
    {
      std::lock_guard lock(mutex);
      if (ended) break;
    }
    std::optional<MicroBatchResult> result = (*executor)->WaitCompletedFor(std::chrono::milliseconds(200));
    if (!result) continue;
    const std::string bytes = wire::EncodeResult(*result);
    const absl::string_view part = bytes;
    (void)group.Send(0, wire::kResult, {part});  // a failed send is the group's loss, reported by its receiver
  }
  group.SetMemoryReport({});  // before the model goes
  executor->reset();
  std::lock_guard lock(mutex);
  // The leader's goodbye (it drained) ends a worker cleanly; anything else is a loss.
  if (absl::IsCancelled(*ended) && absl::StartsWith(ended->message(), "node 0 ")) return absl::OkStatus();
  return *ended;
}

}  // namespace strata::runtime
