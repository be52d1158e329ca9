// strata-server: plans a model's placement at start-up and serves it over gRPC and /metrics.
// Exit status: 0 after SIGINT/SIGTERM/SIGHUP (after the graceful drain; at once when the stop comes during the
// load), 2 on a bad flag or plan, 1 on any other failure (a device that became unusable while serving
// included: a supervisor restarts the process).

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "planner/plan.h"
#include "runtime/engine/draft_model.h"
#include "runtime/executor/group_load.h"
#include "server/flags.h"
#include "server/log_limiter.h"
#include "server/running_server.h"
#include "server/served_model.h"
#include "server/served_plan.h"
#include "server/worker_health.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;
// Raised by the engine's device-lost callback; blocked in every thread like SIGINT/SIGTERM, so sigwait takes it.
constexpr int kDeviceLostSignal = SIGUSR1;
// Raised by this process's own threads to wake the main thread: the load ended, or the drain has nothing
// left in flight. The main thread then looks at the state again.
constexpr int kLookAgainSignal = SIGUSR2;

using Clock = std::chrono::steady_clock;

// SIGHUP (a closed terminal, or a habitual "reload") stops the server as SIGTERM does: gracefully, with
// the drain. strata has no configuration to reload; the default action would end it at once.
bool IsStopSignal(int signal_number) {
  return signal_number == SIGINT || signal_number == SIGTERM || signal_number == SIGHUP;
}

const char* SignalName(int signal_number) {
  return signal_number == SIGINT ? "SIGINT" : signal_number == SIGHUP ? "SIGHUP" : "SIGTERM";
}

// The next of `signals` (all blocked in every thread), or 0 once `deadline` passed; -1 when waiting failed.
int WaitForSignal(const sigset_t& signals, std::optional<Clock::time_point> deadline) {
  for (;;) {
    int signal_number = 0;
    if (!deadline) {
      const int error = sigwait(&signals, &signal_number);
      if (error == 0) return signal_number;
      if (error == EINTR) continue;
      std::cerr << "strata-server: sigwait: " << std::strerror(error) << "\n";
      return -1;
    }
    const auto left = std::max(Clock::duration::zero(), *deadline - Clock::now());
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(left);
    const timespec timeout{static_cast<time_t>(seconds.count()),
                           static_cast<long>(std::chrono::nanoseconds(left - seconds).count())};
    signal_number = sigtimedwait(&signals, nullptr, &timeout);
    if (signal_number > 0) return signal_number;
    if (errno == EAGAIN) return 0;
    if (errno == EINTR) continue;
    std::cerr << "strata-server: sigtimedwait: " << std::strerror(errno) << "\n";
    return -1;
  }
}

// The result of the load thread, read by the main thread once `done`.
struct ModelLoad {
  std::mutex mutex;
  bool done = false;
  absl::StatusOr<std::unique_ptr<strata::server::ServedModel>> model = absl::UnknownError("not loaded");
};

// The graceful drain after the first SIGINT/SIGTERM: health NOT_SERVING and new Generate calls
// UNAVAILABLE at once; generations in flight run to their end for up to `timeout` (a second stop signal
// ends the wait early), then the rest are cut (UNAVAILABLE). 0, or 1 when a device was lost meanwhile.
int Drain(strata::server::RunningServer& running, std::chrono::milliseconds timeout, int stop_signal,
          const sigset_t& signals) {
  const auto deadline = Clock::now() + timeout;
  const int64_t in_flight = running.BeginDrain([] { kill(getpid(), kLookAgainSignal); });
  std::cerr << "strata-server: " << SignalName(stop_signal) << ", draining: NOT_SERVING, " << in_flight
            << " generations in flight, --drain-timeout " << std::chrono::duration<double>(timeout).count() << " s"
            << std::endl;
  bool device_lost = false;
  while (running.generations_in_flight() > 0) {
    const int signal_number = WaitForSignal(signals, deadline);
    if (signal_number <= 0) break;  // the timeout (or waiting failed): cut what runs
    if (signal_number == kDeviceLostSignal) {
      // Every generation ends INTERNAL: the drain ends by itself; the process then exits 1.
      std::cerr << "strata-server: a device is unusable or a node of the group was lost\n";
      device_lost = true;
    } else if (IsStopSignal(signal_number)) {
      std::cerr << "strata-server: " << SignalName(signal_number) << " again: cutting what is in flight now\n";
      break;
    }
  }
  const strata::server::DrainCounts counts = running.EndDrain();
  std::cerr << "strata-server: drained: " << counts.finished << " of " << counts.in_flight << " generations finished, "
            << counts.cut << " cut (UNAVAILABLE); shutting down" << std::endl;
  running.Shutdown();
  return device_lost ? kExitFailure : 0;
}

// The serving line's word on the HTTP API, when it is on.
std::string HttpLine(const strata::server::RunningServer& running) {
  if (!running.http_address()) return "";
  return absl::StrCat(", the OpenAI-compatible HTTP API on ", running.http_address()->ToString());
}

// The start-up line's word on the chat template: its names, or that there is none.
std::string ChatTemplateSummary(const strata::chat_template::CheckpointChatTemplate* chat) {
  if (chat == nullptr) return "no chat template";
  std::vector<std::string> names;
  for (const auto& [name, unused] : chat->templates) names.push_back(name);
  return absl::StrCat("chat template ", absl::StrJoin(names, ", "));
}

// Start-up steps give back the exit status when strata-server ends there (the reason already printed),
// nothing when it goes on.
using EarlyExit = std::optional<int>;

// The plan made at start-up: with weights to serve, the load options (whose plan the load follows);
// without, the plan alone, served by GetDeviceMap.
struct StartupPlan {
  std::optional<strata::server::ServedPlan> plan;
  std::optional<strata::runtime::LoadOptions> load;
  std::optional<strata::runtime::LoadOptions> draft;  // --draft-model, planned beside `load`
};

// The machine, discovered once (what transformers reads when it gets no max_memory): every visible
// GPU's free memory and the host's available memory. Nothing to discover with --max-memory.
EarlyExit DiscoverMachine(const strata::server::ServerOptions& options,
                          std::optional<strata::planner::MachineInventory>& inventory) {
  if (options.placement.max_memory) return std::nullopt;
  absl::StatusOr<strata::planner::MachineInventory> discovered = strata::planner::DiscoverInventory();
  if (!discovered.ok()) {
    std::cerr << "strata-server: " << discovered.status().message() << "\n";
    return kExitFailure;
  }
  inventory = *std::move(discovered);
  std::cout << "strata-server: machine: " << strata::planner::InventoryToString(*inventory) << std::endl;
  return std::nullopt;
}

// One plan per process, made before anything starts: a bad plan exits 2 at once.
EarlyExit MakeStartupPlan(const strata::server::ServerOptions& options, bool serve_weights,
                          const std::optional<strata::planner::MachineInventory>& inventory,
                          strata::runtime::NodeGroup* group, StartupPlan& startup) {
  if (serve_weights) {
    // A group's leader plans for the group's GPUs and sends every worker its part.
    absl::StatusOr<strata::runtime::ServingRequest> request =
        strata::server::ServingRequestOf(options.placement, options.serving, inventory);
    // Errors name their flag (planner::LoadAndPlace prefixes the spec's with --model DIR).
    absl::StatusOr<strata::runtime::LoadOptions> planned =
        !request.ok()      ? absl::StatusOr<strata::runtime::LoadOptions>(request.status())
        : group == nullptr ? strata::runtime::PlanLoad(*request)
                           : strata::runtime::PlanForGroup(*group, *request);
    if (planned.ok() && !options.serving.speculative.draft_model.empty()) {
      // The draft model, planned beside the model with what its plan leaves (runtime/engine/draft_model.h); in a
      // group, on the leader's devices (it runs beside the engine and sampler).
      const std::filesystem::path draft_dir = options.serving.speculative.draft_model;
      absl::Status draft = strata::runtime::CheckDraftTokenizer(request->model_dir, draft_dir);
      if (draft.ok()) {
        absl::StatusOr<strata::runtime::LoadOptions> draft_load =
            strata::runtime::PlanDraftLoad(*request, *planned, draft_dir);
        if (draft_load.ok()) startup.draft = *std::move(draft_load);
        draft = draft_load.status();
      }
      if (!draft.ok()) planned = draft;
    }
    if (!planned.ok()) {
      std::cerr << "strata-server: " << planned.status().message() << "\n";
      return planned.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
    }
    startup.load = *std::move(planned);
  } else {
    absl::StatusOr<strata::server::ServedPlan> served =
        strata::server::PlanWithoutWeights(options.placement, inventory);
    if (!served.ok()) {
      std::cerr << "strata-server: " << served.status().message() << "\n";
      return kExitBadInput;
    }
    startup.plan = *std::move(served);
  }
  return std::nullopt;
}

// The plan's warnings and, when serving weights, the notes on how they will be served.
void PrintPlanWarnings(const strata::server::ServerOptions& options, const StartupPlan& startup) {
  // Loudly: a plan that names GPUs but serves from the CPU is almost never what the operator wants.
  for (const std::string& warning : startup.plan ? startup.plan->plan.warnings : startup.load->plan.warnings) {
    std::cerr << "strata-server: WARNING: " << warning << "\n";
  }
  if (startup.load) {
    const strata::server::ServingNotes notes =
        strata::server::NotesOnServing(options.placement, options.serving, *startup.load);
    for (const std::string& warning : notes.warnings) std::cerr << "strata-server: WARNING: " << warning << "\n";
    for (const std::string& note : notes.notes) std::cerr << "strata-server: " << note << "\n";
  }
}

// Waits for signals while the load thread runs, until it is `done`: returns the stop signal that came
// as the load ended (0 if none), or -1 when waiting failed. A stop before that ends the process here.
int WaitWhileLoading(ModelLoad& load_state, strata::server::RunningServer& running, const sigset_t& stop_signals) {
  for (;;) {
    const int signal_number = WaitForSignal(stop_signals, std::nullopt);
    if (signal_number < 0) return -1;
    std::lock_guard lock(load_state.mutex);
    if (load_state.done) return IsStopSignal(signal_number) ? signal_number : 0;
    if (!IsStopSignal(signal_number)) continue;
    // The load cannot be interrupted (it is inside LibTorch and the checkpoint reader), and waiting for
    // it is what a stop must not do. Close the port (clients see the server go), then end the process
    // without running destructors or atexit handlers: _Exit ends the loader thread with it, so nothing
    // frees state that thread still uses, and the kernel and the GPU driver reclaim its memory and
    // mappings. Nothing was served, so nothing is lost.
    std::cerr << "strata-server: " << SignalName(signal_number) << " while loading: exiting without waiting for "
              << "the load" << std::endl;
    running.Shutdown();
    std::cout.flush();
    std::cerr.flush();
    std::_Exit(0);
  }
}

// Loads the weights by `load` and serves them; the port is already open (NOT_SERVING until then).
EarlyExit LoadAndServe(strata::server::RunningServer& running, const strata::server::ServerOptions& options,
                       const strata::runtime::LoadOptions& load,
                       const std::optional<strata::runtime::LoadOptions>& draft, strata::runtime::NodeGroup* group,
                       const sigset_t& stop_signals) {
  std::cout << "strata-server: loading " << options.placement.model_dir->string() << " (NOT_SERVING on "
            << running.grpc_address().ToString() << " until loaded)" << std::endl;
  // A sticky device error: report NOT_SERVING at once, then let the main thread shut down (answering
  // what is in flight, every generation having ended INTERNAL) and exit 1.
  auto on_device_lost = [&running](const absl::Status&) {
    running.MarkDeviceLost();
    kill(getpid(), kDeviceLostSignal);
  };
  // The load runs on its own thread while this one waits for signals, so that a stop during a load of
  // minutes is obeyed at once.
  ModelLoad load_state;
  std::thread loader([&] {
    absl::StatusOr<std::unique_ptr<strata::server::ServedModel>> loaded =
        strata::server::ServedModel::Load(options, load, draft ? &*draft : nullptr, on_device_lost, group);
    {
      std::lock_guard lock(load_state.mutex);
      load_state.model = std::move(loaded);
      load_state.done = true;
    }
    kill(getpid(), kLookAgainSignal);
  });
  const int stop_during_load = WaitWhileLoading(load_state, running, stop_signals);
  loader.join();
  if (stop_during_load < 0) {
    running.Shutdown();
    return kExitFailure;
  }
  absl::StatusOr<std::unique_ptr<strata::server::ServedModel>>& model = load_state.model;
  if (!model.ok()) {
    std::cerr << "strata-server: " << model.status().message() << "\n";
    running.Shutdown();
    return model.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  if (stop_during_load != 0) {
    // The stop came as the load ended: nothing was served, so there is nothing to drain.
    std::cerr << "strata-server: " << SignalName(stop_during_load) << " while loading, shutting down\n";
    running.Shutdown();
    return 0;
  }
  const strata::runtime::LoadReport& report = (*model)->model().report();
  std::cout << strata::planner::PlanToTable(report.spec, report.plan) << report.stages << "\n"
            << "strata-server: loaded in " << report.seconds << " s (" << report.dtype << ", "
            << ((*model)->tokenizer() != nullptr ? "tokenizer.json" : "no tokenizer: token ids only") << ", "
            << ChatTemplateSummary((*model)->chat_template()) << ")\n";
  if (const strata::runtime::LoadedModel* draft = (*model)->draft(); draft != nullptr) {
    std::cout << "strata-server: draft model " << draft->report().spec.architecture << " ("
              << options.serving.speculative.draft_model << "), planned beside it:\n"
              << strata::planner::PlanToTable(draft->report().spec, draft->report().plan) << draft->report().stages
              << "\n";
  }
  running.ServeModel(*std::move(model));
  std::cout << "strata-server: serving Generate and GetDeviceMap on " << running.grpc_address().ToString()
            << HttpLine(running) << ", metrics on " << running.metrics_address().ToString() << "/metrics" << std::endl;
  return std::nullopt;
}

// Serves until a stop signal, then drains; a lost device ends the server at once (exit 1).
int ServeUntilStopped(strata::server::RunningServer& running, const strata::server::ServerOptions& options,
                      const sigset_t& stop_signals) {
  int stop_signal = 0;
  while (stop_signal == 0) {
    const int signal_number = WaitForSignal(stop_signals, std::nullopt);
    if (signal_number < 0) return kExitFailure;
    if (signal_number == kDeviceLostSignal) {
      std::cerr << "strata-server: a device is unusable or a node of the group was lost, shutting down\n";
      running.Shutdown();
      return kExitFailure;
    }
    if (IsStopSignal(signal_number)) stop_signal = signal_number;
  }
  return Drain(running, options.lifecycle.drain_timeout, stop_signal, stop_signals);
}

// The group this node joins (--group-size > 1): its secret, its facts, the leader's address. Errors are printed.
std::unique_ptr<strata::runtime::NodeGroup> JoinGroup(const strata::server::ServerOptions& options,
                                                      const std::optional<strata::planner::MachineInventory>& inventory,
                                                      int& exit_code) {
  const strata::server::GroupFlags& flags = options.group;
  absl::StatusOr<strata::runtime::ServingRequest> request =
      strata::server::ServingRequestOf(options.placement, options.serving, inventory);
  if (!request.ok()) {
    std::cerr << "strata-server: " << request.status().message() << "\n";
    exit_code = kExitBadInput;
    return nullptr;
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> facts =
      strata::runtime::GroupFacts(*request, flags.size);
  if (!facts.ok()) {
    std::cerr << "strata-server: " << facts.status().message() << "\n";
    exit_code = kExitBadInput;
    return nullptr;
  }
  strata::runtime::GroupOptions group;
  group.rank = flags.rank;
  group.size = flags.size;
  group.leader_host = flags.leader_host;
  group.leader_port = flags.leader_port;
  group.worker_port = flags.worker_port;
  group.bind_host = flags.bind_host;
  group.secret = flags.secret;
  group.facts = *std::move(facts);
  group.start_timeout = absl::FromChrono(flags.timeout);
  group.deadline = absl::FromChrono(flags.deadline);
  std::cout << "strata-server: node " << flags.rank << " of a group of " << flags.size << ": "
            << (flags.rank == 0 ? absl::StrCat("waiting for ", flags.size - 1, " workers on port ", flags.leader_port)
                                : absl::StrCat("joining the leader at ", flags.leader_host, ":", flags.leader_port))
            << std::endl;
  absl::StatusOr<std::unique_ptr<strata::runtime::NodeGroup>> joined = strata::runtime::NodeGroup::Join(group);
  if (!joined.ok()) {
    std::cerr << "strata-server: " << joined.status().message() << "\n";
    exit_code = absl::IsInvalidArgument(joined.status()) ? kExitBadInput : kExitFailure;
    return nullptr;
  }
  std::cout << "strata-server: the group formed (" << flags.size << " nodes)" << std::endl;
  return *std::move(joined);
}

// A worker of a group (--rank > 0): no gRPC; it takes the leader's plan, loads its stages and runs them until the
// group ends. SIGTERM is this node leaving: the leader ends the group at once (it is recreated). Exit 0 when the
// leader drained and left, 1 when the group was lost (a peer gone or silent), 2 on a bad flag.
int RunWorker(const strata::server::ServerOptions& options,
              const std::optional<strata::planner::MachineInventory>& inventory, const sigset_t& stop_signals) {
  // The health port (--listen) first: probes reach the pod while the group forms and the stages load.
  absl::StatusOr<std::unique_ptr<strata::server::WorkerHealth>> health = strata::server::WorkerHealth::Start(options);
  if (!health.ok()) {
    std::cerr << "strata-server: " << health.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << "strata-server: node " << options.group.rank << ": health checks on " << (*health)->address().ToString()
            << " (NOT_SERVING until its stages are loaded)" << std::endl;
  int exit_code = kExitFailure;
  std::unique_ptr<strata::runtime::NodeGroup> group = JoinGroup(options, inventory, exit_code);
  if (group == nullptr) return exit_code;
  absl::StatusOr<strata::runtime::ServingRequest> request =
      strata::server::ServingRequestOf(options.placement, options.serving, inventory);
  absl::StatusOr<strata::runtime::LoadOptions> load =
      request.ok() ? strata::runtime::TakeGroupPlan(*group, *std::move(request))
                   : absl::StatusOr<strata::runtime::LoadOptions>(request.status());
  if (!load.ok()) {
    std::cerr << "strata-server: " << load.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << "strata-server: node " << options.group.rank << ": loading its stages of the leader's plan" << std::endl;
  strata::runtime::ExecutorOptions executor;
  executor.intra_op_threads = options.serving.intra_op_threads;
  executor.fault = options.serving.fault;
  std::mutex mutex;
  std::optional<absl::Status> ended;
  std::thread stages([&] {
    absl::Status status = strata::runtime::ServeGroupStages(*group, *load, executor, [&] {
      (*health)->SetServing(true);
      std::cout << "strata-server: node " << options.group.rank << ": serving its stages" << std::endl;
    });
    (*health)->SetServing(false);
    {
      std::lock_guard lock(mutex);
      ended = std::move(status);
    }
    kill(getpid(), kLookAgainSignal);
  });
  for (;;) {
    const int signal_number = WaitForSignal(stop_signals, std::nullopt);
    if (signal_number < 0 || IsStopSignal(signal_number)) {
      // Leaving: the leader hears it at once (not at its deadline); what this node ran is lost with it, so the
      // process ends without waiting for its stages.
      const std::string why =
          absl::StrCat("node ", options.group.rank, " got ",
                       signal_number < 0 ? "an error waiting for signals" : SignalName(signal_number));
      std::cerr << "strata-server: " << why << ": leaving the group" << std::endl;
      group->Leave(why);
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(0);
    }
    std::lock_guard lock(mutex);
    if (ended) break;
  }
  stages.join();
  if (ended->ok()) {
    std::cout << "strata-server: the leader left the group; node " << options.group.rank << " exits" << std::endl;
    return 0;
  }
  std::cerr << "strata-server: " << ended->message() << "\n";
  return kExitFailure;
}

int Run(std::span<const std::string> args, const sigset_t& stop_signals) {
  using strata::server::ServerCommand;
  absl::StatusOr<ServerCommand> command = strata::server::ParseServerFlags(args);
  if (!command.ok()) {
    std::cerr << "strata-server: " << command.status().message() << "\n"
              << "Run strata-server --help for usage.\n";
    return kExitBadInput;
  }
  if (command->help) {
    std::cout << strata::server::ServerUsage();
    return 0;
  }

  const strata::server::ServerOptions& options = command->options;
  const bool serve_weights = options.placement.model_dir && strata::server::HasWeights(*options.placement.model_dir);
  std::optional<strata::planner::MachineInventory> inventory;
  if (EarlyExit exit = DiscoverMachine(options, inventory)) return *exit;
  std::unique_ptr<strata::runtime::NodeGroup> group;
  if (options.group.size > 1) {
    if (!serve_weights) {
      std::cerr << "strata-server: --group-size: a group serves weights; " << options.placement.model_dir->string()
                << " holds no *.safetensors\n";
      return kExitBadInput;
    }
    if (options.group.rank > 0) return RunWorker(options, inventory, stop_signals);
    int exit_code = kExitFailure;
    group = JoinGroup(options, inventory, exit_code);
    if (group == nullptr) return exit_code;
  }
  StartupPlan startup;
  if (EarlyExit exit = MakeStartupPlan(options, serve_weights, inventory, group.get(), startup)) return *exit;
  PrintPlanWarnings(options, startup);

  // The port opens before the weights load: health says NOT_SERVING and Generate UNAVAILABLE meanwhile.
  absl::StatusOr<std::unique_ptr<strata::server::RunningServer>> server = strata::server::RunningServer::Start(options);
  if (!server.ok()) {
    std::cerr << "strata-server: " << server.status().message() << "\n";
    return kExitFailure;
  }
  strata::server::RunningServer& running = **server;
  if (startup.plan) {
    std::cout << strata::planner::PlanToTable(startup.plan->spec, startup.plan->plan);
    running.ServePlan(*std::move(startup.plan));
    std::cout << "strata-server: serving GetDeviceMap on " << running.grpc_address().ToString() << ", metrics on "
              << running.metrics_address().ToString() << "/metrics" << std::endl;
  } else if (EarlyExit exit = LoadAndServe(running, options, *startup.load, startup.draft, group.get(), stop_signals)) {
    return *exit;
  }
  // Drained or lost, the workers end with the group (the engine's executor says goodbye as it stops).
  return ServeUntilStopped(running, options, stop_signals);
}

}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT, SIGTERM, SIGHUP and our own two before any thread exists: gRPC's, the engine's and /metrics' threads
  // inherit the mask, so the signals wait for sigwait in Run instead of killing the process mid-call.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  sigaddset(&stop_signals, kDeviceLostSignal);
  sigaddset(&stop_signals, kLookAgainSignal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // libprotobuf logs an ERROR line per request with invalid UTF-8 in a string field: identical lines at
  // most once a minute, with a count.
  strata::server::RateLimitProtobufLog();

  std::vector<std::string> args(argv + 1, argv + argc);
  return Run(args, stop_signals);
}
