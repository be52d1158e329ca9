#include "server/pem_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "base/file_reader.h"

namespace strata::server {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* x509) const { X509_free(x509); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using PrivateKey = std::unique_ptr<EVP_PKEY, PkeyFree>;

Bio MemoryBio(const std::string& text) { return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))); }

// OpenSSL's default asks for a passphrase on the terminal; a server has nobody to answer.
int NoPassphrase(char*, int, int, void*) { return -1; }

Certificate FirstCertificate(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  Certificate certificate(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  return certificate;
}

PrivateKey ParsePrivateKey(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  PrivateKey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  return key;
}

}  // namespace

absl::StatusOr<std::string> ReadPemCertificates(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = base::ReadRegularFile(path, kMaxPemFileBytes);
  if (!text.ok()) return text.status();
  if (FirstCertificate(*text) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
  }
  return text;
}

absl::StatusOr<std::string> ReadPemPrivateKey(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = base::ReadRegularFile(path, kMaxPemFileBytes);
  if (!text.ok()) return text.status();
  if (ParsePrivateKey(*text) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": holds no unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"));
  }
  return text;
}

absl::Status CheckKeyMatchesCertificate(const std::string& certificate_chain, const std::string& private_key) {
  Certificate certificate = FirstCertificate(certificate_chain);
  PrivateKey key = ParsePrivateKey(private_key);
  if (certificate == nullptr || key == nullptr) {
    return absl::InvalidArgumentError("the certificate or the private key is not PEM");
  }
  const bool matches = X509_check_private_key(certificate.get(), key.get()) == 1;
  ERR_clear_error();
  if (!matches) return absl::InvalidArgumentError("the private key is not the key of the certificate");
  return absl::OkStatus();
}

}  // namespace strata::server
