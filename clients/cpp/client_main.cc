// strata-client: a command-line client of strata-server.
//   strata-client [--server HOST:PORT] generate (--prompt TEXT | --prompt-ids 1,2,3) [options]
//       streams the generated text to stdout as it arrives; finish reason and usage go to stderr.
//   strata-client [--server HOST:PORT] device-map
//       prints the served plan: modules per stage, each device's budget, planned and measured memory.
// Either command over TLS (--tls-ca; --tls-cert/--tls-key for mTLS) and with an API key (--api-key-file or
// $STRATA_API_KEY), sent as "authorization: Bearer KEY" metadata on each call.
// Exit status: 0 on success, 2 on bad input (a bad flag, or INVALID_ARGUMENT from the server), 1 otherwise.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "server/api_keys.h"
#include "server/pem_files.h"
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
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that signed the server's certificate: connect over TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate chain, for a server that requires one (mTLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_server_name, "", "the name the server's certificate must carry");
ABSL_FLAG(std::string, api_key_file, "",
          "send the file's first key as \"authorization: Bearer KEY\" (blank lines and # comments skipped)");

namespace {

using strata::cli::Flag;

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage =
        R"(usage: strata-client [--server HOST:PORT] [--tls-ca FILE ...] [--api-key-file FILE] COMMAND [options]

commands:
  generate                  stream a continuation of a prompt to stdout (options below)
  device-map                print the served plan and each device's memory
)";
    command.flags = {Flag(FLAGS_server, "HOST:PORT"),
                     Flag(FLAGS_tls_ca, "FILE").ShowDefault("none, plaintext"),
                     Flag(FLAGS_tls_cert, "FILE"),
                     Flag(FLAGS_tls_key, "FILE"),
                     Flag(FLAGS_tls_server_name, "NAME").ShowDefault("--server's host"),
                     Flag(FLAGS_api_key_file, "FILE").ShowDefault("$STRATA_API_KEY if set, else no key"),
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

// The channel to the server and what each call carries.
struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::string authorization;  // "Bearer KEY", or empty: no key

  // A context for one call, with its deadline and the key.
  void Prepare(grpc::ClientContext& context, std::chrono::milliseconds timeout) const {
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  }
};

// The connection the flags ask for: plaintext, or TLS (--tls-ca), with a client certificate (mTLS) and
// an API key. Errors name the flag, and its file.
absl::StatusOr<Connection> Connect(const strata::cli::ParsedArgs& flags) {
  using strata::cli::FlagError;
  Connection connection;
  const bool tls = flags.Given(FLAGS_tls_ca);
  const bool cert = flags.Given(FLAGS_tls_cert), key = flags.Given(FLAGS_tls_key);
  if (cert != key) {
    return absl::InvalidArgumentError(cert ? "--tls-cert needs --tls-key" : "--tls-key needs --tls-cert");
  }
  if ((cert || flags.Given(FLAGS_tls_server_name)) && !tls) {
    return absl::InvalidArgumentError(absl::StrCat(cert ? "--tls-cert" : "--tls-server-name",
                                                   " needs --tls-ca (the CA that signed the server's certificate)"));
  }
  grpc::ChannelArguments arguments;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca = strata::server::ReadPemCertificates(absl::GetFlag(FLAGS_tls_ca));
    if (!ca.ok()) return FlagError(FLAGS_tls_ca, ca.status());
    ssl.pem_root_certs = *std::move(ca);
    if (cert) {
      absl::StatusOr<std::string> chain = strata::server::ReadPemCertificates(absl::GetFlag(FLAGS_tls_cert));
      if (!chain.ok()) return FlagError(FLAGS_tls_cert, chain.status());
      absl::StatusOr<std::string> private_key = strata::server::ReadPemPrivateKey(absl::GetFlag(FLAGS_tls_key));
      if (!private_key.ok()) return FlagError(FLAGS_tls_key, private_key.status());
      if (!strata::server::CheckKeyMatchesCertificate(*chain, *private_key).ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--tls-key: ", absl::GetFlag(FLAGS_tls_key),
                                                       " is not the private key of --tls-cert ",
                                                       absl::GetFlag(FLAGS_tls_cert)));
      }
      ssl.pem_cert_chain = *std::move(chain);
      ssl.pem_private_key = *std::move(private_key);
    }
    if (flags.Given(FLAGS_tls_server_name)) arguments.SetSslTargetNameOverride(absl::GetFlag(FLAGS_tls_server_name));
    credentials = grpc::SslCredentials(ssl);
  }
  std::vector<std::string> keys;
  if (flags.Given(FLAGS_api_key_file)) {
    absl::StatusOr<std::vector<std::string>> read = strata::server::ReadApiKeyFile(absl::GetFlag(FLAGS_api_key_file));
    if (!read.ok()) return FlagError(FLAGS_api_key_file, read.status());
    keys = *std::move(read);
  } else if (const char* env = std::getenv("STRATA_API_KEY"); env != nullptr && *env != '\0') {
    absl::StatusOr<std::vector<std::string>> read = strata::server::ParseApiKeys(env, "$STRATA_API_KEY");
    if (!read.ok()) return read.status();
    keys = *std::move(read);
  }
  if (!keys.empty()) connection.authorization = "Bearer " + keys.front();
  connection.channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server), credentials, arguments);
  return connection;
}

int Generate(strata::v1::InferenceService::Stub& stub, const Connection& connection,
             const strata::cli::ParsedArgs& flags) {
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
  connection.Prepare(context, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
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

int DeviceMap(strata::v1::InferenceService::Stub& stub, const Connection& connection) {
  grpc::ClientContext context;
  connection.Prepare(context, std::chrono::seconds(30));
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
            << std::setw(12) << "kv cache" << std::setw(12) << "runtime"
            << "measured (allocated / total, on)\n";
  for (const auto& d : reply.devices()) {
    std::cout << std::setw(8) << d.device() << std::setw(12) << Bytes(d.budget_bytes()) << std::setw(12)
              << Bytes(static_cast<double>(d.planned_bytes())) << std::setw(12)
              << Bytes(static_cast<double>(d.kv_cache_bytes())) << std::setw(12)
              << Bytes(static_cast<double>(d.runtime_reserve_bytes()));
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
  // Every flag but the connection's belongs to generate.
  const std::vector<absl::string_view> connection_flags = {absl::GetFlagReflectionHandle(FLAGS_server).Name(),
                                                           absl::GetFlagReflectionHandle(FLAGS_tls_ca).Name(),
                                                           absl::GetFlagReflectionHandle(FLAGS_tls_cert).Name(),
                                                           absl::GetFlagReflectionHandle(FLAGS_tls_key).Name(),
                                                           absl::GetFlagReflectionHandle(FLAGS_tls_server_name).Name(),
                                                           absl::GetFlagReflectionHandle(FLAGS_api_key_file).Name()};
  for (const auto& [name, value] : parsed->given) {
    if (command != "generate" &&
        std::find(connection_flags.begin(), connection_flags.end(), name) == connection_flags.end()) {
      return BadInput(strata::cli::Spelling(name) + ": not a flag of " + command);
    }
  }
  absl::StatusOr<Connection> connection = Connect(*parsed);
  if (!connection.ok()) return BadInput(std::string(connection.status().message()));
  auto stub = strata::v1::InferenceService::NewStub(connection->channel);
  return command == "generate" ? Generate(*stub, *connection, *parsed) : DeviceMap(*stub, *connection);
}
