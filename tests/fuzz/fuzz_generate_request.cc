// libFuzzer harness: a GenerateRequest as the server receives it, raw wire bytes, through the one
// validation at the edge (server/generate_validation.h), once with a tokenizer and once without. Links
// the proto library, the tokenizer and generate_validation.cc only: no torch, no gRPC server.
// A request the validation accepts must keep what the rest of the server assumes of it (checked below).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "nlohmann/json.hpp"
#include "server/generate_validation.h"
#include "tokenizer/tokenizer.h"

namespace {

using strata::server::GenerateLimits;
using strata::tokenizer::Tokenizer;

// A small Llama-2 style tokenizer (Metaspace, byte fallback, <s> added by the post-processor), built
// here so that the harness needs no file: specials, the 256 byte tokens, "▁" and the ASCII letters, and
// a few merges.
const Tokenizer& SmallTokenizer() {
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
      std::fprintf(stderr, "fuzz_generate_request: the built-in tokenizer does not load: %s\n",
                   std::string(built.status().message()).c_str());
      std::abort();
    }
    return *std::move(built);
  }();
  return *tokenizer;
}

GenerateLimits Limits() {
  GenerateLimits limits;
  limits.vocab_size = 320;  // a little above the tokenizer's vocabulary, as a model's padded embedding is
  limits.max_context = 2048;
  limits.max_new_tokens = 1024;
  return limits;
}

// What code after the validation relies on (engine admission, sampling, stop strings, the stream).
void CheckAccepted(const strata::runtime::GenerationRequest& request, const GenerateLimits& limits) {
  const auto& s = request.sampling;
  if (request.prompt.empty()) std::abort();
  for (int32_t id : request.prompt) {
    if (id < 0 || id >= limits.vocab_size) std::abort();
  }
  if (s.max_new_tokens < 1 || s.max_new_tokens > limits.max_new_tokens) std::abort();
  // What counts against --max-context: every prompt token and every token that may be generated.
  if (static_cast<int64_t>(request.prompt.size()) + s.max_new_tokens > limits.max_context) std::abort();
  if (!std::isfinite(s.temperature) || s.temperature < 0) std::abort();
  if (!(s.top_p > 0 && s.top_p <= 1)) std::abort();
  if (!std::isfinite(s.repetition_penalty) || s.repetition_penalty <= 0) std::abort();
  if (s.top_k < 0 || s.top_k > limits.vocab_size) std::abort();
  if (s.top_logprobs < 0 || s.top_logprobs > limits.max_top_logprobs) std::abort();
  if (static_cast<int64_t>(s.stop.size()) > limits.max_stop_strings) std::abort();
  for (const std::string& stop : s.stop) {
    if (stop.empty() || static_cast<int64_t>(stop.size()) > limits.max_stop_bytes) std::abort();
  }
  if (static_cast<int64_t>(request.request_id.size()) > limits.max_request_id_bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view wire(reinterpret_cast<const char*>(data), size);
  static const GenerateLimits limits = Limits();
  for (const Tokenizer* tokenizer : {&SmallTokenizer(), static_cast<const Tokenizer*>(nullptr)}) {
    absl::StatusOr<strata::runtime::GenerationRequest> request =
        strata::server::ValidateGenerateRequest(wire, limits, tokenizer);
    if (request.ok()) CheckAccepted(*request, limits);
  }
  return 0;
}
