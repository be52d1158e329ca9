// A group of nodes in one test process (issue 24): the leader and its workers are threads here, each with its own
// NodeGroup over real UCX on loopback and its own LoadedModel holding only its stages. The engine on the leader must
// generate exactly what one process running every stage generates. tests/group runs them as separate processes.

#include "runtime/executor/group.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "absl/time/clock.h"
#include "runtime/engine/engine.h"
#include "runtime/executor/group_load.h"
#include "runtime/executor/group_wire.h"
#include "tests/runtime/engine_fixture.h"

namespace strata::runtime {
namespace {

// A port nothing listens on now (the kernel's choice of an ephemeral one).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

GroupOptions Options(int rank, int size, int port) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.leader_host = "127.0.0.1";
  o.leader_port = port;
  o.bind_host = "127.0.0.1";
  o.secret = "a group secret for the tests";
  o.start_timeout = absl::Seconds(60);
  o.deadline = absl::Seconds(5);
  return o;
}

// Every node's request: the tiny Llama on `map` (the leader's; plan GPUs numbered over the group), each node's own
// GPUs (`gpus` of them) running on the CPU.
ServingRequest Request(const std::string& map, int gpus, int64_t max_batch) {
  ServingRequest r;
  r.model_dir = WriteTinyLlama();
  r.device_map = *planner::ParseDeviceMapChoice(map);
  r.dtype = planner::DType::kFloat32;
  std::string memory;
  for (int g = 0; g < gpus; ++g) {
    memory += std::to_string(g) + "=1GiB,";
    r.physical[g] = {false, 0};
  }
  r.max_memory = *planner::ParseMaxMemory(memory + "cpu=1GiB");
  r.serving.max_batch = max_batch;
  r.serving.max_context = 64;
  return r;
}

std::vector<std::vector<int32_t>> Prompts() {
  return {{1, 5, 9}, {4}, {7, 7, 2, 3, 11, 40, 41}, {90, 3}, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}};
}

// Greedy continuations of every prompt, submitted together (continuous batching, chunked prefill).
std::vector<std::vector<int32_t>> Generate(Engine& engine, int32_t new_tokens) {
  Collector c;
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.sampling.max_new_tokens = new_tokens;
    EXPECT_TRUE(engine.Submit(r, c.For(static_cast<int>(i))).ok());
  }
  c.Wait(static_cast<int>(prompts.size()));
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) out.push_back(c.Ids(static_cast<int>(i)));
  return out;
}

// One process, every stage: the reference.
std::vector<std::vector<int32_t>> OneProcess(const std::string& map, int gpus) {
  ServingRequest r = Request(map, gpus, 4);
  auto load = PlanLoad(r);
  EXPECT_TRUE(load.ok()) << load.status();
  auto model = LoadedModel::Load(*load);
  EXPECT_TRUE(model.ok()) << model.status();
  EngineOptions options;
  options.micro_batches = 3;
  options.prefill_chunk_tokens = 4;
  auto engine = Engine::Start(**model, nullptr, {}, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return Generate(**engine, 10);
}

// A worker's life on its own thread: join, take the plan, serve its stages until the leader leaves.
std::future<absl::Status> StartWorker(int rank, int size, int port, int gpus) {
  return std::async(std::launch::async, [=]() -> absl::Status {
    GroupOptions o = Options(rank, size, port);
    ServingRequest r = Request(kTwoStageMap, gpus, 4);
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> facts = GroupFacts(r, size);
    if (!facts.ok()) return facts.status();
    o.facts = *facts;
    absl::StatusOr<std::unique_ptr<NodeGroup>> group = NodeGroup::Join(o);
    if (!group.ok()) return group.status();
    absl::StatusOr<LoadOptions> load = TakeGroupPlan(**group, r);
    if (!load.ok()) return load.status();
    return ServeGroupStages(**group, *load, {});
  });
}

struct Leader {
  std::unique_ptr<NodeGroup> group;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Engine> engine;
};

absl::StatusOr<Leader> StartLeader(int size, int port, const std::string& map, int gpus,
                                   absl::Duration loads_for = absl::ZeroDuration()) {
  Leader leader;
  GroupOptions o = Options(0, size, port);
  ServingRequest r = Request(map, gpus, 4);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> facts = GroupFacts(r, size);
  if (!facts.ok()) return facts.status();
  o.facts = *facts;
  absl::StatusOr<std::unique_ptr<NodeGroup>> group = NodeGroup::Join(o);
  if (!group.ok()) return group.status();
  leader.group = *std::move(group);
  absl::StatusOr<LoadOptions> load = PlanForGroup(*leader.group, r);
  if (!load.ok()) return load.status();
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadedModel::Load(*load);
  if (!model.ok()) return model.status();
  leader.model = *std::move(model);
  absl::SleepFor(loads_for);  // a leader whose own stages take long to load
  if (absl::Status s = AwaitGroupReady(*leader.group); !s.ok()) return s;
  EngineOptions options;
  options.micro_batches = 3;
  options.prefill_chunk_tokens = 4;
  options.group = leader.group.get();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Start(*leader.model, nullptr, {}, options);
  if (!engine.ok()) return engine.status();
  leader.engine = *std::move(engine);
  return leader;
}

TEST(Group, TwoNodesGenerateWhatOneProcessGenerates) {
  // Node 0 runs the embedding and layer 0 on its GPU 0, node 1 the rest (and samples) on its GPU 0, plan GPU 1.
  const std::vector<std::vector<int32_t>> expected = OneProcess(kTwoStageMap, 2);
  const int port = FreePort();
  std::future<absl::Status> worker = StartWorker(1, 2, port, 1);
  absl::StatusOr<Leader> leader = StartLeader(2, port, kTwoStageMap, 1);
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_EQ(leader->model->report().stages.find("on node 1") != std::string::npos, true)
      << leader->model->report().stages;
  EXPECT_EQ(Generate(*leader->engine, 10), expected);
  // A second round reuses the KV blocks (prefix hits on both nodes).
  EXPECT_EQ(Generate(*leader->engine, 10), expected);
  // As strata-server stops: the engine's executor says goodbye (workers end cleanly).
  leader->engine.reset();
  ASSERT_EQ(worker.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(worker.get().ok());
}

TEST(Group, AWorkerWaitsOutALeaderThatLoadsLongerThanTheDeadline) {
  // The worker loads at once and serves; the leader takes more than two --group-deadlines (5 s each here) longer to
  // load its own stages. Its heartbeats, from the moment the group formed, keep the worker from counting it lost.
  const std::vector<std::vector<int32_t>> expected = OneProcess(kTwoStageMap, 2);
  const int port = FreePort();
  std::future<absl::Status> worker = StartWorker(1, 2, port, 1);
  absl::StatusOr<Leader> leader = StartLeader(2, port, kTwoStageMap, 1, absl::Seconds(11));
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_EQ(worker.wait_for(std::chrono::seconds(0)), std::future_status::timeout) << "the worker ended early";
  EXPECT_EQ(Generate(*leader->engine, 10), expected);
  leader->engine.reset();
  ASSERT_EQ(worker.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(worker.get().ok());
}

TEST(Group, ThreeNodesAndABackAndForthPlan) {
  // Plan GPUs 0 (node 0), 1 (node 1), 2 (node 2); the head goes back to node 0: 0 -> 1 -> 2 -> 0.
  const std::string map = R"({"model.embed_tokens": 0, "model.layers.0": 1, "model.layers.1": 2,
      "model.layers.2": 2, "model.norm": 2, "lm_head": 0})";
  const std::vector<std::vector<int32_t>> expected = OneProcess(map, 3);
  const int port = FreePort();
  std::future<absl::Status> w1 = StartWorker(1, 3, port, 1);
  std::future<absl::Status> w2 = StartWorker(2, 3, port, 1);
  absl::StatusOr<Leader> leader = StartLeader(3, port, map, 1);
  ASSERT_TRUE(leader.ok()) << leader.status();
  EXPECT_EQ(Generate(*leader->engine, 10), expected);
  // As strata-server stops: the engine's executor says goodbye (workers end cleanly).
  leader->engine.reset();
  for (auto* w : {&w1, &w2}) {
    ASSERT_EQ(w->wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_TRUE(w->get().ok());
  }
}

}  // namespace
}  // namespace strata::runtime
