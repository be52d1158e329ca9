// strata-client: a command-line client of strata-server.
//   strata-client [--server HOST:PORT] generate (--prompt TEXT | --prompt-ids 1,2,3) [options]
//       streams the generated text to stdout as it arrives; finish reason and usage go to stderr.
//   strata-client [--server HOST:PORT] device-map
//       prints the served plan: modules per stage, each device's budget, planned and measured memory.
// Exit status: 0 on success, 2 on bad input (a bad flag, or INVALID_ARGUMENT from the server), 1 otherwise.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "strata/v1/strata.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "strata-server's gRPC address");
ABSL_FLAG(std::string, prompt, "", "text, encoded with the served checkpoint's tokenizer.json");
ABSL_FLAG(std::string, prompt_ids, "", "token ids instead of text");
ABSL_FLAG(uint32_t, max_new_tokens, 64, "new tokens to generate");
ABSL_FLAG(float, temperature, 0, "0 is greedy; otherwise sample from softmax(logits / T)");
ABSL_FLAG(float, top_p, 1, "sample from the most likely tokens whose probabilities add up to P, in (0, 1]");
ABSL_FLAG(uint32_t, top_k, 0, "sample from the K most likely tokens; 0: all");
ABSL_FLAG(float, repetition_penalty, 1, "divide the logits of tokens already seen by R (transformers' rule)");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed: the same request with the same seed gives the same tokens");
ABSL_FLAG(std::string, stop, "", "stop before this text (repeatable)");
ABSL_FLAG(bool, no_special_tokens, false, "do not add BOS and the like to a text prompt");
ABSL_FLAG(bool, ids, false, "also print the generated token ids (stderr)");
ABSL_FLAG(double, timeout, 600, "deadline of the call, in seconds");

namespace {

using strata::cli::Flag;

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-client [--server HOST:PORT] COMMAND [options]

commands:
  generate                  stream a continuation of a prompt to stdout (options below)
  device-map                print the served plan and each device's memory
)";
    command.flags = {Flag(FLAGS_server, "HOST:PORT"),
                     Flag(FLAGS_prompt, "TEXT").Section("generate:"),
                     Flag(FLAGS_prompt_ids, "1,2,3"),
                     Flag(FLAGS_max_new_tokens, "N"),
                     Flag(FLAGS_temperature, "T"),
                     Flag(FLAGS_top_p, "P"),
                     Flag(FLAGS_top_k, "K"),
                     Flag(FLAGS_repetition_penalty, "R").ShowDefault("1, none"),
                     Flag(FLAGS_seed, "S").ShowDefault("none"),
                     Flag(FLAGS_stop, "STR").Repeatable(),
                     Flag(FLAGS_no_special_tokens),
                     Flag(FLAGS_ids),
                     Flag(FLAGS_timeout, "SECONDS")};
    command.max_positional = 1;  // the command
    return command;
  }();
  return command;
}

int BadInput(const std::string& message) {
  std::cerr << "strata-client: " << message << "\nRun strata-client --help for usage.\n";
  return kExitBadInput;
}

int RpcFailed(const char* what, const grpc::Status& status) {
  std::cerr << "strata-client: " << what << " failed: " << status.error_code() << " " << status.error_message() << "\n";
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput : kExitFailure;
}

int Generate(strata::v1::InferenceService::Stub& stub, const strata::cli::ParsedArgs& flags) {
  strata::v1::GenerateRequest request;
  request.set_prompt(absl::GetFlag(FLAGS_prompt));
  if (flags.Given(FLAGS_prompt_ids)) {
    for (absl::string_view piece : absl::StrSplit(absl::GetFlag(FLAGS_prompt_ids), ',')) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(piece, &id))
        return BadInput("--prompt-ids: \"" + std::string(piece) + "\" is not a token id");
      request.add_prompt_ids(id);
    }
  }
  if (request.prompt().empty() && request.prompt_ids_size() == 0)
    return BadInput("generate: give --prompt or --prompt-ids");
  const double timeout_s = absl::GetFlag(FLAGS_timeout);
  request.set_max_new_tokens(absl::GetFlag(FLAGS_max_new_tokens));
  request.set_top_k(absl::GetFlag(FLAGS_top_k));
  request.set_temperature(absl::GetFlag(FLAGS_temperature));
  // Optional fields stay absent unless given: the server's default applies then.
  if (flags.Given(FLAGS_top_p)) request.set_top_p(absl::GetFlag(FLAGS_top_p));
  if (flags.Given(FLAGS_repetition_penalty)) request.set_repetition_penalty(absl::GetFlag(FLAGS_repetition_penalty));
  if (flags.Given(FLAGS_seed)) request.set_seed(absl::GetFlag(FLAGS_seed));
  for (const std::string& stop : flags.Values(FLAGS_stop)) request.add_stop(stop);
  request.set_add_special_tokens(!absl::GetFlag(FLAGS_no_special_tokens));

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  std::unique_ptr<grpc::ClientReader<strata::v1::GenerateResponse>> reader = stub.Generate(&context, request);
  strata::v1::GenerateResponse response;
  std::vector<int32_t> ids;
  bool any_text = false;
  strata::v1::GenerateResponse last;
  while (reader->Read(&response)) {
    // Each message is written as it comes: the terminal shows the text while it is generated.
    std::cout << response.text() << std::flush;
    any_text = any_text || !response.text().empty();
    ids.insert(ids.end(), response.token_ids().begin(), response.token_ids().end());
    if (response.finish_reason() != strata::v1::GenerateResponse::FINISH_REASON_UNSPECIFIED) last = response;
  }
  const grpc::Status status = reader->Finish();
  if (any_text) std::cout << "\n";
  if (!status.ok()) return RpcFailed("Generate", status);
  std::ostringstream id_list;
  for (size_t i = 0; i < ids.size(); ++i) id_list << (i ? "," : "") << ids[i];
  // A server without a tokenizer sends ids only: they are the output then.
  if (!any_text)
    std::cout << id_list.str() << "\n";
  else if (absl::GetFlag(FLAGS_ids))
    std::cerr << "ids: " << id_list.str() << "\n";
  std::cerr << "[" << strata::v1::GenerateResponse::FinishReason_Name(last.finish_reason()) << ": "
            << last.usage().prompt_tokens() << " prompt tokens, " << last.usage().completion_tokens()
            << " generated]\n";
  return 0;
}

std::string Bytes(double bytes) {
  if (bytes == std::numeric_limits<double>::infinity()) return "unlimited";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  std::ostringstream out;
  out << std::fixed << std::setprecision(u == 0 ? 0 : 1) << bytes << " " << units[u];
  return out.str();
}

int DeviceMap(strata::v1::InferenceService::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  strata::v1::GetDeviceMapResponse reply;
  const grpc::Status status = stub.GetDeviceMap(&context, strata::v1::GetDeviceMapRequest(), &reply);
  if (!status.ok()) return RpcFailed("GetDeviceMap", status);
  std::cout << reply.architecture() << ", " << reply.dtype() << ", strategy " << reply.strategy() << "\n\n";
  std::cout << "stage  device  modules\n";
  for (int s = 0; s < reply.stages_size(); ++s) {
    const auto& stage = reply.stages(s);
    std::cout << std::left << std::setw(7) << s << std::setw(8) << stage.device();
    for (int m = 0; m < stage.modules_size(); ++m) std::cout << (m ? ", " : "") << stage.modules(m);
    std::cout << "\n";
  }
  std::cout << "\n"
            << std::left << std::setw(8) << "device" << std::setw(12) << "budget" << std::setw(12) << "planned"
            << std::setw(12) << "kv cache"
            << "measured (allocated / total, on)\n";
  for (const auto& d : reply.devices()) {
    std::cout << std::setw(8) << d.device() << std::setw(12) << Bytes(d.budget_bytes()) << std::setw(12)
              << Bytes(static_cast<double>(d.planned_bytes())) << std::setw(12)
              << Bytes(static_cast<double>(d.kv_cache_bytes()));
    if (d.has_measured()) {
      std::cout << Bytes(static_cast<double>(d.measured().allocated_bytes())) << " / "
                << Bytes(static_cast<double>(d.measured().total_bytes())) << ", " << d.measured().physical_device();
    } else {
      std::cout << "-";
    }
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<strata::cli::ParsedArgs> parsed = strata::cli::Parse(Command(), argc, argv);
  if (!parsed.ok()) return BadInput(std::string(parsed.status().message()));
  if (parsed->help) {
    std::cout << strata::cli::Help(Command());
    return 0;
  }
  const std::string command = parsed->positional.empty() ? "" : parsed->positional.front();
  if (command != "generate" && command != "device-map")
    return BadInput(command.empty() ? "give a command: generate or device-map" : "unknown command \"" + command + "\"");
  // Every flag but --server belongs to generate.
  const absl::string_view server_flag = absl::GetFlagReflectionHandle(FLAGS_server).Name();
  for (const auto& [name, value] : parsed->given) {
    if (command != "generate" && name != server_flag) {
      return BadInput(strata::cli::Spelling(name) + ": not a flag of " + command);
    }
  }
  auto stub = strata::v1::InferenceService::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials()));
  return command == "generate" ? Generate(*stub, *parsed) : DeviceMap(*stub);
}
