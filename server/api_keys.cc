#include "server/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_reader.h"

namespace strata::server {
namespace {

std::array<unsigned char, 32> Digest(absl::string_view text) {
  std::array<unsigned char, 32> digest{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest.data());
  return digest;
}

absl::string_view TrimBlanks(absl::string_view line) {
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.remove_suffix(1);
  return line;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseApiKeys(absl::string_view text, absl::string_view file) {
  std::vector<std::string> keys;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = TrimBlanks(line);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = absl::StrCat(file, ":", line_number, ": ");
    for (const char c : line) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "an API key must be printable ASCII without spaces (what gRPC metadata carries)"));
      }
    }
    if (line.size() < kMinApiKeyLength || line.size() > kMaxApiKeyLength) {
      return absl::InvalidArgumentError(absl::StrCat(where, "an API key of ", line.size(), " characters: keys are ",
                                                     kMinApiKeyLength, " to ", kMaxApiKeyLength,
                                                     " characters (e.g. openssl rand -hex 32)"));
    }
    keys.emplace_back(line);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": holds no API key (one per line; blank lines and # comments are skipped)"));
  }
  return keys;
}

absl::StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = base::ReadRegularFile(path, kMaxApiKeyFileBytes);
  if (!text.ok()) return text.status();
  return ParseApiKeys(*text, path.string());
}

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  digests_.reserve(keys.size());
  for (const std::string& key : keys) digests_.push_back(Digest(key));
}

bool ApiKeys::Accepts(absl::string_view presented) const {
  const std::array<unsigned char, 32> digest = Digest(presented);
  int matched = 0;
  // Every key is compared, whether an earlier one matched or not.
  for (const std::array<unsigned char, 32>& key : digests_) {
    matched |= CRYPTO_memcmp(key.data(), digest.data(), digest.size()) == 0 ? 1 : 0;
  }
  return matched != 0;
}

absl::Status CheckAuthorization(const ApiKeys& keys, const std::vector<absl::string_view>& authorization,
                                KeyCarrier carrier) {
  const bool http = carrier == KeyCarrier::kHttpHeader;
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        http ? "this server requires an API key: send the header \"Authorization: Bearer KEY\""
             : "this server requires an API key: send the metadata \"authorization: Bearer KEY\"");
  }
  if (authorization.size() > 1) {
    return absl::UnauthenticatedError(http ? "more than one \"Authorization\" header: send exactly one"
                                           : "more than one \"authorization\" metadata entry: send exactly one");
  }
  absl::string_view value = authorization.front();
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() || !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(http ? "the \"Authorization\" header must be \"Bearer KEY\""
                                           : "the \"authorization\" metadata must be \"Bearer KEY\"");
  }
  value.remove_prefix(kScheme.size());
  if (!keys.Accepts(TrimBlanks(value))) return absl::UnauthenticatedError("the API key is not valid");
  return absl::OkStatus();
}

}  // namespace strata::server
