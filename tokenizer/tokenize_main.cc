// strata-tokenize: encode or decode JSON Lines with a Hugging Face tokenizer.json, token for token as
// the `tokenizers` library does (or with a tiktoken.model, as the `tiktoken` package does).
// Exit codes: 0 ok, 2 bad input (message on stderr), 1 anything else.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"
#include "base/json.h"
#include "cli/flags.h"
#include "nlohmann/json.hpp"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json or tiktoken.model, or a checkpoint directory holding either (and tokenizer_config.json)");
ABSL_FLAG(bool, add_special_tokens, false, "encode: add the post-processor's special tokens (BOS, ...)");
ABSL_FLAG(bool, decode, false, "decode ids instead of encoding text");
ABSL_FLAG(bool, skip_special_tokens, false, "decode: leave special tokens out");
ABSL_FLAG(bool, stream, false,
          "decode through the streaming decoder, one id at a time; writes the JSON array of the chunks it emitted "
          "(their concatenation is the decoded text)");
ABSL_FLAG(std::string, bench, "",
          "time encoding every line of FILE (JSON Lines of strings), one thread; prints {\"lines\", \"bytes\", "
          "\"runs\", \"median_s\", \"min_s\", \"mb_per_s\"}");
ABSL_FLAG(int32_t, runs, 5, "--bench repetitions (one untimed warm-up run comes first)");

namespace {

using strata::base::StrCat;

const strata::cli::CommandLine& Command() {
  static const strata::cli::CommandLine command = [] {
    strata::cli::CommandLine command;
    command.usage = R"(usage: strata-tokenize --tokenizer PATH [options] < input.jsonl

Reads JSON Lines on stdin and writes one JSON line per input line.
  encode (default): each line a JSON string; writes its token ids, e.g. [15496, 995]
  --decode:         each line a JSON array of ids; writes the decoded text as a JSON string
)";
    command.flags = {strata::cli::Flag(FLAGS_tokenizer, "PATH"),
                     strata::cli::Flag(FLAGS_add_special_tokens),
                     strata::cli::Flag(FLAGS_decode),
                     strata::cli::Flag(FLAGS_skip_special_tokens),
                     strata::cli::Flag(FLAGS_stream),
                     strata::cli::Flag(FLAGS_bench, "FILE"),
                     strata::cli::Flag(FLAGS_runs, "N")};
    return command;
  }();
  return command;
}

// The flags' values, read once after parsing.
struct Flags {
  std::string tokenizer = absl::GetFlag(FLAGS_tokenizer);
  std::string bench = absl::GetFlag(FLAGS_bench);
  int runs = absl::GetFlag(FLAGS_runs);
  bool add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
  bool decode = absl::GetFlag(FLAGS_decode);
  bool skip_special_tokens = absl::GetFlag(FLAGS_skip_special_tokens);
  bool stream = absl::GetFlag(FLAGS_stream);
};

int Fail(int code, std::string_view message) {
  std::cerr << "strata-tokenize: " << message << "\n";
  return code;
}

// Bad input (exit 2) is what the caller can fix: flags, files, the lines they send. The rest is 1.
int FailStatus(const absl::Status& status) {
  const bool bad_input = absl::IsInvalidArgument(status) || absl::IsNotFound(status);
  return Fail(bad_input ? 2 : 1, std::string(status.message()));
}

// The checks between flags; empty when they agree.
std::string CheckFlags(const Flags& flags) {
  if (flags.tokenizer.empty()) return "--tokenizer PATH is required";
  if (flags.stream && !flags.decode) return "--stream applies to --decode";
  return "";
}

std::string Dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// Reads a JSON Lines file of strings (the --bench corpus).
absl::StatusOr<std::vector<std::string>> ReadCorpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat(path, ": cannot open"));
  std::vector<std::string> lines;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    absl::StatusOr<nlohmann::json> j =
        strata::base::ParseJson(line, strata::base::kMaxJsonDepth, StrCat(path, ": line ", n));
    if (!j.ok() || !j->is_string()) {
      return absl::InvalidArgumentError(StrCat(path, ": line ", n, ": expected a JSON string"));
    }
    lines.push_back(j->get<std::string>());
  }
  return lines;
}

int Bench(const strata::tokenizer::Tokenizer& tok, const Flags& flags) {
  const int runs = flags.runs;
  if (runs < 1) return Fail(2, StrCat("--runs: expected a positive integer, got ", runs));
  auto lines = ReadCorpus(flags.bench);
  if (!lines.ok()) return FailStatus(lines.status());
  size_t bytes = 0;
  for (const auto& l : *lines) bytes += l.size();
  std::vector<double> seconds;
  size_t tokens = 0;
  for (int r = 0; r <= runs; ++r) {
    const auto start = std::chrono::steady_clock::now();
    size_t n = 0;
    for (const auto& l : *lines) {
      auto ids = tok.Encode(l, flags.add_special_tokens);
      if (!ids.ok()) return FailStatus(ids.status());
      n += ids->size();
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (r > 0) seconds.push_back(took.count());  // run 0 warms the word cache, as upstream's is warm too
    tokens = n;
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  std::cout << Dump({{"lines", lines->size()},
                     {"bytes", bytes},
                     {"tokens", tokens},
                     {"runs", runs},
                     {"median_s", median},
                     {"min_s", seconds.front()},
                     {"mb_per_s", static_cast<double>(bytes) / 1e6 / median}})
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<strata::cli::ParsedArgs> parsed = strata::cli::Parse(Command(), argc, argv);
  if (!parsed.ok()) return Fail(2, StrCat(parsed.status().message(), " (see --help)"));
  if (parsed->help) {
    std::cout << strata::cli::Help(Command());
    return 0;
  }
  const Flags flags;
  if (std::string error = CheckFlags(flags); !error.empty()) return Fail(2, error);
  auto loaded = strata::tokenizer::Tokenizer::FromPath(flags.tokenizer);
  if (!loaded.ok()) return FailStatus(loaded.status());
  const strata::tokenizer::Tokenizer& tok = **loaded;
  if (!flags.bench.empty()) return Bench(tok, flags);

  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    const std::string where = StrCat("stdin line ", n, ": ");
    // Checked before parsing so the message says where, and stderr never echoes the bad bytes.
    if (const size_t bad = strata::tokenizer::FindInvalidUtf8(line); bad != std::string::npos) {
      return Fail(2, StrCat(where, "invalid UTF-8 at byte ", bad));
    }
    // nlohmann rejects escapes of lone surrogates ("\ud800"), which are not text either. Bounded: a deep
    // element would be quoted below (printing recurses).
    absl::StatusOr<nlohmann::json> parsed =
        strata::base::ParseJson(line, strata::base::kMaxJsonDepth, StrCat("stdin line ", n));
    if (!parsed.ok()) return Fail(2, std::string(parsed.status().message()));
    const nlohmann::json& input = *parsed;
    std::string out;
    if (!flags.decode) {
      if (!input.is_string()) return Fail(2, StrCat(where, "expected a JSON string to encode"));
      auto ids = tok.Encode(input.get_ref<const std::string&>(), flags.add_special_tokens);
      if (!ids.ok()) return FailStatus(absl::Status(ids.status().code(), StrCat(where, ids.status().message())));
      out = Dump(*ids);
    } else {
      if (!input.is_array()) return Fail(2, StrCat(where, "expected a JSON array of token ids to decode"));
      std::vector<int32_t> ids;
      ids.reserve(input.size());
      for (size_t i = 0; i < input.size(); ++i) {
        const auto& v = input[i];
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
          return Fail(2, StrCat(where, "element ", i, ": expected a token id (an integer >= 0), got ", v.dump()));
        }
        ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
      if (flags.stream) {
        strata::tokenizer::StreamingDecoder stream(tok, flags.skip_special_tokens);
        nlohmann::json chunks = nlohmann::json::array();
        for (int32_t id : ids) {
          std::string piece = stream.Step(id);
          if (!piece.empty()) chunks.push_back(std::move(piece));
        }
        if (std::string rest = stream.Finish(); !rest.empty()) chunks.push_back(std::move(rest));
        out = Dump(chunks);
      } else {
        out = Dump(tok.Decode(ids, flags.skip_special_tokens));
      }
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);  // one answer per line as it comes: callers may drive it interactively
  }
  if (std::cin.bad()) return Fail(1, "error reading stdin");
  return 0;
}
