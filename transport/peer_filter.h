#pragma once
// Who may reach UCX's own listening sockets (no torch, no UCX). UCX's TCP transport listens on an ephemeral port
// of every network device it may use, and parses the first bytes of whatever connects there: in UCX 1.13.1 its
// 8-byte magic number followed by a bad length aborts the process (an assertion). strata cannot authenticate
// before UCX reads those bytes, but the kernel can refuse the connection before it exists: a classic BPF socket
// filter on each such listener drops every packet, the SYN included, whose source address is not one of the
// group's members (added as each member passes strata's HMAC handshake). Accepted sockets inherit the filter.
//
// What it cannot tell apart: processes on a member's own host (they share its address), and a host that
// spoofs a member's address on the same network segment.
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "absl/status/status.h"

namespace strata::transport {

// The sockets of this process listening on TCP (IPv4 or IPv6), by file descriptor.
std::set<int> ListeningTcpSockets();

class PeerAddressFilter {
 public:
  // At most this many member addresses of each family (a group is a few nodes; the filter's jumps are 8-bit).
  static constexpr size_t kMaxAddresses = 64;

  // Guards `fds` (not owned; they must outlive this object or be closed with the process): from now on they
  // admit no connection but from addresses given to Allow. An error (the sandbox refuses SO_ATTACH_FILTER)
  // leaves them unguarded, and Allow then does nothing.
  absl::Status Guard(std::vector<int> fds);
  // Admits connections from `address`'s host (its port is ignored; an IPv4-mapped IPv6 address counts as the
  // IPv4 one). Safe from any thread.
  absl::Status Allow(const sockaddr_storage& address);
  size_t guarded() const;

 private:
  absl::Status AttachLocked();

  mutable std::mutex mu_;
  std::vector<int> fds_;
  std::vector<uint32_t> v4_;                 // host byte order, as BPF loads them
  std::vector<std::array<uint32_t, 4>> v6_;  // likewise, word by word
};

}  // namespace strata::transport
