#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/absl_compat.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "nlohmann/json.hpp"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoders.h"
#include "tokenizer/json_path.h"
#include "tokenizer/normalizers.h"
#include "tokenizer/pieces.h"
#include "tokenizer/post_processors.h"
#include "tokenizer/pre_tokenizers.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/utf8.h"

namespace strata::tokenizer {

namespace {

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, std::string_view source) {
  // As deep as tokenizers itself reads (serde_json); the Sequence readers recurse once per level.
  absl::StatusOr<nlohmann::json> parsed = base::ParseJson(text, base::kMaxJsonDepth, source);
  if (!parsed.ok()) return parsed.status();
  nlohmann::json json = *std::move(parsed);
  if (!json.is_object()) return absl::InvalidArgumentError(base::StrCat(source, ": expected a JSON object"));
  return json;
}

// A token named in tokenizer_config.json: "<s>" or {"content": "<s>", ...}.
absl::StatusOr<std::string> ConfigTokenContent(const JsonAt& config, std::string_view key) {
  JsonAt f = config.Field(key);
  if (f.value.is_string()) return f.value.get<std::string>();
  if (f.value.is_object()) return f.String("content");
  return f.Error("expected a token string or an object with \"content\"");
}

// Encode's input limit: offsets inside a piece stay well within 32 bits.
constexpr size_t kMaxTextBytes = size_t{1} << 30;

// The type of a component object ("" when it has none), and its parts when it is a Sequence (`parts_key`).
std::string ComponentType(const nlohmann::json& component) {
  if (!component.is_object()) return "";
  auto type = component.find("type");
  return type != component.end() && type->is_string() ? type->get<std::string>() : "";
}
std::vector<nlohmann::json> SequenceParts(const nlohmann::json& component, const char* parts_key) {
  if (ComponentType(component) != "Sequence") return {component};
  auto parts = component.find(parts_key);
  if (parts == component.end() || !parts->is_array()) return {};
  return std::vector<nlohmann::json>(parts->begin(), parts->end());
}

// xgrammar's HFTokenizerAnalyzer::DetectVocabType: the first ByteLevel or ByteFallback among the decoders.
Tokenizer::TokenSpelling DetectTokenSpelling(const nlohmann::json& root) {
  auto decoder = root.find("decoder");
  if (decoder == root.end()) return Tokenizer::TokenSpelling::kRaw;
  for (const nlohmann::json& part : SequenceParts(*decoder, "decoders")) {
    const std::string type = ComponentType(part);
    if (type == "ByteLevel") return Tokenizer::TokenSpelling::kByteLevel;
    if (type == "ByteFallback") return Tokenizer::TokenSpelling::kByteFallback;
  }
  return Tokenizer::TokenSpelling::kRaw;
}

// xgrammar's HFTokenizerAnalyzer::DetectAddPrefixSpace: a Prepend("\u2581") normalizer (alone or in a Sequence),
// or a top-level Metaspace pre-tokenizer whose prepend_scheme is "always" or "first".
bool DetectPrefixSpace(const nlohmann::json& root) {
  if (auto normalizer = root.find("normalizer"); normalizer != root.end()) {
    for (const nlohmann::json& part : SequenceParts(*normalizer, "normalizers")) {
      auto prepend = part.is_object() ? part.find("prepend") : part.end();
      if (ComponentType(part) == "Prepend" && prepend != part.end() && *prepend == "\u2581") return true;
    }
  }
  auto pre = root.find("pre_tokenizer");
  if (pre == root.end() || ComponentType(*pre) != "Metaspace") return false;
  auto scheme = pre->find("prepend_scheme");
  return scheme != pre->end() && (*scheme == "always" || *scheme == "first");
}

// A file FromPath reads as a tiktoken rank file rather than as tokenizer.json.
bool IsTiktokenFileName(const std::filesystem::path& p) {
  return p.filename() == "tiktoken.model" || p.extension() == ".tiktoken";
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromPath(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) {
    if (!base::PathMayExist(p / "tokenizer.json") && base::PathMayExist(p / "tiktoken.model")) {
      // Kimi K2 and its kin ship a tiktoken vocabulary instead of tokenizer.json.
      auto ranks = base::ReadRegularFile(p / "tiktoken.model", base::kMaxTokenizerFileBytes);
      if (!ranks.ok()) return ranks.status();
      auto config = base::ReadRegularFileIfPresent(p / "tokenizer_config.json", base::kMaxConfigFileBytes);
      if (!config.ok()) return config.status();
      return FromTiktoken(*ranks, config->value_or(""), (p / "tiktoken.model").string());
    }
    auto json = base::ReadRegularFile(p / "tokenizer.json", base::kMaxTokenizerFileBytes);
    if (!json.ok()) return json.status();
    auto config = base::ReadRegularFileIfPresent(p / "tokenizer_config.json", base::kMaxConfigFileBytes);
    if (!config.ok()) return config.status();
    return FromJson(*json, config->value_or(""), (p / "tokenizer.json").string());
  }
  auto json = base::ReadRegularFile(p, base::kMaxTokenizerFileBytes);
  if (!json.ok()) return json.status();
  if (IsTiktokenFileName(p)) return FromTiktoken(*json, {}, path);
  return FromJson(*json, {}, path);
}

bool Tokenizer::DirectoryHasTokenizer(const std::string& dir) {
  const std::filesystem::path p(dir);
  return base::PathMayExist(p / "tokenizer.json") || base::PathMayExist(p / "tiktoken.model");
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTiktoken(std::string_view ranks, std::string_view config_json,
                                                                   std::string_view source) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  auto model = TiktokenModel::Parse(ranks, source);
  if (!model.ok()) return model.status();
  const int32_t num_ranks = (*model)->size();
  tok->model_ = *std::move(model);

  nlohmann::json config;  // null when there is no tokenizer_config.json
  if (!config_json.empty()) {
    auto parsed = ParseJson(config_json, "tokenizer_config.json");
    if (!parsed.ok()) return parsed.status();
    config = *std::move(parsed);
  }
  auto specials = TiktokenSpecialTokens(JsonAt{config, "", "tokenizer_config.json"}, num_ranks);
  if (!specials.ok()) return specials.status();
  auto added = AddedVocabulary::Parse(JsonAt{*specials, "added_tokens", source}, nullptr);
  if (!added.ok()) return added.status();
  tok->added_ = std::make_unique<AddedVocabulary>(*std::move(added));
  tok->tiktoken_ = true;
  tok->token_spelling_ = TokenSpelling::kByteLevel;  // IdToToken spells the rank's bytes in the byte-level alphabet

  // The pipeline tiktoken runs, in tokenizer.json's terms: the regex isolates pieces, the model merges each
  // piece's bytes, and the ByteLevel decoder turns the byte-level spelling back into text.
  const nlohmann::json split = {{"type", "Split"},
                                {"pattern", {{"Regex", std::string(kKimiPattern)}}},
                                {"behavior", "Isolated"},
                                {"invert", false}};
  auto pre_tokenizer = ParsePreTokenizer(JsonAt{split, "pre_tokenizer", source});
  if (!pre_tokenizer.ok()) return pre_tokenizer.status();
  tok->pre_tokenizer_ = *std::move(pre_tokenizer);
  const nlohmann::json byte_level = {{"type", "ByteLevel"}};
  auto decoder = ParseDecoder(JsonAt{byte_level, "decoder", source});
  if (!decoder.ok()) return decoder.status();
  tok->decoder_ = *std::move(decoder);
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json, std::string_view source) {
  auto parsed = ParseJson(tokenizer_json, source);
  if (!parsed.ok()) return parsed.status();
  const JsonAt root{*parsed, "", source};
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->token_spelling_ = DetectTokenSpelling(*parsed);
  tok->adds_prefix_space_ = DetectPrefixSpace(*parsed);

  // Truncation and padding change the ids of a single encode; strata does neither, so a file that
  // asks for them is refused rather than encoded differently.
  for (const char* key : {"truncation", "padding"}) {
    if (root.Has(key)) return root.FieldError(key, "unsupported: must be null (strata does not truncate or pad)");
  }
  if (root.Has("normalizer")) {
    auto n = ParseNormalizer(root.Field("normalizer"));
    if (!n.ok()) return n.status();
    tok->normalizer_ = *std::move(n);
  }
  if (root.Has("pre_tokenizer")) {
    auto p = ParsePreTokenizer(root.Field("pre_tokenizer"));
    if (!p.ok()) return p.status();
    tok->pre_tokenizer_ = *std::move(p);
  }
  auto model = BpeModel::Parse(root.Field("model"));
  if (!model.ok()) return model.status();
  tok->model_ = *std::move(model);
  if (root.Has("post_processor")) {
    auto p = ParsePostProcessor(root.Field("post_processor"));
    if (!p.ok()) return p.status();
    tok->post_processor_ = *std::move(p);
  }
  if (root.Has("decoder")) {
    auto d = ParseDecoder(root.Field("decoder"));
    if (!d.ok()) return d.status();
    tok->decoder_ = *std::move(d);
  }
  auto added = AddedVocabulary::Parse(root.Field("added_tokens"), tok->normalizer_.get());
  if (!added.ok()) return added.status();
  tok->added_ = std::make_unique<AddedVocabulary>(*std::move(added));

  if (!config_json.empty() && tok->post_processor_ == nullptr) {
    // transformers adds BOS/EOS itself for files without a post-processor when the config asks.
    auto config = ParseJson(config_json, "tokenizer_config.json");
    if (!config.ok()) return config.status();
    const JsonAt c{*config, "", "tokenizer_config.json"};
    std::vector<int32_t> prefix, suffix;
    for (auto [flag, token_key, to] :
         {std::tuple{"add_bos_token", "bos_token", &prefix}, std::tuple{"add_eos_token", "eos_token", &suffix}}) {
      auto add = c.Bool(flag, false);
      if (!add.ok()) return add.status();
      if (!*add) continue;
      auto content = ConfigTokenContent(c, token_key);
      if (!content.ok()) return content.status();
      auto id = tok->TokenToId(*content);
      if (!id.has_value()) {
        return c.FieldError(token_key, base::StrCat("\"", *content, "\" is not a token of ", source));
      }
      to->push_back(*id);
    }
    if (!prefix.empty() || !suffix.empty()) tok->post_processor_ = MakeBosEosProcessor(prefix, suffix);
  }
  return tok;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_->IdOf(token)) return id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* t = added_->ById(id)) return t->content;
  if (const std::string* t = model_->IdToToken(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* t = added_->ById(id);
  if (tiktoken_) return t != nullptr && t->special;
  if (t != nullptr) return added_->IsSpecialContent(t->content);
  const std::string* m = model_->IdToToken(id);
  return m != nullptr && added_->IsSpecialContent(*m);
}

bool Tokenizer::HasByteFallbackDecoder() const { return decoder_ != nullptr && decoder_->HasByteFallback(); }

int64_t Tokenizer::IdCount() const {
  int64_t count = model_->IdCount();
  for (const AddedToken& t : added_->tokens()) count = std::max<int64_t>(count, int64_t{t.id} + 1);
  return count;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (text.size() > kMaxTextBytes) {
    return absl::InvalidArgumentError(
        base::StrCat("text: ", text.size(), " bytes, more than the tokenizer's limit of ", kMaxTextBytes));
  }
  if (const size_t bad = FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(base::StrCat("text: invalid UTF-8 at byte ", bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  EncodeText(text, ids);
  if (post_processor_ != nullptr) post_processor_->Process(ids, add_special_tokens);
  return ids;
}

void Tokenizer::EncodeText(std::string_view text, std::vector<int32_t>& ids) const {
  // Scratch reused by every call on this thread: after warm-up an encode allocates only its result.
  thread_local PieceArena arena;
  thread_local std::vector<Segment> raw_segments;
  thread_local std::vector<Segment> norm_segments;
  thread_local std::vector<Piece> pieces;
  thread_local std::string normalized;
  arena.Reset();
  raw_segments.clear();

  // 1. Added tokens that match the raw input, 2. normalisation of the text between them, 3. added
  // tokens that match normalised text, 4. pre-tokenization, 5. the model, piece by piece.
  if (added_->has_raw_tokens()) {
    added_->Split(text, /*normalized_tokens=*/false, raw_segments);
  } else {
    raw_segments.push_back(Segment{0, text.size(), -1});
  }
  for (const Segment& seg : raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.end == seg.start) continue;
    std::string_view part = text.substr(seg.start, seg.end - seg.start);
    if (normalizer_ != nullptr) {
      normalized.assign(part);
      normalizer_->Normalize(normalized);
      std::string& kept = arena.NewBuffer(normalized.size());  // pieces point into it
      kept.append(normalized);
      part = kept;
    }
    norm_segments.clear();
    if (added_->has_normalized_tokens()) {
      added_->Split(part, /*normalized_tokens=*/true, norm_segments);
    } else {
      norm_segments.push_back(Segment{0, part.size(), -1});
    }
    for (const Segment& sub : norm_segments) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      if (sub.end == sub.start) continue;
      pieces.clear();
      pieces.push_back(Piece{part.substr(sub.start, sub.end - sub.start), seg.start == 0 && sub.start == 0});
      if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(pieces, arena);
      for (const Piece& p : pieces) model_->Tokenize(p.text, ids);
    }
  }
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  const auto& alphabet = ByteLevelAlphabet();
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    const AddedToken* added = added_->ById(id);
    if (added != nullptr) {
      token = &added->content;
    } else {
      token = model_->IdToToken(id);
    }
    if (token == nullptr) continue;
    if (skip_special_tokens && (tiktoken_ ? added != nullptr && added->special : added_->IsSpecialContent(*token))) {
      continue;
    }
    if (added != nullptr && tiktoken_) {
      std::string& spelled = tokens.emplace_back();
      for (char c : *token) spelled.append(alphabet[static_cast<unsigned char>(c)]);
      continue;
    }
    tokens.push_back(*token);
  }
  if (decoder_ == nullptr) return absl::StrJoin(tokens, " ");
  decoder_->DecodeChain(tokens);
  return absl::StrJoin(tokens, "");
}

}  // namespace strata::tokenizer
