// libFuzzer harness: the bytes a client sends to the HTTP API's port (request lines, headers, bodies, as
// many requests as the input holds), read by server::HttpServer: libmicrohttpd under strata's callbacks
// (the framing check, the body limit, the read deadline's and caps' bookkeeping, the half-close watch).
//
// Why the whole server over loopback: MHD's request parser is not a function one can call (it runs inside
// its connection state machine, fed by its own recv()), and what strata adds sits in the callbacks MHD
// calls from that machine; a socket is the one way to drive both as a client does. The server runs once in
// this process (MHD is the system's, uninstrumented; http_server.cc is instrumented and gives libFuzzer its
// coverage); each input is one connection: sent, half-closed (shutdown(SHUT_WR)), read to the server's
// close. Promises checked: the server closes every connection (no hang: a request cut short is released,
// whole ones are answered); every response starts with a status line; the handler never sees a request
// whose framing is ambiguous (two Content-Lengths that differ, Transfer-Encoding with Content-Length), nor
// a body above the limit, nor header names that are not lower case.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "server/http_server.h"

namespace strata::server {
// flags.cc (the server's whole command line) is not part of this build; HttpServer only names addresses.
std::string ListenAddress::ToString() const { return host + ":" + std::to_string(port); }
}  // namespace strata::server

namespace {

constexpr size_t kMaxBody = 4096;
constexpr int kCloseWithinMs = 8000;  // the read deadline is 2 s; libFuzzer's -timeout is 10 s

void CheckRequest(const strata::server::HttpRequest& request) {
  if (request.method.empty() || request.body.size() > kMaxBody) std::abort();
  for (const auto& [name, value] : request.headers) {
    for (char c : name) {
      if (std::isupper(static_cast<unsigned char>(c))) std::abort();
    }
  }
  const auto lengths = request.Header("content-length");
  if (!lengths.empty() && !request.Header("transfer-encoding").empty()) std::abort();
  // CheckRequestFraming compares values without their surrounding blanks.
  auto trimmed = [](std::string_view text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
    return text;
  };
  for (std::string_view length : lengths) {
    if (trimmed(length) != trimmed(lengths.front())) std::abort();
  }
}

// Answers at once (a whole response), or, for paths under /stream, as a stream of three writes.
void Handle(std::shared_ptr<strata::server::HttpExchange> exchange) {
  const strata::server::HttpRequest& request = exchange->request();
  CheckRequest(request);
  if (request.path.rfind("/stream", 0) == 0) {
    exchange->BeginStream("text/event-stream");
    for (int i = 0; i < 3; ++i) exchange->Write("data: x\n\n");
    exchange->End();
    return;
  }
  strata::server::HttpResponse response;
  response.body = std::to_string(request.body.size());
  exchange->Respond(std::move(response));
}

strata::server::HttpServer& Server() {
  static strata::server::HttpServer* server = [] {
    strata::server::HttpServerOptions options;
    options.max_connections = 64;
    options.max_body_bytes = kMaxBody;
    options.read_timeout_seconds = 2;
    options.idle_timeout_seconds = 5;
    absl::StatusOr<std::unique_ptr<strata::server::HttpServer>> started =
        strata::server::HttpServer::Start(strata::server::ListenAddress{"127.0.0.1", 0}, options, &Handle);
    if (!started.ok()) std::abort();
    return started->release();  // lives as long as the process
  }();
  return *server;
}

// Every response in `received` (there may be several: pipelined requests, interim 100s) begins with a
// status line; only the first is checked, the rest may be inside bodies.
void CheckResponse(std::string_view received) {
  if (received.empty()) return;  // closed without an answer (MHD does so for some malformed heads)
  if (received.size() < 12 || received.substr(0, 7) != "HTTP/1.") std::abort();
  for (size_t i = 9; i < 12; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(received[i]))) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int port = Server().port();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return 0;
  }
  // The server may answer (and close) before it has read everything: a failed send is not a finding.
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string received;
  char buffer[16384];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCloseWithinMs);
  for (;;) {
    pollfd waiting{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) std::abort();  // the server kept a client that has nothing more to send
    const int ready = poll(&waiting, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;  // libFuzzer's timer (SIGALRM) and the like
    if (ready <= 0) continue;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) break;  // closed (or reset, when it answered before reading everything)
    if (received.size() < 64) received.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  CheckResponse(received);
  return 0;
}
