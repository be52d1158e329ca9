// strata-client: a command-line client of strata-server.
//   strata-client [--server HOST:PORT] generate (--prompt TEXT | --prompt-ids 1,2,3) [options]
//       streams the generated text to stdout as it arrives; finish reason and usage go to stderr.
//   strata-client [--server HOST:PORT] device-map
//       prints the served plan: modules per stage, each device's budget, planned and measured memory.
// Exit status: 0 on success, 2 on bad input (a bad flag, or INVALID_ARGUMENT from the server), 1 otherwise.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "strata/v1/strata.grpc.pb.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

constexpr char kUsage[] = R"(usage: strata-client [--server HOST:PORT] COMMAND [options]

  --server HOST:PORT        strata-server's gRPC address (default 127.0.0.1:50051)

commands:
  generate                  stream a continuation of a prompt to stdout
    --prompt TEXT           text, encoded with the served checkpoint's tokenizer.json
    --prompt-ids 1,2,3      token ids instead of text
    --max-new-tokens N      (default 64)
    --temperature T         0 (default) is greedy
    --top-p P  --top-k K  --repetition-penalty R  --seed S
    --stop STR              stop before this text (repeatable)
    --no-special-tokens     do not add BOS and the like to a text prompt
    --ids                   also print the generated token ids (stderr)
    --timeout SECONDS       deadline of the call (default 600)
  device-map                print the served plan and each device's memory
)";

// "--name value" or "--name=value" flags after the command; bare flags map to "".
struct Flags {
  std::multimap<std::string, std::string> values;
  const std::string* Find(const std::string& name) const {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second;
  }
};

int BadInput(const std::string& message) {
  std::cerr << "strata-client: " << message << "\nRun strata-client --help for usage.\n";
  return kExitBadInput;
}

int RpcFailed(const char* what, const grpc::Status& status) {
  std::cerr << "strata-client: " << what << " failed: " << status.error_code() << " " << status.error_message() << "\n";
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput : kExitFailure;
}

template <typename T>
bool ParseNumber(const Flags& flags, const std::string& name, T* out, std::string* error) {
  const std::string* text = flags.Find(name);
  if (text == nullptr) return true;
  bool ok = false;
  if constexpr (std::is_floating_point_v<T>) {
    double value = 0;
    ok = absl::SimpleAtod(*text, &value);
    *out = static_cast<T>(value);
  } else {
    ok = absl::SimpleAtoi(*text, out);
  }
  if (!ok) *error = "--" + name + ": \"" + *text + "\" is not a number";
  return ok;
}

int Generate(strata::v1::InferenceService::Stub& stub, const Flags& flags) {
  strata::v1::GenerateRequest request;
  if (const std::string* prompt = flags.Find("prompt")) request.set_prompt(*prompt);
  if (const std::string* ids = flags.Find("prompt-ids")) {
    for (absl::string_view piece : absl::StrSplit(*ids, ',')) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(piece, &id))
        return BadInput("--prompt-ids: \"" + std::string(piece) + "\" is not a token id");
      request.add_prompt_ids(id);
    }
  }
  if (request.prompt().empty() && request.prompt_ids_size() == 0)
    return BadInput("generate: give --prompt or --prompt-ids");
  uint32_t max_new_tokens = 64, top_k = 0;
  float temperature = 0;
  double timeout_s = 600;
  std::string error;
  float value = 0;
  if (!ParseNumber(flags, "max-new-tokens", &max_new_tokens, &error) || !ParseNumber(flags, "top-k", &top_k, &error) ||
      !ParseNumber(flags, "temperature", &temperature, &error) || !ParseNumber(flags, "timeout", &timeout_s, &error)) {
    return BadInput(error);
  }
  request.set_max_new_tokens(max_new_tokens);
  request.set_top_k(top_k);
  request.set_temperature(temperature);
  if (flags.Find("top-p")) {
    if (!ParseNumber(flags, "top-p", &value, &error)) return BadInput(error);
    request.set_top_p(value);
  }
  if (flags.Find("repetition-penalty")) {
    if (!ParseNumber(flags, "repetition-penalty", &value, &error)) return BadInput(error);
    request.set_repetition_penalty(value);
  }
  if (flags.Find("seed")) {
    uint64_t seed = 0;
    if (!ParseNumber(flags, "seed", &seed, &error)) return BadInput(error);
    request.set_seed(seed);
  }
  for (auto [it, end] = flags.values.equal_range("stop"); it != end; ++it) request.add_stop(it->second);
  request.set_add_special_tokens(flags.Find("no-special-tokens") == nullptr);

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
  else if (flags.Find("ids"))
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
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string server = "127.0.0.1:50051";
  std::string command;
  Flags flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (arg.rfind("--", 0) != 0) {
      if (!command.empty()) return BadInput("unexpected argument \"" + arg + "\"");
      command = arg;
      continue;
    }
    std::string name = arg.substr(2), value;
    static const std::vector<std::string> kBare = {"no-special-tokens", "ids"};
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (std::find(kBare.begin(), kBare.end(), name) == kBare.end()) {
      if (i + 1 >= args.size()) return BadInput("--" + name + ": needs a value");
      value = args[++i];
    }
    if (name == "server") {
      server = value;
    } else {
      flags.values.emplace(name, value);
    }
  }
  static const std::map<std::string, std::vector<std::string>> kKnown = {
      {"generate",
       {"prompt", "prompt-ids", "max-new-tokens", "temperature", "top-p", "top-k", "repetition-penalty", "seed", "stop",
        "no-special-tokens", "ids", "timeout"}},
      {"device-map", {}}};
  auto known = kKnown.find(command);
  if (known == kKnown.end())
    return BadInput(command.empty() ? "give a command: generate or device-map" : "unknown command \"" + command + "\"");
  for (const auto& [name, value] : flags.values) {
    if (std::find(known->second.begin(), known->second.end(), name) == known->second.end()) {
      return BadInput("--" + name + ": not a flag of " + command);
    }
  }
  auto stub = strata::v1::InferenceService::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  return command == "generate" ? Generate(*stub, flags) : DeviceMap(*stub);
}
