#include "cli/flags.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace strata::cli {
namespace {

// --help's layout: flag names in the first kHelpColumn columns, help wrapped at kHelpWidth.
constexpr size_t kHelpColumn = 26;
constexpr size_t kHelpWidth = 100;

// What a value of the flag's type looks like, for "--n: \"x\" is not an integer".
std::string ValueKind(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<int32_t>() || flag.IsOfType<int64_t>()) return "an integer";
  if (flag.IsOfType<uint32_t>() || flag.IsOfType<uint64_t>()) return "a non-negative integer";
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "a number";
  return "a valid value";
}

const FlagSpec* FindSpec(const CommandLine& command_line, absl::string_view spelled) {
  for (const FlagSpec& spec : command_line.flags) {
    if (Spelling(spec.flag->Name()) == absl::StrCat("--", spelled)) return &spec;
  }
  return nullptr;
}

// Appends `text` to `out` wrapped at kHelpWidth, every line after the first indented to kHelpColumn.
// A "\n" in the text starts a new line.
void AppendWrapped(std::string& out, absl::string_view text, size_t column) {
  bool first_line = true;
  for (absl::string_view paragraph : absl::StrSplit(text, '\n')) {
    if (!first_line) absl::StrAppend(&out, "\n", std::string(kHelpColumn, ' '));
    column = first_line ? column : kHelpColumn;
    first_line = false;
    bool line_start = true;
    for (absl::string_view word : absl::StrSplit(paragraph, ' ', absl::SkipEmpty())) {
      if (!line_start && column + 1 + word.size() > kHelpWidth) {
        absl::StrAppend(&out, "\n", std::string(kHelpColumn, ' '));
        column = kHelpColumn;
        line_start = true;
      }
      if (!line_start) {
        out += ' ';
        ++column;
      }
      absl::StrAppend(&out, word);
      column += word.size();
      line_start = false;
    }
  }
  out += '\n';
}

}  // namespace

std::string Spelling(absl::string_view flag_name) {
  return absl::StrCat("--", absl::StrReplaceAll(flag_name, {{"_", "-"}}));
}

bool ParsedArgs::Given(absl::string_view flag_name) const {
  return std::any_of(given.begin(), given.end(), [&](const auto& g) { return g.first == flag_name; });
}

std::vector<std::string> ParsedArgs::Values(absl::string_view flag_name) const {
  std::vector<std::string> values;
  for (const auto& [name, value] : given) {
    if (name == flag_name) values.push_back(value);
  }
  return values;
}

absl::StatusOr<ParsedArgs> Parse(const CommandLine& command_line, std::span<const std::string> args) {
  for (const FlagSpec& spec : command_line.flags) {
    std::string error;
    if (spec.flag == nullptr || !spec.flag->ParseFrom(spec.flag->DefaultValue(), &error)) {
      return absl::InternalError(absl::StrCat("cannot reset a flag to its default: ", error));
    }
  }
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.help = true;
      return parsed;
    }
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      if (parsed.positional.size() == command_line.max_positional) {
        return absl::InvalidArgumentError(absl::StrCat(
            "unexpected argument \"", arg, "\"", command_line.max_positional == 0 ? " (flags start with --)" : ""));
      }
      parsed.positional.emplace_back(arg);
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg, " (flags start with --)"));
    }
    absl::string_view name = arg.substr(2);
    std::optional<absl::string_view> value;
    if (const size_t eq = name.find('='); eq != absl::string_view::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const FlagSpec* spec = FindSpec(command_line, name);
    if (spec == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    absl::CommandLineFlag& flag = *spec->flag;
    const std::string spelled = Spelling(flag.Name());
    if (!value.has_value()) {
      if (flag.IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 == args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(spelled, " needs a value"));
      } else {
        value = args[++i];
      }
    }
    if (!spec->repeatable && parsed.Given(flag.Name())) {
      return absl::InvalidArgumentError(absl::StrCat(spelled, " is given twice"));
    }
    std::string error;
    if (!flag.ParseFrom(*value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(spelled, ": \"", *value, "\" is not ", ValueKind(flag)));
    }
    parsed.given.emplace_back(std::string(flag.Name()), std::string(*value));
  }
  return parsed;
}

absl::StatusOr<ParsedArgs> Parse(const CommandLine& command_line, int argc, const char* const* argv) {
  const std::vector<std::string> args(argv + std::min(argc, 1), argv + argc);
  return Parse(command_line, args);
}

std::string Help(const CommandLine& command_line) {
  std::string out = command_line.usage;
  if (!command_line.flags.empty() && !out.empty()) out += '\n';
  const auto append_flag = [&out](absl::string_view name_and_value, absl::string_view help) {
    std::string line = absl::StrCat("  ", name_and_value);
    if (line.size() + 1 > kHelpColumn) {
      absl::StrAppend(&out, line, "\n");
      line.clear();
    }
    line.resize(kHelpColumn, ' ');
    out += line;
    AppendWrapped(out, help, kHelpColumn);
  };
  for (const FlagSpec& spec : command_line.flags) {
    if (!spec.section.empty()) absl::StrAppend(&out, spec.section, "\n");
    const absl::CommandLineFlag& flag = *spec.flag;
    std::string help = flag.Help();
    std::string shown_default = spec.default_text;
    if (shown_default.empty()) {
      shown_default = flag.DefaultValue();
      if (flag.IsOfType<bool>() && shown_default == "false") shown_default.clear();
    }
    if (!shown_default.empty()) absl::StrAppend(&help, " (default: ", shown_default, ")");
    const std::string name = Spelling(flag.Name());
    append_flag(spec.value_name.empty() ? name : absl::StrCat(name, " ", spec.value_name), help);
  }
  append_flag("--help", "this text");
  absl::StrAppend(&out, command_line.epilogue);
  return out;
}

}  // namespace strata::cli
