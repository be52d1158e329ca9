#include "chat_template/checkpoint_template.h"

#include <system_error>

#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"  // StrCat over std::string_view (Debian's Abseil)
#include "base/file_reader.h"
#include "base/json.h"

namespace strata::chat_template {

using base::StrCat;
namespace {

using json = nlohmann::ordered_json;

// A chat template is text a person wrote; 16 MiB is far beyond any real one.
constexpr uint64_t kMaxTemplateFileBytes = base::kMaxConfigFileBytes;

absl::Status AddTemplate(CheckpointChatTemplate& out, const std::string& name, std::string_view source,
                         const std::string& where) {
  absl::StatusOr<Template> t = ParseTemplate(source, where);
  if (!t.ok()) return t.status();
  out.templates.insert_or_assign(name, std::move(*t));
  return absl::OkStatus();
}

absl::Status AddTemplateFile(CheckpointChatTemplate& out, const std::string& name, const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = base::ReadRegularFile(path, kMaxTemplateFileBytes);
  if (!text.ok()) return text.status();
  return AddTemplate(out, name, *text, path.string());
}

// A special token's text: a string, or an AddedToken object's "content". Anything else is not a token.
std::optional<std::string> TokenText(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object()) {
    auto it = v.find("content");
    if (it != v.end() && it->is_string()) return it->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<const Template*> CheckpointChatTemplate::Select(std::string_view name, bool has_tools) const {
  if (!name.empty()) {
    auto it = templates.find(std::string(name));
    if (it != templates.end()) return &it->second;
    std::string known;
    for (const auto& [n, t] : templates) absl::StrAppend(&known, known.empty() ? "" : ", ", n);
    return absl::NotFoundError(StrCat("no chat template named \"", absl::string_view(name.data(), name.size()),
                                      "\" (the checkpoint has: ", known, ")"));
  }
  if (has_tools) {
    auto it = templates.find("tool_use");
    if (it != templates.end()) return &it->second;
  }
  auto it = templates.find("default");
  if (it != templates.end()) return &it->second;
  std::string known;
  for (const auto& [n, t] : templates) absl::StrAppend(&known, known.empty() ? "" : ", ", n);
  return absl::NotFoundError(
      StrCat("the checkpoint has several chat templates and none is \"default\": ", known, "; name one"));
}

absl::StatusOr<CheckpointChatTemplate> LoadChatTemplate(const std::filesystem::path& checkpoint_dir,
                                                        const std::filesystem::path& override_file) {
  CheckpointChatTemplate out;
  json config = json::object();
  const std::filesystem::path config_path = checkpoint_dir / "tokenizer_config.json";
  if (!checkpoint_dir.empty()) {
    absl::StatusOr<std::optional<std::string>> text =
        base::ReadRegularFileIfPresent(config_path, base::kMaxConfigFileBytes);
    if (!text.ok()) return text.status();
    if (text->has_value()) {
      absl::StatusOr<json> parsed = base::ParseOrderedJson(**text, base::kMaxJsonDepth, config_path.string());
      if (!parsed.ok()) return parsed.status();
      config = *std::move(parsed);
      if (!config.is_object()) {
        return absl::InvalidArgumentError(StrCat(config_path.string(), ": not a JSON object"));
      }
    }
  }

  // Special tokens, as transformers' special_tokens_map.
  static constexpr std::string_view kStandard[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                                   "pad_token", "cls_token", "mask_token"};
  for (std::string_view key : kStandard) {
    auto it = config.find(std::string(key));
    if (it == config.end()) continue;
    if (std::optional<std::string> text = TokenText(*it)) out.special_tokens[std::string(key)] = *text;
  }
  for (const auto& [key, value] : config.items()) {
    if (key.size() <= 6 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (out.special_tokens.contains(key)) continue;
    if (std::find(std::begin(kStandard), std::end(kStandard), key) != std::end(kStandard)) continue;
    if (std::optional<std::string> text = TokenText(value)) out.special_tokens[key] = *text;
  }
  if (auto it = config.find("extra_special_tokens"); it != config.end() && it->is_object()) {
    for (const auto& [key, value] : it->items()) {
      if (std::optional<std::string> text = TokenText(value)) out.special_tokens[key] = *text;
    }
  }

  if (!override_file.empty()) {
    if (absl::Status s = AddTemplateFile(out, "default", override_file); !s.ok()) return s;
    return out;
  }
  if (checkpoint_dir.empty()) return absl::InvalidArgumentError("no checkpoint directory and no template file");

  // Template files take priority over tokenizer_config.json, as in transformers.
  const std::filesystem::path jinja = checkpoint_dir / "chat_template.jinja";
  if (base::PathMayExist(jinja)) {
    if (absl::Status s = AddTemplateFile(out, "default", jinja); !s.ok()) return s;
  }
  std::error_code ec;
  const std::filesystem::path extra_dir = checkpoint_dir / "additional_chat_templates";
  if (std::filesystem::is_directory(extra_dir, ec)) {
    for (const auto& entry : std::filesystem::directory_iterator(extra_dir, ec)) {
      const std::filesystem::path& p = entry.path();
      if (p.extension() != ".jinja") continue;
      if (absl::Status s = AddTemplateFile(out, p.stem().string(), p); !s.ok()) return s;
    }
  }
  if (!out.templates.empty()) return out;

  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(StrCat(checkpoint_dir.string(),
                                      ": no chat template (no chat_template.jinja, and tokenizer_config.json "
                                      "has no \"chat_template\"); give one with --chat-template FILE"));
  }
  const std::string where = StrCat(config_path.string(), "[chat_template]");
  if (it->is_string()) {
    if (absl::Status s = AddTemplate(out, "default", it->get_ref<const std::string&>(), where); !s.ok()) return s;
    return out;
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(StrCat(where, ": expected a string or a list of {name, template}"));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& entry = (*it)[i];
    const std::string at = StrCat(config_path.string(), "[chat_template][", i, "]");
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string()) {
      return absl::InvalidArgumentError(StrCat(at, ": expected {\"name\": string, \"template\": string}"));
    }
    const std::string name = entry["name"].get<std::string>();
    if (absl::Status s = AddTemplate(out, name, entry["template"].get_ref<const std::string&>(),
                                     StrCat(config_path.string(), "[chat_template][", name, "]"));
        !s.ok()) {
      return s;
    }
  }
  if (out.templates.empty()) return absl::InvalidArgumentError(StrCat(where, ": an empty list"));
  return out;
}

}  // namespace strata::chat_template
