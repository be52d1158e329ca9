// strata-generate: offline greedy generation from text or token ids, no server. Loads a checkpoint onto the
// devices a plan gives it and decodes a batch of prompts. Exit codes: 0 ok, 2 bad input (message on
// stderr naming it), 1 anything else.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/file_reader.h"
#include "cli/flags.h"
#include "cli/placement_flags.h"
#include "nlohmann/json.hpp"
#include "runtime/executor/loaded_model.h"
#include "tokenizer/tokenizer.h"

ABSL_FLAG(std::string, prompt, "",
          "a text prompt, encoded with the checkpoint's tokenizer.json; repeat for more prompts (may be mixed with "
          "--prompt-ids, order is kept)");
ABSL_FLAG(std::string, prompt_ids, "", "comma-separated token ids; repeat for more prompts");
ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json or a directory holding one (default: --model DIR)");
ABSL_FLAG(bool, no_special_tokens, false, "encode --prompt text without the tokenizer's special tokens (BOS...)");
ABSL_FLAG(int64_t, max_new_tokens, 16, "tokens to generate per prompt");
ABSL_FLAG(int64_t, top_logprobs, 0, "also report the K most likely tokens at each step");
ABSL_FLAG(int64_t, max_batch, 0, "KV-cache sequence slots");
ABSL_FLAG(int64_t, max_context, 0, "KV-cache positions per slot");
ABSL_FLAG(int64_t, warmup, 0,
          "run the batch this many times before the reported run (its ids and timings are dropped): the "
          "timings of a warm process, as llama-bench's warm-up run");
ABSL_FLAG(bool, json, false,
          "print {\"results\": [{\"ids\", \"text\", \"logprobs\", \"top_logprobs\"}], \"load\", \"timing\"} "
          "(\"text\": the new tokens decoded, special tokens skipped; present when a tokenizer is found)");

namespace {

using strata::cli::Flag;

constexpr strata::cli::PlacementFlagSet kPlacementFlags{.physical_devices = true};

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [...] [options]

Greedy decoding of prompts (run together as one batch) on the devices a plan gives the model.
)";
    command.flags = strata::cli::PlacementFlagSpecs(kPlacementFlags);
    command.flags.insert(
        command.flags.end(),
        {Flag(FLAGS_prompt, "TEXT").Repeatable(), Flag(FLAGS_prompt_ids, "IDS").Repeatable(),
         Flag(FLAGS_tokenizer, "PATH"), Flag(FLAGS_no_special_tokens), Flag(FLAGS_max_new_tokens, "N"),
         Flag(FLAGS_top_logprobs, "K"), Flag(FLAGS_max_batch, "N").ShowDefault("the number of prompts"),
         Flag(FLAGS_max_context, "N").ShowDefault("longest prompt + new tokens"), Flag(FLAGS_warmup, "N"),
         Flag(FLAGS_json)});
    return command;
  }();
  return command;
}

struct PromptArg {
  bool is_text = false;
  std::string value;  // the text, or comma-separated ids
};

int Fail(int code, absl::string_view message) {
  std::cerr << "strata-generate: " << message << "\n";
  return code;
}

// The prompts in the order they were given: --prompt and --prompt-ids may be mixed.
std::vector<PromptArg> Prompts(const strata::cli::ParsedArgs& parsed) {
  const absl::string_view text_flag = absl::GetFlagReflectionHandle(FLAGS_prompt).Name();
  const absl::string_view ids_flag = absl::GetFlagReflectionHandle(FLAGS_prompt_ids).Name();
  std::vector<PromptArg> prompts;
  for (const auto& [name, value] : parsed.given) {
    if (name == text_flag || name == ids_flag) prompts.push_back({name == text_flag, value});
  }
  return prompts;
}

// A count flag's value when given; an error naming it when it is negative.
absl::StatusOr<std::optional<int64_t>> Count(const strata::cli::ParsedArgs& parsed, const absl::Flag<int64_t>& flag) {
  if (!parsed.Given(flag)) return std::nullopt;
  const int64_t value = absl::GetFlag(flag);
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(strata::cli::Spelling(flag), ": \"", value, "\" is not a non-negative integer"));
  }
  return value;
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
  absl::StatusOr<strata::cli::ParsedArgs> parsed = strata::cli::Parse(Command(), argc, argv);
  if (!parsed.ok()) return Fail(2, absl::StrCat(parsed.status().message(), " (see --help)"));
  if (parsed->help) {
    std::cout << strata::cli::Help(Command());
    return 0;
  }
  const std::vector<PromptArg> prompts = Prompts(*parsed);
  absl::StatusOr<strata::cli::Placement> placement = strata::cli::ParsePlacement(*parsed, kPlacementFlags);
  if (!placement.ok()) return Fail(2, placement.status().message());
  if (prompts.empty()) return Fail(2, "give at least one --prompt TEXT or --prompt-ids IDS");

  // The tokenizer: required for text prompts, used for "text" in the output whenever one is found.
  const bool any_text = std::any_of(prompts.begin(), prompts.end(), [](const PromptArg& p) { return p.is_text; });
  std::unique_ptr<strata::tokenizer::Tokenizer> tokenizer;
  {
    const bool explicit_path = parsed->Given(FLAGS_tokenizer);
    const std::string path = explicit_path ? absl::GetFlag(FLAGS_tokenizer) : placement->model_dir->string();
    const bool present =
        explicit_path || strata::checkpoint::PathMayExist(std::filesystem::path(path) / "tokenizer.json");
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
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int64_t> ids;
    if (prompts[p].is_text) {
      absl::StatusOr<std::vector<int32_t>> encoded =
          tokenizer->Encode(prompts[p].value, !absl::GetFlag(FLAGS_no_special_tokens));
      if (!encoded.ok()) return Fail(2, absl::StrCat("--prompt (prompt ", p, "): ", encoded.status().message()));
      if (encoded->empty()) return Fail(2, absl::StrCat("--prompt (prompt ", p, "): encodes to no tokens"));
      ids.assign(encoded->begin(), encoded->end());
    } else {
      for (absl::string_view piece : absl::StrSplit(prompts[p].value, ',', absl::SkipWhitespace())) {
        int64_t id = 0;
        if (!absl::SimpleAtoi(piece, &id)) {
          return Fail(2, absl::StrCat("--prompt-ids (prompt ", p, "): \"", piece, "\" is not an integer token id"));
        }
        ids.push_back(id);
      }
    }
    request.prompts.push_back(std::move(ids));
  }
  absl::StatusOr<std::optional<int64_t>> new_tokens = Count(*parsed, FLAGS_max_new_tokens);
  absl::StatusOr<std::optional<int64_t>> top = Count(*parsed, FLAGS_top_logprobs);
  absl::StatusOr<std::optional<int64_t>> max_batch = Count(*parsed, FLAGS_max_batch);
  absl::StatusOr<std::optional<int64_t>> max_context = Count(*parsed, FLAGS_max_context);
  absl::StatusOr<std::optional<int64_t>> warmup = Count(*parsed, FLAGS_warmup);
  for (const auto* count : {&new_tokens, &top, &max_batch, &max_context, &warmup}) {
    if (!count->ok()) return Fail(2, count->status().message());
  }
  constexpr int64_t kMaxWarmup = 100;
  if (warmup->value_or(0) > kMaxWarmup) return Fail(2, absl::StrCat("--warmup: at most ", kMaxWarmup, " runs"));
  request.max_new_tokens = new_tokens->value_or(absl::GetFlag(FLAGS_max_new_tokens));
  request.top_logprobs = top->value_or(0);

  ServingRequest serving;
  serving.model_dir = *placement->model_dir;
  serving.device_map = placement->device_map;
  serving.max_memory = placement->max_memory;
  serving.physical = placement->physical_devices;
  serving.dtype = placement->dtype;
  size_t longest = 0;
  for (const auto& prompt : request.prompts) longest = std::max(longest, prompt.size());
  serving.max_batch = max_batch->value_or(static_cast<int64_t>(request.prompts.size()));
  serving.max_context = max_context->value_or(static_cast<int64_t>(longest) + request.max_new_tokens);
  absl::StatusOr<LoadOptions> options = PlanServing(serving);
  if (!options.ok()) {
    return Fail(options.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, options.status().message());
  }

  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadedModel::Load(*options);
  if (!model.ok()) {
    return Fail(model.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, model.status().message());
  }
  for (int64_t i = 0; i < warmup->value_or(0); ++i) {
    GenerateTiming ignored;
    absl::StatusOr<std::vector<GreedyResult>> warm = (*model)->Greedy(request, &ignored);
    if (!warm.ok()) {
      return Fail(warm.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, warm.status().message());
    }
  }
  GenerateTiming timing;
  absl::StatusOr<std::vector<GreedyResult>> results = (*model)->Greedy(request, &timing);
  if (!results.ok()) {
    return Fail(results.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1, results.status().message());
  }

  const LoadReport& report = (*model)->report();
  if (absl::GetFlag(FLAGS_json)) {
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
