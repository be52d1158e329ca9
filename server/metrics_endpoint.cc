#include "server/metrics_endpoint.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace strata::server {
namespace {

// Waits up to `millis` for `fd` to become readable.
bool Readable(int fd, int millis) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, millis) > 0 && (p.revents & POLLIN);
}

void WriteAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;  // the scraper went away; nothing to do
    }
    sent += static_cast<size_t>(n);
  }
}

std::string Response(absl::string_view status, absl::string_view content_type, const std::string& body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const ListenAddress& address,
                                                                         std::shared_ptr<prometheus::Registry> registry) {
  std::string host = address.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", address.ToString(), ": cannot resolve host: ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restartable while old sockets linger
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", address.ToString(), ": ", error));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  char service[NI_MAXSERV] = {0};
  getnameinfo(reinterpret_cast<sockaddr*>(&bound), length, nullptr, 0, service, sizeof(service), NI_NUMERICSERV);
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(fd, std::atoi(service), std::move(registry)));
}

MetricsEndpoint::MetricsEndpoint(int listen_fd, int port, std::shared_ptr<prometheus::Registry> registry)
    : listen_fd_(listen_fd), port_(port), registry_(std::move(registry)), thread_([this] { Serve(); }) {}

MetricsEndpoint::~MetricsEndpoint() {
  stopping_ = true;
  thread_.join();
  close(listen_fd_);
}

void MetricsEndpoint::Serve() {
  // Scrapes are rare and small: one connection at a time, polled so that shutdown is noticed.
  while (!stopping_) {
    if (!Readable(listen_fd_, 100)) continue;
    int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    Answer(connection);
    close(connection);
  }
}

void MetricsEndpoint::Answer(int connection) const {
  // Read the request head (a scrape sends no body); give up on a client that stalls.
  std::string request;
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 65536) {
    if (!Readable(connection, 2000)) return;
    ssize_t n = recv(connection, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const std::string line = request.substr(0, request.find("\r\n"));
  if (!absl::StartsWith(line, "GET ") && !absl::StartsWith(line, "HEAD ")) {
    WriteAll(connection, Response("405 Method Not Allowed", "text/plain", "only GET /metrics\n"));
    return;
  }
  const size_t path_start = line.find(' ') + 1;
  std::string path = line.substr(path_start, line.find(' ', path_start) - path_start);
  path = path.substr(0, path.find('?'));
  if (path != "/metrics") {
    WriteAll(connection, Response("404 Not Found", "text/plain", "strata serves /metrics\n"));
    return;
  }
  const std::string body = prometheus::TextSerializer().Serialize(registry_->Collect());
  WriteAll(connection, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8",
                                absl::StartsWith(line, "HEAD ") ? std::string() : body));
}

}  // namespace strata::server
