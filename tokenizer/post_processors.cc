#include "tokenizer/post_processors.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/absl_compat.h"

namespace strata::tokenizer {

namespace {

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void Process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& p : parts_) p->Process(ids, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

class NoIdChange : public PostProcessor {
 public:
  void Process(std::vector<int32_t>&, bool) const override {}
};

// The single-sequence template flattened to ids: `prefix` + sequence + `suffix` (a template may name
// the sequence once; special pieces before it form the prefix).
class AffixProcessor : public PostProcessor {
 public:
  AffixProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void Process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<int32_t> prefix_, suffix_;
};

absl::StatusOr<std::vector<int32_t>> SpecialTokenIds(const JsonAt& special_tokens, const std::string& name,
                                                     const JsonAt& where) {
  JsonAt entry = special_tokens.Field(name);
  if (!entry.value.is_object()) {
    return where.Error(base::StrCat("special token \"", name, "\" is not in special_tokens"));
  }
  JsonAt ids = entry.Field("ids");
  if (!ids.value.is_array()) return ids.Error("expected an array of ids");
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.value.size(); ++i) {
    JsonAt id = ids.Index(i);
    if (!id.value.is_number_integer() || id.value.get<int64_t>() < 0 || id.value.get<int64_t>() > INT32_MAX) {
      return id.Error("expected a non-negative 32-bit integer id");
    }
    out.push_back(static_cast<int32_t>(id.value.get<int64_t>()));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const JsonAt& json) {
  JsonAt single = json.Field("single");
  JsonAt special_tokens = json.Field("special_tokens");
  std::vector<int32_t> prefix, suffix;
  bool seen_sequence = false;
  auto add_special = [&](const std::string& name, const JsonAt& where) -> absl::Status {
    auto ids = SpecialTokenIds(special_tokens, name, where);
    if (!ids.ok()) return ids.status();
    auto& to = seen_sequence ? suffix : prefix;
    to.insert(to.end(), ids->begin(), ids->end());
    return absl::OkStatus();
  };
  auto add_sequence = [&](std::string_view id, const JsonAt& where) -> absl::Status {
    if (id != "A") return where.Error(base::StrCat("the single template can only name sequence A, not ", id));
    if (seen_sequence) return where.Error("the single template names sequence A twice");
    seen_sequence = true;
    return absl::OkStatus();
  };
  if (single.value.is_string()) {
    // The string form, e.g. "<s> $A </s>" ("$A", "$0", "$" name the sequence; ":1" suffixes set type ids).
    for (absl::string_view p : absl::StrSplit(single.value.get_ref<const std::string&>(), ' ', absl::SkipEmpty())) {
      const std::string_view piece(p.data(), p.size());
      const std::string_view name = piece.substr(0, std::min(piece.size(), piece.rfind(':')));
      absl::Status s = name.starts_with('$') ? add_sequence(name == "$" || name == "$0" ? "A" : name.substr(1), single)
                                             : add_special(std::string(name), single);
      if (!s.ok()) return s;
    }
  } else if (single.value.is_array()) {
    for (size_t i = 0; i < single.value.size(); ++i) {
      JsonAt piece = single.Index(i);
      absl::Status s;
      if (piece.Has("SpecialToken")) {
        auto id = piece.Field("SpecialToken").String("id");
        if (!id.ok()) return id.status();
        s = add_special(*id, piece);
      } else if (piece.Has("Sequence")) {
        auto id = piece.Field("Sequence").String("id");
        if (!id.ok()) return id.status();
        s = add_sequence(*id, piece);
      } else {
        return piece.Error("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
      if (!s.ok()) return s;
    }
  } else {
    return single.Error("expected the single-sequence template");
  }
  if (!seen_sequence) return single.Error("the single template does not name the sequence ($A)");
  return std::make_unique<AffixProcessor>(std::move(prefix), std::move(suffix));
}

// RobertaProcessing / BertProcessing: "cls": [token, id], "sep": [token, id]; single = cls A sep.
absl::StatusOr<std::unique_ptr<PostProcessor>> ParseClsSep(const JsonAt& json) {
  auto id_of = [&](std::string_view key) -> absl::StatusOr<int32_t> {
    JsonAt f = json.Field(key);
    if (!f.value.is_array() || f.value.size() != 2 || !f.value[1].is_number_integer()) {
      return f.Error("expected [token, id]");
    }
    return static_cast<int32_t>(f.value[1].get<int64_t>());
  };
  auto cls = id_of("cls");
  if (!cls.ok()) return cls.status();
  auto sep = id_of("sep");
  if (!sep.ok()) return sep.status();
  return std::make_unique<AffixProcessor>(std::vector<int32_t>{*cls}, std::vector<int32_t>{*sep});
}

}  // namespace

std::unique_ptr<PostProcessor> MakeBosEosProcessor(std::vector<int32_t> prefix, std::vector<int32_t> suffix) {
  return std::make_unique<AffixProcessor>(std::move(prefix), std::move(suffix));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const JsonAt& json) {
  auto type = json.Type();
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    JsonAt list = json.Field("processors");
    if (!list.value.is_array()) return list.Error("expected an array of post-processors");
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < list.value.size(); ++i) {
      auto part = ParsePostProcessor(list.Index(i));
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  if (*type == "ByteLevel") return std::make_unique<NoIdChange>();  // it only trims offsets
  if (*type == "TemplateProcessing") return ParseTemplate(json);
  if (*type == "RobertaProcessing" || *type == "BertProcessing") return ParseClsSep(json);
  return json.FieldError("type", base::StrCat("unsupported post-processor \"", *type, "\""));
}

}  // namespace strata::tokenizer
