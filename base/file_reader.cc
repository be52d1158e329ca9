#include "base/file_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::base {
namespace {

std::string FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor on every path out of ReadOpened.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// `fd` is open on `path`; ENOENT at open is the caller's business.
absl::StatusOr<std::string> ReadOpened(const std::filesystem::path& path, int fd, uint64_t max_bytes) {
  const std::string name = path.string();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot stat (", std::strerror(errno), ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": is ", FileKind(st.st_mode), ", expected a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", size, " bytes is over the limit of ", max_bytes, " bytes for this file"));
  }
  std::string text;
  text.resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InvalidArgumentError(absl::StrCat(name, ": read error (", std::strerror(errno), ")"));
    }
    if (n == 0) break;  // the file shrank while being read: keep what is there
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

absl::StatusOr<std::optional<std::string>> Read(const std::filesystem::path& path, uint64_t max_bytes,
                                                bool missing_is_absent) {
  // O_NONBLOCK: opening a FIFO for reading without a writer would otherwise wait forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT && missing_is_absent) {
      // A dangling symlink is something the user put there: say so instead of ignoring it.
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) return std::optional<std::string>();
    }
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot open (", std::strerror(err), ")"));
  }
  Descriptor owned(fd);
  absl::StatusOr<std::string> text = ReadOpened(path, owned.get(), max_bytes);
  if (!text.ok()) return text.status();
  return std::optional<std::string>(*std::move(text));
}

}  // namespace

absl::StatusOr<std::string> ReadRegularFile(const std::filesystem::path& path, uint64_t max_bytes) {
  absl::StatusOr<std::optional<std::string>> text = Read(path, max_bytes, /*missing_is_absent=*/false);
  if (!text.ok()) return text.status();
  return **std::move(text);
}

absl::StatusOr<std::optional<std::string>> ReadRegularFileIfPresent(const std::filesystem::path& path,
                                                                    uint64_t max_bytes) {
  return Read(path, max_bytes, /*missing_is_absent=*/true);
}

bool PathMayExist(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, ec);
  if (!ec) return status.type() != std::filesystem::file_type::not_found;
  return ec != std::errc::no_such_file_or_directory;
}

}  // namespace strata::base
