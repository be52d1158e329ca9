// strata-generate: offline greedy generation from text or token ids, no server. Loads a checkpoint onto the
// devices a plan gives it and decodes a batch of prompts. Exit codes: 0 ok, 2 bad input (message on
// stderr naming it), 1 anything else.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/executor/loaded_model.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr char kUsage[] = R"(usage: strata-generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [...] [options]

Greedy decoding of prompts (run together as one batch) on the devices a plan gives the model.

  --model DIR               checkpoint directory (config.json + safetensors [+ tokenizer.json])
  --prompt TEXT             a text prompt, encoded with the checkpoint's tokenizer.json; repeat for
                            more prompts (may be mixed with --prompt-ids, order is kept)
  --prompt-ids IDS          comma-separated token ids; repeat for more prompts
  --tokenizer PATH          tokenizer.json or a directory holding one (default: --model DIR)
  --no-special-tokens       encode --prompt text without the tokenizer's special tokens (BOS...)
  --max-new-tokens N        tokens to generate per prompt (default 16)
  --top-logprobs K          also report the K most likely tokens at each step
  --device-map S            auto | balanced | balanced_low_0 (default) | sequential | JSON map | @FILE
  --max-memory SPEC         0=20GiB,1=20GiB,cpu=64GiB,disk=1TB
  --physical-devices MAP    run plan GPUs on these devices: 0=cpu,1=cpu or 0=cuda:0,1=cuda:0
                            (default: GPU i is cuda:i)
  --dtype D                 float32 | float16 | bfloat16 (default: the checkpoint's on GPUs,
                            float32 on the CPU)
  --max-batch N             KV-cache sequence slots (default: the number of prompts)
  --max-context N           KV-cache positions per slot (default: longest prompt + new tokens)
  --json                    print {"results": [{"ids", "text", "logprobs", "top_logprobs"}], "load", "timing"}
                            ("text": the new tokens decoded, special tokens skipped; present when
                            a tokenizer is found)
  --help                    this text
)";

struct PromptArg {
  bool is_text = false;
  std::string value;  // the text, or comma-separated ids
};

struct Flags {
  std::map<std::string, std::string> values;
  std::vector<PromptArg> prompts;
  bool json = false;
  bool special_tokens = true;
};

int Fail(int code, absl::string_view message) {
  std::cerr << "strata-generate: " << message << "\n";
  return code;
}

std::string ParseFlags(int argc, char** argv, Flags& flags) {
  const std::vector<std::string> with_value = {"--model",      "--max-new-tokens", "--top-logprobs",
                                               "--device-map", "--max-memory",     "--physical-devices",
                                               "--dtype",      "--max-batch",      "--max-context",
                                               "--tokenizer"};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    }
    if (arg == "--json" && !value) {
      flags.json = true;
      continue;
    }
    if (arg == "--no-special-tokens" && !value) {
      flags.special_tokens = false;
      continue;
    }
    const bool prompt = arg == "--prompt-ids" || arg == "--prompt";
    if (!prompt && std::find(with_value.begin(), with_value.end(), arg) == with_value.end()) {
      return absl::StrCat("unknown argument \"", argv[i], "\" (see --help)");
    }
    if (!value) {
      if (i + 1 >= argc) return absl::StrCat(arg, " needs a value");
      value = argv[++i];
    }
    if (prompt) {
      flags.prompts.push_back({arg == "--prompt", *value});
    } else {
      flags.values[arg] = *value;
    }
  }
  if (!flags.values.contains("--model")) return "--model DIR is required";
  if (flags.prompts.empty()) return "give at least one --prompt TEXT or --prompt-ids IDS";
  return "";
}

std::optional<int64_t> ParseCount(const Flags& flags, const std::string& flag, std::string& error) {
  auto it = flags.values.find(flag);
  if (it == flags.values.end()) return std::nullopt;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < 0) {
    error = absl::StrCat(flag, ": \"", it->second, "\" is not a non-negative integer");
    return std::nullopt;
  }
  return v;
}

// The generated text: the new ids decoded as HF's decode(skip_special_tokens=True) does. Invalid
// UTF-8 from byte tokens arrives as U+FFFD, so the JSON stays valid.
std::string DecodeNew(const strata::tokenizer::Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  std::vector<int32_t> narrow(ids.begin(), ids.end());
  return tokenizer.Decode(narrow, /*skip_special_tokens=*/true);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata::runtime;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage;
      return 0;
    }
  }
  Flags flags;
  if (std::string error = ParseFlags(argc, argv, flags); !error.empty()) return Fail(2, error);

  // The tokenizer: required for text prompts, used for "text" in the output whenever one is found.
  const bool any_text = std::any_of(flags.prompts.begin(), flags.prompts.end(), [](const PromptArg& p) {
    return p.is_text;
  });
  std::unique_ptr<strata::tokenizer::Tokenizer> tokenizer;
  {
    const bool explicit_path = flags.values.contains("--tokenizer");
    const std::string path = explicit_path ? flags.values["--tokenizer"] : flags.values["--model"];
    const bool present = explicit_path || std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json");
    if (present) {
      absl::StatusOr<std::unique_ptr<strata::tokenizer::Tokenizer>> loaded =
          strata::tokenizer::Tokenizer::FromPath(path);
      if (!loaded.ok()) return Fail(2, loaded.status().message());
      tokenizer = *std::move(loaded);
    } else if (any_text) {
      return Fail(2, absl::StrCat("--prompt needs a tokenizer: ", path,
                                  " has no tokenizer.json (pass --tokenizer PATH, or use --prompt-ids)"));
    }
  }

  GreedyRequest request;
  for (size_t p = 0; p < flags.prompts.size(); ++p) {
    std::vector<int64_t> ids;
    if (flags.prompts[p].is_text) {
      absl::StatusOr<std::vector<int32_t>> encoded = tokenizer->Encode(flags.prompts[p].value, flags.special_tokens);
      if (!encoded.ok()) return Fail(2, absl::StrCat("--prompt (prompt ", p, "): ", encoded.status().message()));
      if (encoded->empty()) return Fail(2, absl::StrCat("--prompt (prompt ", p, "): encodes to no tokens"));
      ids.assign(encoded->begin(), encoded->end());
    } else {
      for (absl::string_view piece : absl::StrSplit(flags.prompts[p].value, ',', absl::SkipWhitespace())) {
        int64_t id = 0;
        if (!absl::SimpleAtoi(piece, &id)) {
          return Fail(2, absl::StrCat("--prompt-ids (prompt ", p, "): \"", piece, "\" is not an integer token id"));
        }
        ids.push_back(id);
      }
    }
    request.prompts.push_back(std::move(ids));
  }
  std::string error;
  std::optional<int64_t> new_tokens = ParseCount(flags, "--max-new-tokens", error);
  std::optional<int64_t> top = ParseCount(flags, "--top-logprobs", error);
  std::optional<int64_t> max_batch = ParseCount(flags, "--max-batch", error);
  std::optional<int64_t> max_context = ParseCount(flags, "--max-context", error);
  if (!error.empty()) return Fail(2, error);
  request.max_new_tokens = new_tokens.value_or(16);
  request.top_logprobs = top.value_or(0);

  ServingRequest serving;
  serving.model_dir = flags.values["--model"];
  if (flags.values.contains("--device-map")) {
    absl::StatusOr<strata::planner::DeviceMapChoice> choice = strata::planner::ParseDeviceMapChoice(flags.values["--device-map"]);
    if (!choice.ok()) return Fail(2, absl::StrCat("--device-map: ", choice.status().message()));
    serving.device_map = *std::move(choice);
  }
  if (!flags.values["--max-memory"].empty()) {
    absl::StatusOr<strata::planner::MaxMemory> max_memory = strata::planner::ParseMaxMemory(flags.values["--max-memory"]);
    if (!max_memory.ok()) return Fail(2, absl::StrCat("--max-memory: ", max_memory.status().message()));
    serving.max_memory = *std::move(max_memory);
  }
  if (!flags.values["--physical-devices"].empty()) {
    absl::StatusOr<PhysicalDeviceMap> physical = ParsePhysicalDevices(flags.values["--physical-devices"]);
    if (!physical.ok()) return Fail(2, absl::StrCat("--physical-devices: ", physical.status().message()));
    serving.physical = *std::move(physical);
  }
  if (!flags.values["--dtype"].empty()) {
    absl::StatusOr<strata::planner::DType> dtype = strata::planner::ParseDType(flags.values["--dtype"]);
    if (!dtype.ok()) return Fail(2, absl::StrCat("--dtype: ", dtype.status().message()));
    serving.dtype = *dtype;
  }
  size_t longest = 0;
  for (const auto& prompt : request.prompts) longest = std::max(longest, prompt.size());
  serving.max_batch = max_batch.value_or(static_cast<int64_t>(request.prompts.size()));
  serving.max_context = max_context.value_or(static_cast<int64_t>(longest) + request.max_new_tokens);
  absl::StatusOr<LoadOptions> options = PlanServing(serving);
  if (!options.ok()) {
    return Fail(options.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, options.status().message());
  }

  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadedModel::Load(*options);
  if (!model.ok()) {
    return Fail(model.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, model.status().message());
  }
  GenerateTiming timing;
  absl::StatusOr<std::vector<GreedyResult>> results = (*model)->Greedy(request, &timing);
  if (!results.ok()) {
    return Fail(results.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, results.status().message());
  }

  const LoadReport& report = (*model)->report();
  if (flags.json) {
    nlohmann::ordered_json out;
    out["results"] = nlohmann::json::array();
    for (const GreedyResult& r : *results) {
      nlohmann::ordered_json item;
      item["ids"] = r.ids;
      if (tokenizer) item["text"] = DecodeNew(*tokenizer, r.ids);
      item["logprobs"] = r.logprobs;
      nlohmann::json top_json = nlohmann::json::array();
      for (const auto& step : r.top_logprobs) {
        nlohmann::json pairs = nlohmann::json::array();
        for (const TokenLogprob& t : step) pairs.push_back({t.id, t.logprob});
        top_json.push_back(std::move(pairs));
      }
      item["top_logprobs"] = std::move(top_json);
      out["results"].push_back(std::move(item));
    }
    out["load"] = {{"seconds", report.seconds},
                   {"dtype", report.dtype},
                   {"checkpoint_bytes", report.checkpoint_bytes},
                   {"zero_copy_tensors", report.zero_copy_tensors},
                   {"copied_tensors", report.copied_tensors},
                   {"disk_tensors", report.disk_tensors},
                   {"kv_cache_bytes", report.kv_cache_bytes},
                   {"stages", report.stages}};
    out["timing"] = {{"prefill_seconds", timing.prefill_seconds},
                     {"decode_seconds", timing.decode_seconds},
                     {"decode_steps", timing.decode_steps}};
    std::cout << out.dump() << "\n";
  } else {
    std::cerr << report.stages << "\n";
    for (size_t p = 0; p < results->size(); ++p) {
      std::cout << "prompt " << p << ":";
      for (int64_t id : (*results)[p].ids) std::cout << " " << id;
      if (tokenizer) std::cout << "\n  " << nlohmann::json(DecodeNew(*tokenizer, (*results)[p].ids)).dump();
      std::cout << "\n";
    }
  }
  return 0;
}
