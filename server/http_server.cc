#include "server/http_server.h"

#include <gnutls/gnutls.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace strata::server {

namespace {

// A header value quoted in an error message: at most 40 bytes, each outside printable ASCII (or a quote or
// backslash, which the JSON body would need escaped) shown as '?'.
std::string Quoted(std::string_view value) {
  std::string quoted = "\"";
  for (char c : value.substr(0, 40)) quoted += (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? c : '?';
  if (value.size() > 40) quoted += "...";
  return quoted + "\"";
}

// abseil's string_view is its own type here (Debian's build), not std::string_view.
absl::string_view Absl(std::string_view text) { return absl::string_view(text.data(), text.size()); }
std::string_view Trimmed(std::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(Absl(text));
  return std::string_view(trimmed.data(), trimmed.size());
}

// The client's address, the key of the per-peer cap: an IPv4 address mapped into IPv6 counts as itself.
std::string PeerKey(const sockaddr* address) {
  if (address == nullptr) return "";
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return std::string(reinterpret_cast<const char*>(&v4->sin_addr), sizeof(v4->sin_addr));
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    const char* bytes = reinterpret_cast<const char*>(&v6->sin6_addr);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) return std::string(bytes + 12, 4);
    return std::string(bytes, sizeof(v6->sin6_addr));
  }
  return "";
}

}  // namespace

absl::Status CheckRequestFraming(const std::vector<std::string_view>& content_lengths,
                                 const std::vector<std::string_view>& transfer_encodings) {
  if (!transfer_encodings.empty()) {
    if (!content_lengths.empty()) {
      return absl::InvalidArgumentError(
          "Transfer-Encoding: not allowed together with Content-Length (RFC 9112 section 6.3: the two could frame "
          "the body differently)");
    }
    const std::string_view coding = Trimmed(transfer_encodings.front());
    if (transfer_encodings.size() > 1 || !absl::EqualsIgnoreCase(Absl(coding), "chunked")) {
      return absl::InvalidArgumentError(absl::StrCat("Transfer-Encoding: ", Quoted(coding),
                                                     (transfer_encodings.size() > 1 ? " and more" : ""),
                                                     " is not supported; send \"chunked\" alone or Content-Length"));
    }
  }
  for (size_t i = 1; i < content_lengths.size(); ++i) {
    const std::string_view first = Trimmed(content_lengths.front());
    const std::string_view other = Trimmed(content_lengths[i]);
    if (first != other) {
      return absl::InvalidArgumentError(absl::StrCat("Content-Length: two different values, ", Quoted(first), " and ",
                                                     Quoted(other), " (RFC 9112 section 6.3)"));
    }
  }
  return absl::OkStatus();
}

const char* ConnectionDropName(ConnectionDrop drop) {
  switch (drop) {
    case ConnectionDrop::kConnectionLimit:
      return "connection_limit";
    case ConnectionDrop::kPeerLimit:
      return "peer_limit";
    case ConnectionDrop::kReadTimeout:
      return "read_timeout";
  }
  return "unknown";
}

std::vector<std::string_view> HttpRequest::Header(std::string_view name) const {
  std::vector<std::string_view> values;
  for (const auto& [key, value] : headers) {
    if (key == name) values.emplace_back(value);
  }
  return values;
}

absl::StatusOr<std::vector<sockaddr_storage>> ResolveListenAddress(const ListenAddress& address,
                                                                   absl::string_view flag) {
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
        absl::StrCat(flag, " ", address.ToString(), ": cannot resolve host: ", gai_strerror(rc)));
  }
  std::vector<sockaddr_storage> addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    sockaddr_storage storage{};
    std::memcpy(&storage, a->ai_addr, std::min<size_t>(a->ai_addrlen, sizeof(storage)));
    addresses.push_back(storage);
  }
  freeaddrinfo(found);
  return addresses;
}

// libmicrohttpd's callbacks. MHD's per-request pointer holds a heap std::shared_ptr<HttpExchange>, as
// does a streamed response's reader: the exchange lives while either needs it.
struct HttpServer::Callbacks {
  static MHD_Result CollectHeader(void* headers_ptr, MHD_ValueKind /*kind*/, const char* key, const char* value) {
    auto& headers = *static_cast<std::vector<std::pair<std::string, std::string>>*>(headers_ptr);
    if (headers.size() < 256) headers.emplace_back(absl::AsciiStrToLower(key), value != nullptr ? value : "");
    return MHD_YES;
  }

  static MHD_Result QueueWhole(MHD_Connection* connection, const HttpResponse& response) {
    MHD_Response* mhd = MHD_create_response_from_buffer(response.body.size(), const_cast<char*>(response.body.data()),
                                                        MHD_RESPMEM_MUST_COPY);
    if (mhd == nullptr) return MHD_NO;
    MHD_add_response_header(mhd, MHD_HTTP_HEADER_CONTENT_TYPE, response.content_type.c_str());
    for (const auto& [name, value] : response.headers) MHD_add_response_header(mhd, name.c_str(), value.c_str());
    const MHD_Result queued = MHD_queue_response(connection, static_cast<unsigned>(response.status), mhd);
    MHD_destroy_response(mhd);
    return queued;
  }

  // mTLS (--tls-client-ca): whether the connection's client presented a certificate that --tls-client-ca
  // signed and that is valid now (GnuTLS checks the chain, the dates and the signature; MHD asked for it
  // in the handshake, as MHD_OPTION_HTTPS_MEM_TRUST does, but leaves the verdict to the application).
  static bool ClientCertificateVerified(MHD_Connection* connection) {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (info == nullptr || info->tls_session == nullptr) return false;
    auto session = static_cast<gnutls_session_t>(info->tls_session);
    unsigned int list_size = 0;
    if (gnutls_certificate_get_peers(session, &list_size) == nullptr || list_size == 0) return false;
    unsigned int status = 0;
    return gnutls_certificate_verify_peers2(session, &status) == GNUTLS_E_SUCCESS && status == 0;
  }

  static HttpResponse Unauthenticated() {
    HttpResponse response;
    response.status = 401;
    response.body =
        R"json({"error":{"message":"this port requires a client certificate signed by the server's --tls-client-ca","type":"invalid_request_error","param":null,"code":"client_certificate_required"}})json";
    return response;
  }

  // Every Content-Length and Transfer-Encoding value (MHD itself reads only the first of each).
  struct FramingHeaders {
    std::vector<std::string_view> content_lengths;
    std::vector<std::string_view> transfer_encodings;
  };
  static MHD_Result CollectFraming(void* framing_ptr, MHD_ValueKind /*kind*/, const char* key, const char* value) {
    auto& framing = *static_cast<FramingHeaders*>(framing_ptr);
    const std::string_view v = value != nullptr ? value : "";
    if (absl::EqualsIgnoreCase(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) framing.content_lengths.push_back(v);
    if (absl::EqualsIgnoreCase(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) framing.transfer_encodings.push_back(v);
    return MHD_YES;
  }

  static HttpResponse BadFraming(const absl::Status& status) {
    HttpResponse response;
    response.status = 400;
    // The message quotes header values: Quoted leaves no byte but '"' that JSON would need escaped.
    response.body =
        absl::StrCat(R"json({"error":{"message":")json", absl::StrReplaceAll(status.message(), {{"\"", "\\\""}}),
                     R"json(","type":"invalid_request_error","param":null,"code":"bad_request_framing"}})json");
    return response;
  }

  // The first call of a request (its head is whole): a refusal queued now (the client's certificate, its
  // framing, a body that says it is too large) is all the request gets; MHD closes the connection after it.
  static MHD_Result RefuseEarly(HttpServer& server, HttpExchange& exchange, MHD_Connection* connection) {
    const HttpServerOptions& options = server.options_;
    std::optional<HttpResponse> refusal;
    if (options.tls && !options.tls->client_ca.empty() && !ClientCertificateVerified(connection)) {
      refusal = Unauthenticated();
    }
    FramingHeaders framing;
    MHD_get_connection_values(connection, MHD_HEADER_KIND, &CollectFraming, &framing);
    if (absl::Status framed = CheckRequestFraming(framing.content_lengths, framing.transfer_encodings);
        !refusal && !framed.ok()) {
      refusal = BadFraming(framed);
    }
    uint64_t bytes = 0;
    if (!refusal && !framing.content_lengths.empty() && absl::SimpleAtoi(Absl(framing.content_lengths[0]), &bytes) &&
        bytes > options.max_body_bytes) {
      refusal = TooLarge(options.max_body_bytes);
    }
    if (!refusal) return MHD_YES;
    exchange.refused_ = true;  // nothing of it is read or answered but this refusal
    server.SetReading(connection, false);
    return QueueWhole(connection, *refusal);
  }

  static HttpResponse TooLarge(size_t limit) {
    HttpResponse response;
    response.status = 413;
    response.body = absl::StrCat(
        R"json({"error":{"message":"request body: more than the server's limit of )json", limit,
        R"json( bytes (--max-message-bytes)","type":"invalid_request_error","param":null,"code":"request_too_large"}})json");
    return response;
  }

  // A streamed response's bytes: what the exchange holds, or (nothing yet) the connection suspends until
  // Write, End or the client's disconnect resumes it.
  static ssize_t Read(void* exchange_ptr, uint64_t /*position*/, char* buffer, size_t max) {
    HttpExchange& exchange = **static_cast<std::shared_ptr<HttpExchange>*>(exchange_ptr);
    std::lock_guard lock(exchange.mutex_);
    if (exchange.gone_) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (!exchange.buffer_.empty()) {
      const size_t n = std::min(max, exchange.buffer_.size());
      std::memcpy(buffer, exchange.buffer_.data(), n);
      exchange.buffer_.erase(0, n);
      return static_cast<ssize_t>(n);
    }
    if (exchange.ended_) return MHD_CONTENT_READER_END_OF_STREAM;
    exchange.SuspendLocked();
    return 0;
  }

  static void FreeReader(void* exchange_ptr) { delete static_cast<std::shared_ptr<HttpExchange>*>(exchange_ptr); }

  static MHD_Result Access(void* server_ptr, MHD_Connection* connection, const char* url, const char* method,
                           const char* version, const char* upload_data, size_t* upload_data_size,
                           void** request_state) {
    auto* server = static_cast<HttpServer*>(server_ptr);
    if (*request_state == nullptr) {
      std::shared_ptr<HttpExchange> exchange(
          new HttpExchange(server, connection, server->options_.max_stream_buffer_bytes));
      exchange->request_.method = method;
      exchange->request_.path = url;
      // A half-closed client's connection is probed with an interim response (HalfClosed): only HTTP/1.1
      // clients must parse one, and only a plaintext socket may be written to around MHD.
      exchange->may_probe_ = !server->options_.tls && std::strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
      MHD_get_connection_values(connection, MHD_HEADER_KIND, &CollectHeader, &exchange->request_.headers);
      *request_state = new std::shared_ptr<HttpExchange>(exchange);
      {
        std::lock_guard lock(server->mutex_);
        server->open_.insert(exchange);
      }
      return RefuseEarly(*server, *exchange, connection);
    }
    HttpExchange& exchange = **static_cast<std::shared_ptr<HttpExchange>*>(*request_state);
    if (*upload_data_size > 0) {
      const size_t size = *upload_data_size;
      *upload_data_size = 0;
      if (exchange.refused_) return MHD_YES;
      if (exchange.request_.body.size() + size > server->options_.max_body_bytes) {
        exchange.refused_ = true;
        exchange.request_.body.clear();
        server->SetReading(connection, false);
        return QueueWhole(connection, TooLarge(server->options_.max_body_bytes));
      }
      exchange.request_.body.append(upload_data, size);
      return MHD_YES;
    }
    if (exchange.refused_) return MHD_YES;
    server->SetReading(connection, false);  // the request is whole
    std::unique_lock lock(exchange.mutex_);
    if (exchange.queued_) return MHD_YES;
    if (!exchange.dispatched_) {
      exchange.dispatched_ = true;
      lock.unlock();
      server->handler_(exchange.shared_from_this());
      lock.lock();
    }
    if (exchange.gone_) return MHD_NO;  // MHD closes the connection
    if (exchange.response_) {
      exchange.queued_ = true;
      return QueueWhole(connection, *exchange.response_);
    }
    if (exchange.streaming_) {
      exchange.queued_ = true;
      MHD_Response* mhd = MHD_create_response_from_callback(
          MHD_SIZE_UNKNOWN, 64 << 10, &Read, new std::shared_ptr<HttpExchange>(exchange.shared_from_this()),
          &FreeReader);
      if (mhd == nullptr) return MHD_NO;
      MHD_add_response_header(mhd, MHD_HTTP_HEADER_CONTENT_TYPE, exchange.stream_content_type_.c_str());
      for (const auto& [name, value] : exchange.stream_headers_) {
        MHD_add_response_header(mhd, name.c_str(), value.c_str());
      }
      const MHD_Result queued = MHD_queue_response(connection, MHD_HTTP_OK, mhd);
      MHD_destroy_response(mhd);
      return queued;
    }
    exchange.SuspendLocked();
    return MHD_YES;
  }

  // A new connection: the kernel's send buffer is capped, so that a client that stops reading holds at
  // most kSocketSendBufferBytes there (plus the stream buffer here) before its stream is cut; Linux would
  // otherwise let it grow to tcp_wmem's maximum (4 MiB) per connection.
  static void Connection(void* server_ptr, MHD_Connection* connection, void** /*socket_state*/,
                         MHD_ConnectionNotificationCode code) {
    auto* server = static_cast<HttpServer*>(server_ptr);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) return server->ConnectionClosed(connection);
    if (code != MHD_CONNECTION_NOTIFY_STARTED) return;
    server->ConnectionStarted(connection);
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == nullptr) return;
    const int bytes = kSocketSendBufferBytes;
    setsockopt(info->connect_fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }

  // Before MHD takes a new connection: the caps (a refusal closes the socket at once, counted).
  static MHD_Result AcceptPolicy(void* server_ptr, const sockaddr* address, socklen_t /*length*/) {
    return static_cast<HttpServer*>(server_ptr)->AcceptPeer(address) ? MHD_YES : MHD_NO;
  }

  // The request is over: answered (OK), or its connection closed, timed out or failed first.
  static void Completed(void* server_ptr, MHD_Connection* connection, void** request_state,
                        MHD_RequestTerminationCode termination) {
    auto* server = static_cast<HttpServer*>(server_ptr);
    server->SetReading(connection, true);  // a kept-alive connection's next request: its deadline starts now
    if (*request_state == nullptr) return;
    auto* holder = static_cast<std::shared_ptr<HttpExchange>*>(*request_state);
    std::shared_ptr<HttpExchange> exchange = std::move(*holder);
    delete holder;
    *request_state = nullptr;
    bool answered = false;
    {
      std::lock_guard lock(exchange->mutex_);
      answered = termination == MHD_REQUEST_TERMINATED_COMPLETED_OK && exchange->queued_ &&
                 (!exchange->streaming_ || exchange->ended_);
    }
    if (!answered) exchange->ClientGone();
    std::lock_guard lock(server->mutex_);
    server->suspended_.erase(exchange.get());
    server->open_.erase(exchange);
    server->changed_.notify_all();
  }
};

void HttpExchange::SuspendLocked() {
  if (suspended_) return;
  if (fd_ < 0) {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(connection_, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info != nullptr) fd_ = info->connect_fd;
  }
  {
    std::lock_guard lock(server_->mutex_);
    server_->suspended_.insert(this);
    server_->changed_.notify_all();
  }
  suspended_ = true;
  MHD_suspend_connection(connection_);
}

void HttpExchange::ResumeLocked() {
  if (!suspended_) return;
  suspended_ = false;
  {
    std::lock_guard lock(server_->mutex_);
    server_->suspended_.erase(this);
  }
  MHD_resume_connection(connection_);
}

void HttpExchange::Respond(HttpResponse response) {
  std::lock_guard lock(mutex_);
  if (gone_ || response_ || streaming_) return;
  response_ = std::move(response);
  ResumeLocked();
}

void HttpExchange::BeginStream(std::string content_type, std::vector<std::pair<std::string, std::string>> headers) {
  std::lock_guard lock(mutex_);
  if (gone_ || response_ || streaming_) return;
  streaming_ = true;
  stream_content_type_ = std::move(content_type);
  stream_headers_ = std::move(headers);
  ResumeLocked();
}

bool HttpExchange::Write(std::string_view bytes) {
  std::function<void()> on_gone;
  {
    std::lock_guard lock(mutex_);
    if (gone_ || ended_ || !streaming_) return false;
    if (buffer_.size() + bytes.size() <= max_stream_buffer_bytes_) {
      buffer_.append(bytes);
      ResumeLocked();
      return true;
    }
    // The client does not read: the stream is cut (the reader ends it with an error) and counted gone.
    gone_ = true;
    overflowed_ = true;
    buffer_.clear();
    on_gone = std::move(on_gone_);
    ResumeLocked();
  }
  if (on_gone) on_gone();
  return false;
}

void HttpExchange::End() {
  std::lock_guard lock(mutex_);
  ended_ = true;
  ResumeLocked();
}

void HttpExchange::OnClientGone(std::function<void()> callback) {
  {
    std::lock_guard lock(mutex_);
    if (!gone_) {
      on_gone_ = std::move(callback);
      return;
    }
  }
  callback();
}

bool HttpExchange::client_gone() const {
  std::lock_guard lock(mutex_);
  return gone_;
}

bool HttpExchange::overflowed() const {
  std::lock_guard lock(mutex_);
  return overflowed_;
}

void HttpExchange::ClientGone() {
  std::function<void()> on_gone;
  {
    std::lock_guard lock(mutex_);
    ResumeLocked();  // MHD then ends the connection (the handler answers MHD_NO, the reader an error)
    if (gone_) return;
    gone_ = true;
    on_gone = std::move(on_gone_);
  }
  if (on_gone) on_gone();
}

// A half-close (the client's FIN) tells nothing of whether the client still reads: shutdown(SHUT_WR) after
// a request (as some proxies do) keeps reading, close() does not. Only bytes sent tell them apart: a socket
// that was closed answers them with a reset, which the watcher then sees as POLLHUP/POLLERR. Before the
// response has begun, those bytes are an interim "100 Continue", which every HTTP/1.1 client must skip
// (RFC 9110 section 15.2); MHD is suspended and writes nothing meanwhile. A begun stream needs no probe: its
// next event is one.
bool HttpExchange::HalfClosed() {
  std::lock_guard lock(mutex_);
  if (gone_) return true;
  if (!may_probe_ || fd_ < 0) return false;
  if (suspended_ && !queued_ && !response_ && !streaming_) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    if (send(fd_, kContinue.data(), kContinue.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(kContinue.size())) {
      return false;
    }
  }
  half_closed_.store(true);
  return true;
}

bool HttpServer::AcceptPeer(const sockaddr* address) {
  std::optional<ConnectionDrop> drop;
  {
    std::lock_guard lock(connections_mutex_);
    if (connections_.size() >= options_.max_connections) {
      drop = ConnectionDrop::kConnectionLimit;
    } else if (options_.max_connections_per_peer > 0) {
      auto peer = per_peer_.find(PeerKey(address));
      if (peer != per_peer_.end() && peer->second >= options_.max_connections_per_peer)
        drop = ConnectionDrop::kPeerLimit;
    }
  }
  if (!drop) return true;
  Dropped(*drop);
  return false;
}

void HttpServer::ConnectionStarted(MHD_Connection* connection) {
  OpenConnection open;
  if (const MHD_ConnectionInfo* fd = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD)) {
    open.fd = fd->connect_fd;
  }
  if (const MHD_ConnectionInfo* peer = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS)) {
    open.peer = PeerKey(peer->client_addr);
  }
  open.read_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options_.read_timeout_seconds);
  std::lock_guard lock(connections_mutex_);
  ++per_peer_[open.peer];
  connections_.insert_or_assign(connection, std::move(open));
}

// MHD calls this before it closes the socket: under the mutex, every fd the watcher touches is still its own.
void HttpServer::ConnectionClosed(MHD_Connection* connection) {
  std::lock_guard lock(connections_mutex_);
  auto open = connections_.find(connection);
  if (open == connections_.end()) return;
  auto peer = per_peer_.find(open->second.peer);
  if (peer != per_peer_.end() && --peer->second == 0) per_peer_.erase(peer);
  connections_.erase(open);
}

void HttpServer::SetReading(MHD_Connection* connection, bool reading) {
  std::lock_guard lock(connections_mutex_);
  auto open = connections_.find(connection);
  if (open == connections_.end() || open->second.reading == reading) return;
  open->second.reading = reading;
  open->second.eof_since.reset();
  if (reading) {
    open->second.read_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options_.read_timeout_seconds);
  }
}

// Connections whose request is not whole yet: past the deadline, or closed by their client, the socket is
// shut down, which MHD sees at once and closes. The client's FIN needs this watch: MHD's epoll loop
// (edge-triggered) takes a short read for a drained socket and never reads again the FIN that came with the
// last bytes, so such a connection would sit in CLOSE-WAIT until the idle timeout. A FIN counts only when
// nothing is left unread on every watch for kEofGraceMs: MHD hands a whole request to Access in the same turn
// as it reads its last bytes, so a request that is whole has stopped reading by then, however loaded the host.
void HttpServer::WatchReads() {
  std::unique_lock lock(connections_mutex_);
  while (!connections_stopping_) {
    const auto now = std::chrono::steady_clock::now();
    std::vector<pollfd> fds;
    std::vector<OpenConnection*> watched;
    int timed_out = 0;
    for (auto& [connection, open] : connections_) {
      if (!open.reading || open.dropped || open.fd < 0) continue;
      if (options_.read_timeout_seconds > 0 && now >= open.read_deadline) {
        shutdown(open.fd, SHUT_RDWR);
        open.dropped = true;
        ++timed_out;
        continue;
      }
      fds.push_back(pollfd{open.fd, POLLRDHUP, 0});
      watched.push_back(&open);
    }
    if (!fds.empty() && poll(fds.data(), fds.size(), 0) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        OpenConnection& open = *watched[i];
        int unread = 0;
        const bool eof = (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 &&
                         ioctl(open.fd, FIONREAD, &unread) == 0 && unread == 0;
        if (!eof) {
          open.eof_since.reset();
        } else if (!open.eof_since) {
          open.eof_since = now;
        } else if (now - *open.eof_since >= std::chrono::milliseconds(kEofGraceMs)) {
          shutdown(open.fd, SHUT_RDWR);
          open.dropped = true;
        }
      }
    }
    if (timed_out > 0) {
      lock.unlock();
      for (int i = 0; i < timed_out; ++i) Dropped(ConnectionDrop::kReadTimeout);
      lock.lock();
    }
    connections_changed_.wait_for(lock, std::chrono::milliseconds(kReadWatchMs),
                                  [this] { return connections_stopping_; });
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const ListenAddress& address, HttpServerOptions options,
                                                              HttpHandler handler) {
  absl::StatusOr<std::vector<sockaddr_storage>> addresses = ResolveListenAddress(address, options.flag);
  if (!addresses.ok()) return addresses.status();
  if (options.tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.flag, ": this libmicrohttpd was built without TLS; serve HTTPS behind a proxy"));
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options), std::move(handler)));
  const HttpServerOptions& o = server->options_;
  for (const sockaddr_storage& a : *addresses) {
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME;
    if (a.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (o.tls) flags |= MHD_USE_TLS;
    const char* key = o.tls ? o.tls->private_key.c_str() : nullptr;
    const char* cert = o.tls ? o.tls->certificate_chain.c_str() : nullptr;
    // With a client CA, MHD asks clients for a certificate in the handshake (checked per request above).
    const bool mtls = o.tls && !o.tls->client_ca.empty();
    const char* trust = mtls ? o.tls->client_ca.c_str() : nullptr;
    server->daemon_ = MHD_start_daemon(
        flags, static_cast<uint16_t>(address.port), &Callbacks::AcceptPolicy, server.get(), &Callbacks::Access,
        server.get(),
        // MHD's own limit is one above the policy's, which refuses (and counts) first: at its limit MHD would
        // stop accepting, and new clients would wait in the backlog instead of being refused.
        MHD_OPTION_SOCK_ADDR, &a, MHD_OPTION_CONNECTION_LIMIT, o.max_connections + 1, MHD_OPTION_CONNECTION_TIMEOUT,
        o.idle_timeout_seconds, MHD_OPTION_THREAD_STACK_SIZE, kThreadStackBytes, MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
        MHD_OPTION_NOTIFY_COMPLETED, &Callbacks::Completed, server.get(), MHD_OPTION_NOTIFY_CONNECTION,
        &Callbacks::Connection, server.get(),
        // Without TLS (or without a client CA) what follows MHD_OPTION_END is never read.
        o.tls ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, key, MHD_OPTION_HTTPS_MEM_CERT, cert,
        mtls ? MHD_OPTION_HTTPS_MEM_TRUST : MHD_OPTION_END, trust, MHD_OPTION_END);
    if (server->daemon_ != nullptr) break;
  }
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", address.ToString(), " (", o.flag,
                                               ": port in use or address not local?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : address.port;
  server->watcher_ = std::thread([s = server.get()] { s->WatchDisconnects(); });
  server->read_watcher_ = std::thread([s = server.get()] { s->WatchReads(); });
  return server;
}

void HttpServer::WatchDisconnects() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (suspended_.empty()) {
      changed_.wait(lock, [this] { return stopping_ || !suspended_.empty(); });
      continue;
    }
    // Under the mutex: a suspended connection cannot be resumed (ResumeLocked takes it), so MHD cannot
    // close it and every socket polled is the connection's own.
    // A half-closed client's socket stays readable (its FIN): it is then watched for a reset only.
    std::vector<pollfd> fds;
    std::vector<HttpExchange*> exchanges;
    for (HttpExchange* exchange : suspended_) {
      if (exchange->fd_ < 0) continue;
      fds.push_back(pollfd{exchange->fd_, static_cast<short>(exchange->half_closed_.load() ? 0 : POLLRDHUP), 0});
      exchanges.push_back(exchange);
    }
    std::vector<std::shared_ptr<HttpExchange>> gone;
    std::vector<std::shared_ptr<HttpExchange>> half_closed;
    if (!fds.empty() && poll(fds.data(), fds.size(), 0) > 0) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if ((fds[i].revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
          gone.push_back(exchanges[i]->shared_from_this());
        } else if ((fds[i].revents & POLLRDHUP) != 0) {
          half_closed.push_back(exchanges[i]->shared_from_this());
        }
      }
    }
    if (!gone.empty() || !half_closed.empty()) {
      lock.unlock();
      for (const std::shared_ptr<HttpExchange>& exchange : half_closed) {
        if (!exchange->HalfClosed()) gone.push_back(exchange);
      }
      for (const std::shared_ptr<HttpExchange>& exchange : gone) exchange->ClientGone();
      gone.clear();
      half_closed.clear();
      lock.lock();
    }
    changed_.wait_for(lock, std::chrono::milliseconds(kDisconnectPollMs), [this] { return stopping_; });
  }
}

HttpServer::~HttpServer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
  }
  if (watcher_.joinable()) watcher_.join();
  {
    std::lock_guard lock(connections_mutex_);
    connections_stopping_ = true;
    connections_changed_.notify_all();
  }
  if (read_watcher_.joinable()) read_watcher_.join();
  if (daemon_ == nullptr) return;
  // MHD must not be stopped with connections suspended: every exchange still answering is cut, and MHD
  // given a moment to close their connections (each is resumed; its handler or reader then ends it).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<std::shared_ptr<HttpExchange>> open;
    {
      std::lock_guard lock(mutex_);
      open.assign(open_.begin(), open_.end());
    }
    // Outside the server's mutex: an exchange's is taken first everywhere else.
    std::vector<std::shared_ptr<HttpExchange>> answering;
    for (const std::shared_ptr<HttpExchange>& exchange : open) {
      std::lock_guard exchange_lock(exchange->mutex_);
      if (exchange->dispatched_) answering.push_back(exchange);
    }
    if (answering.empty()) break;
    for (const std::shared_ptr<HttpExchange>& exchange : answering) exchange->ClientGone();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  MHD_stop_daemon(daemon_);
}

}  // namespace strata::server
