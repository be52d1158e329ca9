#include "cli/flags.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

ABSL_FLAG(std::string, model_dir, "", "checkpoint directory");
ABSL_FLAG(int64_t, max_batch, 16, "KV-cache slots");
ABSL_FLAG(double, temperature, 0.5, "sampling temperature");
ABSL_FLAG(bool, json, false, "machine-readable output");
ABSL_FLAG(std::string, stop, "", "stop before this text");

namespace strata::cli {
namespace {

CommandLine TestCommandLine(size_t max_positional = 0) {
  CommandLine command;
  command.usage = "usage: test [flags]\n";
  command.flags = {Flag(FLAGS_model_dir, "DIR"), Flag(FLAGS_max_batch, "N"),
                   Flag(FLAGS_temperature, "T").ShowDefault("half"), Flag(FLAGS_json).Section("Output:"),
                   Flag(FLAGS_stop, "STR").Repeatable()};
  command.epilogue = "Exit status: 0.\n";
  command.max_positional = max_positional;
  return command;
}

absl::StatusOr<ParsedArgs> ParseArgs(std::vector<std::string> args, size_t max_positional = 0) {
  return Parse(TestCommandLine(max_positional), args);
}

TEST(CliFlags, AcceptsSpaceAndEqualsFormsAndBareBools) {
  absl::StatusOr<ParsedArgs> parsed =
      ParseArgs({"--model-dir", "/m", "--max-batch=4", "--temperature", "0.25", "--json"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_model_dir), "/m");
  EXPECT_EQ(absl::GetFlag(FLAGS_max_batch), 4);
  EXPECT_EQ(absl::GetFlag(FLAGS_temperature), 0.25);
  EXPECT_TRUE(absl::GetFlag(FLAGS_json));
  EXPECT_FALSE(parsed->help);
}

TEST(CliFlags, BoolTakesTrueOrFalseAfterEquals) {
  ASSERT_TRUE(ParseArgs({"--json=false"}).ok());
  EXPECT_FALSE(absl::GetFlag(FLAGS_json));
  ASSERT_TRUE(ParseArgs({"--json=true"}).ok());
  EXPECT_TRUE(absl::GetFlag(FLAGS_json));
  // A bool never takes the next argument: "true" is a positional argument here.
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({"--json", "true"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("unexpected argument \"true\""), std::string::npos) << parsed.status();
}

TEST(CliFlags, EveryParseStartsFromTheDefaults) {
  ASSERT_TRUE(ParseArgs({"--model-dir", "/m", "--max-batch", "4", "--json"}).ok());
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({});
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_model_dir), "");
  EXPECT_EQ(absl::GetFlag(FLAGS_max_batch), 16);
  EXPECT_FALSE(absl::GetFlag(FLAGS_json));
  EXPECT_TRUE(parsed->given.empty());
}

TEST(CliFlags, RecordsWhichFlagsWereGivenInOrder) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({"--stop", "a,b", "--max-batch=16", "--stop=c"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->Given(FLAGS_max_batch));  // given, even with the default value
  EXPECT_FALSE(parsed->Given(FLAGS_model_dir));
  EXPECT_EQ(parsed->Values(FLAGS_stop), (std::vector<std::string>{"a,b", "c"}));
  ASSERT_EQ(parsed->given.size(), 3u);
  EXPECT_EQ(parsed->given[1].first, "max_batch");
  EXPECT_EQ(absl::GetFlag(FLAGS_stop), "c");
}

TEST(CliFlags, EmptyValueAfterEqualsIsAValue) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({"--model-dir="});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->Given(FLAGS_model_dir));
  EXPECT_EQ(absl::GetFlag(FLAGS_model_dir), "");
}

TEST(CliFlags, HelpStopsReadingButOnlyWhereItIsMet) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({"--max-batch", "2", "-h", "--bogus"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->help);
  EXPECT_FALSE(ParseArgs({"--bogus", "--help"}).ok());
  // As a flag's value, "--help" is the value.
  parsed = ParseArgs({"--stop", "--help"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->help);
  EXPECT_EQ(absl::GetFlag(FLAGS_stop), "--help");
}

TEST(CliFlags, PositionalArgumentsUpToTheLimit) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({"--json", "generate", "--max-batch", "2"}, 1);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->positional, std::vector<std::string>{"generate"});
  parsed = ParseArgs({"generate", "again"}, 1);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("\"again\""), std::string::npos);
}

TEST(CliFlags, UnderscoreSpellingIsNotAFlag) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs({"--max_batch", "2"});
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "unknown flag --max_batch");
}

TEST(CliFlags, SpellingAndFlagErrorNameTheFlagAsWritten) {
  EXPECT_EQ(Spelling(FLAGS_model_dir), "--model-dir");
  const absl::Status error = FlagError(FLAGS_max_batch, absl::OutOfRangeError("\"0\" is not an integer >= 1"));
  EXPECT_EQ(error.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(error.message(), "--max-batch: \"0\" is not an integer >= 1");
}

TEST(CliFlags, HelpListsFlagsInOrderWithDefaults) {
  EXPECT_EQ(Help(TestCommandLine()),
            "usage: test [flags]\n"
            "\n"
            "  --model-dir DIR         checkpoint directory\n"
            "  --max-batch N           KV-cache slots (default: 16)\n"
            "  --temperature T         sampling temperature (default: half)\n"
            "Output:\n"
            "  --json                  machine-readable output\n"
            "  --stop STR              stop before this text\n"
            "  --help                  this text\n"
            "Exit status: 0.\n");
}

// Every bad command line is InvalidArgument, and the message names what was wrong.
struct BadArgs {
  std::vector<std::string> args;
  std::string message;
};

class CliFlagsRejects : public testing::TestWithParam<BadArgs> {};

TEST_P(CliFlagsRejects, NamingTheFlagAndTheValue) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(GetParam().args);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message(), GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(CliFlags, CliFlagsRejects,
                         testing::Values(BadArgs{{"--bogus", "1"}, "unknown flag --bogus"},
                                         BadArgs{{"--bogus=1"}, "unknown flag --bogus"},
                                         BadArgs{{"-x"}, "unknown flag -x (flags start with --)"},
                                         BadArgs{{"--model-dir"}, "--model-dir needs a value"},
                                         BadArgs{{"--max-batch", "many"}, "--max-batch: \"many\" is not an integer"},
                                         BadArgs{{"--max-batch=99999999999999999999"},
                                                 "--max-batch: \"99999999999999999999\" is not an integer"},
                                         BadArgs{{"--temperature", "warm"}, "--temperature: \"warm\" is not a number"},
                                         BadArgs{{"--json=maybe"}, "--json: \"maybe\" is not true or false"},
                                         BadArgs{{"--model-dir", "a", "--model-dir=b"}, "--model-dir is given twice"},
                                         BadArgs{{"stray"}, "unexpected argument \"stray\" (flags start with --)"}));

}  // namespace
}  // namespace strata::cli
