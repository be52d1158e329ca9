#pragma once
// One way for strata's binaries to read their command lines. Flags are declared with ABSL_FLAG (their
// type, default and help live there); each binary lists the flags it takes in a CommandLine, and Parse
// reads argv against that list. Abseil's own absl::ParseCommandLine is not used: it exits 1 on a bad
// flag, and strata's binaries exit 2 on bad input with a message naming it (GUIDE.md, "Contracts").
//
// The command line: "--flag VALUE" or "--flag=VALUE"; a bool flag is "--flag" alone or "--flag=true"/
// "--flag=false". A flag declared as ABSL_FLAG(T, max_memory, ...) is spelled --max-memory. "--help"
// and "-h" ask for Help(). Parsing is in order: the first problem met is the error.

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::cli {

// The reflection handle of a flag declared with ABSL_FLAG, writable (Parse sets it).
template <typename T>
absl::CommandLineFlag* Handle(const absl::Flag<T>& flag) {
  return absl::FindCommandLineFlag(absl::GetFlagReflectionHandle(flag).Name());
}

// One flag of a command line, as the parser reads it and --help shows it.
struct FlagSpec {
  absl::CommandLineFlag* flag = nullptr;  // cli::Handle(FLAGS_name); see Flag() below
  std::string value_name;                 // "DIR", "N", ... shown after the flag; empty for bool flags
  // What --help shows as the default, for a default that needs words ("the checkpoint's"). Empty: the
  // flag's default value, unless that is "" or false (nothing is shown then).
  std::string default_text;
  bool repeatable = false;  // may be given more than once: ParsedArgs::Values has every value, in order
  std::string section;      // a heading --help prints before this flag (e.g. "Serving:"); empty: none

  FlagSpec ShowDefault(std::string text) && {
    default_text = std::move(text);
    return std::move(*this);
  }
  FlagSpec Repeatable() && {
    repeatable = true;
    return std::move(*this);
  }
  FlagSpec Section(std::string heading) && {
    section = std::move(heading);
    return std::move(*this);
  }
};

// The FlagSpec of a flag declared with ABSL_FLAG: Flag(FLAGS_model, "DIR").ShowDefault("...").
template <typename T>
FlagSpec Flag(const absl::Flag<T>& flag, std::string value_name = "") {
  FlagSpec spec;
  spec.flag = Handle(flag);
  spec.value_name = std::move(value_name);
  return spec;
}

// What a binary accepts, and the text around its flags in --help.
struct CommandLine {
  std::string usage;            // --help's first lines: "usage: strata-x ...", a description (ends with "\n")
  std::vector<FlagSpec> flags;  // in the order --help lists them
  std::string epilogue;         // printed after the flags ("" or text ending with "\n")
  size_t max_positional = 0;    // arguments that do not start with "-" (e.g. a command); more is an error
};

// A command line that parsed: the flags hold their values (the default when not given).
struct ParsedArgs {
  bool help = false;                    // --help or -h came first: nothing after it was read
  std::vector<std::string> positional;  // in order
  // Every flag given, in order: the flag's name as declared ("max_memory") and the value as written.
  std::vector<std::pair<std::string, std::string>> given;

  bool Given(absl::string_view flag_name) const;
  template <typename T>
  bool Given(const absl::Flag<T>& flag) const {
    return Given(absl::GetFlagReflectionHandle(flag).Name());
  }
  // The values of a repeatable flag, in order.
  std::vector<std::string> Values(absl::string_view flag_name) const;
  template <typename T>
  std::vector<std::string> Values(const absl::Flag<T>& flag) const {
    return Values(absl::GetFlagReflectionHandle(flag).Name());
  }
};

// Resets every flag of `command_line` to its default, then reads `args` (argv without argv[0]) into
// them. Errors are InvalidArgument naming the flag and the value: an unknown flag, a missing value, a
// value the flag's type does not take, a flag given twice that is not repeatable, a positional argument
// beyond max_positional. Domain checks (ranges, formats such as "0=20GiB") are the caller's, on the
// flag's value afterwards; their messages start with the flag ("--max-memory: ...", see FlagError).
absl::StatusOr<ParsedArgs> Parse(const CommandLine& command_line, std::span<const std::string> args);

// The same, from main's argc/argv.
absl::StatusOr<ParsedArgs> Parse(const CommandLine& command_line, int argc, const char* const* argv);

// --help's text: usage, then each flag ("  --name VALUE   help (default: D)") in the listed order,
// its help wrapped, then "--help", then the epilogue.
std::string Help(const CommandLine& command_line);

// How a flag is written on the command line: "max_memory" -> "--max-memory".
std::string Spelling(absl::string_view flag_name);
template <typename T>
std::string Spelling(const absl::Flag<T>& flag) {
  return Spelling(absl::GetFlagReflectionHandle(flag).Name());
}

// A caller's check of a flag's value failed: `status`'s code, its message prefixed with the flag
// ("--max-memory: cannot parse ...").
template <typename T>
absl::Status FlagError(const absl::Flag<T>& flag, const absl::Status& status) {
  return absl::Status(status.code(), Spelling(flag) + ": " + std::string(status.message()));
}

}  // namespace strata::cli
