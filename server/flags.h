#pragma once
// strata-server's command line: parsed and validated here, once, into ServerOptions. Everything after
// ParseServerFlags may trust the options it gets (STYLE.md, validation in one place).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "chat_template/reasoning.h"
#include "chat_template/tool_calls.h"
#include "planner/device.h"
#include "planner/model_spec.h"
#include "planner/placement_flags.h"
#include "planner/plan.h"
#include "runtime/engine/speculation.h"
#include "runtime/executor/executor.h"
#include "runtime/executor/serving_options.h"
#include "server/api_keys.h"

namespace strata::server {

// A HOST:PORT to listen on. `host` keeps IPv6 brackets ("[::1]"), so host + ":" + port round-trips.
struct ListenAddress {
  std::string host;
  int port = 0;  // 0: the system picks one

  std::string ToString() const;
};

// "0.0.0.0:50051", "127.0.0.1:0", "[::1]:9464", "localhost:50051". The error names the text.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view text);

// TLS on the gRPC port: the PEM text of --tls-cert, --tls-key and --tls-client-ca, read and checked once
// by ParseServerFlags.
struct ServerTls {
  std::string certificate_chain;
  std::string private_key;
  std::string client_ca;  // not empty: clients must present a certificate this CA signed (mTLS)
};

// The strata methods --auth-open-methods may name, as gRPC spells them.
inline constexpr char kGenerateMethod[] = "/strata.v1.InferenceService/Generate";
inline constexpr char kGetDeviceMapMethod[] = "/strata.v1.InferenceService/GetDeviceMap";

// How the engine runs (when --model DIR holds safetensors weights; see ServerUsage).
struct ServingFlags {
  // What the runtime reads as it is: --max-batch, --max-context (prompt tokens + max_new_tokens of one request, at
  // most), --kv-block-tokens (the paged KV cache holds Placement::kv_cache_tokens, 0: max_batch x max_context, in
  // blocks of it) and --fp8-matmul (Placement::fp8_scaled_mm, copied here once).
  runtime::ServingOptions runtime{.max_batch = 16};
  bool prefix_cache = true;        // reuses the KV blocks of prompt prefixes seen before
  bool jump_forward = false;       // --jump-forward: structured outputs' forced tokens without a forward pass each
  int64_t max_queue = 256;         // requests waiting to run before RESOURCE_EXHAUSTED
  int64_t micro_batches = 0;       // micro-batches in flight across the stages (1: unpipelined; 0: one per stage)
  int64_t prefill_chunk = 256;     // prompt tokens per prefill chunk
  int64_t max_batch_tokens = 512;  // tokens per micro-batch: decodes first, then prefill chunks cut to fit
  int32_t intra_op_threads = 0;    // LibTorch intra-op threads per stage worker; 0: LibTorch's default
  // --chat-template FILE: instead of the checkpoint's template (chat_template/checkpoint_template.h).
  std::filesystem::path chat_template_file;
  // The model's name in the HTTP API (requests' "model", /v1/models): --served-model-name, else --model as
  // given (vLLM's rule).
  std::string served_model_name;
  // --tool-call-parser: how the HTTP API reads tool calls out of chat outputs (chat_template/tool_calls.h).
  std::optional<chat_template::ToolCallFormat> tool_call_parser;
  // --reasoning-parser: how the HTTP API splits reasoning_content out of chat outputs (chat_template/reasoning.h).
  std::optional<chat_template::ReasoningFormat> reasoning_parser;
  std::optional<runtime::FaultInjection> fault;  // --inject-fault: the engine's test seam
  runtime::SpeculativeOptions speculative;       // --speculative and its flags (runtime/engine/speculation_flags.h)
};

// Limits on what clients may ask and hold (server/README.md, "Limits"). Every refusal is counted under its
// code.
struct ClientLimits {
  int64_t max_new_tokens = 0;                // per request; 0: --max-context
  int64_t max_message_bytes = 4 << 20;       // a GenerateRequest on the wire; larger: RESOURCE_EXHAUSTED
  int64_t max_prompt_bytes = 1 << 20;        // prompt text, checked before it is tokenized: INVALID_ARGUMENT
  int64_t max_prompt_tokens = 0;             // prompt tokens (text or ids); 0: max_context
  int64_t max_streams = 1024;                // Generate calls open at once; more: RESOURCE_EXHAUSTED
  int64_t max_streams_per_connection = 100;  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; more wait in the client
  // Response bytes a stream may hold for a client that does not read them; beyond, its generation is
  // cancelled and the call ends RESOURCE_EXHAUSTED.
  int64_t max_stream_buffer_bytes = 1 << 20;
  // Tokens one HTTP API response may list (openai::ApiLimits::max_response_tokens); more: 400.
  int64_t max_response_tokens = int64_t{1} << 19;
  // Threads that validate and tokenize requests above 16 KiB (server/admission_pool.h); 0: half the
  // cores, from 1 to 4.
  int32_t tokenize_threads = 0;
  // Structured outputs (structured::CompilerOptions): the longest a request waits for its grammar to compile, and
  // the largest constraint text (schema, regex, grammar, structural tag; choices together). Beyond: 400.
  std::chrono::milliseconds max_grammar_compile_time{10'000};
  int64_t max_grammar_bytes = 256 << 10;
};

// Where the server listens.
struct Endpoints {
  ListenAddress listen{"127.0.0.1", 50051};  // as the flags' defaults: loopback unless told otherwise
  ListenAddress metrics_listen{"127.0.0.1", 9464};
  // --health-listen: a second, plaintext port for Kubernetes' gRPC probes (which speak no TLS); strata's
  // methods refuse calls that come in there. Only with Security::tls.
  std::optional<ListenAddress> health_listen;
  // --http-listen: the OpenAI-compatible HTTP API (server/http_api.h); off when absent.
  std::optional<ListenAddress> http_listen;
  // Its connection limits (server/README.md, "Connection limits and deadlines"): connections one client
  // address may hold (0: no cap of its own), and the seconds a client has to send a whole request (0: none).
  int64_t http_max_connections_per_peer = 256;
  int64_t http_read_timeout_seconds = 30;
};

// Transport security and API keys of the gRPC port.
struct Security {
  std::optional<ServerTls> tls;  // absent: plaintext
  // --api-key-file: strata's methods need "authorization: Bearer KEY" with one of these keys, except
  // `auth_open_methods` (full method names). Null: no key is needed. gRPC health checking and reflection
  // are always open (probes cannot send metadata).
  std::shared_ptr<const ApiKeys> api_keys;
  std::set<std::string> auth_open_methods;
};

// When the server stops serving: the drain and the readiness rule.
struct Lifecycle {
  // After SIGINT/SIGTERM/SIGHUP, how long generations in flight may run to their end before they are cut
  // (UNAVAILABLE). Inside Kubernetes' default 30 s terminationGracePeriodSeconds; 0 cuts at once.
  std::chrono::milliseconds drain_timeout{20'000};
  // The readiness rule (server/README.md, "Health"): after this many requests in a row end INTERNAL (a
  // failed forward pass or sampler, no token produced between them) health says NOT_SERVING, and a probe
  // generation runs every ready_probe_interval until one succeeds. 0: never.
  int64_t not_serving_after_errors = 5;
  std::chrono::milliseconds ready_probe_interval{5'000};
};

// A group of nodes serving one model (issue 24; runtime/executor/group_load.h): one strata-server per node, rank 0
// the leader (gRPC, HTTP, metrics, the engine), the others workers running their stages. Each field comes from its
// flag or else from LeaderWorkerSet's environment (LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS), so a pod
// needs no script.
struct GroupFlags {
  int size = 1;                         // --group-size; 1: no group
  int rank = 0;                         // --rank
  std::string leader_host;              // --leader HOST:PORT (or LWS_LEADER_ADDRESS): where workers reach the leader
  int leader_port = 50061;              // the leader's data port: --leader's, else --group-port
  std::string bind_host = "127.0.0.1";  // --group-bind: the address this node's data port binds
  // A worker's data port (its neighbours in the stage order connect to it): --group-port under LeaderWorkerSet
  // (each pod has its own address), else any free port (nodes that share a host, as the tests run them).
  int worker_port = 0;
  std::string secret;                          // --group-secret-file's bytes (trailing newline dropped)
  std::chrono::milliseconds timeout{120'000};  // --group-timeout: the group forming, planning and loading
  std::chrono::milliseconds deadline{10'000};  // --group-deadline: the longest a link may stay silent
};

// What strata-server runs with, in the parts its consumers take.
struct ServerOptions {
  // The model and where it goes: --model | --module-tree, --device-map, --max-memory, --dtype,
  // --kv-cache-tokens, --physical-devices (the flags strata-plan and strata-generate share).
  planner::Placement placement;
  ServingFlags serving;
  ClientLimits limits;
  Endpoints endpoints;
  Security security;
  Lifecycle lifecycle;
  GroupFlags group;
};

// The command line asked either for usage or for a server.
struct ServerCommand {
  bool help = false;
  ServerOptions options;
};

// Parses the arguments after argv[0]. Flags take "--flag VALUE" or "--flag=VALUE". Errors are
// InvalidArgument naming the flag and, where there is one, the value.
absl::StatusOr<ServerCommand> ParseServerFlags(std::span<const std::string> args);

// The text --help prints.
std::string ServerUsage();

}  // namespace strata::server
