#pragma once
// A character-level tokenizer.json for tests of structured outputs (the engine's, the server's, the fuzz harness's):
// ids 0-94 are the printable ASCII characters ' ' .. '~' (id = character - ' '), id 95 is the special "<eos>";
// the Fuse decoder joins tokens without spaces, so an output's text is its ids' characters. Plain C++ (no gtest).

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"

namespace strata::structured::testing {

inline constexpr int32_t kCharEos = 95;

inline std::string CharVocabularyJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int32_t id = 0; id < kCharEos; ++id) vocab[std::string(1, static_cast<char>(' ' + id))] = id;
  vocab["<eos>"] = kCharEos;
  const nlohmann::json json = {{"version", "1.0"},
                               {"added_tokens",
                                {{{"id", kCharEos},
                                  {"content", "<eos>"},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", false},
                                  {"special", true}}}},
                               {"normalizer", nullptr},
                               {"pre_tokenizer", nullptr},
                               {"post_processor", nullptr},
                               {"decoder", {{"type", "Fuse"}}},
                               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return json.dump();
}

}  // namespace strata::structured::testing
