// strata-generate: offline greedy generation from text or token ids, no server. Loads a checkpoint onto the
// devices a plan gives it and decodes a batch of prompts through the serving engine (runtime/engine/
// batch_generate.h): the same scheduler, executor and sampler the server runs. Exit codes: 0 ok, 2 bad
// input (message on stderr naming it), 1 anything else.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"
#include "planner/placement_flags.h"
#include "runtime/engine/batch_generate.h"
#include "runtime/engine/draft_model.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/speculation_flags.h"
#include "runtime/executor/loaded_model.h"
#include "tokenizer/tokenizer.h"

ABSL_FLAG(std::string, prompt, "",
          "a text prompt, encoded with the checkpoint's tokenizer.json; repeat for more prompts (may be mixed with "
          "--prompt-ids, order is kept)");
ABSL_FLAG(std::string, prompt_ids, "", "comma-separated token ids; repeat for more prompts");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json, tiktoken.model or a directory holding one (default: --model DIR)");
ABSL_FLAG(bool, no_special_tokens, false, "encode --prompt text without the tokenizer's special tokens (BOS...)");
ABSL_FLAG(int64_t, max_new_tokens, 16, "tokens to generate per prompt");
ABSL_FLAG(int64_t, top_logprobs, 0, "also report the K most likely tokens at each step");
ABSL_FLAG(int64_t, prompt_logprobs, -1,
          "also score every prompt token after the first (log-probability given the tokens before it) with the "
          "K most likely tokens there: \"prompt_logprobs\" and \"prompt_top_logprobs\" in --json");
ABSL_FLAG(double, presence_penalty, 0, "OpenAI's presence penalty over the generated tokens");
ABSL_FLAG(double, frequency_penalty, 0, "OpenAI's frequency penalty over the generated tokens");
ABSL_FLAG(double, repetition_penalty, 1, "transformers' repetition penalty over prompt and generated tokens");
ABSL_FLAG(std::string, logit_bias, "", "ID=BIAS,...: added to those ids' logits before choosing");
ABSL_FLAG(int64_t, min_tokens, 0, "the --eos-ids cannot be chosen before this many new tokens");
ABSL_FLAG(std::string, eos_ids, "",
          "comma-separated ids that end a sequence (finish \"eos\"); default none: exactly --max-new-tokens");
ABSL_FLAG(int64_t, prefill_chunk, 0, "prefill prompts in chunks of at most N tokens (default: the engine's)");
ABSL_FLAG(bool, prefix_cache, false, "reuse the KV blocks of prompt prefixes computed by earlier prompts");
ABSL_FLAG(int64_t, max_batch, 0, "KV-cache sequence slots");
ABSL_FLAG(int64_t, max_context, 0, "KV-cache positions per slot");
ABSL_FLAG(int64_t, warmup, 0,
          "run the batch this many times before the reported run (its ids and timings are dropped): the "
          "timings of a warm process, as llama-bench's warm-up run");
ABSL_FLAG(std::string, speculation_trace, "",
          "write one JSON line per verified proposal to this file (speculative decoding: {\"sequence\", \"at\", "
          "\"proposed\", \"accepted\"}; warm-up runs' too)");
ABSL_FLAG(bool, json, false,
          "print {\"results\": [{\"ids\", \"text\", \"logprobs\", \"top_logprobs\"}], \"load\", \"timing\"} "
          "(\"text\": the new tokens decoded, special tokens skipped; present when a tokenizer is found)");

namespace {

using strata::cli::Flag;

constexpr strata::planner::PlacementFlagSet kPlacementFlags{
    .physical_devices = true, .fp8_matmul = true, .runtime_reserve_auto = true};

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [...] [options]

Greedy decoding of prompts, run together through the serving engine, on the devices a plan gives the model.
)";
    command.flags = strata::planner::PlacementFlagSpecs(kPlacementFlags);
    command.flags.insert(command.flags.end(), {Flag(FLAGS_prompt, "TEXT").Repeatable(),
                                               Flag(FLAGS_prompt_ids, "IDS").Repeatable(),
                                               Flag(FLAGS_tokenizer, "PATH"),
                                               Flag(FLAGS_no_special_tokens),
                                               Flag(FLAGS_max_new_tokens, "N"),
                                               Flag(FLAGS_top_logprobs, "K"),
                                               Flag(FLAGS_prompt_logprobs, "K"),
                                               Flag(FLAGS_presence_penalty, "F"),
                                               Flag(FLAGS_frequency_penalty, "F"),
                                               Flag(FLAGS_repetition_penalty, "F"),
                                               Flag(FLAGS_logit_bias, "ID=BIAS,..."),
                                               Flag(FLAGS_min_tokens, "N"),
                                               Flag(FLAGS_eos_ids, "IDS"),
                                               Flag(FLAGS_prefill_chunk, "N"),
                                               Flag(FLAGS_prefix_cache),
                                               Flag(FLAGS_max_batch, "N").ShowDefault("the number of prompts"),
                                               Flag(FLAGS_max_context, "N").ShowDefault("longest prompt + new tokens"),
                                               Flag(FLAGS_warmup, "N"),
                                               Flag(FLAGS_speculation_trace, "FILE"),
                                               Flag(FLAGS_json)});
    for (strata::cli::FlagSpec& spec : strata::runtime::SpeculativeFlagSpecs("")) {
      command.flags.push_back(std::move(spec));
    }
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
std::string DecodeNew(const strata::tokenizer::Tokenizer& tokenizer,
                      const std::vector<strata::runtime::GeneratedToken>& tokens) {
  std::vector<int32_t> ids;
  for (const auto& t : tokens) ids.push_back(t.id);
  return tokenizer.Decode(ids, /*skip_special_tokens=*/true);
}

// A failure's exit code: 2 for bad input, 1 for anything else.
int FailWith(const absl::Status& status) {
  return Fail(status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1, status.message());
}

// The tokenizer: required for text prompts, used for "text" in the output whenever one is found (null
// when none is).
absl::StatusOr<std::unique_ptr<strata::tokenizer::Tokenizer>> FindTokenizer(const strata::cli::ParsedArgs& parsed,
                                                                            const std::filesystem::path& model_dir,
                                                                            bool needed) {
  const bool explicit_path = parsed.Given(FLAGS_tokenizer);
  const std::string path = explicit_path ? absl::GetFlag(FLAGS_tokenizer) : model_dir.string();
  if (explicit_path || strata::tokenizer::Tokenizer::DirectoryHasTokenizer(path)) {
    return strata::tokenizer::Tokenizer::FromPath(path);
  }
  if (needed) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt needs a tokenizer: ", path,
                                                   " has no tokenizer.json or tiktoken.model (pass --tokenizer PATH, "
                                                   "or use --prompt-ids)"));
  }
  return nullptr;
}

// The prompts as token ids, in the order given.
absl::StatusOr<std::vector<std::vector<int32_t>>> PromptIds(const std::vector<PromptArg>& prompts,
                                                            const strata::tokenizer::Tokenizer* tokenizer) {
  std::vector<std::vector<int32_t>> out;
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int32_t> ids;
    if (prompts[p].is_text) {
      absl::StatusOr<std::vector<int32_t>> encoded =
          tokenizer->Encode(prompts[p].value, !absl::GetFlag(FLAGS_no_special_tokens));
      if (!encoded.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--prompt (prompt ", p, "): ", encoded.status().message()));
      }
      if (encoded->empty())
        return absl::InvalidArgumentError(absl::StrCat("--prompt (prompt ", p, "): encodes to no tokens"));
      ids = *std::move(encoded);
    } else {
      for (absl::string_view piece : absl::StrSplit(prompts[p].value, ',', absl::SkipWhitespace())) {
        int64_t id = 0;
        if (!absl::SimpleAtoi(piece, &id)) {
          return absl::InvalidArgumentError(
              absl::StrCat("--prompt-ids (prompt ", p, "): \"", piece, "\" is not an integer token id"));
        }
        if (id < std::numeric_limits<int32_t>::min() || id > std::numeric_limits<int32_t>::max()) {
          return absl::InvalidArgumentError(
              absl::StrCat("prompt ", p, ": token id ", id, " at position ", ids.size(), " is outside the vocabulary"));
        }
        ids.push_back(static_cast<int32_t>(id));
      }
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// Comma-separated token ids (--eos-ids).
absl::StatusOr<std::vector<int32_t>> IdList(absl::string_view flag, const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id) || id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", piece, "\" is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

// The sampling flags beyond greedy decoding, each checked (ids against the vocabulary: GenerateBatch).
absl::Status ParseSampling(strata::runtime::SamplingParams& sampling) {
  sampling.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  sampling.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  sampling.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  if (!(sampling.repetition_penalty > 0)) return absl::InvalidArgumentError("--repetition-penalty: must be positive");
  for (absl::string_view piece : absl::StrSplit(absl::GetFlag(FLAGS_logit_bias), ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(piece, absl::MaxSplits('=', 1));
    int32_t id = 0;
    float bias = 0;
    if (!absl::SimpleAtoi(kv.first, &id) || !absl::SimpleAtof(kv.second, &bias)) {
      return absl::InvalidArgumentError(absl::StrCat("--logit-bias: \"", piece, "\" is not ID=BIAS"));
    }
    sampling.logit_bias.emplace_back(id, bias);
  }
  const int64_t min_tokens = absl::GetFlag(FLAGS_min_tokens);
  if (min_tokens < 0 || min_tokens > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("--min-tokens: not a count");
  }
  sampling.min_tokens = static_cast<int32_t>(min_tokens);
  const int64_t prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);
  if (prompt_logprobs < -1 || prompt_logprobs > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("--prompt-logprobs: not a count");
  }
  sampling.prompt_logprobs = static_cast<int32_t>(prompt_logprobs);
  return absl::OkStatus();
}

// The counts of the command line, each checked.
struct Counts {
  int64_t max_new_tokens = 16;
  int64_t top_logprobs = 0;
  std::optional<int64_t> max_batch, max_context;
  int64_t warmup = 0;
};

absl::StatusOr<Counts> ParseCounts(const strata::cli::ParsedArgs& parsed) {
  absl::StatusOr<std::optional<int64_t>> new_tokens = Count(parsed, FLAGS_max_new_tokens);
  absl::StatusOr<std::optional<int64_t>> top = Count(parsed, FLAGS_top_logprobs);
  absl::StatusOr<std::optional<int64_t>> max_batch = Count(parsed, FLAGS_max_batch);
  absl::StatusOr<std::optional<int64_t>> max_context = Count(parsed, FLAGS_max_context);
  absl::StatusOr<std::optional<int64_t>> warmup = Count(parsed, FLAGS_warmup);
  for (const auto* count : {&new_tokens, &top, &max_batch, &max_context, &warmup}) {
    if (!count->ok()) return count->status();
  }
  constexpr int64_t kMaxWarmup = 100;
  if (warmup->value_or(0) > kMaxWarmup) {
    return absl::InvalidArgumentError(absl::StrCat("--warmup: at most ", kMaxWarmup, " runs"));
  }
  Counts counts{new_tokens->value_or(absl::GetFlag(FLAGS_max_new_tokens)), top->value_or(0), *max_batch, *max_context,
                warmup->value_or(0)};
  constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();
  if (counts.max_new_tokens > kInt32) {
    return absl::InvalidArgumentError(absl::StrCat("--max-new-tokens: at most ", kInt32));
  }
  if (counts.top_logprobs > kInt32) return absl::InvalidArgumentError(absl::StrCat("--top-logprobs: at most ", kInt32));
  return counts;
}

void PrintJson(const std::vector<strata::runtime::BatchOutput>& results, const strata::runtime::LoadReport& report,
               const strata::runtime::BatchTiming& timing, const strata::runtime::EngineStats& before,
               const strata::runtime::EngineStats& stats, const strata::tokenizer::Tokenizer* tokenizer,
               bool prompt_logprobs) {
  nlohmann::ordered_json out;
  out["results"] = nlohmann::json::array();
  for (const strata::runtime::BatchOutput& r : results) {
    nlohmann::ordered_json item;
    std::vector<int64_t> ids;
    std::vector<double> logprobs;
    nlohmann::json top_json = nlohmann::json::array();
    for (const strata::runtime::GeneratedToken& t : r.tokens) {
      ids.push_back(t.id);
      logprobs.push_back(t.logprob);
      nlohmann::json pairs = nlohmann::json::array();
      for (const auto& [id, lp] : t.top) pairs.push_back({id, lp});
      if (!t.top.empty()) top_json.push_back(std::move(pairs));
    }
    item["ids"] = ids;
    if (tokenizer != nullptr) item["text"] = DecodeNew(*tokenizer, r.tokens);
    item["logprobs"] = logprobs;
    item["top_logprobs"] = std::move(top_json);
    item["finish"] = strata::runtime::FinishReasonName(r.finish);
    if (prompt_logprobs) {
      // Entry i scores prompt token i; the first has no context: null.
      nlohmann::json scored = nlohmann::json::array(), scored_top = nlohmann::json::array();
      for (const std::optional<strata::runtime::GeneratedToken>& t : r.prompt_logprobs) {
        if (!t) {
          scored.push_back(nullptr);
          scored_top.push_back(nullptr);
          continue;
        }
        scored.push_back(t->logprob);
        nlohmann::json pairs = nlohmann::json::array();
        for (const auto& [id, lp] : t->top) pairs.push_back({id, lp});
        scored_top.push_back(std::move(pairs));
      }
      item["prompt_logprobs"] = std::move(scored);
      item["prompt_top_logprobs"] = std::move(scored_top);
    }
    out["results"].push_back(std::move(item));
  }
  out["load"] = {{"seconds", report.seconds},
                 {"dtype", report.dtype},
                 {"checkpoint_bytes", report.checkpoint_bytes},
                 {"huge_page_bytes", report.huge_page_bytes},
                 {"copied_tensors", report.copied_tensors},
                 {"disk_tensors", report.disk_tensors},
                 {"ignored_tensors", report.spec.ignored_tensors.size()},
                 {"packed_tensors", report.packed_tensors},
                 {"pinned_bytes", report.pinned_bytes},
                 {"offload_slot_bytes", report.offload_slot_bytes},
                 {"fp8_scaled_mm_tensors", report.fp8_scaled_mm_tensors},
                 {"kv_cache_bytes", report.kv_cache_bytes},
                 {"stages", report.stages},
                 {"device_map", nlohmann::json::parse(strata::planner::PlanToJson(report.plan)["device_map"].dump())}};
  out["timing"] = {{"prefill_seconds", timing.prefill_seconds},
                   {"decode_seconds", timing.decode_seconds},
                   {"decode_steps", timing.decode_steps}};
  // The reported run's proposals (speculative decoding), not the warm-up runs'.
  out["engine"] = {{"prefix_queried_tokens", stats.prefix_queried_tokens},
                   {"prefix_hit_tokens", stats.prefix_hit_tokens},
                   {"spec_proposed_tokens", stats.spec_proposed_tokens - before.spec_proposed_tokens},
                   {"spec_accepted_tokens", stats.spec_accepted_tokens - before.spec_accepted_tokens},
                   {"spec_verifications", stats.spec_verifications - before.spec_verifications},
                   {"spec_skipped_steps", stats.spec_skipped_steps - before.spec_skipped_steps},
                   {"spec_method", stats.spec_method}};
  std::cout << out.dump() << "\n";
}

void PrintText(const std::vector<strata::runtime::BatchOutput>& results, const strata::runtime::LoadReport& report,
               const strata::tokenizer::Tokenizer* tokenizer) {
  std::cerr << report.stages << "\n";
  for (size_t p = 0; p < results.size(); ++p) {
    std::cout << "prompt " << p << ":";
    for (const auto& t : results[p].tokens) std::cout << " " << t.id;
    if (tokenizer != nullptr) std::cout << "\n  " << nlohmann::json(DecodeNew(*tokenizer, results[p].tokens)).dump();
    std::cout << "\n";
  }
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
  const std::vector<PromptArg> prompt_args = Prompts(*parsed);
  absl::StatusOr<strata::planner::Placement> placement = strata::planner::ParsePlacement(*parsed, kPlacementFlags);
  if (!placement.ok()) return Fail(2, placement.status().message());
  if (prompt_args.empty()) return Fail(2, "give at least one --prompt TEXT or --prompt-ids IDS");
  const bool any_text =
      std::any_of(prompt_args.begin(), prompt_args.end(), [](const PromptArg& p) { return p.is_text; });
  absl::StatusOr<std::unique_ptr<strata::tokenizer::Tokenizer>> tokenizer =
      FindTokenizer(*parsed, *placement->model_dir, any_text);
  if (!tokenizer.ok()) return Fail(2, tokenizer.status().message());
  absl::StatusOr<std::vector<std::vector<int32_t>>> prompts = PromptIds(prompt_args, tokenizer->get());
  if (!prompts.ok()) return Fail(2, prompts.status().message());
  absl::StatusOr<Counts> counts = ParseCounts(*parsed);
  if (!counts.ok()) return Fail(2, counts.status().message());
  SamplingParams sampling;
  if (absl::Status s = ParseSampling(sampling); !s.ok()) return Fail(2, s.message());
  absl::StatusOr<std::vector<int32_t>> eos_ids = IdList("--eos-ids", absl::GetFlag(FLAGS_eos_ids));
  if (!eos_ids.ok()) return Fail(2, eos_ids.status().message());
  const int64_t prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  if (prefill_chunk < 0) return Fail(2, "--prefill-chunk: must not be negative");
  absl::StatusOr<strata::runtime::SpeculativeOptions> speculative = strata::runtime::ParseSpeculativeFlags();
  if (!speculative.ok()) return Fail(2, speculative.status().message());

  ServingRequest request;
  request.model_dir = *placement->model_dir;
  request.device_map = placement->device_map;
  request.max_memory = placement->max_memory;
  request.physical = placement->physical_devices;
  request.dtype = placement->dtype;
  request.quantized_sizing = placement->quantized_sizing;
  request.serving.fp8_scaled_mm = placement->fp8_scaled_mm;
  request.mtp = speculative->method == SpeculativeOptions::Method::kMtp;
  size_t longest = 0;
  for (const auto& prompt : *prompts) longest = std::max(longest, prompt.size());
  request.serving.max_batch = counts->max_batch.value_or(static_cast<int64_t>(prompts->size()));
  request.serving.max_context = counts->max_context.value_or(static_cast<int64_t>(longest) + counts->max_new_tokens);
  request.runtime_reserve = placement->runtime_reserve;
  // One micro-batch in flight (below), of the engine's default token budget.
  request.runtime_reserve.limits = {.max_batch = request.serving.max_batch,
                                    .max_context = request.serving.max_context,
                                    .max_batch_tokens = EngineOptions{}.micro_batch_tokens,
                                    .micro_batches = 1,
                                    .prompt_logprobs = true};
  absl::StatusOr<LoadOptions> options = PlanLoad(request);
  if (!options.ok()) return FailWith(options.status());
  absl::StatusOr<std::unique_ptr<LoadedModel>> model = LoadedModel::Load(*options);
  if (!model.ok()) return FailWith(model.status());
  std::unique_ptr<LoadedModel> draft;  // --draft-model, planned beside the model
  if (!speculative->draft_model.empty()) {
    if (absl::Status same = CheckDraftTokenizer(request.model_dir, speculative->draft_model); !same.ok()) {
      return FailWith(same);
    }
    absl::StatusOr<LoadOptions> draft_options = PlanDraftLoad(request, *options, speculative->draft_model);
    if (!draft_options.ok()) return FailWith(draft_options.status());
    absl::StatusOr<std::unique_ptr<LoadedModel>> loaded = LoadedModel::Load(*draft_options);
    if (!loaded.ok()) return FailWith(loaded.status());
    draft = *std::move(loaded);
  }

  // Greedy (temperature 0) for exactly max_new_tokens unless --eos-ids are given. One micro-batch in
  // flight, so that the engine forms the same batches on every run (the server's default, 2, overlaps
  // stages instead), and no prefix cache unless asked for, so that a --warmup run leaves nothing the
  // measured run reuses.
  EngineOptions engine_options;
  engine_options.max_queue = static_cast<int64_t>(prompts->size());
  engine_options.micro_batches = 1;
  engine_options.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  engine_options.speculative = *speculative;
  engine_options.draft = draft.get();
  engine_options.speculation_trace = absl::GetFlag(FLAGS_speculation_trace);
  if (prefill_chunk > 0) engine_options.prefill_chunk_tokens = prefill_chunk;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Start(**model, nullptr, *eos_ids, engine_options);
  if (!engine.ok()) return FailWith(engine.status());
  sampling.max_new_tokens = static_cast<int32_t>(counts->max_new_tokens);
  sampling.top_logprobs = static_cast<int32_t>(counts->top_logprobs);
  sampling.ignore_eos = eos_ids->empty();
  for (int64_t i = 0; i < counts->warmup; ++i) {
    absl::StatusOr<std::vector<BatchOutput>> warm = GenerateBatch(**engine, *prompts, sampling);
    if (!warm.ok()) return FailWith(warm.status());
  }
  BatchTiming timing;
  const strata::runtime::EngineStats before = (*engine)->Stats();
  absl::StatusOr<std::vector<BatchOutput>> results = GenerateBatch(**engine, *prompts, sampling, &timing);
  if (!results.ok()) return FailWith(results.status());
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(*results, (*model)->report(), timing, before, (*engine)->Stats(), tokenizer->get(),
              sampling.prompt_logprobs >= 0);
  } else {
    PrintText(*results, (*model)->report(), tokenizer->get());
  }
  return 0;
}
