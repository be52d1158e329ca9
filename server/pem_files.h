#pragma once
// The PEM files of TLS (certificate chains, CA bundles, private keys), read once at start by strata-server
// and strata-client and checked with OpenSSL, so that a wrong file is an error naming it at start instead
// of a handshake that fails later. No gRPC here; the text goes to gRPC's credentials as read.

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::server {

// A certificate chain or a CA bundle is a few KB; a megabyte is far beyond any real one.
inline constexpr uint64_t kMaxPemFileBytes = uint64_t{1} << 20;

// The file at `path` (regular files only, at most kMaxPemFileBytes), which must hold one or more PEM
// certificates. InvalidArgument naming the path otherwise.
absl::StatusOr<std::string> ReadPemCertificates(const std::filesystem::path& path);

// The file at `path`, which must hold an unencrypted PEM private key (an encrypted one is refused:
// nobody is there to type a passphrase). InvalidArgument naming the path otherwise.
absl::StatusOr<std::string> ReadPemPrivateKey(const std::filesystem::path& path);

// Whether `private_key` (PEM) is the key of the first certificate in `certificate_chain` (PEM).
// InvalidArgument when it is not.
absl::Status CheckKeyMatchesCertificate(const std::string& certificate_chain, const std::string& private_key);

}  // namespace strata::server
