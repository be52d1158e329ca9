#include "server/flags.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_reader.h"
#include "cli/flags.h"
#include "planner/placement_flags.h"
#include "runtime/engine/speculation_flags.h"
#include "server/pem_files.h"

// Declared at global scope, as ABSL_FLAG asks; only ParseServerFlags reads them.
ABSL_FLAG(int64_t, kv_block_tokens, 16, "positions per block of the paged KV cache");
ABSL_FLAG(bool, prefix_cache, true,
          "reuse the KV blocks of prompt prefixes seen before (--prefix-cache=false: off; always off for longrope)");
ABSL_FLAG(int64_t, max_batch, 16, "sequences running at once");
ABSL_FLAG(int64_t, max_context, 2048,
          "context of one request: its prompt tokens + max_new_tokens, at most (a warning at start-up when it is "
          "more than the model's max_position_embeddings)");
ABSL_FLAG(int64_t, max_queue, 256, "requests waiting to run before RESOURCE_EXHAUSTED (at least 1)");
ABSL_FLAG(int64_t, max_new_tokens, 0, "most new tokens a request may ask for");
ABSL_FLAG(std::string, chat_template, "",
          "a Jinja chat template file to use instead of the checkpoint's (chat_template.jinja or "
          "tokenizer_config.json's chat_template); checked at start");
ABSL_FLAG(int64_t, micro_batches, 0, "micro-batches in flight across the stages; 1 runs one stage at a time");
ABSL_FLAG(int64_t, prefill_chunk, 256, "prompt tokens per prefill chunk");
ABSL_FLAG(int64_t, max_batch_tokens, 512,
          "tokens one micro-batch feeds at most: running decodes first, then prefill chunks cut to fit (vLLM's "
          "--max-num-batched-tokens; lower it for steadier inter-token latency under bursts of prompts)");
ABSL_FLAG(int32_t, intra_op_threads, 0, "LibTorch intra-op threads per stage worker");
ABSL_FLAG(std::string, inject_fault, "",
          "testing only: stage=N,call=M[,repeat[,until=K]][,device_lost] makes stage N throw on its M-th micro-batch "
          "(repeat: and every later one, to the K-th; device_lost: as a sticky CUDA error would)");
ABSL_FLAG(double, drain_timeout, 20,
          "after SIGINT/SIGTERM, seconds that generations in flight may run to their end (health NOT_SERVING and "
          "new Generate calls UNAVAILABLE meanwhile) before they are cut with UNAVAILABLE; 0 cuts them at once");
ABSL_FLAG(int64_t, not_serving_after_errors, 5,
          "readiness: health turns NOT_SERVING after N requests in a row end INTERNAL (no token produced between "
          "them), and SERVING again once a probe generation (or any request) produces a token; 0: never");
ABSL_FLAG(double, ready_probe_interval, 5, "seconds between probe generations while NOT_SERVING after errors");
ABSL_FLAG(int64_t, max_message_bytes, 4 << 20,
          "largest GenerateRequest accepted, in bytes; a larger one is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_prompt_bytes, 1 << 20, "largest prompt text, in bytes, checked before it is tokenized");
ABSL_FLAG(int64_t, max_prompt_tokens, 0, "most prompt tokens a request may send (text or ids)");
ABSL_FLAG(int64_t, max_streams, 1024,
          "Generate calls open at once (validating, waiting, generating or being read); more are RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_streams_per_connection, 100,
          "concurrent streams per HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS); more wait in the client");
ABSL_FLAG(int64_t, max_stream_buffer_bytes, 1 << 20,
          "response bytes a stream may hold for a client that does not read; beyond, the generation is cancelled "
          "and the call ends RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_response_tokens, int64_t{1} << 19,
          "tokens one HTTP API response may list: n x (echoed prompt + max_tokens) x (1 + logprobs); a request "
          "asking for more is refused (400)");
ABSL_FLAG(double, max_grammar_compile_seconds, 10,
          "structured outputs: the longest a request waits for its grammar (JSON schema, regex, choices, EBNF) to "
          "compile; later it is refused (400 / INVALID_ARGUMENT naming the field) while the compile finishes in the "
          "background and fills the cache");
ABSL_FLAG(bool, jump_forward, false,
          "structured outputs: where a grammar allows exactly one token, append it without a forward pass of its own "
          "(exact: the same ids as without; costs a mask fill on the engine thread per token)");
ABSL_FLAG(int64_t, max_grammar_bytes, 256 << 10,
          "structured outputs: the largest JSON schema, regex, grammar or structural tag (choices together), in "
          "bytes; larger ones are refused (400 / INVALID_ARGUMENT naming the field)");
ABSL_FLAG(int32_t, tokenize_threads, 0,
          "threads that validate and tokenize requests above 16 KiB, off gRPC's threads (smaller ones are "
          "checked on the thread that received them)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC address (0.0.0.0:50051 for all interfaces)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address (0.0.0.0:9464 for all interfaces)");
ABSL_FLAG(std::string, http_listen, "",
          "serve the OpenAI-compatible HTTP API here (/v1/completions, /v1/chat/completions, /v1/models, "
          "/tokenize, /detokenize, /health); TLS and API keys as on --listen");
ABSL_FLAG(int64_t, http_max_connections_per_peer, 256,
          "HTTP API connections one client address may hold open; more are refused at accept (0: no cap of its "
          "own). Behind a proxy or gateway every client shares its address: raise it to --max-streams or 0");
ABSL_FLAG(int64_t, http_read_timeout, 30,
          "seconds an HTTP API client has to send a whole request (line, headers and body), from the accept or "
          "from the previous response's end; later, the connection is closed (0: no deadline). A response, a "
          "long stream included, is not bound by it");
ABSL_FLAG(std::string, served_model_name, "", "the model's name in HTTP requests and /v1/models");
ABSL_FLAG(std::string, tool_call_parser, "",
          "read tool calls out of chat outputs in this format (hermes: Qwen2.5/Qwen3, Hermes; llama3_json: Llama "
          "3.x; deepseek_v3: DeepSeek-V3/R1; kimi_k2: Kimi K2; glm45: GLM-4.5/4.6; minimax_m2: MiniMax-M2; openai: "
          "gpt-oss's harmony channels, with --reasoning-parser gpt_oss implied), as vLLM's --tool-call-parser; "
          "needed for tool_choice \"auto\"");
ABSL_FLAG(std::string, reasoning_parser, "",
          "return the reasoning of chat outputs as reasoning_content (deepseek_r1: DeepSeek-R1, V3.1; qwen3: Qwen3, "
          "Qwen3.5; glm45: GLM-4.5/4.6; gpt_oss: gpt-oss's analysis channel), whole and streamed, as vLLM's "
          "--reasoning-parser; tool calls are then read from the rest");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the gRPC port: serve TLS (needs --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert (unencrypted)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mTLS; needs --tls-cert)");
ABSL_FLAG(std::string, health_listen, "",
          "a second gRPC address, plaintext, for health probes (Kubernetes' gRPC probes speak no TLS): health "
          "checking and reflection answer there, strata's methods are UNAUTHENTICATED; needs --tls-cert");
ABSL_FLAG(std::string, api_key_file, "",
          "require \"authorization: Bearer KEY\" metadata on strata's methods, KEY one of this file's lines "
          "(blank lines and # comments skipped); others are UNAUTHENTICATED");
ABSL_FLAG(int32_t, group_size, 1,
          "nodes serving the model together, one strata-server each (else LWS_GROUP_SIZE; 1: this node alone)");
ABSL_FLAG(int32_t, rank, 0, "this node in the group: 0 the leader, 1.. workers (else LWS_WORKER_INDEX)");
ABSL_FLAG(std::string, leader, "",
          "the leader's data address, HOST:PORT (else LWS_LEADER_ADDRESS and --group-port); the leader listens on "
          "its port");
ABSL_FLAG(int32_t, group_port, 50061, "the leader's data port when --leader is not given");
ABSL_FLAG(std::string, group_bind, "127.0.0.1",
          "the address this node's data port (and UCX's own sockets) binds: loopback by default; in a cluster, the "
          "pod's IP (deploy/ passes $(POD_IP))");
ABSL_FLAG(std::string, group_secret_file, "",
          "the group secret (a Kubernetes Secret): every node proves it holds it; at least 16 bytes");
ABSL_FLAG(double, group_timeout, 120, "seconds for the group to form, plan and load before start-up fails");
ABSL_FLAG(double, group_deadline, 10,
          "seconds a link may stay silent (heartbeats every quarter of it) before its node counts as lost");
ABSL_FLAG(std::string, auth_open_methods, "",
          "strata methods callable without a key: Generate, GetDeviceMap (comma-separated; full names "
          "/strata.v1.InferenceService/M too)");

namespace strata::server {
namespace {

using cli::Flag;
using cli::FlagError;

constexpr planner::PlacementFlagSet kPlacementFlags{.module_tree = true,
                                                    .kv_cache_tokens = true,
                                                    .physical_devices = true,
                                                    .fp8_matmul = true,
                                                    .runtime_reserve_auto = true};

const cli::CommandLine& Command() {
  static const cli::CommandLine command = [] {
    cli::CommandLine command;
    command.usage = R"(Usage: strata-server (--model DIR | --module-tree FILE) [flags]

Plans where every module of a model lives (transformers' device_map semantics) and serves the plan
over gRPC (strata.v1.InferenceService/GetDeviceMap, health checking, reflection) and Prometheus.
When --model DIR holds safetensors weights, the server also loads them onto the planned devices and
serves Generate (health is NOT_SERVING until the weights are loaded); otherwise it only plans.
)";
    // The shared placement flags (planner/placement_flags.h), then the serving ones.
    command.flags = planner::PlacementFlagSpecs(kPlacementFlags);
    command.flags.insert(command.flags.end(),
                         {Flag(FLAGS_max_batch, "N").Section("Serving (weights present):"),
                          Flag(FLAGS_max_context, "N"),
                          Flag(FLAGS_kv_block_tokens, "N"),
                          Flag(FLAGS_prefix_cache),
                          Flag(FLAGS_max_queue, "N"),
                          Flag(FLAGS_max_new_tokens, "N").ShowDefault("--max-context"),
                          Flag(FLAGS_chat_template, "FILE").ShowDefault("the checkpoint's"),
                          Flag(FLAGS_micro_batches, "N").ShowDefault("0, one per stage of the plan"),
                          Flag(FLAGS_prefill_chunk, "N"),
                          Flag(FLAGS_max_batch_tokens, "N"),
                          Flag(FLAGS_intra_op_threads, "N").ShowDefault("LibTorch's"),
                          Flag(FLAGS_inject_fault, "SPEC"),
                          Flag(FLAGS_drain_timeout, "SECONDS"),
                          Flag(FLAGS_not_serving_after_errors, "N"),
                          Flag(FLAGS_ready_probe_interval, "SECONDS"),
                          Flag(FLAGS_listen, "HOST:PORT"),
                          Flag(FLAGS_metrics_listen, "HOST:PORT"),
                          Flag(FLAGS_http_listen, "HOST:PORT").ShowDefault("none, no HTTP API"),
                          Flag(FLAGS_served_model_name, "NAME").ShowDefault("--model as given"),
                          Flag(FLAGS_tool_call_parser, "FORMAT").ShowDefault("none, tool calls not parsed"),
                          Flag(FLAGS_reasoning_parser, "FORMAT").ShowDefault("none, reasoning left in content"),
                          Flag(FLAGS_max_message_bytes, "N").Section("Limits (server/README.md, \"Limits\"):"),
                          Flag(FLAGS_max_prompt_bytes, "N"),
                          Flag(FLAGS_max_prompt_tokens, "N").ShowDefault("--max-context"),
                          Flag(FLAGS_max_streams, "N"),
                          Flag(FLAGS_max_streams_per_connection, "N"),
                          Flag(FLAGS_max_stream_buffer_bytes, "N"),
                          Flag(FLAGS_max_response_tokens, "N"),
                          Flag(FLAGS_tokenize_threads, "N").ShowDefault("half the cores, 1 to 4"),
                          Flag(FLAGS_max_grammar_compile_seconds, "SECONDS"),
                          Flag(FLAGS_max_grammar_bytes, "N"),
                          Flag(FLAGS_jump_forward),
                          Flag(FLAGS_http_max_connections_per_peer, "N"),
                          Flag(FLAGS_http_read_timeout, "SECONDS"),
                          Flag(FLAGS_tls_cert, "FILE")
                              .ShowDefault("none, plaintext")
                              .Section("Security (the gRPC port; /metrics stays plaintext):"),
                          Flag(FLAGS_tls_key, "FILE"),
                          Flag(FLAGS_tls_client_ca, "FILE").ShowDefault("none, no client certificate asked"),
                          Flag(FLAGS_health_listen, "HOST:PORT").ShowDefault("none"),
                          Flag(FLAGS_api_key_file, "FILE").ShowDefault("none, no key needed"),
                          Flag(FLAGS_auth_open_methods, "M,M")
                              .ShowDefault("none of strata's; gRPC health checking and reflection are always open"),
                          Flag(FLAGS_group_size, "N").Section("A group of nodes (README \"Several nodes\"):"),
                          Flag(FLAGS_rank, "N"),
                          Flag(FLAGS_leader, "HOST:PORT").ShowDefault("LWS_LEADER_ADDRESS:--group-port"),
                          Flag(FLAGS_group_port, "PORT"),
                          Flag(FLAGS_group_bind, "HOST"),
                          Flag(FLAGS_group_secret_file, "FILE").ShowDefault("none; needed in a group"),
                          Flag(FLAGS_group_timeout, "SECONDS"),
                          Flag(FLAGS_group_deadline, "SECONDS")});
    for (cli::FlagSpec& spec :
         runtime::SpeculativeFlagSpecs("Speculative decoding (server/README.md, \"Speculative decoding\"):")) {
      command.flags.push_back(std::move(spec));
    }
    command.epilogue = R"(
Exit status: 0 after SIGINT/SIGTERM (once drained; at once when it comes during the load), 2 on a bad flag or plan (the message names it), 1 otherwise
(for example a port already in use, or a device that became unusable while serving).
)";
    return command;
  }();
  return command;
}

// An integer flag's value, or an error naming the flag when it is below `least`.
template <typename T>
absl::StatusOr<T> AtLeast(const absl::Flag<T>& flag, T least, absl::string_view what) {
  const T value = absl::GetFlag(flag);
  if (value < least) {
    return absl::InvalidArgumentError(absl::StrCat(cli::Spelling(flag), ": \"", value, "\" is not ", what));
  }
  return value;
}

// A duration flag in seconds (fractions allowed) from `least` to a day, far beyond any grace period a
// supervisor gives; "nan" and "inf" parse as doubles, so finiteness is checked here.
absl::StatusOr<std::chrono::milliseconds> Seconds(const absl::Flag<double>& flag, double least) {
  constexpr double kMaxSeconds = 86'400;
  const double seconds = absl::GetFlag(flag);
  if (!std::isfinite(seconds) || seconds < least || seconds > kMaxSeconds) {
    return absl::InvalidArgumentError(absl::StrCat(cli::Spelling(flag), ": \"", seconds,
                                                   "\" is not a number of seconds from ", least, " to ", kMaxSeconds));
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

// A strata method as --auth-open-methods names it ("GetDeviceMap", "strata.v1.InferenceService/GetDeviceMap"
// or with a leading "/"), as gRPC spells it.
absl::StatusOr<std::string> OpenMethod(absl::string_view name) {
  for (const char* method : {kGenerateMethod, kGetDeviceMapMethod}) {
    const absl::string_view full(method);
    if (name == full || name == full.substr(1) || name == full.substr(full.rfind('/') + 1)) return std::string(full);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", name,
                   "\" is not a strata method (Generate, GetDeviceMap); gRPC health checking and "
                   "reflection are always open"));
}

// --tls-cert, --tls-key and --tls-client-ca, read and checked: every error names the flag and its file.
absl::StatusOr<std::optional<ServerTls>> ReadServerTls(const cli::ParsedArgs& parsed) {
  const bool cert = parsed.Given(FLAGS_tls_cert), key = parsed.Given(FLAGS_tls_key);
  const bool client_ca = parsed.Given(FLAGS_tls_client_ca);
  if (cert != key) {
    return absl::InvalidArgumentError(cert ? "--tls-cert needs --tls-key (the certificate's private key)"
                                           : "--tls-key needs --tls-cert (the certificate it belongs to)");
  }
  if (client_ca && !cert) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key: client certificates are "
        "asked for only over TLS");
  }
  if (!cert) return std::nullopt;
  ServerTls tls;
  absl::StatusOr<std::string> chain = ReadPemCertificates(absl::GetFlag(FLAGS_tls_cert));
  if (!chain.ok()) return FlagError(FLAGS_tls_cert, chain.status());
  tls.certificate_chain = *std::move(chain);
  absl::StatusOr<std::string> private_key = ReadPemPrivateKey(absl::GetFlag(FLAGS_tls_key));
  if (!private_key.ok()) return FlagError(FLAGS_tls_key, private_key.status());
  tls.private_key = *std::move(private_key);
  if (absl::Status match = CheckKeyMatchesCertificate(tls.certificate_chain, tls.private_key); !match.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key: ", absl::GetFlag(FLAGS_tls_key),
                                                   " is not the private key of --tls-cert ",
                                                   absl::GetFlag(FLAGS_tls_cert)));
  }
  if (client_ca) {
    absl::StatusOr<std::string> ca = ReadPemCertificates(absl::GetFlag(FLAGS_tls_client_ca));
    if (!ca.ok()) return FlagError(FLAGS_tls_client_ca, ca.status());
    tls.client_ca = *std::move(ca);
  }
  return tls;
}

// The serving, limit and lifecycle flags into `options`, each checked on its own.
absl::Status ReadServingFlags(const cli::ParsedArgs& parsed, ServerOptions& options) {
  // Integer flags: destination, flag, smallest allowed value.
  for (auto [value, flag, least] :
       {std::tuple{&options.serving.runtime.max_batch, &FLAGS_max_batch, int64_t{1}},
        std::tuple{&options.serving.runtime.max_context, &FLAGS_max_context, int64_t{1}},
        std::tuple{&options.serving.runtime.kv_block_tokens, &FLAGS_kv_block_tokens, int64_t{1}},
        // 0 would refuse every request while health says SERVING.
        std::tuple{&options.serving.max_queue, &FLAGS_max_queue, int64_t{1}},
        std::tuple{&options.lifecycle.not_serving_after_errors, &FLAGS_not_serving_after_errors, int64_t{0}},
        std::tuple{&options.serving.micro_batches, &FLAGS_micro_batches, int64_t{0}},
        std::tuple{&options.serving.prefill_chunk, &FLAGS_prefill_chunk, int64_t{1}},
        std::tuple{&options.serving.max_batch_tokens, &FLAGS_max_batch_tokens, int64_t{1}},
        std::tuple{&options.limits.max_message_bytes, &FLAGS_max_message_bytes, int64_t{1}},
        std::tuple{&options.limits.max_prompt_bytes, &FLAGS_max_prompt_bytes, int64_t{1}},
        std::tuple{&options.limits.max_prompt_tokens, &FLAGS_max_prompt_tokens, int64_t{0}},
        std::tuple{&options.limits.max_streams, &FLAGS_max_streams, int64_t{1}},
        std::tuple{&options.limits.max_streams_per_connection, &FLAGS_max_streams_per_connection, int64_t{1}},
        std::tuple{&options.limits.max_stream_buffer_bytes, &FLAGS_max_stream_buffer_bytes, int64_t{1}},
        std::tuple{&options.limits.max_response_tokens, &FLAGS_max_response_tokens, int64_t{1}},
        std::tuple{&options.limits.max_grammar_bytes, &FLAGS_max_grammar_bytes, int64_t{1}}}) {
    absl::StatusOr<int64_t> checked = AtLeast(*flag, least, absl::StrCat("an integer >= ", least));
    if (!checked.ok()) return checked.status();
    *value = *checked;
  }
  // --max-new-tokens 0 is not a limit a user may give: its default means "--max-context".
  if (parsed.Given(FLAGS_max_new_tokens)) {
    absl::StatusOr<int64_t> checked = AtLeast(FLAGS_max_new_tokens, int64_t{1}, "an integer >= 1");
    if (!checked.ok()) return checked.status();
    options.limits.max_new_tokens = *checked;
  }
  if (options.serving.runtime.kv_block_tokens > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(cli::Spelling(FLAGS_kv_block_tokens), ": ",
                                                   options.serving.runtime.kv_block_tokens, " is more than 4096"));
  }
  options.serving.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  options.serving.jump_forward = absl::GetFlag(FLAGS_jump_forward);
  if (parsed.Given(FLAGS_chat_template)) {
    if (absl::GetFlag(FLAGS_chat_template).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(cli::Spelling(FLAGS_chat_template), ": empty: give a file"));
    }
    options.serving.chat_template_file = absl::GetFlag(FLAGS_chat_template);
  }
  absl::StatusOr<int32_t> threads = AtLeast(FLAGS_intra_op_threads, int32_t{0}, "an integer >= 0");
  if (!threads.ok()) return threads.status();
  options.serving.intra_op_threads = *threads;
  absl::StatusOr<int32_t> tokenize_threads = AtLeast(FLAGS_tokenize_threads, int32_t{0}, "an integer >= 0");
  if (!tokenize_threads.ok()) return tokenize_threads.status();
  if (*tokenize_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(cli::Spelling(FLAGS_tokenize_threads), ": ", *tokenize_threads, " is more than 256"));
  }
  options.limits.tokenize_threads = *tokenize_threads;
  if (parsed.Given(FLAGS_inject_fault)) {
    absl::StatusOr<runtime::FaultInjection> fault = runtime::ParseFaultInjection(absl::GetFlag(FLAGS_inject_fault));
    if (!fault.ok()) return FlagError(FLAGS_inject_fault, fault.status());
    options.serving.fault = *fault;
  }
  absl::StatusOr<std::chrono::milliseconds> drain = Seconds(FLAGS_drain_timeout, 0);
  if (!drain.ok()) return drain.status();
  options.lifecycle.drain_timeout = *drain;
  absl::StatusOr<std::chrono::milliseconds> probe = Seconds(FLAGS_ready_probe_interval, 0.1);
  if (!probe.ok()) return probe.status();
  options.lifecycle.ready_probe_interval = *probe;
  absl::StatusOr<std::chrono::milliseconds> compile = Seconds(FLAGS_max_grammar_compile_seconds, 0.01);
  if (!compile.ok()) return compile.status();
  options.limits.max_grammar_compile_time = *compile;
  absl::StatusOr<runtime::SpeculativeOptions> speculative = runtime::ParseSpeculativeFlags();
  if (!speculative.ok()) return speculative.status();
  options.serving.speculative = *speculative;
  return absl::OkStatus();
}

// The limits against --max-context and against what gRPC can take.
absl::Status CheckLimits(const ServerOptions& options) {
  if (options.limits.max_new_tokens > options.serving.runtime.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("--max-new-tokens: ", options.limits.max_new_tokens,
                                                   " is more than --max-context ",
                                                   options.serving.runtime.max_context));
  }
  // gRPC takes its message limit and stream count as int; the transport's own ceiling is twice the
  // message limit (server/README.md, "Limits").
  constexpr int64_t kMaxMessageBytes = 1 << 30;
  if (options.limits.max_message_bytes > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrCat(cli::Spelling(FLAGS_max_message_bytes), ": ",
                                                   options.limits.max_message_bytes, " is more than ",
                                                   kMaxMessageBytes));
  }
  if (options.limits.max_streams_per_connection > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(cli::Spelling(FLAGS_max_streams_per_connection), ": ",
                                                   options.limits.max_streams_per_connection, " is more than ",
                                                   INT32_MAX));
  }
  if (options.limits.max_prompt_tokens > options.serving.runtime.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("--max-prompt-tokens: ", options.limits.max_prompt_tokens,
                                                   " is more than --max-context ",
                                                   options.serving.runtime.max_context));
  }
  return absl::OkStatus();
}

// --listen and --metrics-listen.
absl::Status ReadListenAddresses(ServerOptions& options) {
  for (auto [flag, address] : {std::pair{&FLAGS_listen, &options.endpoints.listen},
                               std::pair{&FLAGS_metrics_listen, &options.endpoints.metrics_listen}}) {
    absl::StatusOr<ListenAddress> parsed_address = ParseListenAddress(absl::GetFlag(*flag));
    if (!parsed_address.ok()) return FlagError(*flag, parsed_address.status());
    *address = *std::move(parsed_address);
  }
  if (!absl::GetFlag(FLAGS_http_listen).empty()) {
    absl::StatusOr<ListenAddress> http = ParseListenAddress(absl::GetFlag(FLAGS_http_listen));
    if (!http.ok()) return FlagError(FLAGS_http_listen, http.status());
    for (const ListenAddress* other : {&options.endpoints.listen, &options.endpoints.metrics_listen}) {
      if (http->port != 0 && http->ToString() == other->ToString()) {
        return absl::InvalidArgumentError(absl::StrCat("--http-listen: ", http->ToString(),
                                                       " is already the address of --listen or --metrics-listen"));
      }
    }
    options.endpoints.http_listen = *std::move(http);
  }
  for (auto [value, flag] :
       {std::pair{&options.endpoints.http_max_connections_per_peer, &FLAGS_http_max_connections_per_peer},
        std::pair{&options.endpoints.http_read_timeout_seconds, &FLAGS_http_read_timeout}}) {
    absl::StatusOr<int64_t> checked = AtLeast(*flag, int64_t{0}, "an integer >= 0");
    if (!checked.ok()) return checked.status();
    if (*checked > 1'000'000) {
      return absl::InvalidArgumentError(
          absl::StrCat(cli::Spelling(*flag), ": \"", *checked, "\" is more than 1000000"));
    }
    *value = *checked;
  }
  if (!absl::GetFlag(FLAGS_tool_call_parser).empty()) {
    absl::StatusOr<chat_template::ToolCallFormat> format =
        chat_template::ParseToolCallFormat(absl::GetFlag(FLAGS_tool_call_parser));
    if (!format.ok()) return FlagError(FLAGS_tool_call_parser, format.status());
    options.serving.tool_call_parser = *format;
  }
  if (!absl::GetFlag(FLAGS_reasoning_parser).empty()) {
    absl::StatusOr<chat_template::ReasoningFormat> format =
        chat_template::ParseReasoningFormat(absl::GetFlag(FLAGS_reasoning_parser));
    if (!format.ok()) return FlagError(FLAGS_reasoning_parser, format.status());
    options.serving.reasoning_parser = *format;
  }
  // openai reads gpt-oss's harmony channels: its analysis channel is the reasoning (vLLM's gpt-oss serving always
  // returns it), which no other reasoning parser can find there.
  if (options.serving.tool_call_parser == chat_template::ToolCallFormat::kOpenAi) {
    if (options.serving.reasoning_parser.value_or(chat_template::ReasoningFormat::kGptOss) !=
        chat_template::ReasoningFormat::kGptOss) {
      return absl::InvalidArgumentError(
          absl::StrCat("--reasoning-parser: \"", absl::GetFlag(FLAGS_reasoning_parser),
                       "\" cannot read gpt-oss's harmony output; --tool-call-parser openai takes gpt_oss (or none)"));
    }
    options.serving.reasoning_parser = chat_template::ReasoningFormat::kGptOss;
  }
  options.serving.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  if (options.serving.served_model_name.empty()) {
    options.serving.served_model_name = options.placement.model_dir     ? options.placement.model_dir->string()
                                        : options.placement.module_tree ? options.placement.module_tree->string()
                                                                        : "strata";
  }
  return absl::OkStatus();
}

// TLS, the plaintext health port that needs it, the API keys and the methods open without one.
absl::Status ReadSecurityFlags(const cli::ParsedArgs& parsed, ServerOptions& options) {
  absl::StatusOr<std::optional<ServerTls>> tls = ReadServerTls(parsed);
  if (!tls.ok()) return tls.status();
  options.security.tls = *std::move(tls);
  if (parsed.Given(FLAGS_health_listen)) {
    if (!options.security.tls) {
      return absl::InvalidArgumentError("--health-listen needs --tls-cert: without TLS, probes use --listen");
    }
    absl::StatusOr<ListenAddress> health = ParseListenAddress(absl::GetFlag(FLAGS_health_listen));
    if (!health.ok()) return FlagError(FLAGS_health_listen, health.status());
    if (health->port != 0 && health->ToString() == options.endpoints.listen.ToString()) {
      return absl::InvalidArgumentError("--health-listen: must differ from --listen (a second, plaintext port)");
    }
    options.endpoints.health_listen = *std::move(health);
  }
  if (parsed.Given(FLAGS_api_key_file)) {
    absl::StatusOr<std::vector<std::string>> keys = ReadApiKeyFile(absl::GetFlag(FLAGS_api_key_file));
    if (!keys.ok()) return FlagError(FLAGS_api_key_file, keys.status());
    options.security.api_keys = std::make_shared<const ApiKeys>(*keys);
  }
  if (parsed.Given(FLAGS_auth_open_methods)) {
    if (options.security.api_keys == nullptr) {
      return absl::InvalidArgumentError("--auth-open-methods needs --api-key-file: without it every method is open");
    }
    for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_auth_open_methods), ',', absl::SkipEmpty())) {
      absl::StatusOr<std::string> method = OpenMethod(name);
      if (!method.ok()) return FlagError(FLAGS_auth_open_methods, method.status());
      options.security.auth_open_methods.insert(*std::move(method));
    }
  }
  return absl::OkStatus();
}

// An integer from the environment (LeaderWorkerSet's), or an error naming the variable.
absl::StatusOr<std::optional<int>> EnvInt(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  int n = 0;
  if (!absl::SimpleAtoi(value, &n)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "=\"", value, "\" (environment) is not an integer"));
  }
  return n;
}

// --group-size, --rank, --leader and the rest, each from its flag or else from LeaderWorkerSet's environment.
absl::Status ReadGroupFlags(const cli::ParsedArgs& parsed, ServerOptions& options) {
  GroupFlags& group = options.group;
  for (auto [value, flag, env] : {std::tuple{&group.size, &FLAGS_group_size, "LWS_GROUP_SIZE"},
                                  std::tuple{&group.rank, &FLAGS_rank, "LWS_WORKER_INDEX"}}) {
    *value = absl::GetFlag(*flag);
    if (!parsed.Given(*flag)) {
      absl::StatusOr<std::optional<int>> from_env = EnvInt(env);
      if (!from_env.ok()) return from_env.status();
      if (*from_env) *value = **from_env;
    }
  }
  if (group.size < 1 || group.size > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--group-size: ", group.size, " is not from 1 to 1024"));
  }
  if (group.rank < 0 || group.rank >= group.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank: ", group.rank, " is not in [0, ", group.size, ") (--group-size ", group.size, ")"));
  }
  if (group.size == 1) return absl::OkStatus();
  if (!options.placement.model_dir) {
    return absl::InvalidArgumentError("--group-size: a group serves a checkpoint's weights: give --model DIR");
  }
  const int32_t port = absl::GetFlag(FLAGS_group_port);
  if (port < 1 || port > 65535) return FlagError(FLAGS_group_port, absl::InvalidArgumentError("not a port"));
  if (parsed.Given(FLAGS_leader)) {
    absl::StatusOr<ListenAddress> leader = ParseListenAddress(absl::GetFlag(FLAGS_leader));
    if (!leader.ok()) return FlagError(FLAGS_leader, leader.status());
    if (leader->port == 0) return absl::InvalidArgumentError("--leader: the port must not be 0");
    group.leader_host = leader->host;
    group.leader_port = leader->port;
  } else if (const char* lws = std::getenv("LWS_LEADER_ADDRESS"); lws != nullptr && *lws != '\0') {
    group.leader_host = lws;
    group.leader_port = port;
    group.worker_port = port;
  } else if (group.rank > 0) {
    return absl::InvalidArgumentError("--leader: a worker needs the leader's HOST:PORT (or LWS_LEADER_ADDRESS)");
  } else {
    group.leader_port = port;
  }
  if (group.leader_host.size() > 2 && group.leader_host.front() == '[') {
    group.leader_host = group.leader_host.substr(1, group.leader_host.size() - 2);
  }
  group.bind_host = absl::GetFlag(FLAGS_group_bind);
  if (!parsed.Given(FLAGS_group_secret_file)) {
    return absl::InvalidArgumentError(
        "--group-secret-file: a group needs a secret every node holds (a Kubernetes Secret); its links are refused "
        "to anyone else");
  }
  absl::StatusOr<std::string> secret = base::ReadRegularFile(absl::GetFlag(FLAGS_group_secret_file), uint64_t{1} << 16);
  if (!secret.ok()) return FlagError(FLAGS_group_secret_file, secret.status());
  while (!secret->empty() && (secret->back() == '\n' || secret->back() == '\r')) secret->pop_back();
  if (secret->size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--group-secret-file: ", absl::GetFlag(FLAGS_group_secret_file), " holds ", secret->size(),
                     " bytes; a group secret has at least 16 (e.g. openssl rand -hex 32)"));
  }
  group.secret = *std::move(secret);
  absl::StatusOr<std::chrono::milliseconds> timeout = Seconds(FLAGS_group_timeout, 1);
  if (!timeout.ok()) return timeout.status();
  group.timeout = *timeout;
  absl::StatusOr<std::chrono::milliseconds> deadline = Seconds(FLAGS_group_deadline, 0.2);
  if (!deadline.ok()) return deadline.status();
  group.deadline = *deadline;
  return absl::OkStatus();
}

}  // namespace

std::string ListenAddress::ToString() const { return absl::StrCat(host, ":", port); }

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text) {
  // The port follows the last colon: IPv6 hosts hold colons of their own, inside brackets.
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not HOST:PORT"));
  }
  const absl::string_view host = text.substr(0, colon);
  const absl::string_view port_text = text.substr(colon + 1);
  if (host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" has no host (use 0.0.0.0 for all)"));
  }
  if (host.find(':') != absl::string_view::npos && !(host.front() == '[' && host.back() == ']')) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\": write an IPv6 host in brackets, [::1]:PORT"));
  }
  int port = 0;
  if (port_text.empty() || port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" has no valid port (0 to 65535)"));
  }
  return ListenAddress{std::string(host), port};
}

absl::StatusOr<ServerCommand> ParseServerFlags(std::span<const std::string> args) {
  absl::StatusOr<cli::ParsedArgs> parsed = cli::Parse(Command(), args);
  if (!parsed.ok()) return parsed.status();
  ServerCommand command;
  if (parsed->help) {
    command.help = true;
    return command;
  }
  ServerOptions& options = command.options;

  absl::StatusOr<planner::Placement> placement = planner::ParsePlacement(*parsed, kPlacementFlags);
  if (!placement.ok()) return placement.status();
  options.placement = *std::move(placement);
  if (absl::Status status = ReadServingFlags(*parsed, options); !status.ok()) return status;
  options.serving.runtime.fp8_scaled_mm = options.placement.fp8_scaled_mm;
  options.placement.runtime_reserve.limits = {.max_batch = options.serving.runtime.max_batch,
                                              .max_context = options.serving.runtime.max_context,
                                              .max_batch_tokens = options.serving.max_batch_tokens,
                                              .micro_batches = options.serving.micro_batches,
                                              .prompt_logprobs = true};
  if (absl::Status status = CheckLimits(options); !status.ok()) return status;
  if (absl::Status status = ReadListenAddresses(options); !status.ok()) return status;
  if (absl::Status status = ReadSecurityFlags(*parsed, options); !status.ok()) return status;
  if (absl::Status status = ReadGroupFlags(*parsed, options); !status.ok()) return status;
  return command;
}

std::string ServerUsage() { return cli::Help(Command()); }

}  // namespace strata::server
