// strata-server's TLS and API key flags: files read and checked at parse time, errors naming the flag and
// the file. The PEM checks against real certificates are in tests/auth (openssl makes them there).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server/flags.h"

namespace strata::server {
namespace {

class SecurityFlags : public testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        std::filesystem::temp_directory_path() / ("strata_security_flags_" + std::to_string(::getpid()) + "_" +
                                                  testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::filesystem::path path = directory_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  absl::StatusOr<ServerCommand> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), {"--model", "/models/llama"});
    return ParseServerFlags(args);
  }

  std::filesystem::path directory_;
};

TEST_F(SecurityFlags, DefaultsArePlaintextWithoutKeys) {
  absl::StatusOr<ServerCommand> command = Parse({});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_FALSE(command->options.security.tls.has_value());
  EXPECT_EQ(command->options.security.api_keys, nullptr);
  EXPECT_TRUE(command->options.security.auth_open_methods.empty());
}

TEST_F(SecurityFlags, ApiKeyFileAndOpenMethodsInEverySpelling) {
  const std::string keys = Write("keys", "# two keys\n0123456789abcdef\nabcdef0123456789abcdef\n");
  absl::StatusOr<ServerCommand> command =
      Parse({"--api-key-file", keys, "--auth-open-methods", "GetDeviceMap,/strata.v1.InferenceService/Generate"});
  ASSERT_TRUE(command.ok()) << command.status();
  ASSERT_NE(command->options.security.api_keys, nullptr);
  EXPECT_EQ(command->options.security.api_keys->size(), 2u);
  EXPECT_TRUE(command->options.security.api_keys->Accepts("abcdef0123456789abcdef"));
  EXPECT_EQ(command->options.security.auth_open_methods, (std::set<std::string>{kGenerateMethod, kGetDeviceMapMethod}));
  command = Parse({"--api-key-file", keys, "--auth-open-methods", "strata.v1.InferenceService/GetDeviceMap"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.security.auth_open_methods, (std::set<std::string>{kGetDeviceMapMethod}));
}

TEST_F(SecurityFlags, BadCombinationsAndFilesNameTheFlag) {
  const std::string keys = Write("keys", "0123456789abcdef\n");
  const std::string not_pem = Write("not.pem", "hello\n");
  const std::string empty_keys = Write("empty", "# none\n");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls-cert", not_pem}, "--tls-cert needs --tls-key"},
      {{"--tls-key", not_pem}, "--tls-key needs --tls-cert"},
      {{"--tls-client-ca", not_pem}, "--tls-client-ca needs --tls-cert and --tls-key"},
      {{"--tls-cert", not_pem, "--tls-key", not_pem}, "--tls-cert: " + not_pem + ": holds no PEM certificate"},
      {{"--tls-cert", directory_.string(), "--tls-key", not_pem},
       "--tls-cert: " + directory_.string() + ": is a directory"},
      {{"--api-key-file", empty_keys}, "--api-key-file: " + empty_keys + ": holds no API key"},
      {{"--api-key-file", directory_.string()}, "--api-key-file: " + directory_.string() + ": is a directory"},
      {{"--api-key-file", "/dev/null"}, "--api-key-file: /dev/null: is a character device"},
      {{"--auth-open-methods", "Generate"}, "--auth-open-methods needs --api-key-file"},
      {{"--health-listen", "127.0.0.1:50052"}, "--health-listen needs --tls-cert"},
      {{"--api-key-file", keys, "--auth-open-methods", "grpc.health.v1.Health"},
       "--auth-open-methods: \"grpc.health.v1.Health\" is not a strata method"},
  };
  for (const auto& [args, named] : cases) {
    absl::StatusOr<ServerCommand> command = Parse(args);
    ASSERT_FALSE(command.ok()) << named;
    EXPECT_EQ(command.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(command.status().message().find(named), std::string::npos) << command.status();
  }
}

}  // namespace
}  // namespace strata::server
