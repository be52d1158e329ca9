// strata-server: plans a model's placement at start-up and serves it over gRPC and /metrics.
// Exit status: 0 after SIGINT/SIGTERM, 2 on a bad flag or plan, 1 on any other failure.

#include <pthread.h>
#include <signal.h>

#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "server/flags.h"
#include "server/running_server.h"
#include "server/served_plan.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

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

  absl::StatusOr<strata::server::ServedPlan> served = strata::server::MakeServedPlan(command->options);
  if (!served.ok()) {
    std::cerr << "strata-server: " << served.status().message() << "\n";
    return kExitBadInput;
  }
  std::cout << strata::planner::PlanToTable(served->spec, served->plan);

  absl::StatusOr<std::unique_ptr<strata::server::RunningServer>> server =
      strata::server::RunningServer::Start(*served, command->options);
  if (!server.ok()) {
    std::cerr << "strata-server: " << server.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << "strata-server: serving GetDeviceMap on " << (*server)->grpc_address().ToString() << ", metrics on "
            << (*server)->metrics_address().ToString() << "/metrics" << std::endl;

  int signal_number = 0;
  if (int error = sigwait(&stop_signals, &signal_number); error != 0) {
    std::cerr << "strata-server: sigwait: " << std::strerror(error) << "\n";
    return kExitFailure;
  }
  std::cerr << "strata-server: " << (signal_number == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down\n";
  (*server)->Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Block SIGINT and SIGTERM before any thread exists: gRPC's and civetweb's threads inherit the mask,
  // so the signals wait for sigwait in Run instead of killing the process mid-call.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::vector<std::string> args(argv + 1, argv + argc);
  return Run(args, stop_signals);
}
