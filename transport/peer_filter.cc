#include "transport/peer_filter.h"

#include <dirent.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata::transport {
namespace {

constexpr uint32_t kAccept = 0xffffffffu;  // keep the whole packet
constexpr uint32_t kDrop = 0;

sock_filter Statement(uint16_t code, uint32_t k) { return sock_filter{code, 0, 0, k}; }
sock_filter Jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) { return sock_filter{code, jt, jf, k}; }

// The IP header's words as BPF's absolute loads see them (SKF_NET_OFF: from the network header, whatever the
// socket's protocol): big-endian, read into host order.
uint32_t Word(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | bytes[3];
}

// Accepts a packet whose IPv4 source is one of `v4` or whose IPv6 source is one of `v6`; drops every other.
// A dual-stack IPv6 listener receives IPv4 packets with IPv4 headers, so the version decides which list applies.
std::vector<sock_filter> Program(const std::vector<uint32_t>& v4, const std::vector<std::array<uint32_t, 4>>& v6) {
  std::vector<sock_filter> p;
  p.push_back(Statement(BPF_LD | BPF_B | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF)));
  p.push_back(Statement(BPF_ALU | BPF_RSH | BPF_K, 4));
  // IPv4: the v4 section (three instructions per address, then a drop) follows; else skip it.
  p.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, static_cast<uint8_t>(3 * v4.size() + 1)));
  for (uint32_t address : v4) {
    // The source, then accept on a match (a load per address keeps each one's two instructions together).
    p.push_back(Statement(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF + 12)));
    p.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, address, 0, 1));
    p.push_back(Statement(BPF_RET | BPF_K, kAccept));
  }
  p.push_back(Statement(BPF_RET | BPF_K, kDrop));
  for (const std::array<uint32_t, 4>& address : v6) {
    // Nine instructions: four loads and compares of the source's words (a mismatch skips to the next address),
    // then accept.
    for (int w = 0; w < 4; ++w) {
      p.push_back(Statement(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(SKF_NET_OFF + 8 + 4 * w)));
      p.push_back(Jump(BPF_JMP | BPF_JEQ | BPF_K, address[w], 0, static_cast<uint8_t>(7 - 2 * w)));
    }
    p.push_back(Statement(BPF_RET | BPF_K, kAccept));
  }
  p.push_back(Statement(BPF_RET | BPF_K, kDrop));
  return p;
}

}  // namespace

std::set<int> ListeningTcpSockets() {
  std::set<int> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int listening = 0;
    int type = 0;
    socklen_t len = sizeof(int);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening == 0) continue;
    len = sizeof(int);
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage address{};
    len = sizeof(address);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&address), &len) != 0) continue;
    if (address.ss_family == AF_INET || address.ss_family == AF_INET6) out.insert(static_cast<int>(fd));
  }
  closedir(dir);
  return out;
}

absl::Status PeerAddressFilter::Guard(std::vector<int> fds) {
  std::lock_guard<std::mutex> lock(mu_);
  fds_.insert(fds_.end(), fds.begin(), fds.end());
  absl::Status attached = AttachLocked();
  if (!attached.ok()) fds_.clear();  // not guarded: Allow has nothing to update
  return attached;
}

absl::Status PeerAddressFilter::Allow(const sockaddr_storage& address) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint8_t* v4 = nullptr;
  if (address.ss_family == AF_INET) {
    v4 = reinterpret_cast<const uint8_t*>(&reinterpret_cast<const sockaddr_in&>(address).sin_addr);
  } else if (address.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr)) v4 = in6.sin6_addr.s6_addr + 12;
  } else {
    return absl::InvalidArgumentError("peer filter: not an IP address");
  }
  if (v4 != nullptr) {
    const uint32_t word = Word(v4);
    for (uint32_t known : v4_) {
      if (known == word) return absl::OkStatus();
    }
    if (v4_.size() >= kMaxAddresses) {
      return absl::ResourceExhaustedError(absl::StrCat("peer filter: more than ", kMaxAddresses, " IPv4 members"));
    }
    v4_.push_back(word);
    return AttachLocked();
  }
  const uint8_t* bytes = reinterpret_cast<const sockaddr_in6&>(address).sin6_addr.s6_addr;
  std::array<uint32_t, 4> words{};
  for (int w = 0; w < 4; ++w) words[w] = Word(bytes + 4 * w);
  for (const auto& known : v6_) {
    if (known == words) return absl::OkStatus();
  }
  if (v6_.size() >= kMaxAddresses) {
    return absl::ResourceExhaustedError(absl::StrCat("peer filter: more than ", kMaxAddresses, " IPv6 members"));
  }
  v6_.push_back(words);
  return AttachLocked();
}

size_t PeerAddressFilter::guarded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fds_.size();
}

absl::Status PeerAddressFilter::AttachLocked() {
  std::vector<sock_filter> program = Program(v4_, v6_);
  sock_fprog fprog{};
  fprog.len = static_cast<unsigned short>(program.size());
  fprog.filter = program.data();
  for (int fd : fds_) {
    // Replaces the socket's previous filter at once: no moment without one.
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) != 0) {
      return absl::InternalError(
          absl::StrCat("peer filter: SO_ATTACH_FILTER on socket ", fd, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::transport
