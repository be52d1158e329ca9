#include "server/flags.h"

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::server {
namespace {

// Flags that take a value, in the order --help lists them.
constexpr absl::string_view kValueFlags[] = {
    "model",          "module-tree",    "device-map",       "max-memory",       "dtype",       "kv-cache-tokens",
    "listen",         "metrics-listen", "physical-devices", "max-batch",        "max-context", "max-queue",
    "max-new-tokens", "micro-batches",  "prefill-chunk",    "intra-op-threads", "inject-fault",
};

bool IsValueFlag(absl::string_view name) {
  for (absl::string_view flag : kValueFlags) {
    if (flag == name) return true;
  }
  return false;
}

// Prefixes a planner error with the flag it came from, keeping its code.
absl::Status ForFlag(absl::string_view flag, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("--", flag, ": ", status.message()));
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
  ServerCommand command;
  std::map<std::string, std::string, std::less<>> values;
  for (size_t i = 0; i < args.size(); ++i) {
    const absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      command.help = true;
      return command;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", arg, "\" (flags start with --)"));
    }
    absl::string_view name = arg.substr(2);
    std::optional<absl::string_view> value;
    if (const size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (!IsValueFlag(name)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!value.has_value()) {
      if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    if (!values.emplace(std::string(name), std::string(*value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " is given twice"));
    }
  }

  ServerOptions& options = command.options;
  const auto find = [&values](absl::string_view name) -> const std::string* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : &it->second;
  };

  const std::string* model = find("model");
  const std::string* module_tree = find("module-tree");
  if (model != nullptr && module_tree != nullptr) {
    return absl::InvalidArgumentError("--model and --module-tree are exclusive: give one");
  }
  if (model == nullptr && module_tree == nullptr) {
    return absl::InvalidArgumentError("one of --model DIR or --module-tree FILE is required");
  }
  if (model != nullptr) {
    if (model->empty()) return absl::InvalidArgumentError("--model: empty path");
    options.model_dir = *model;
  } else {
    if (module_tree->empty()) return absl::InvalidArgumentError("--module-tree: empty path");
    options.module_tree = *module_tree;
  }

  if (const std::string* text = find("device-map")) {
    absl::StatusOr<planner::DeviceMapChoice> choice = planner::ParseDeviceMapChoice(*text);
    if (!choice.ok()) return ForFlag("device-map", choice.status());
    options.device_map = *std::move(choice);
  }
  if (const std::string* text = find("max-memory")) {
    absl::StatusOr<planner::MaxMemory> max_memory = planner::ParseMaxMemory(*text);
    if (!max_memory.ok()) return ForFlag("max-memory", max_memory.status());
    options.max_memory = *std::move(max_memory);
  }
  if (const std::string* text = find("dtype")) {
    absl::StatusOr<planner::DType> dtype = planner::ParseDType(*text);
    if (!dtype.ok()) return ForFlag("dtype", dtype.status());
    options.dtype = *dtype;
  }
  if (const std::string* text = find("kv-cache-tokens")) {
    if (!absl::SimpleAtoi(*text, &options.kv_cache_tokens) || options.kv_cache_tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-tokens: \"", *text, "\" is not a non-negative integer"));
    }
  }
  if (const std::string* text = find("physical-devices")) {
    absl::StatusOr<runtime::PhysicalDeviceMap> physical = runtime::ParsePhysicalDevices(*text);
    if (!physical.ok()) return ForFlag("physical-devices", physical.status());
    options.physical_devices = *std::move(physical);
  }
  // Integer flags: name, destination, smallest allowed value.
  for (auto [flag, value, least] : {std::tuple{"max-batch", &options.max_batch, int64_t{1}},
                                    std::tuple{"max-context", &options.max_context, int64_t{1}},
                                    std::tuple{"max-queue", &options.max_queue, int64_t{0}},
                                    std::tuple{"max-new-tokens", &options.max_new_tokens, int64_t{1}},
                                    std::tuple{"micro-batches", &options.micro_batches, int64_t{0}},
                                    std::tuple{"prefill-chunk", &options.prefill_chunk, int64_t{1}}}) {
    if (const std::string* text = find(flag)) {
      if (!absl::SimpleAtoi(*text, value) || *value < least) {
        return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", *text, "\" is not an integer >= ", least));
      }
    }
  }
  if (const std::string* text = find("intra-op-threads")) {
    if (!absl::SimpleAtoi(*text, &options.intra_op_threads) || options.intra_op_threads < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--intra-op-threads: \"", *text, "\" is not an integer >= 0"));
    }
  }
  if (const std::string* text = find("inject-fault")) {
    absl::StatusOr<runtime::FaultInjection> fault = runtime::ParseFaultInjection(*text);
    if (!fault.ok()) return ForFlag("inject-fault", fault.status());
    options.fault = *fault;
  }
  if (options.max_new_tokens > options.max_context) {
    return absl::InvalidArgumentError(absl::StrCat("--max-new-tokens: ", options.max_new_tokens,
                                                   " is more than --max-context ", options.max_context));
  }
  for (auto [flag, address] :
       {std::pair{"listen", &options.listen}, std::pair{"metrics-listen", &options.metrics_listen}}) {
    if (const std::string* text = find(flag)) {
      absl::StatusOr<ListenAddress> parsed = ParseListenAddress(*text);
      if (!parsed.ok()) return ForFlag(flag, parsed.status());
      *address = *std::move(parsed);
    }
  }
  return command;
}

std::string ServerUsage() {
  return R"(Usage: strata-server (--model DIR | --module-tree FILE) [flags]

Plans where every module of a model lives (transformers' device_map semantics) and serves the plan
over gRPC (strata.v1.InferenceService/GetDeviceMap, health checking, reflection) and Prometheus.
When --model DIR holds safetensors weights, the server also loads them onto the planned devices and
serves Generate (health is NOT_SERVING until the weights are loaded); otherwise it only plans.

  --model DIR             checkpoint directory: config.json, optionally *.safetensors (headers are
                          checked against the config)
  --module-tree FILE      a module tree JSON (tools/export_module_tree.py) instead of --model
  --device-map S          balanced_low_0 (default), balanced, auto, sequential; or a manual map as
                          JSON ({"model.embed_tokens": 0, "lm_head": "cpu", ...}) or @FILE holding it
  --max-memory SPEC       per-device budgets as accelerate reads them: 0=20GiB,1=20GiB,cpu=64GiB
                          (default: 90% of the available host memory, on cpu)
  --dtype D               size the weights in D (float16, bfloat16, float32, ...); default: the
                          checkpoint's torch_dtype
  --kv-cache-tokens N     reserve KV cache for N tokens on every GPU that holds decoder layers (0);
                          when serving weights the reserve is --max-batch x --max-context instead
Serving (weights present):
  --physical-devices MAP  run plan GPUs on these devices: 0=cpu,1=cpu or 0=cuda:0,1=cuda:0
                          (default: GPU i is cuda:i)
  --max-batch N           KV-cache slots: sequences generating at once (16)
  --max-context N         KV-cache positions per slot: prompt + new tokens (2048)
  --max-queue N           requests waiting for a slot before RESOURCE_EXHAUSTED (256)
  --max-new-tokens N      most new tokens a request may ask for (default: --max-context)
  --micro-batches N       micro-batches in flight across the stages; 1 runs one stage at a time
                          (default 0: one per stage of the plan)
  --prefill-chunk N       prompt tokens per prefill chunk (256)
  --intra-op-threads N    LibTorch intra-op threads per stage worker (default: LibTorch's)
  --inject-fault SPEC     testing only: stage=N,call=M[,repeat][,device_lost] makes stage N throw on
                          its M-th micro-batch (device_lost: as a sticky CUDA error would)
  --listen HOST:PORT      gRPC address (0.0.0.0:50051)
  --metrics-listen HOST:PORT
                          Prometheus /metrics address (0.0.0.0:9464)
  --help                  this text

Exit status: 0 after SIGINT/SIGTERM, 2 on a bad flag or plan (the message names it), 1 otherwise
(for example a port already in use, or a device that became unusable while serving).
)";
}

}  // namespace strata::server
