#pragma once
// server::HttpServer: the HTTP/1.1 server of strata's OpenAI-compatible API (server/http_api.h), on GNU
// libmicrohttpd, as /metrics is (server/metrics_endpoint.h). Why libmicrohttpd: one internal thread polls
// every connection with epoll, so thousands of open SSE streams cost a socket and a buffer each, not a
// thread; a client that trickles its request, or stops reading its response, holds one connection slot
// and is closed after the idle timeout; it is packaged in Debian (already linked for /metrics), speaks TLS
// through GnuTLS, and lets a connection be suspended while the engine works (MHD_suspend_connection) and
// resumed from the engine's thread when there is something to send.
//
// A request is read whole (at most max_body_bytes: 413 beyond, before the body is read when it says its
// length), then handed to the handler as an HttpExchange, which answers it once, from any thread: with a
// whole response, or with a stream (chunked transfer encoding; Server-Sent Events for the API). While the
// exchange waits, its connection is suspended; a watcher thread polls the sockets of suspended
// connections, so a client that disconnects while its request waits or generates is noticed within
// kDisconnectPollMs (MHD itself does not watch suspended connections) and the exchange's OnClientGone
// callback cancels the generation. A stream holds at most max_stream_buffer_bytes for a client that does
// not read; beyond, it is cut and its client counted gone.
//
// Connection limits (server/README.md, "Connection limits and deadlines"): at most max_connections open,
// at most max_connections_per_peer from one client address (both refused at accept, counted by on_drop);
// a request's head and body must arrive within read_timeout_seconds of the accept (or of the previous
// response's end on a kept-alive connection), which a client trickling bytes cannot extend, as it does
// MHD's idle timeout; a client that closes (or half-closes) before its request is whole is released at
// once. A client that half-closes after its request (shutdown(SHUT_WR)) still gets its answer.

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/flags.h"

struct MHD_Daemon;
struct MHD_Connection;
struct sockaddr_storage;

namespace strata::server {

// The socket addresses (IPv4, IPv6) `address` resolves to for listening, in the resolver's order. The
// error names `flag` and the address.
absl::StatusOr<std::vector<sockaddr_storage>> ResolveListenAddress(const ListenAddress& address,
                                                                   absl::string_view flag);

// RFC 9112 §6.3: a request whose framing two parsers could read differently is refused (400) rather than
// guessed at: Transfer-Encoding with Content-Length, Content-Length values that differ, a Transfer-Encoding
// other than one "chunked". `content_lengths` and `transfer_encodings` are every value of those headers, in
// arrival order. The error names the header.
absl::Status CheckRequestFraming(const std::vector<std::string_view>& content_lengths,
                                 const std::vector<std::string_view>& transfer_encodings);

// Why a connection was refused at accept or closed before its request was whole.
enum class ConnectionDrop { kConnectionLimit, kPeerLimit, kReadTimeout };
// "connection_limit", "peer_limit", "read_timeout": the reason label of strata_http_connections_dropped_total.
const char* ConnectionDropName(ConnectionDrop drop);

struct HttpRequest {
  std::string method;
  std::string path;                                          // without the query string
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case, in arrival order
  std::string body;

  // The values of header `name` (lower case).
  std::vector<std::string_view> Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class HttpServer;

// One request and its answer. The handler (and the threads it hands the exchange to) answer it exactly
// once: Respond, or BeginStream + Write... + End. Thread-safe.
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  const HttpRequest& request() const { return request_; }

  // The whole response. Ignored when the exchange was answered already or its client is gone.
  void Respond(HttpResponse response);
  // A streamed 200 response (chunked) with `content_type`; Write adds to it, End completes it.
  void BeginStream(std::string content_type, std::vector<std::pair<std::string, std::string>> headers = {});
  // Queues `bytes` for the client. False when nothing more will reach it: it is gone, or it left more than
  // the stream buffer's limit unread (the stream is then cut and OnClientGone's callback runs).
  bool Write(std::string_view bytes);
  void End();
  // `callback` runs once, on any thread (at once when already so), when the client disconnects or is cut
  // before its response is complete. It must not call back into this exchange under a lock it holds.
  void OnClientGone(std::function<void()> callback);
  bool client_gone() const;
  // The stream was cut because its client left more than the stream buffer's limit unread.
  bool overflowed() const;

 private:
  friend class HttpServer;
  HttpExchange(HttpServer* server, MHD_Connection* connection, size_t max_stream_buffer_bytes)
      : server_(server), connection_(connection), max_stream_buffer_bytes_(max_stream_buffer_bytes) {}
  // The client is gone (a failed write, a closed socket, a full buffer, a server shutting down):
  // runs the callback and lets MHD close the connection.
  void ClientGone();
  // The watcher saw the client's FIN on the suspended connection: kept (a half-close), and, where the
  // response has not begun, probed so that a client that closed its socket is told apart (false: it cannot
  // be, and the client is taken for gone, as before half-closes were answered).
  bool HalfClosed();
  void SuspendLocked();
  void ResumeLocked();

  HttpServer* const server_;
  MHD_Connection* const connection_;
  const size_t max_stream_buffer_bytes_;
  HttpRequest request_;
  bool refused_ = false;  // answered by a refusal queued before its body was read
  bool dispatched_ = false;

  mutable std::mutex mutex_;
  bool suspended_ = false;
  bool queued_ = false;  // a response (whole or streamed) was handed to MHD
  std::optional<HttpResponse> response_;
  bool streaming_ = false;
  std::string stream_content_type_;
  std::vector<std::pair<std::string, std::string>> stream_headers_;
  std::string buffer_;  // stream bytes not yet taken by MHD
  bool ended_ = false;
  bool gone_ = false;
  bool overflowed_ = false;
  std::function<void()> on_gone_;
  int fd_ = -1;  // the connection's socket, watched while suspended
  // The client shut its side (read EOF): it sends nothing more but may still read (see HalfClosed).
  std::atomic<bool> half_closed_{false};
  bool may_probe_ = false;  // plain HTTP/1.1: an interim 100 (Continue) may be written to the socket
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct HttpServerOptions {
  std::string flag = "--http-listen";  // named in errors
  unsigned max_connections = 4096;
  unsigned max_connections_per_peer = 0;  // from one client address; 0: no cap of its own
  unsigned idle_timeout_seconds = 60;     // a connection that neither sends nor takes bytes for this long is closed
  // A request's head and body must arrive within this, from the accept or the previous response's end; 0:
  // no deadline. A response (a long stream included) is not bound by it.
  unsigned read_timeout_seconds = 30;
  // A connection refused or dropped (any thread; must not block). May be empty.
  std::function<void(ConnectionDrop)> on_drop;
  size_t max_body_bytes = 4 << 20;
  size_t max_stream_buffer_bytes = 1 << 20;
  std::optional<ServerTls> tls;  // HTTPS with this certificate and key
};

class HttpServer {
 public:
  static constexpr int kDisconnectPollMs = 20;
  // How often connections still reading a request are checked for their deadline and for a closed client.
  static constexpr int kReadWatchMs = 20;
  // How long a FIN with nothing unread must stand before a connection still reading is shut down: MHD hands a
  // whole request to its handler just after reading its last bytes, but on a loaded host its thread may be
  // descheduled between the two (a shorter grace cut half-closed clients' whole requests).
  static constexpr int kEofGraceMs = 1000;
  static constexpr size_t kThreadStackBytes = 8 << 20;
  static constexpr int kSocketSendBufferBytes = 256 << 10;

  // Binds `address` (Unavailable when it cannot: a port in use) and serves `handler` until destroyed.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const ListenAddress& address, HttpServerOptions options,
                                                           HttpHandler handler);
  // Every exchange still open is cut (its client counted gone), then the connections are closed.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  friend class HttpExchange;
  struct Callbacks;
  HttpServer(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)), handler_(std::move(handler)) {}
  void WatchDisconnects();

  // A connection from accept to close, for the read deadline and the caps (connections_mutex_).
  struct OpenConnection {
    int fd = -1;
    std::string peer;     // the client's address bytes
    bool reading = true;  // its request (head or body) is not whole yet
    std::chrono::steady_clock::time_point read_deadline;
    // Since when every watch saw the client's FIN with nothing left unread (unset: the last did not).
    std::optional<std::chrono::steady_clock::time_point> eof_since;
    bool dropped = false;  // shut down by the watch; MHD closes it
  };
  bool AcceptPeer(const sockaddr* address);
  void ConnectionStarted(MHD_Connection* connection);
  void ConnectionClosed(MHD_Connection* connection);
  // The connection's request is whole (false) or a new one may begin (true: its deadline starts now).
  void SetReading(MHD_Connection* connection, bool reading);
  void WatchReads();
  void Dropped(ConnectionDrop drop) const {
    if (options_.on_drop) options_.on_drop(drop);
  }

  const HttpServerOptions options_;
  const HttpHandler handler_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;

  // Exchanges whose connection is suspended (their sockets watched), and every exchange still open.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_set<HttpExchange*> suspended_;
  std::unordered_set<std::shared_ptr<HttpExchange>> open_;
  bool stopping_ = false;
  std::thread watcher_;

  // Every open connection, and how many each client address holds. A leaf lock: nothing is taken under it.
  std::mutex connections_mutex_;
  std::condition_variable connections_changed_;
  std::unordered_map<MHD_Connection*, OpenConnection> connections_;
  std::unordered_map<std::string, unsigned> per_peer_;
  bool connections_stopping_ = false;
  std::thread read_watcher_;
};

}  // namespace strata::server
