#pragma once
// The transport's plain sockets (no UCX): addresses, name resolution, the interface that holds an address, and the
// connector's non-blocking connect. The port itself (listen, accept) is the progress core's (core.cc, acceptor.cc).
#include <sys/socket.h>

#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::transport::internal {

// "host:port", "[v6 host]:port", or "?" for another family.
std::string AddressString(const sockaddr_storage& addr);

// The first address of host:port (numeric port; `passive`: a wildcard for an empty host), or UNAVAILABLE naming the
// host.
absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> Resolve(const std::string& host, int port, bool passive);

// The network interface that holds `addr` ("lo" for any loopback address); "" for a wildcard address or when no
// interface holds it.
std::string InterfaceOf(const sockaddr_storage& addr);

// poll()'s timeout until `deadline`: at least 0, at most 1000 ms.
int PollMs(absl::Time deadline);

// The connector's socket: connected to `addr` by `deadline`, or an error naming the peer (retryable).
absl::StatusOr<int> ConnectSocket(const sockaddr_storage& addr, socklen_t len, const std::string& at,
                                  absl::Time deadline);

// Held while this process's transports open or close a listening socket (their own, or UCX's in
// ucp_worker_create / ucp_worker_destroy): the sockets a worker's creation adds are then UCX's alone, not another
// transport's (several run in one process in tests), and no descriptor number is reused meanwhile.
std::mutex& ListenerChanges();

}  // namespace strata::transport::internal
