#include "transport/sockets.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::transport::internal {

std::string AddressString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, host, sizeof host);
    return absl::StrCat(host, ":", ntohs(in.sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof host);
    return absl::StrCat("[", host, "]:", ntohs(in6.sin6_port));
  }
  return "?";
}

absl::StatusOr<std::pair<sockaddr_storage, socklen_t>> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::pair<sockaddr_storage, socklen_t> out{};
  std::memcpy(&out.first, found->ai_addr, found->ai_addrlen);
  out.second = found->ai_addrlen;
  freeaddrinfo(found);
  return out;
}

std::string InterfaceOf(const sockaddr_storage& addr) {
  bool loopback = false;
  if (addr.ss_family == AF_INET) {
    const in_addr a = reinterpret_cast<const sockaddr_in&>(addr).sin_addr;
    if (a.s_addr == htonl(INADDR_ANY)) return "";
    loopback = (ntohl(a.s_addr) >> 24) == 127;
  } else if (addr.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr;
    if (IN6_IS_ADDR_UNSPECIFIED(&a)) return "";
    loopback = IN6_IS_ADDR_LOOPBACK(&a);
  } else {
    return "";
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != addr.ss_family) continue;
    if (loopback) {
      if (i->ifa_flags & IFF_LOOPBACK) name = i->ifa_name;
    } else if (addr.ss_family == AF_INET) {
      if (reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
          reinterpret_cast<const sockaddr_in&>(addr).sin_addr.s_addr) {
        name = i->ifa_name;
      }
    } else if (std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                           &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, sizeof(in6_addr)) == 0) {
      name = i->ifa_name;
    }
  }
  freeifaddrs(list);
  return name;
}

int PollMs(absl::Time deadline) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1, 0, 1000));
}

absl::StatusOr<int> ConnectSocket(const sockaddr_storage& addr, socklen_t len, const std::string& at,
                                  absl::Time deadline) {
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(at, " is not reachable (socket: ", strerror(errno), ")"));
  int error = 0;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    error = errno;
    while (error == EINPROGRESS && absl::Now() < deadline) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, PollMs(deadline)) > 0) {
        socklen_t size = sizeof error;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      }
    }
  }
  if (error != 0) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat(at, " is not reachable (", error == EINPROGRESS ? "timed out" : strerror(error), ")"));
  }
  return fd;
}

std::mutex& ListenerChanges() {
  static std::mutex changes;
  return changes;
}

}  // namespace strata::transport::internal
