#pragma once
// What the server-side harnesses (fuzz_generate_request, fuzz_http_request) validate against: a small
// tokenizer and a ChatML chat template, built here so that no harness needs a file.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "chat_template/checkpoint_template.h"
#include "nlohmann/json.hpp"
#include "server/served_model.h"
#include "tokenizer/tokenizer.h"

namespace strata::fuzz {

using strata::tokenizer::Tokenizer;

// A small Llama-2 style tokenizer (Metaspace, byte fallback, <s> added by the post-processor), built
// here so that the harness needs no file: specials, the 256 byte tokens, "▁" and the ASCII letters, and
// a few merges.
inline const Tokenizer& SmallTokenizer() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    nlohmann::json vocab = nlohmann::json::object();
    int id = 0;
    for (const char* special : {"<unk>", "<s>", "</s>"}) vocab[special] = id++;
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = id++;
    }
    vocab["\u2581"] = id++;
    for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = id++;
    for (const char* merged : {"\u2581h", "he", "ll", "\u2581he", "llo", "\u2581hello"}) vocab[merged] = id++;
    // Pairs built one by one: a braced list of two-string lists would make nlohmann build an object.
    nlohmann::json merges = nlohmann::json::array();
    for (const auto& [left, right] : {std::pair<const char*, const char*>{"\u2581", "h"},
                                      {"h", "e"},
                                      {"l", "l"},
                                      {"\u2581h", "e"},
                                      {"ll", "o"},
                                      {"\u2581he", "llo"}}) {
      merges.push_back(nlohmann::json::array({left, right}));
    }
    nlohmann::json added = nlohmann::json::array();
    for (int i = 0; i < 3; ++i) {
      const char* content[] = {"<unk>", "<s>", "</s>"};
      added.push_back({{"id", i},
                       {"content", content[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    }
    const nlohmann::json json = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}}},
        {"post_processor",
         {{"type", "TemplateProcessing"},
          {"single",
           {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", "<unk>"},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", true},
          {"byte_fallback", true},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", merges}}}};
    absl::StatusOr<std::unique_ptr<Tokenizer>> built = Tokenizer::FromJson(json.dump());
    if (!built.ok()) {
      std::fprintf(stderr, "fuzz harness: the built-in tokenizer does not load: %s\n",
                   std::string(built.status().message()).c_str());
      std::abort();
    }
    return *std::move(built);
  }();
  return *tokenizer;
}

// ChatML (Qwen2.5's shape, without tools), with the special tokens a checkpoint would give it.
inline const chat_template::CheckpointChatTemplate& SmallChatTemplate() {
  static const chat_template::CheckpointChatTemplate chat = [] {
    absl::StatusOr<chat_template::Template> parsed = chat_template::ParseTemplate(
        "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- "
        "endif %}",
        "chatml.jinja");
    if (!parsed.ok()) {
      std::fprintf(stderr, "fuzz harness: the built-in chat template does not parse: %s\n",
                   std::string(parsed.status().message()).c_str());
      std::abort();
    }
    chat_template::CheckpointChatTemplate out;
    out.templates.emplace("default", *std::move(parsed));
    out.special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
    return out;
  }();
  return chat;
}

inline server::GenerateLimits SmallLimits() {
  server::GenerateLimits limits;
  limits.vocab_size = 320;  // a little above the tokenizer's vocabulary, as a model's padded embedding is
  limits.max_context = 2048;
  limits.max_new_tokens = 1024;
  return limits;
}

// What code after the validation relies on (engine admission, sampling, stop strings, the stream).
inline void CheckAccepted(const runtime::GenerationRequest& request, const server::GenerateLimits& limits) {
  const auto& s = request.sampling;
  if (request.prompt.empty()) std::abort();
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= limits.vocab_size) std::abort();
  }
  // 0 only for a request that scores its prompt.
  if (s.max_new_tokens < (s.prompt_logprobs >= 0 ? 0 : 1) || s.max_new_tokens > limits.max_new_tokens) std::abort();
  // What counts against --max-context: every prompt token and every token that may be generated.
  if (static_cast<int64_t>(request.prompt.size()) + s.max_new_tokens > limits.max_context) std::abort();
  if (!std::isfinite(s.temperature) || s.temperature < 0) std::abort();
  if (!(s.top_p > 0 && s.top_p <= 1)) std::abort();
  if (!std::isfinite(s.repetition_penalty) || s.repetition_penalty <= 0) std::abort();
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2)) std::abort();
  if (!(s.frequency_penalty >= -2 && s.frequency_penalty <= 2)) std::abort();
  for (const auto& [id, bias] : s.logit_bias) {
    if (id < 0 || id >= limits.vocab_size || !(bias >= -100 && bias <= 100)) std::abort();
  }
  if (s.min_tokens < 0 || s.min_tokens > s.max_new_tokens) std::abort();
  if (s.prompt_logprobs < -1 || s.prompt_logprobs > limits.max_top_logprobs) std::abort();
  if (s.top_k < 0 || s.top_k > limits.vocab_size) std::abort();
  if (s.top_logprobs < 0 || s.top_logprobs > limits.max_top_logprobs) std::abort();
  if (static_cast<int64_t>(s.stop.size()) > limits.max_stop_strings) std::abort();
  for (const std::string& stop : s.stop) {
    if (stop.empty() || static_cast<int64_t>(stop.size()) > limits.max_stop_bytes) std::abort();
  }
  if (static_cast<int64_t>(request.request_id.size()) > limits.max_request_id_bytes) std::abort();
}

}  // namespace strata::fuzz
