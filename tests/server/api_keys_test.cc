#include "server/api_keys.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::server {
namespace {

const std::string kKeyA = "0123456789abcdef0123";
const std::string kKeyB = "fedcba9876543210-_.~+/=";

TEST(ApiKeys, OneKeyPerLineBlanksAndCommentsSkipped) {
  absl::StatusOr<std::vector<std::string>> keys =
      ParseApiKeys("# the operators' keys\n\n  " + kKeyA + "\t\r\n   \n#" + kKeyB + "\n" + kKeyB, "keys.txt");
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{kKeyA, kKeyB}));
}

TEST(ApiKeys, NoKeyIsAnErrorNamingTheFile) {
  for (const std::string text : {"", "\n\n", "# only a comment\n   \n"}) {
    absl::StatusOr<std::vector<std::string>> keys = ParseApiKeys(text, "/etc/strata/keys");
    ASSERT_FALSE(keys.ok());
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(keys.status().message(),
              "/etc/strata/keys: holds no API key (one per line; blank lines and # comments are skipped)");
  }
}

TEST(ApiKeys, BadKeysNameTheLineNeverTheKey) {
  absl::StatusOr<std::vector<std::string>> short_key = ParseApiKeys("# keys\nsecret\n", "k");
  ASSERT_FALSE(short_key.ok());
  EXPECT_EQ(short_key.status().message().substr(0, 38), "k:2: an API key of 6 characters: keys ");
  EXPECT_EQ(short_key.status().message().find("secret"), std::string::npos);
  absl::StatusOr<std::vector<std::string>> spaced = ParseApiKeys(kKeyA + "\n" + kKeyA + " " + kKeyB, "k");
  ASSERT_FALSE(spaced.ok());
  EXPECT_EQ(spaced.status().message(),
            "k:2: an API key must be printable ASCII without spaces (what gRPC metadata carries)");
  EXPECT_FALSE(ParseApiKeys(kKeyA + "\xc3\xa9", "k").ok());
  EXPECT_FALSE(ParseApiKeys(std::string(kMaxApiKeyLength + 1, 'a'), "k").ok());
  EXPECT_TRUE(ParseApiKeys(std::string(kMaxApiKeyLength, 'a'), "k").ok());
}

TEST(ApiKeys, AcceptsExactlyTheKeys) {
  const ApiKeys keys({kKeyA, kKeyB});
  EXPECT_EQ(keys.size(), 2u);
  EXPECT_TRUE(keys.Accepts(kKeyA));
  EXPECT_TRUE(keys.Accepts(kKeyB));
  EXPECT_FALSE(keys.Accepts(""));
  EXPECT_FALSE(keys.Accepts(kKeyA.substr(0, kKeyA.size() - 1)));
  EXPECT_FALSE(keys.Accepts(kKeyA + "0"));
  EXPECT_FALSE(keys.Accepts(kKeyA + kKeyB));
  std::string flipped = kKeyA;
  flipped.back() = '4';
  EXPECT_FALSE(keys.Accepts(flipped));
}

TEST(ApiKeys, AuthorizationIsOneBearerHeaderWithAKey) {
  const ApiKeys keys({kKeyA});
  const std::string bearer = "Bearer " + kKeyA;
  const std::string lower = "bearer " + kKeyA;
  EXPECT_TRUE(CheckAuthorization(keys, {bearer}).ok());
  EXPECT_TRUE(CheckAuthorization(keys, {lower}).ok());

  auto refused = [&](std::vector<absl::string_view> values, absl::string_view message) {
    const absl::Status status = CheckAuthorization(keys, values);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(status.message(), message);
  };
  refused({}, "this server requires an API key: send the metadata \"authorization: Bearer KEY\"");
  refused({bearer, bearer}, "more than one \"authorization\" metadata entry: send exactly one");
  refused({kKeyA}, "the \"authorization\" metadata must be \"Bearer KEY\"");
  refused({"Basic " + kKeyA}, "the \"authorization\" metadata must be \"Bearer KEY\"");
  refused({"Bearer"}, "the \"authorization\" metadata must be \"Bearer KEY\"");
  const std::string wrong = "Bearer " + kKeyA + "x";
  refused({wrong}, "the API key is not valid");
  refused({"Bearer "}, "the API key is not valid");

  // The HTTP API's messages speak of its header, not of gRPC metadata.
  auto refused_http = [&](std::vector<absl::string_view> values, absl::string_view message) {
    const absl::Status status = CheckAuthorization(keys, values, KeyCarrier::kHttpHeader);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(status.message(), message);
  };
  EXPECT_TRUE(CheckAuthorization(keys, {bearer}, KeyCarrier::kHttpHeader).ok());
  refused_http({}, "this server requires an API key: send the header \"Authorization: Bearer KEY\"");
  refused_http({bearer, bearer}, "more than one \"Authorization\" header: send exactly one");
  refused_http({kKeyA}, "the \"Authorization\" header must be \"Bearer KEY\"");
  refused_http({wrong}, "the API key is not valid");
}

}  // namespace
}  // namespace strata::server
