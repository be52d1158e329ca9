#include "server/flags.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace strata::server {
namespace {

absl::StatusOr<ServerCommand> Parse(std::vector<std::string> args) { return ParseServerFlags(args); }

TEST(ServerFlags, DefaultsAreBalancedLow0OnTheStandardPorts) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "/models/llama"});
  ASSERT_TRUE(command.ok()) << command.status();
  const ServerOptions& options = command->options;
  EXPECT_FALSE(command->help);
  EXPECT_EQ(options.placement.model_dir, std::filesystem::path("/models/llama"));
  EXPECT_FALSE(options.placement.module_tree.has_value());
  EXPECT_EQ(options.placement.device_map.strategy, planner::Strategy::kBalancedLow0);
  EXPECT_FALSE(options.placement.max_memory.has_value());
  EXPECT_FALSE(options.placement.dtype.has_value());
  EXPECT_EQ(options.placement.kv_cache_tokens, 0);
  // Loopback unless told otherwise; the image and the manifests pass 0.0.0.0 on purpose.
  EXPECT_EQ(options.endpoints.listen.ToString(), "127.0.0.1:50051");
  EXPECT_EQ(options.endpoints.metrics_listen.ToString(), "127.0.0.1:9464");
}

TEST(ServerFlags, AcceptsSpaceAndEqualsForms) {
  absl::StatusOr<ServerCommand> command =
      Parse({"--module-tree=/t.json", "--device-map", "sequential", "--max-memory=0=1GiB,cpu=2GiB", "--dtype",
             "float16", "--kv-cache-tokens=4096", "--listen", "127.0.0.1:0", "--metrics-listen=[::1]:9000"});
  ASSERT_TRUE(command.ok()) << command.status();
  const ServerOptions& options = command->options;
  EXPECT_EQ(options.placement.module_tree, std::filesystem::path("/t.json"));
  EXPECT_EQ(options.placement.device_map.strategy, planner::Strategy::kSequential);
  ASSERT_TRUE(options.placement.max_memory.has_value());
  ASSERT_EQ(options.placement.max_memory->size(), 2u);
  EXPECT_EQ((*options.placement.max_memory)[0].device, planner::Device::Gpu(0));
  EXPECT_EQ((*options.placement.max_memory)[0].bytes, 1024.0 * 1024 * 1024);
  EXPECT_EQ(options.placement.dtype, planner::DType::kFloat16);
  EXPECT_EQ(options.placement.kv_cache_tokens, 4096);
  EXPECT_EQ(options.endpoints.listen.host, "127.0.0.1");
  EXPECT_EQ(options.endpoints.listen.port, 0);
  EXPECT_EQ(options.endpoints.metrics_listen.host, "[::1]");
  EXPECT_EQ(options.endpoints.metrics_listen.port, 9000);
}

TEST(ServerFlags, ManualMapIsJson) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m", "--device-map", R"({"model": 0, "lm_head": "cpu"})"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.placement.device_map.strategy, planner::Strategy::kManual);
  EXPECT_EQ(command->options.placement.device_map.manual.size(), 2u);
}

TEST(ServerFlags, HelpIsReadInOrderWithTheOtherFlags) {
  absl::StatusOr<ServerCommand> command = Parse({"--no-such-flag", "--help"});
  // Flags are read in order: the unknown one comes first and is the error.
  EXPECT_FALSE(command.ok());
  command = Parse({"--help"});
  ASSERT_TRUE(command.ok());
  EXPECT_TRUE(command->help);
  EXPECT_NE(ServerUsage().find("--metrics-listen"), std::string::npos);
}

TEST(ServerFlags, EachParseStartsFromTheDefaults) {
  ASSERT_TRUE(Parse({"--model", "m", "--max-batch", "4", "--listen", "127.0.0.1:1", "--max-memory", "cpu=1GiB"}).ok());
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.serving.runtime.max_batch, 16);
  EXPECT_EQ(command->options.endpoints.listen.ToString(), "127.0.0.1:50051");
  EXPECT_FALSE(command->options.placement.max_memory.has_value());
}

TEST(ServerFlags, ServingLimitsAreCheckedAgainstEachOther) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m", "--max-context", "8", "--max-new-tokens", "8"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.limits.max_new_tokens, 8);
  command = Parse({"--model", "m", "--max-context", "8", "--max-new-tokens", "9"});
  ASSERT_FALSE(command.ok());
  EXPECT_NE(command.status().message().find("more than --max-context 8"), std::string::npos) << command.status();
}

TEST(ServerFlags, UsageListsEveryFlagWithItsDefault) {
  const std::string usage = ServerUsage();
  for (const char* flag : {"--model DIR",
                           "--module-tree FILE",
                           "--device-map S",
                           "--max-memory SPEC",
                           "--dtype D",
                           "--quantized-sizing S",
                           "--kv-cache-tokens N",
                           "--physical-devices MAP",
                           "--max-batch N",
                           "--max-context N",
                           "--max-queue N",
                           "--max-new-tokens N",
                           "--micro-batches N",
                           "--prefill-chunk N",
                           "--max-batch-tokens N",
                           "--kv-block-tokens N",
                           "--prefix-cache",
                           "--intra-op-threads N",
                           "--inject-fault SPEC",
                           "--listen HOST:PORT",
                           "--drain-timeout SECONDS",
                           "--metrics-listen HOST:PORT",
                           "--not-serving-after-errors N",
                           "--ready-probe-interval SECONDS",
                           "--tool-call-parser FORMAT",
                           "--reasoning-parser FORMAT",
                           "--help"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(usage.find("(default: 127.0.0.1:50051)"), std::string::npos) << usage;
  EXPECT_NE(usage.find("(default: balanced_low_0)"), std::string::npos) << usage;
  EXPECT_NE(usage.find("(default: 20)"), std::string::npos) << usage;
}

TEST(ServerFlags, PagedKvCacheFlags) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.placement.kv_cache_tokens, 0);  // --max-batch x --max-context
  EXPECT_EQ(command->options.serving.runtime.kv_block_tokens, 16);
  EXPECT_TRUE(command->options.serving.prefix_cache);
  EXPECT_EQ(command->options.serving.max_batch_tokens, 512);
  command = Parse({"--model", "m", "--kv-cache-tokens", "4096", "--kv-block-tokens=32", "--prefix-cache=false",
                   "--max-batch-tokens", "64"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.placement.kv_cache_tokens, 4096);
  EXPECT_EQ(command->options.serving.runtime.kv_block_tokens, 32);
  EXPECT_FALSE(command->options.serving.prefix_cache);
  EXPECT_EQ(command->options.serving.max_batch_tokens, 64);
  for (const auto& [args, error] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--kv-block-tokens", "0"}, "--kv-block-tokens"},
           {{"--kv-block-tokens", "5000"}, "--kv-block-tokens: 5000 is more than 4096"},
           {{"--kv-cache-tokens", "-1"}, "--kv-cache-tokens"},
           {{"--max-batch-tokens", "0"}, "--max-batch-tokens"},
           {{"--prefix-cache=maybe"}, "prefix"}}) {
    std::vector<std::string> argv{"--model", "m"};
    argv.insert(argv.end(), args.begin(), args.end());
    command = Parse(argv);
    ASSERT_FALSE(command.ok()) << args.front();
    EXPECT_NE(command.status().message().find(error), std::string::npos) << command.status();
  }
}

// --max-queue 0 refused every Generate while health said SERVING (the binary before accepted it).
TEST(ServerFlags, OutputParsersAreVllmsNames) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_FALSE(command->options.serving.tool_call_parser.has_value());
  EXPECT_FALSE(command->options.serving.reasoning_parser.has_value());
  command = Parse({"--model", "m", "--tool-call-parser", "kimi_k2", "--reasoning-parser=deepseek_r1"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.serving.tool_call_parser, chat_template::ToolCallFormat::kKimiK2);
  EXPECT_EQ(command->options.serving.reasoning_parser, chat_template::ReasoningFormat::kDeepSeekR1);
  command = Parse({"--model", "m", "--tool-call-parser", "deepseek_v3", "--reasoning-parser", "qwen3"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.serving.tool_call_parser, chat_template::ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(command->options.serving.reasoning_parser, chat_template::ReasoningFormat::kQwen3);
  command = Parse({"--model", "m", "--tool-call-parser", "glm45", "--reasoning-parser", "glm45"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.serving.tool_call_parser, chat_template::ToolCallFormat::kGlm45);
  EXPECT_EQ(command->options.serving.reasoning_parser, chat_template::ReasoningFormat::kGlm45);
  command = Parse({"--model", "m", "--tool-call-parser", "minimax_m2", "--reasoning-parser", "openai_gptoss"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.serving.tool_call_parser, chat_template::ToolCallFormat::kMinimaxM2);
  EXPECT_EQ(command->options.serving.reasoning_parser, chat_template::ReasoningFormat::kGptOss);
}

TEST(ServerFlags, OpenAiToolCallsReadTheHarmonyReasoning) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m", "--tool-call-parser", "openai"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.serving.tool_call_parser, chat_template::ToolCallFormat::kOpenAi);
  EXPECT_EQ(command->options.serving.reasoning_parser, chat_template::ReasoningFormat::kGptOss);
  EXPECT_TRUE(Parse({"--model", "m", "--tool-call-parser", "openai", "--reasoning-parser", "gpt_oss"}).ok());
  command = Parse({"--model", "m", "--tool-call-parser", "openai", "--reasoning-parser", "qwen3"});
  ASSERT_FALSE(command.ok());
  EXPECT_EQ(command.status().message(),
            "--reasoning-parser: \"qwen3\" cannot read gpt-oss's harmony output; --tool-call-parser openai takes "
            "gpt_oss (or none)");
}

TEST(ServerFlags, MaxQueueZeroIsRefused) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m", "--max-queue", "0"});
  ASSERT_FALSE(command.ok());
  EXPECT_EQ(command.status().message(), "--max-queue: \"0\" is not an integer >= 1");
  EXPECT_TRUE(Parse({"--model", "m", "--max-queue", "1"}).ok());
}

TEST(ServerFlags, ReadinessRuleFlags) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.lifecycle.not_serving_after_errors, 5);
  EXPECT_EQ(command->options.lifecycle.ready_probe_interval, std::chrono::seconds(5));
  command = Parse({"--model", "m", "--not-serving-after-errors", "0", "--ready-probe-interval", "0.5"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.lifecycle.not_serving_after_errors, 0);
  EXPECT_EQ(command->options.lifecycle.ready_probe_interval, std::chrono::milliseconds(500));
  for (const auto& [args, error] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--not-serving-after-errors", "-1"}, "--not-serving-after-errors"},
           {{"--ready-probe-interval", "0"}, "--ready-probe-interval: \"0\" is not a number of seconds"},
           {{"--ready-probe-interval", "nan"}, "--ready-probe-interval"}}) {
    std::vector<std::string> argv{"--model", "m"};
    argv.insert(argv.end(), args.begin(), args.end());
    command = Parse(argv);
    ASSERT_FALSE(command.ok()) << args.front();
    EXPECT_NE(command.status().message().find(error), std::string::npos) << command.status();
  }
}

TEST(ServerFlags, LimitsHaveTheirDocumentedDefaults) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.limits.max_message_bytes, 4 << 20);  // gRPC's own default
  EXPECT_EQ(command->options.limits.max_prompt_bytes, 1 << 20);
  EXPECT_EQ(command->options.limits.max_prompt_tokens, 0);  // --max-context
  EXPECT_EQ(command->options.limits.max_streams, 1024);
  EXPECT_EQ(command->options.limits.max_streams_per_connection, 100);
  EXPECT_EQ(command->options.limits.max_stream_buffer_bytes, 1 << 20);
  EXPECT_EQ(command->options.limits.tokenize_threads, 0);  // half the cores, 1 to 4
  command =
      Parse({"--model", "m", "--max-message-bytes", "65536", "--max-prompt-tokens", "100", "--max-streams=7",
             "--max-streams-per-connection", "3", "--max-stream-buffer-bytes", "4096", "--max-prompt-bytes", "1000"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.limits.max_message_bytes, 65536);
  EXPECT_EQ(command->options.limits.max_prompt_bytes, 1000);
  EXPECT_EQ(command->options.limits.max_prompt_tokens, 100);
  EXPECT_EQ(command->options.limits.max_streams, 7);
  EXPECT_EQ(command->options.limits.max_streams_per_connection, 3);
  EXPECT_EQ(command->options.limits.max_stream_buffer_bytes, 4096);
}

TEST(ServerFlags, GrammarLimitsDefaultToTenSecondsAnd256KiB) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.limits.max_grammar_compile_time, std::chrono::seconds(10));
  EXPECT_EQ(command->options.limits.max_grammar_bytes, 256 << 10);
  command = Parse({"--model", "m", "--max-grammar-compile-seconds", "0.5", "--max-grammar-bytes=65536"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.limits.max_grammar_compile_time, std::chrono::milliseconds(500));
  EXPECT_EQ(command->options.limits.max_grammar_bytes, 65536);
  for (const char* bad :
       {"--max-grammar-compile-seconds=0", "--max-grammar-compile-seconds=nan", "--max-grammar-bytes=0"}) {
    command = Parse({"--model", "m", bad});
    ASSERT_FALSE(command.ok()) << bad;
    const std::string flag(bad, std::string_view(bad).find('='));
    EXPECT_EQ(std::string(command.status().message()).rfind(flag, 0), 0u) << command.status();
  }
  const std::string usage = ServerUsage();
  EXPECT_NE(usage.find("--max-grammar-compile-seconds SECONDS"), std::string::npos);
  EXPECT_NE(usage.find("--max-grammar-bytes N"), std::string::npos);
}

TEST(ServerFlags, DrainTimeoutIsSecondsDefaultingInsideKubernetesGrace) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.lifecycle.drain_timeout, std::chrono::seconds(20));
  command = Parse({"--model", "m", "--drain-timeout", "2.5"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.lifecycle.drain_timeout, std::chrono::milliseconds(2500));
  command = Parse({"--model", "m", "--drain-timeout=0"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.lifecycle.drain_timeout, std::chrono::milliseconds(0));
}

// Every bad command line is InvalidArgument, and the message names what was wrong.
struct BadFlags {
  std::vector<std::string> args;
  std::string named;
};

class ServerFlagsRejects : public testing::TestWithParam<BadFlags> {};

TEST_P(ServerFlagsRejects, NamingTheProblem) {
  absl::StatusOr<ServerCommand> command = Parse(GetParam().args);
  ASSERT_FALSE(command.ok());
  EXPECT_EQ(command.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(command.status().message().find(GetParam().named), std::string::npos) << command.status();
}

INSTANTIATE_TEST_SUITE_P(
    ServerFlags, ServerFlagsRejects,
    testing::Values(
        BadFlags{{}, "--model"}, BadFlags{{"--model", "a", "--module-tree", "b"}, "--module-tree"},
        BadFlags{{"--model", "a", "--bogus", "1"}, "--bogus"}, BadFlags{{"--model"}, "--model needs a value"},
        BadFlags{{"--model", "a", "--model", "b"}, "given twice"}, BadFlags{{"--model", "a", "stray"}, "stray"},
        BadFlags{{"--model", "a", "--device-map", "balanced_high"}, "balanced_high"},
        BadFlags{{"--model", "a", "--max-memory", "0=20XB"}, "20XB"},
        BadFlags{{"--model", "a", "--dtype", "float13"}, "float13"},
        BadFlags{{"--model", "a", "--quantized-sizing", "hf"}, "--quantized-sizing: \"hf\" is not a quantized sizing"},
        BadFlags{{"--model", "a", "--kv-cache-tokens", "-1"}, "--kv-cache-tokens"},
        BadFlags{{"--model", "a", "--kv-cache-tokens", "many"}, "many"},
        BadFlags{{"--model", "a", "--max-batch", "0"}, "--max-batch: \"0\" is not an integer >= 1"},
        BadFlags{{"--model", "a", "--max-new-tokens", "0"}, "--max-new-tokens"},
        BadFlags{{"--model", "a", "--intra-op-threads", "-2"}, "--intra-op-threads"},
        BadFlags{{"--model", "a", "--inject-fault", "stage=x"}, "--inject-fault"},
        BadFlags{{"--model", "a", "--physical-devices", "0=tpu"}, "--physical-devices"},
        BadFlags{{"--model", "a", "--drain-timeout", "-1"}, "--drain-timeout: \"-1\" is not a number"},
        BadFlags{{"--model", "a", "--drain-timeout", "soon"}, "--drain-timeout"},
        BadFlags{{"--model", "a", "--drain-timeout", "20s"}, "--drain-timeout"},
        BadFlags{{"--model", "a", "--drain-timeout", "nan"}, "--drain-timeout"},
        BadFlags{{"--model", "a", "--drain-timeout", "inf"}, "--drain-timeout"},
        BadFlags{{"--model", "a", "--drain-timeout", "100000"}, "--drain-timeout"},
        BadFlags{{"--model", "a", "--listen", "50051"}, "--listen"},
        BadFlags{{"--model", "a", "--listen", ":50051"}, "no host"},
        BadFlags{{"--model", "a", "--listen", "::1:50051"}, "brackets"},
        BadFlags{{"--model", "a", "--metrics-listen", "localhost:70000"}, "--metrics-listen"},
        BadFlags{{"--model", "a", "--metrics-listen", "localhost:9x"}, "localhost:9x"},
        BadFlags{{"--model", "a", "--max-message-bytes", "0"}, "--max-message-bytes"},
        BadFlags{{"--model", "a", "--max-message-bytes", "2000000000"},
                 "--max-message-bytes: 2000000000 is more than 1073741824"},
        BadFlags{{"--model", "a", "--max-prompt-bytes", "-5"}, "--max-prompt-bytes"},
        BadFlags{{"--model", "a", "--max-prompt-tokens", "4096"},
                 "--max-prompt-tokens: 4096 is more than --max-context 2048"},
        BadFlags{{"--model", "a", "--max-streams", "0"}, "--max-streams"},
        BadFlags{{"--model", "a", "--max-streams-per-connection", "0"}, "--max-streams-per-connection"},
        BadFlags{{"--model", "a", "--max-streams-per-connection", "3000000000"}, "--max-streams-per-connection"},
        BadFlags{{"--model", "a", "--max-stream-buffer-bytes", "none"}, "--max-stream-buffer-bytes"},
        BadFlags{{"--model", "a", "--tokenize-threads", "-1"}, "--tokenize-threads"},
        BadFlags{{"--model", "a", "--tokenize-threads", "1000"}, "--tokenize-threads: 1000 is more than 256"},
        BadFlags{{"--model", "a", "--tool-call-parser", "mistral"},
                 "\"mistral\" (valid: hermes, llama3_json, deepseek_v3, kimi_k2, glm45, minimax_m2, openai)"},
        BadFlags{{"--model", "a", "--reasoning-parser", "deepseek_v3"},
                 "\"deepseek_v3\" (valid: deepseek_r1, qwen3, glm45, gpt_oss)"}));

}  // namespace
}  // namespace strata::server
