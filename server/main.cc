// strata-server: plans a model's placement at start-up and serves it over gRPC and /metrics.
// Exit status: 0 after SIGINT/SIGTERM, 2 on a bad flag or plan, 1 on any other failure (a device that
// became unusable while serving included: a supervisor restarts the process).

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "server/flags.h"
#include "server/running_server.h"
#include "server/served_model.h"
#include "server/served_plan.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;
// Raised by the engine's device-lost callback; blocked in every thread like SIGINT/SIGTERM, so sigwait takes it.
constexpr int kDeviceLostSignal = SIGUSR1;

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
  const bool serve_weights = options.model_dir && strata::server::HasWeights(*options.model_dir);
  // The machine, discovered once (what transformers reads when it gets no max_memory): every visible
  // GPU's free memory and the host's available memory.
  std::optional<strata::planner::MachineInventory> inventory;
  if (!options.max_memory) {
    absl::StatusOr<strata::planner::MachineInventory> discovered = strata::planner::DiscoverInventory();
    if (!discovered.ok()) {
      std::cerr << "strata-server: " << discovered.status().message() << "\n";
      return kExitFailure;
    }
    inventory = *std::move(discovered);
    std::cout << "strata-server: machine: " << strata::planner::InventoryToString(*inventory) << std::endl;
  }
  // One plan per process, made before anything starts: a bad plan exits 2 at once.
  std::optional<strata::server::ServedPlan> plan;
  std::optional<strata::runtime::LoadOptions> load;
  if (serve_weights) {
    absl::StatusOr<strata::runtime::LoadOptions> planned = strata::server::PlanServedModel(options, inventory);
    if (!planned.ok()) {
      std::cerr << "strata-server: " << planned.status().message() << "\n";
      return planned.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
    }
    load = *std::move(planned);
  } else {
    absl::StatusOr<strata::server::ServedPlan> served = strata::server::MakeServedPlan(options, inventory);
    if (!served.ok()) {
      std::cerr << "strata-server: " << served.status().message() << "\n";
      return kExitBadInput;
    }
    plan = *std::move(served);
  }

  // Loudly: a plan that names GPUs but serves from the CPU is almost never what the operator wants.
  for (const std::string& warning : plan ? plan->plan.warnings : load->plan.warnings) {
    std::cerr << "strata-server: WARNING: " << warning << "\n";
  }

  // The port opens before the weights load: health says NOT_SERVING and Generate UNAVAILABLE meanwhile.
  absl::StatusOr<std::unique_ptr<strata::server::RunningServer>> server = strata::server::RunningServer::Start(options);
  if (!server.ok()) {
    std::cerr << "strata-server: " << server.status().message() << "\n";
    return kExitFailure;
  }
  if (plan) {
    std::cout << strata::planner::PlanToTable(plan->spec, plan->plan);
    (*server)->ServePlan(*std::move(plan));
    std::cout << "strata-server: serving GetDeviceMap on " << (*server)->grpc_address().ToString() << ", metrics on "
              << (*server)->metrics_address().ToString() << "/metrics" << std::endl;
  } else {
    std::cout << "strata-server: loading " << options.model_dir->string() << " (NOT_SERVING on "
              << (*server)->grpc_address().ToString() << " until loaded)" << std::endl;
    // Signals wait (blocked) until the load ends: a load is seconds to minutes, and stopping halfway
    // would leave nothing to clean up that exiting does not.
    // A sticky device error: report NOT_SERVING at once, then let the main thread shut down (answering
    // what is in flight, every generation having ended INTERNAL) and exit 1.
    strata::server::RunningServer* running = server->get();
    auto on_device_lost = [running](const absl::Status&) {
      running->MarkNotServing();
      kill(getpid(), kDeviceLostSignal);
    };
    absl::StatusOr<std::unique_ptr<strata::server::ServedModel>> model =
        strata::server::ServedModel::Load(options, *load, on_device_lost);
    if (!model.ok()) {
      std::cerr << "strata-server: " << model.status().message() << "\n";
      (*server)->Shutdown();
      return model.status().code() == absl::StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
    }
    const strata::runtime::LoadReport& report = (*model)->model().report();
    std::cout << strata::planner::PlanToTable(report.spec, report.plan) << report.stages << "\n"
              << "strata-server: loaded in " << report.seconds << " s (" << report.dtype << ", "
              << ((*model)->tokenizer() != nullptr ? "tokenizer.json" : "no tokenizer: token ids only") << ")\n";
    (*server)->ServeModel(*std::move(model));
    std::cout << "strata-server: serving Generate and GetDeviceMap on " << (*server)->grpc_address().ToString()
              << ", metrics on " << (*server)->metrics_address().ToString() << "/metrics" << std::endl;
  }

  int signal_number = 0;
  if (int error = sigwait(&stop_signals, &signal_number); error != 0) {
    std::cerr << "strata-server: sigwait: " << std::strerror(error) << "\n";
    return kExitFailure;
  }
  if (signal_number == kDeviceLostSignal) {
    std::cerr << "strata-server: a device is unusable, shutting down\n";
    (*server)->Shutdown();
    return kExitFailure;
  }
  std::cerr << "strata-server: " << (signal_number == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down\n";
  (*server)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT and SIGTERM before any thread exists: gRPC's, the engine's and /metrics' threads inherit the mask,
  // so the signals wait for sigwait in Run instead of killing the process mid-call.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, kDeviceLostSignal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::vector<std::string> args(argv + 1, argv + argc);
  return Run(args, stop_signals);
}
