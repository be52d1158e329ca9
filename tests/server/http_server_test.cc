// server/http_server.h's framing rule (RFC 9112 section 6.3) and the connection flags that feed HttpServer.
// The server itself is tested over sockets: tests/http_api/test_http_connections.py.
#include "server/http_server.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/flags.h"

namespace strata::server {
namespace {

using Values = std::vector<std::string_view>;

absl::StatusOr<ServerCommand> Parse(std::vector<std::string> args) { return ParseServerFlags(args); }

TEST(RequestFraming, OneLengthOrChunkedAloneIsServed) {
  EXPECT_TRUE(CheckRequestFraming({}, {}).ok());
  EXPECT_TRUE(CheckRequestFraming(Values{"16"}, {}).ok());
  EXPECT_TRUE(CheckRequestFraming(Values{"16", " 16 "}, {}).ok());  // the same length twice is one length
  EXPECT_TRUE(CheckRequestFraming({}, Values{"chunked"}).ok());
  EXPECT_TRUE(CheckRequestFraming({}, Values{" Chunked"}).ok());
}

TEST(RequestFraming, AmbiguousFramingIsRefusedNamingTheHeader) {
  absl::Status status = CheckRequestFraming(Values{"16", "17"}, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "Content-Length: two different values, \"16\" and \"17\" (RFC 9112 section 6.3)");
  status = CheckRequestFraming(Values{"16"}, Values{"chunked"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(status.message(), "Transfer-Encoding: not allowed together with Content-Length"))
      << status;
  for (const Values& codings : {Values{"gzip"}, Values{"gzip, chunked"}, Values{"chunked", "chunked"}}) {
    status = CheckRequestFraming({}, codings);
    EXPECT_TRUE(absl::StartsWith(status.message(), "Transfer-Encoding: \"")) << status;
  }
}

TEST(RequestFraming, QuotedValuesAreShortAndPrintable) {
  const std::string junk = "1\"\\\n" + std::string(100, '9');
  const absl::Status status = CheckRequestFraming(Values{"1", junk}, {});
  EXPECT_EQ(status.message(), absl::StrCat("Content-Length: two different values, \"1\" and \"1???",
                                           std::string(36, '9'), "...\" (RFC 9112 section 6.3)"));
}

TEST(ConnectionFlags, DefaultsAndZero) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.endpoints.http_max_connections_per_peer, 256);
  EXPECT_EQ(command->options.endpoints.http_read_timeout_seconds, 30);
  command = Parse({"--model", "m", "--http-max-connections-per-peer", "0", "--http-read-timeout", "0"});
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->options.endpoints.http_max_connections_per_peer, 0);
  EXPECT_EQ(command->options.endpoints.http_read_timeout_seconds, 0);
}

TEST(ConnectionFlags, NegativeIsRefusedNamingTheFlag) {
  absl::StatusOr<ServerCommand> command = Parse({"--model", "m", "--http-read-timeout", "-1"});
  ASSERT_FALSE(command.ok());
  EXPECT_TRUE(absl::StrContains(command.status().message(), "--http-read-timeout")) << command.status();
  command = Parse({"--model", "m", "--http-max-connections-per-peer", "-5"});
  ASSERT_FALSE(command.ok());
  EXPECT_TRUE(absl::StrContains(command.status().message(), "--http-max-connections-per-peer")) << command.status();
}

}  // namespace
}  // namespace strata::server
