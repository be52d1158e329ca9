#pragma once
// API keys: the file strata-server reads them from (--api-key-file, one key per line) and the check of a
// call's `authorization: Bearer KEY` metadata against them. No gRPC here: strata-client reads its key
// with the same ReadApiKeyFile.

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::server {

// A key file is a few lines; a megabyte is far beyond any real one and keeps /dev/zero out.
inline constexpr uint64_t kMaxApiKeyFileBytes = uint64_t{1} << 20;
// Shorter keys are guessable: a key is a secret, not a password a person types.
inline constexpr size_t kMinApiKeyLength = 16;
inline constexpr size_t kMaxApiKeyLength = 4096;

// The keys in a key file's `text`: one per line, surrounding spaces, tabs and a CR trimmed; blank lines
// and lines whose first non-blank character is '#' skipped. A key must be printable ASCII without spaces
// (what gRPC metadata can carry), kMinApiKeyLength to kMaxApiKeyLength characters. Errors are
// InvalidArgument "FILE:LINE: ..." (the key itself is never shown); no key at all is an error naming `file`.
absl::StatusOr<std::vector<std::string>> ParseApiKeys(absl::string_view text, absl::string_view file);

// ParseApiKeys on the file at `path`, read with base::ReadRegularFile (regular files only, at most
// kMaxApiKeyFileBytes): every error names the path.
absl::StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::filesystem::path& path);

// The accepted keys, kept as SHA-256 digests. Accepts compares the digest of what a client presents with
// every digest, without stopping at a match and with CRYPTO_memcmp, so that neither the time taken nor
// the key's length tells an attacker how close a guess came or which key matched.
class ApiKeys {
 public:
  explicit ApiKeys(const std::vector<std::string>& keys);

  bool Accepts(absl::string_view presented) const;
  size_t size() const { return digests_.size(); }

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
};

// Where the API key travels, as messages name it: gRPC metadata or an HTTP header.
enum class KeyCarrier { kGrpcMetadata, kHttpHeader };

// The verdict on a call's `authorization` values (gRPC keeps every header given, as does the HTTP API):
// exactly one, "Bearer KEY" (the scheme case-insensitive, as HTTP's), with a key `keys` accepts. Otherwise
// Unauthenticated with a message that says what was wrong, in the carrier's words, and never echoes what
// was sent.
absl::Status CheckAuthorization(const ApiKeys& keys, const std::vector<absl::string_view>& authorization,
                                KeyCarrier carrier = KeyCarrier::kGrpcMetadata);

}  // namespace strata::server
