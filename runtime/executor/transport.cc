#include "runtime/executor/transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::runtime::transport {
namespace internal {
namespace {

// A Status another thread also holds, as a Status of its own (its own payload): absl::Status shares its payload by
// a reference count that Debian's uninstrumented Abseil releases where ThreadSanitizer cannot see the order, so a
// stored failure is never handed to a caller as a copy (the engine's output thread does the same).
absl::Status Detached(const absl::Status& status) {
  return status.ok() ? absl::OkStatus() : absl::Status(status.code(), std::string(status.message()));
}

// Active message ids. Handshake frames and the polite close are small eager messages; data may be rendezvous.
constexpr unsigned kAmHandshake = 0x5701;
constexpr unsigned kAmData = 0x5702;
constexpr unsigned kAmClose = 0x5703;

constexpr absl::string_view kProtocol = "strata-group-v1";
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kMaxHandshakeBytes = 64 << 10;
constexpr size_t kMaxFacts = 256;
constexpr size_t kMaxFactNameBytes = 256;
constexpr size_t kMaxFactValueBytes = 4096;
constexpr size_t kDataHeaderBytes = 16;  // kind (4), reserved (4), sequence number (8); little-endian
// How far ahead of the next message to deliver a sequence number may be (UCX keeps one endpoint's messages in
// order on its default single eager lane; the numbers only guard against lanes that do not).
constexpr uint64_t kMaxSequenceGap = uint64_t{1} << 24;
// A connection attempt's handshake: a silent or slow peer is dropped after this, so it cannot hold a rank's slot.
constexpr absl::Duration kHandshakeLimit = absl::Seconds(10);
// A link that failed its handshake keeps its endpoint this long, so the peer reads the last frame (a refusal,
// the facts) before the connection goes.
constexpr absl::Duration kLinger = absl::Seconds(1);
constexpr absl::Duration kConnectRetry = absl::Milliseconds(200);
constexpr int kIdleWakeMs = 100;  // the progress thread's longest sleep: handshake timeouts are checked this often

// The steps of the handshake. A frame: one byte naming the step, then fields, each a 4-byte big-endian length
// and that many bytes; nothing after the last field.
enum Step : uint8_t { kHello = 1, kAuth = 2, kAccept = 3, kRefuse = 4, kFacts = 5, kReady = 6 };

std::string EncodeFrame(Step step, const std::vector<absl::string_view>& fields) {
  std::string out(1, static_cast<char>(step));
  for (absl::string_view field : fields) {
    const uint32_t n = static_cast<uint32_t>(field.size());
    const char length[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                            static_cast<char>(n)};
    out.append(length, 4);
    out.append(field.data(), field.size());
  }
  return out;
}

struct Frame {
  Step step;
  std::vector<absl::string_view> fields;  // views into the received bytes
};

std::optional<Frame> DecodeFrame(absl::string_view bytes) {
  if (bytes.empty() || bytes.size() > kMaxHandshakeBytes) return std::nullopt;
  const uint8_t step = static_cast<uint8_t>(bytes[0]);
  if (step < kHello || step > kReady) return std::nullopt;
  Frame frame{static_cast<Step>(step), {}};
  size_t at = 1;
  while (at < bytes.size()) {
    if (bytes.size() - at < 4 || frame.fields.size() >= 2 * kMaxFacts + 4) return std::nullopt;
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data() + at);
    const size_t n = (size_t{p[0]} << 24) | (size_t{p[1]} << 16) | (size_t{p[2]} << 8) | size_t{p[3]};
    at += 4;
    if (n > bytes.size() - at) return std::nullopt;
    frame.fields.push_back(bytes.substr(at, n));
    at += n;
  }
  return frame;
}

std::string RankBytes(int rank) {
  const uint32_t r = static_cast<uint32_t>(rank);
  return std::string{static_cast<char>(r >> 24), static_cast<char>(r >> 16), static_cast<char>(r >> 8),
                     static_cast<char>(r)};
}

std::optional<int> ParseRank(absl::string_view bytes) {
  if (bytes.size() != 4) return std::nullopt;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint32_t r = (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
  if (r > (1u << 20)) return std::nullopt;
  return static_cast<int>(r);
}

// HMAC-SHA256(secret, label | nonce A | nonce B | rank): fixed-length parts, so the concatenation is unambiguous.
std::string Mac(const std::string& secret, absl::string_view label, absl::string_view a, absl::string_view b,
                int rank) {
  const std::string data = absl::StrCat(label, a, b, RankBytes(rank));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &out_len);
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

bool SameMac(absl::string_view a, absl::string_view b) {
  return a.size() == kMacBytes && b.size() == kMacBytes && CRYPTO_memcmp(a.data(), b.data(), kMacBytes) == 0;
}

std::string Nonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    // OpenSSL's generator failing is not recoverable here; an all-zero nonce would weaken the handshake.
    std::fprintf(stderr, "strata transport: RAND_bytes failed\n");
    std::abort();
  }
  return nonce;
}

// What a peer sent, made printable and short enough for a status message.
std::string Printable(absl::string_view untrusted, size_t limit = 200) {
  std::string out = absl::CHexEscape(untrusted.substr(0, limit));
  if (untrusted.size() > limit) out += "...";
  return out;
}

std::string AddressString(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, host, sizeof host);
    port = ntohs(in.sin_port);
    return absl::StrCat(host, ":", port);
  }
  if (addr.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof host);
    port = ntohs(in6.sin6_port);
    return absl::StrCat("[", host, "]:", port);
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

using Facts = std::vector<std::pair<std::string, std::string>>;

void AppendFacts(const Facts& facts, std::vector<absl::string_view>& fields) {
  for (const auto& [name, value] : facts) {
    fields.push_back(name);
    fields.push_back(value);
  }
}

// Fields [first, end) as name/value pairs with bounds; nullopt when malformed.
std::optional<Facts> ParseFacts(const std::vector<absl::string_view>& fields, size_t first) {
  if (fields.size() < first || (fields.size() - first) % 2 != 0 || (fields.size() - first) / 2 > kMaxFacts) {
    return std::nullopt;
  }
  Facts facts;
  for (size_t i = first; i < fields.size(); i += 2) {
    if (fields[i].empty() || fields[i].size() > kMaxFactNameBytes || fields[i + 1].size() > kMaxFactValueBytes) {
      return std::nullopt;
    }
    for (const auto& [name, value] : facts) {
      if (name == fields[i]) return std::nullopt;  // a name twice
    }
    facts.emplace_back(std::string(fields[i]), std::string(fields[i + 1]));
  }
  return facts;
}

// Every fact that differs, as seen from node `self`: empty when the two agree.
std::string CompareFacts(const Facts& mine, const Facts& theirs, int self, int peer) {
  auto find = [](const Facts& facts, const std::string& name) -> const std::string* {
    for (const auto& [n, v] : facts) {
      if (n == name) return &v;
    }
    return nullptr;
  };
  auto quoted = [](const std::string* value) {
    return value == nullptr ? std::string("not set") : absl::StrCat("\"", Printable(*value), "\"");
  };
  std::vector<std::string> differences;
  auto compare = [&](const std::string& name) {
    const std::string* here = find(mine, name);
    const std::string* there = find(theirs, name);
    if (here != nullptr && there != nullptr && *here == *there) return;
    differences.push_back(absl::StrCat("node ", self, " differs from node ", peer, ": ", Printable(name), " is ",
                                       quoted(here), " here and ", quoted(there), " on node ", peer));
  };
  for (const auto& [name, value] : mine) compare(name);
  for (const auto& [name, value] : theirs) {
    if (find(mine, name) == nullptr) compare(name);
  }
  return absl::StrJoin(differences, "; ");
}

std::string Seconds(absl::Duration d) {
  return absl::StrCat(absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1))));
}

// cv.wait_until with an absl deadline (an infinite one waits in long steps).
template <typename Lock>
void WaitUntil(std::condition_variable& cv, Lock& lock, absl::Time deadline) {
  if (deadline - absl::Now() > absl::Hours(1)) {
    cv.wait_for(lock, std::chrono::hours(1));
  } else {
    cv.wait_until(lock, absl::ToChronoTime(deadline));
  }
}

}  // namespace

class Core;
namespace {
// The Core whose progress thread this is: UCX's completion callbacks run there and find their Core here.
thread_local Core* current_core = nullptr;
Core* CurrentCore() { return current_core; }
}  // namespace

enum class Role { kAcceptor, kConnector };
enum class Phase {
  kConnecting,   // connector: endpoint made, waiting for the acceptor's hello
  kAwaitAuth,    // acceptor: hello sent, waiting for the connector's proof
  kAwaitAccept,  // connector: proof sent, waiting for the acceptor's proof and facts
  kAwaitFacts,   // acceptor: proof and facts sent, waiting for the connector's facts
  kAwaitReady,   // connector: facts agree, waiting for the acceptor's word that it agrees too
  kEstablished,
  kFailed,
};

struct Slot {
  uint32_t kind = 0;
  std::string bytes;
  bool ready = false;  // a rendezvous message is in the map before its bytes have arrived
};

struct LinkState {
  LinkState(Role role, int self_rank, int peer_rank, std::string address, absl::Time handshake_deadline)
      : role(role),
        self_rank(self_rank),
        address(std::move(address)),
        handshake_deadline(handshake_deadline),
        peer_rank(peer_rank) {}

  const Role role;
  const int self_rank;
  const std::string address;  // the peer's "host:port" as seen from here
  const absl::Time handshake_deadline;

  std::mutex mu;
  std::condition_variable cv;
  int peer_rank;  // -1 until an acceptor has read the connector's claim
  Phase phase = Phase::kConnecting;
  absl::Status failure;       // why the link is gone; or, once the peer closed politely, why it will be
  bool hard_failure = false;  // false: the peer closed; its messages in flight still arrive
  bool retryable = false;     // connector: failed before the acceptor spoke (not listening yet)
  bool closed_here = false;   // Close() was called: nothing more is delivered
  std::map<uint64_t, std::unique_ptr<Slot>> inbox;
  uint64_t next_deliver = 0;

  // The progress thread's alone.
  ucp_ep_h ep = nullptr;
  uint64_t next_send = 0;
  int receives_in_flight = 0;
  absl::Time close_at = absl::InfiniteFuture();  // failed: when to close the endpoint
  std::string nonce_a, nonce_b;
  // Connector whose facts differ: the status it fails with once the acceptor has read its facts and answered
  // (or gone), so that the acceptor's Accept reports the difference too.
  absl::Status verdict;

  std::string Who() {
    std::lock_guard<std::mutex> lock(mu);
    return WhoLocked();
  }
  std::string WhoLocked() const {
    if (peer_rank < 0) return absl::StrCat("a connection from ", address);
    return absl::StrCat("node ", peer_rank, " (", address, ")");
  }
};

// One UCX worker driven by one progress thread: every UCX call happens on that thread. Other threads hand it
// tasks (a queue and an eventfd) and wait on condition variables. It sleeps in epoll on the worker's event fd.
class Core {
 public:
  explicit Core(const TransportOptions& options) : options_(options) {
    bool has_group_size = false;
    for (const auto& [name, value] : options_.facts) has_group_size |= name == "group size";
    if (!has_group_size) options_.facts.emplace_back("group size", std::to_string(options_.group_size));
  }
  ~Core() { Stop(); }

  absl::Status Start();
  void Stop();

  const TransportOptions& options() const { return options_; }
  int port() const { return port_; }
  int64_t refused() const { return refused_.load(); }
  std::string listen_address() const { return absl::StrCat(options_.bind_host, ":", port_); }

  // Runs `task` on the progress thread; false once the transport stopped.
  bool Post(std::function<void()> task);

  absl::StatusOr<std::shared_ptr<LinkState>> Accept(int peer, absl::Time deadline);
  absl::StatusOr<std::shared_ptr<LinkState>> Connect(int peer, const std::string& host, int port, absl::Time deadline);
  absl::Status Send(const std::shared_ptr<LinkState>& link, uint32_t kind, absl::Span<const absl::string_view> parts);
  void Close(const std::shared_ptr<LinkState>& link);

 private:
  struct SendOp {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    ucs_status_t status = UCS_OK;
    std::array<uint8_t, kDataHeaderBytes> header{};
    std::vector<ucp_dt_iov_t> iov;
    std::string owned;  // a handshake frame's bytes
  };
  struct RecvOp {
    std::shared_ptr<LinkState> link;
    Slot* slot;
    size_t length;
  };

  void Run(std::promise<absl::Status> started);
  absl::Status InitUcx();
  void TeardownUcx();
  bool RunTasks();
  void Sweep();
  void ReapClosing();

  // Progress thread.
  void OnConnRequest(ucp_conn_request_h request);
  void OnEpError(ucp_ep_h ep, ucs_status_t status);
  void ReportErrorsOf(ucp_ep_params_t& params);  // an endpoint's peer-failure callback
  void OnHandshake(const std::shared_ptr<LinkState>& link, absl::string_view bytes);
  ucs_status_t OnData(ucp_ep_h ep, const void* header, size_t header_length, void* data, size_t length,
                      bool rendezvous);
  void OnPeerClose(ucp_ep_h ep);
  void StartReceive(uint64_t op_id, void* desc);
  void FinishReceive(uint64_t op_id, ucs_status_t status);
  void FinishSend(SendOp* op, ucs_status_t status);
  bool CreateConnectorEp(const std::shared_ptr<LinkState>& link, const sockaddr_storage& addr, socklen_t len);
  void SendFrame(const std::shared_ptr<LinkState>& link, std::string frame);
  void StartSend(const std::shared_ptr<LinkState>& link, const std::shared_ptr<SendOp>& op, unsigned id,
                 const void* header, size_t header_length, const void* buffer, size_t count, bool iov);
  // Marks the link failed (once); the endpoint closes now (`linger` false) or after kLinger.
  void Fail(const std::shared_ptr<LinkState>& link, absl::Status status, bool hard, bool linger);
  void Refuse(const std::shared_ptr<LinkState>& link, const std::string& reason, const std::string& claim);
  void CloseEp(const std::shared_ptr<LinkState>& link, bool force);
  void Established(const std::shared_ptr<LinkState>& link);

  static std::shared_ptr<LinkState> Find(const std::unordered_map<ucp_ep_h, std::shared_ptr<LinkState>>& eps,
                                         ucp_ep_h ep) {
    auto it = eps.find(ep);
    return it == eps.end() ? nullptr : it->second;
  }

  TransportOptions options_;
  int port_ = 0;
  std::atomic<int64_t> refused_{0};
  std::thread thread_;

  std::mutex tasks_mu_;
  std::deque<std::function<void()>> tasks_;
  bool accepting_tasks_ = false;
  bool stopping_ = false;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;

  // Accept's side: links that passed the handshake and wait for Accept(rank), and ranks whose facts differed.
  std::mutex accept_mu_;
  std::condition_variable accept_cv_;
  std::map<int, std::shared_ptr<LinkState>> accepted_;
  std::map<int, absl::Status> accept_failures_;
  bool stopped_ = false;

  // The progress thread's alone.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  std::unordered_map<ucp_ep_h, std::shared_ptr<LinkState>> eps_;
  std::map<int, std::weak_ptr<LinkState>> ranks_;  // acceptor: the link each rank holds
  std::vector<void*> closing_;                     // ucp_ep_close_nbx requests in flight
  std::unordered_map<SendOp*, std::shared_ptr<SendOp>> sends_;
  std::unordered_map<uint64_t, RecvOp> receives_;
  uint64_t next_receive_id_ = 1;
  bool tearing_down_ = false;
};

// ---- start and stop ----

absl::Status Core::Start() {
  if (options_.secret.empty()) return absl::InvalidArgumentError("transport: the group secret is empty");
  if (options_.group_size < 1 || options_.rank < 0 || options_.rank >= options_.group_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport: rank ", options_.rank, " is not in a group of ", options_.group_size));
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) return absl::InternalError("transport: cannot create an eventfd/epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    accepting_tasks_ = true;
  }
  std::promise<absl::Status> started;
  std::future<absl::Status> result = started.get_future();
  thread_ = std::thread([this, p = std::move(started)]() mutable { Run(std::move(p)); });
  absl::Status status = result.get();
  if (!status.ok()) Stop();
  return status;
}

void Core::Stop() {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    stopping_ = true;
  }
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(accept_mu_);
    stopped_ = true;
    for (auto& [rank, link] : accepted_) {
      std::lock_guard<std::mutex> link_lock(link->mu);
      if (link->phase != Phase::kFailed) {
        link->phase = Phase::kFailed;
        link->hard_failure = true;
        link->failure = absl::UnavailableError(absl::StrCat(link->WhoLocked(), ": this node's transport stopped"));
      }
      link->cv.notify_all();
    }
    accepted_.clear();
  }
  accept_cv_.notify_all();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

bool Core::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    if (!accepting_tasks_) return false;
    tasks_.push_back(std::move(task));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof one);
  return true;
}

bool Core::RunTasks() {
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
  return !tasks.empty();
}

absl::Status Core::InitUcx() {
  ucp_config_t* config = nullptr;
  // NULL, NULL: the UCX_* environment applies (UCX_TLS, UCX_NET_DEVICES, ...); nothing is forced here.
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_config_read: ", ucs_status_string(st)));
  // A decode step's hop (a few KiB to a few hundred) goes eagerly, in one send, rather than by rendezvous (a
  // round trip before the data): 32 KiB one-way 194 -> 70 us over TCP on loopback (bench/README.md, group_speed).
  // UCX_RNDV_THRESH in the environment still decides.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr) {
    st = ucp_config_modify(config, "RNDV_THRESH", "262144");
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InternalError(absl::StrCat("transport: RNDV_THRESH: ", ucs_status_string(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_init: ", ucs_status_string(st)));

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // the progress thread alone calls UCX
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_worker_create: ", ucs_status_string(st)));

  int efd = -1;
  st = ucp_worker_get_efd(worker_, &efd);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_worker_get_efd: ", ucs_status_string(st)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = efd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, efd, &ev);

  struct Handler {
    unsigned id;
    ucp_am_recv_callback_t cb;
  };
  const Handler handlers[] = {
      {kAmHandshake,
       [](void* arg, const void*, size_t header_length, void* data, size_t length,
          const ucp_am_recv_param_t* param) -> ucs_status_t {
         auto* core = static_cast<Core*>(arg);
         const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
         if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return rndv ? UCS_ERR_REJECTED : UCS_OK;
         auto link = Find(core->eps_, param->reply_ep);
         if (link == nullptr) return rndv ? UCS_ERR_REJECTED : UCS_OK;
         if (rndv || header_length != 0 || length > kMaxHandshakeBytes) {
           core->OnHandshake(link, "");  // malformed: refused (acceptor) or failed (connector)
           return rndv ? UCS_ERR_REJECTED : UCS_OK;
         }
         core->OnHandshake(link, absl::string_view(static_cast<const char*>(data), length));
         return UCS_OK;
       }},
      {kAmData,
       [](void* arg, const void* header, size_t header_length, void* data, size_t length,
          const ucp_am_recv_param_t* param) -> ucs_status_t {
         auto* core = static_cast<Core*>(arg);
         const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
         if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return rndv ? UCS_ERR_REJECTED : UCS_OK;
         return core->OnData(param->reply_ep, header, header_length, data, length, rndv);
       }},
      {kAmClose,
       [](void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t* param) -> ucs_status_t {
         auto* core = static_cast<Core*>(arg);
         const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
         if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) core->OnPeerClose(param->reply_ep);
         return rndv ? UCS_ERR_REJECTED : UCS_OK;
       }},
  };
  for (const Handler& h : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                    UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = h.id;
    hp.cb = h.cb;
    hp.arg = this;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) {
      return absl::InternalError(absl::StrCat("transport: ucp_worker_set_am_recv_handler: ", ucs_status_string(st)));
    }
  }

  auto bind = Resolve(options_.bind_host, options_.port, /*passive=*/true);
  if (!bind.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("transport: cannot listen on ", options_.bind_host, ":",
                                                   options_.port, ": ", bind.status().message()));
  }
  ucp_listener_params_t lparams{};
  lparams.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lparams.sockaddr.addr = reinterpret_cast<const sockaddr*>(&bind->first);
  lparams.sockaddr.addrlen = bind->second;
  lparams.conn_handler.cb = [](ucp_conn_request_h request, void* arg) {
    static_cast<Core*>(arg)->OnConnRequest(request);
  };
  lparams.conn_handler.arg = this;
  st = ucp_listener_create(worker_, &lparams, &listener_);
  if (st != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("transport: cannot listen on ", options_.bind_host, ":", options_.port,
                                               ": ", ucs_status_string(st)));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_listener_query: ", ucs_status_string(st)));
  port_ = attr.sockaddr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(attr.sockaddr).sin6_port)
                                              : ntohs(reinterpret_cast<const sockaddr_in&>(attr.sockaddr).sin_port);
  return absl::OkStatus();
}

void Core::Run(std::promise<absl::Status> started) {
  current_core = this;
  absl::Status status = InitUcx();
  const bool ok = status.ok();
  started.set_value(std::move(status));
  if (ok) {
    epoll_event events[4];
    for (;;) {
      RunTasks();
      {
        std::lock_guard<std::mutex> lock(tasks_mu_);
        if (stopping_) break;
      }
      while (ucp_worker_progress(worker_) != 0) {
      }
      Sweep();
      ReapClosing();
      {
        std::lock_guard<std::mutex> lock(tasks_mu_);
        if (!tasks_.empty() || stopping_) continue;
      }
      if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
      const int n = epoll_wait(epoll_fd_, events, 4, kIdleWakeMs);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.fd == wake_fd_) {
          uint64_t count;
          [[maybe_unused]] ssize_t r = read(wake_fd_, &count, sizeof count);
        }
      }
    }
  }
  TeardownUcx();
}

void Core::TeardownUcx() {
  tearing_down_ = true;
  if (worker_ != nullptr) {
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    listener_ = nullptr;
    std::vector<std::shared_ptr<LinkState>> links;
    for (auto& [ep, link] : eps_) links.push_back(link);
    // Each peer hears that the link closed (after what was sent before), then the endpoints close with a
    // flush, for at most 2 s.
    for (auto& link : links) {
      bool established;
      {
        std::lock_guard<std::mutex> lock(link->mu);
        established = link->phase == Phase::kEstablished;
      }
      Fail(link, absl::UnavailableError(absl::StrCat(link->Who(), ": this node's transport stopped")), true, false);
      if (established) StartSend(link, std::make_shared<SendOp>(), kAmClose, nullptr, 0, nullptr, 0, false);
      CloseEp(link, /*force=*/false);
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(2);
    while ((!closing_.empty() || !sends_.empty() || !receives_.empty() || !eps_.empty()) && absl::Now() < give_up) {
      RunTasks();
      ucp_worker_progress(worker_);
      ReapClosing();
      links.clear();
      for (auto& [ep, link] : eps_) links.push_back(link);  // endpoints a deferred task or an error left behind
      for (auto& link : links) CloseEp(link, true);
    }
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      accepting_tasks_ = false;
    }
    RunTasks();  // tasks posted before the queue closed (a deferred receive releases its descriptor)
    for (void* request : closing_) ucp_request_free(request);
    closing_.clear();
    for (auto& [raw, op] : sends_) {
      std::lock_guard<std::mutex> lock(op->mu);
      op->done = true;
      op->status = UCS_ERR_CANCELED;
      op->cv.notify_all();
    }
    sends_.clear();
    receives_.clear();
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  } else {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    accepting_tasks_ = false;
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
}

void Core::ReapClosing() {
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i]);
      closing_[i] = closing_.back();
      closing_.pop_back();
    } else {
      ++i;
    }
  }
}

// Handshakes past their time, and failed links whose endpoints may now go.
void Core::Sweep() {
  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<LinkState>> late, to_close;
  for (auto& [ep, link] : eps_) {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->phase == Phase::kFailed) {
      if (now >= link->close_at && (link->receives_in_flight == 0 || now >= link->close_at + absl::Seconds(5))) {
        to_close.push_back(link);
      }
    } else if (link->phase != Phase::kEstablished && now >= link->handshake_deadline) {
      late.push_back(link);
    }
  }
  for (auto& link : late) {
    if (link->role == Role::kAcceptor) {
      Refuse(link, "", "");  // silent: nothing to say to a peer that says nothing
    } else {
      if (!link->verdict.ok()) {
        Fail(link, link->verdict, true, false);
        continue;
      }
      Fail(link,
           absl::DeadlineExceededError(absl::StrCat("node ", link->peer_rank, " at ", link->address,
                                                    " did not complete the handshake in time")),
           true, false);
      std::lock_guard<std::mutex> lock(link->mu);
      link->retryable = true;
    }
  }
  for (auto& link : to_close) CloseEp(link, /*force=*/false);
}

// ---- links: failure and close ----

void Core::Fail(const std::shared_ptr<LinkState>& link, absl::Status status, bool hard, bool linger) {
  {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->phase != Phase::kFailed) {
      link->phase = Phase::kFailed;
      link->failure = std::move(status);
      link->hard_failure = hard;
    } else if (hard && !link->hard_failure) {
      link->hard_failure = true;  // keep the first reason (the peer closed), stop waiting for its messages
    }
    link->close_at = std::min(link->close_at, absl::Now() + (linger ? kLinger : absl::ZeroDuration()));
    link->cv.notify_all();
  }
  if (link->role == Role::kAcceptor) accept_cv_.notify_all();
}

void Core::CloseEp(const std::shared_ptr<LinkState>& link, bool force) {
  if (link->ep == nullptr) return;
  ucp_ep_h ep = link->ep;
  link->ep = nullptr;
  eps_.erase(ep);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
}

void Core::Refuse(const std::shared_ptr<LinkState>& link, const std::string& reason, const std::string& claim) {
  {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->phase == Phase::kFailed) return;
  }
  refused_.fetch_add(1);
  std::fprintf(stderr, "strata transport: node %d refused a connection from %s%s: %s\n", options_.rank,
               link->address.c_str(), claim.c_str(),
               reason.empty() ? "the handshake did not complete in time" : reason.c_str());
  if (!reason.empty()) SendFrame(link, EncodeFrame(kRefuse, {reason}));
  Fail(link, absl::PermissionDeniedError(absl::StrCat("refused ", link->address, ": ", reason)), true,
       /*linger=*/!reason.empty());
}

void Core::OnEpError(ucp_ep_h ep, ucs_status_t status) {
  auto link = Find(eps_, ep);
  if (link == nullptr) return;
  bool before_hello, mid_handshake;
  {
    std::lock_guard<std::mutex> lock(link->mu);
    before_hello = link->phase == Phase::kConnecting;
    mid_handshake = link->phase != Phase::kEstablished && link->phase != Phase::kFailed;
    if (before_hello) link->retryable = true;
  }
  std::string what;
  if (before_hello) {
    what = absl::StrCat("node ", link->peer_rank, " at ", link->address, " is not reachable (",
                        ucs_status_string(status), ")");
  } else {
    what = absl::StrCat(link->Who(), ": connection lost (", ucs_status_string(status), ")");
  }
  if (link->role == Role::kAcceptor && mid_handshake) {
    // A stranger that went away mid-handshake: refused like any other.
    refused_.fetch_add(1);
    std::fprintf(stderr, "strata transport: node %d refused a connection from %s: it went away mid-handshake (%s)\n",
                 options_.rank, link->address.c_str(), ucs_status_string(status));
  }
  Fail(link, link->verdict.ok() ? absl::UnavailableError(what) : link->verdict, true, false);
  CloseEp(link, /*force=*/true);  // UCX requires a forced close after an endpoint error
}

void Core::OnPeerClose(ucp_ep_h ep) {
  auto link = Find(eps_, ep);
  if (link == nullptr) return;
  Fail(link, absl::UnavailableError(absl::StrCat(link->Who(), " closed the link")), /*hard=*/false, false);
}

// ---- handshake ----

void Core::OnConnRequest(ucp_conn_request_h request) {
  if (tearing_down_) {
    if (listener_ != nullptr) ucp_listener_reject(listener_, request);
    return;
  }
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string address = "?";
  if (ucp_conn_request_query(request, &attr) == UCS_OK) address = AddressString(attr.client_address);
  auto link = std::make_shared<LinkState>(Role::kAcceptor, options_.rank, -1, address, absl::Now() + kHandshakeLimit);
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  ReportErrorsOf(params);
  ucp_ep_h ep = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
  if (st != UCS_OK) {
    refused_.fetch_add(1);
    std::fprintf(stderr, "strata transport: node %d refused a connection from %s: %s\n", options_.rank, address.c_str(),
                 ucs_status_string(st));
    return;
  }
  link->ep = ep;
  link->phase = Phase::kAwaitAuth;
  link->nonce_a = Nonce();
  eps_[ep] = link;
  SendFrame(link, EncodeFrame(kHello, {kProtocol, link->nonce_a, RankBytes(options_.rank)}));
}

// Peer error mode: a peer that dies or resets is reported at once (OnEpError), not at a timeout.
void Core::ReportErrorsOf(ucp_ep_params_t& params) {
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<Core*>(arg)->OnEpError(ep, status);
  };
  params.err_handler.arg = this;
}

bool Core::CreateConnectorEp(const std::shared_ptr<LinkState>& link, const sockaddr_storage& addr, socklen_t len) {
  if (tearing_down_) {
    Fail(link, absl::UnavailableError("transport stopped"), true, false);
    return false;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = len;
  ReportErrorsOf(params);
  ucp_ep_h ep = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
  if (st != UCS_OK) {
    Fail(link,
         absl::UnavailableError(absl::StrCat("node ", link->peer_rank, " at ", link->address, " is not reachable (",
                                             ucs_status_string(st), ")")),
         true, false);
    std::lock_guard<std::mutex> lock(link->mu);
    link->retryable = true;
    return false;
  }
  link->ep = ep;
  eps_[ep] = link;
  return true;
}

void Core::OnHandshake(const std::shared_ptr<LinkState>& link, absl::string_view bytes) {
  std::optional<Frame> frame = DecodeFrame(bytes);
  Phase phase;
  {
    std::lock_guard<std::mutex> lock(link->mu);
    phase = link->phase;
  }
  if (phase == Phase::kFailed) return;
  const int self = options_.rank;

  if (link->role == Role::kAcceptor) {
    if (!frame || (phase == Phase::kAwaitAuth && frame->step != kAuth) ||
        (phase == Phase::kAwaitFacts && frame->step != kFacts) ||
        (phase != Phase::kAwaitAuth && phase != Phase::kAwaitFacts)) {
      Refuse(link, "the handshake was malformed", "");
      return;
    }
    if (frame->step == kAuth) {
      std::optional<int> rank;
      if (frame->fields.size() != 3 || !(rank = ParseRank(frame->fields[0])) ||
          frame->fields[1].size() != kNonceBytes || frame->fields[2].size() != kMacBytes) {
        Refuse(link, "the handshake was malformed", "");
        return;
      }
      const std::string claim = absl::StrCat(" (claims rank ", *rank, ")");
      link->nonce_b = std::string(frame->fields[1]);
      const std::string expected = Mac(options_.secret, "strata-group-v1 connect", link->nonce_a, link->nonce_b, *rank);
      if (!SameMac(expected, frame->fields[2])) {
        Refuse(link, "the group secret differs", claim);
        return;
      }
      if (*rank < 1 || *rank >= options_.group_size) {
        Refuse(link,
               absl::StrCat("rank ", *rank, " is not in [1, ", options_.group_size, ") in a group of ",
                            options_.group_size),
               claim);
        return;
      }
      if (*rank == self) {
        Refuse(link, absl::StrCat("rank ", *rank, " is node ", self, "'s own"), claim);
        return;
      }
      if (auto held = ranks_[*rank].lock()) {
        std::lock_guard<std::mutex> lock(held->mu);
        if (held->phase != Phase::kFailed) {
          Refuse(link, absl::StrCat("node ", *rank, " already has a link to node ", self), claim);
          return;
        }
      }
      ranks_[*rank] = link;
      {
        std::lock_guard<std::mutex> lock(link->mu);
        link->peer_rank = *rank;
        link->phase = Phase::kAwaitFacts;
      }
      const std::string mac = Mac(options_.secret, "strata-group-v1 accept", link->nonce_a, link->nonce_b, *rank);
      std::vector<absl::string_view> fields{mac};
      AppendFacts(options_.facts, fields);
      SendFrame(link, EncodeFrame(kAccept, fields));
      return;
    }
    // kFacts
    std::optional<Facts> theirs = ParseFacts(frame->fields, 0);
    if (!theirs) {
      Refuse(link, "the handshake was malformed", absl::StrCat(" (rank ", link->peer_rank, ")"));
      return;
    }
    const std::string differences = CompareFacts(options_.facts, *theirs, self, link->peer_rank);
    if (!differences.empty()) {
      refused_.fetch_add(1);
      std::fprintf(stderr, "strata transport: node %d refused a connection from %s (rank %d): %s\n", self,
                   link->address.c_str(), link->peer_rank, differences.c_str());
      absl::Status status = absl::FailedPreconditionError(differences);
      {
        std::lock_guard<std::mutex> lock(accept_mu_);
        accept_failures_[link->peer_rank] = Detached(status);  // its own payload: the link keeps `status`
      }
      SendFrame(link, EncodeFrame(kRefuse, {"the facts differ"}));
      Fail(link, status, true, /*linger=*/true);
      return;
    }
    SendFrame(link, EncodeFrame(kReady, {}));
    Established(link);
    return;
  }

  // Connector.
  const std::string at = absl::StrCat("node ", link->peer_rank, " at ", link->address);
  if (!link->verdict.ok()) {  // the acceptor answered this node's facts: fail with the difference
    Fail(link, link->verdict, true, false);
    CloseEp(link, false);
    return;
  }
  if (frame && frame->step == kRefuse && frame->fields.size() == 1 &&
      (phase == Phase::kAwaitAccept || phase == Phase::kConnecting || phase == Phase::kAwaitReady)) {
    Fail(link,
         absl::PermissionDeniedError(
             absl::StrCat(at, " refused this node (rank ", self, "): ", Printable(frame->fields[0]))),
         true, false);
    CloseEp(link, false);
    return;
  }
  if (phase == Phase::kConnecting) {
    if (!frame || frame->step != kHello || frame->fields.size() != 3 || frame->fields[0] != kProtocol ||
        frame->fields[1].size() != kNonceBytes) {
      Fail(link, absl::PermissionDeniedError(absl::StrCat(at, " does not speak ", kProtocol)), true, false);
      CloseEp(link, false);
      return;
    }
    const std::optional<int> their_rank = ParseRank(frame->fields[2]);
    if (!their_rank || *their_rank != link->peer_rank) {
      Fail(link,
           absl::FailedPreconditionError(absl::StrCat(at, " is node ", their_rank ? std::to_string(*their_rank) : "?",
                                                      ", not node ", link->peer_rank)),
           true, false);
      CloseEp(link, false);
      return;
    }
    link->nonce_a = std::string(frame->fields[1]);
    link->nonce_b = Nonce();
    const std::string mac = Mac(options_.secret, "strata-group-v1 connect", link->nonce_a, link->nonce_b, self);
    {
      std::lock_guard<std::mutex> lock(link->mu);
      link->phase = Phase::kAwaitAccept;
    }
    SendFrame(link, EncodeFrame(kAuth, {RankBytes(self), link->nonce_b, mac}));
    return;
  }
  if (phase == Phase::kAwaitAccept && frame && frame->step == kAccept && !frame->fields.empty()) {
    const std::string expected = Mac(options_.secret, "strata-group-v1 accept", link->nonce_a, link->nonce_b, self);
    if (!SameMac(expected, frame->fields[0])) {
      Fail(link,
           absl::PermissionDeniedError(absl::StrCat(
               at, " could not prove it holds the group secret (its answer to this node's challenge is wrong)")),
           true, false);
      CloseEp(link, false);
      return;
    }
    std::optional<Facts> theirs = ParseFacts(frame->fields, 1);
    if (!theirs) {
      Fail(link, absl::PermissionDeniedError(absl::StrCat(at, " sent a malformed handshake")), true, false);
      CloseEp(link, false);
      return;
    }
    std::vector<absl::string_view> fields;
    AppendFacts(options_.facts, fields);
    SendFrame(link, EncodeFrame(kFacts, fields));  // sent either way: the acceptor reports the difference too
    const std::string differences = CompareFacts(options_.facts, *theirs, self, link->peer_rank);
    if (!differences.empty()) link->verdict = absl::FailedPreconditionError(differences);
    std::lock_guard<std::mutex> lock(link->mu);
    link->phase = Phase::kAwaitReady;
    return;
  }
  if (phase == Phase::kAwaitReady && frame && frame->step == kReady && frame->fields.empty()) {
    Established(link);
    return;
  }
  Fail(link, absl::PermissionDeniedError(absl::StrCat(at, " sent a malformed handshake")), true, false);
  CloseEp(link, false);
}

void Core::Established(const std::shared_ptr<LinkState>& link) {
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->phase = Phase::kEstablished;
    link->cv.notify_all();
  }
  if (link->role == Role::kAcceptor) {
    {
      std::lock_guard<std::mutex> lock(accept_mu_);
      accepted_[link->peer_rank] = link;
      accept_failures_.erase(link->peer_rank);
    }
    accept_cv_.notify_all();
  }
}

// ---- sending ----

void Core::FinishSend(SendOp* raw, ucs_status_t status) {
  auto it = sends_.find(raw);
  if (it == sends_.end()) return;
  std::shared_ptr<SendOp> op = std::move(it->second);
  sends_.erase(it);
  std::lock_guard<std::mutex> lock(op->mu);
  op->done = true;
  op->status = status;
  op->cv.notify_all();
}

void Core::StartSend(const std::shared_ptr<LinkState>& link, const std::shared_ptr<SendOp>& op, unsigned id,
                     const void* header, size_t header_length, const void* buffer, size_t count, bool iov) {
  sends_[op.get()] = op;
  if (link->ep == nullptr) {
    FinishSend(op.get(), UCS_ERR_CONNECTION_RESET);
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    CurrentCore()->FinishSend(op, status);
    ucp_request_free(request);
  };
  param.user_data = op.get();
  if (iov) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
  }
  ucs_status_ptr_t request = ucp_am_send_nbx(link->ep, id, header, header_length, buffer, count, &param);
  if (request == nullptr) {
    FinishSend(op.get(), UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    FinishSend(op.get(), UCS_PTR_STATUS(request));
  }
}

void Core::SendFrame(const std::shared_ptr<LinkState>& link, std::string frame) {
  auto op = std::make_shared<SendOp>();
  op->owned = std::move(frame);
  StartSend(link, op, kAmHandshake, nullptr, 0, op->owned.data(), op->owned.size(), false);
}

absl::Status Core::Send(const std::shared_ptr<LinkState>& link, uint32_t kind,
                        absl::Span<const absl::string_view> parts) {
  {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->phase == Phase::kFailed) {
      return link->hard_failure ? Detached(link->failure) : absl::UnavailableError(link->failure.message());
    }
  }
  auto op = std::make_shared<SendOp>();
  size_t total = 0;
  for (absl::string_view part : parts) {
    total += part.size();
    if (!part.empty()) op->iov.push_back(ucp_dt_iov_t{const_cast<char*>(part.data()), part.size()});
  }
  const bool posted = Post([this, link, op, kind] {
    {
      std::lock_guard<std::mutex> lock(link->mu);
      if (link->phase == Phase::kFailed) {
        std::lock_guard<std::mutex> op_lock(op->mu);
        op->done = true;
        op->status = UCS_ERR_CONNECTION_RESET;
        op->cv.notify_all();
        return;
      }
    }
    const uint64_t seq = link->next_send++;
    for (int i = 0; i < 4; ++i) op->header[i] = static_cast<uint8_t>(kind >> (8 * i));
    for (int i = 0; i < 8; ++i) op->header[8 + i] = static_cast<uint8_t>(seq >> (8 * i));
    if (op->iov.size() == 1) {
      StartSend(link, op, kAmData, op->header.data(), op->header.size(), op->iov[0].buffer, op->iov[0].length, false);
    } else if (op->iov.empty()) {
      StartSend(link, op, kAmData, op->header.data(), op->header.size(), nullptr, 0, false);
    } else {
      StartSend(link, op, kAmData, op->header.data(), op->header.size(), op->iov.data(), op->iov.size(), true);
    }
  });
  if (!posted) return absl::UnavailableError(absl::StrCat(link->Who(), ": this node's transport stopped"));
  ucs_status_t status;
  {
    std::unique_lock<std::mutex> lock(op->mu);
    op->cv.wait(lock, [&] { return op->done; });
    status = op->status;
  }
  if (status == UCS_OK) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(link->mu);
  if (link->phase == Phase::kFailed && link->hard_failure) return Detached(link->failure);
  return absl::UnavailableError(absl::StrCat(link->WhoLocked(), ": sending a message of ", total, " bytes failed (",
                                             ucs_status_string(status), ")"));
}

// ---- receiving ----

ucs_status_t Core::OnData(ucp_ep_h ep, const void* header, size_t header_length, void* data, size_t length,
                          bool rendezvous) {
  const ucs_status_t drop = rendezvous ? UCS_ERR_REJECTED : UCS_OK;
  auto link = Find(eps_, ep);
  if (link == nullptr) return drop;
  std::unique_lock<std::mutex> lock(link->mu);
  if (link->phase == Phase::kFailed) return drop;
  const bool allowed = link->phase == Phase::kEstablished || (link->phase == Phase::kAwaitReady && link->verdict.ok());
  uint64_t seq = 0;
  uint32_t kind = 0;
  if (header_length == kDataHeaderBytes) {
    const auto* h = static_cast<const uint8_t*>(header);
    for (int i = 0; i < 4; ++i) kind |= uint32_t{h[i]} << (8 * i);
    for (int i = 0; i < 8; ++i) seq |= uint64_t{h[8 + i]} << (8 * i);
  }
  std::string problem;
  if (!allowed) {
    problem = "sent a message before the handshake completed";
  } else if (header_length != kDataHeaderBytes || seq < link->next_deliver ||
             seq - link->next_deliver >= kMaxSequenceGap || link->inbox.count(seq) != 0) {
    problem = "sent a malformed message header";
  }
  if (!problem.empty()) {
    const std::string who = link->WhoLocked();
    lock.unlock();
    if (!allowed && link->role == Role::kAcceptor) {
      Refuse(link, "the handshake was malformed", "");
    } else {
      Fail(link, absl::UnavailableError(absl::StrCat(who, " ", problem, "; the link is closed")), true, false);
      CloseEp(link, true);
    }
    return drop;
  }
  if (length > options_.max_message_bytes) {
    const std::string who = link->WhoLocked();
    lock.unlock();
    Fail(link,
         absl::InvalidArgumentError(absl::StrCat(who, " sent a message of ", length,
                                                 " bytes, more than max_message_bytes (", options_.max_message_bytes,
                                                 "); the link is closed")),
         true, false);
    CloseEp(link, true);
    return rendezvous ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;
  }
  auto slot = std::make_unique<Slot>();
  slot->kind = kind;
  Slot* raw = slot.get();
  if (!rendezvous) {
    if (length > 0) slot->bytes.assign(static_cast<const char*>(data), length);
    slot->ready = true;
    link->inbox.emplace(seq, std::move(slot));
    link->cv.notify_all();
    return UCS_OK;
  }
  slot->bytes.resize(length);
  link->inbox.emplace(seq, std::move(slot));
  ++link->receives_in_flight;
  lock.unlock();
  const uint64_t id = next_receive_id_++;
  receives_[id] = RecvOp{link, raw, length};
  // The rendezvous data is fetched once the callback has returned (UCS_INPROGRESS keeps the descriptor).
  tasks_mu_.lock();
  tasks_.push_back([this, id, data] { StartReceive(id, data); });
  tasks_mu_.unlock();
  return UCS_INPROGRESS;
}

void Core::StartReceive(uint64_t id, void* desc) {
  auto it = receives_.find(id);
  if (it == receives_.end() || worker_ == nullptr) return;
  RecvOp& op = it->second;
  bool failed;
  {
    std::lock_guard<std::mutex> lock(op.link->mu);
    failed = op.link->phase == Phase::kFailed && op.link->hard_failure;
  }
  if (failed || op.link->ep == nullptr) {
    ucp_am_data_release(worker_, desc);
    FinishReceive(id, UCS_ERR_CANCELED);
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = [](void* request, ucs_status_t status, size_t, void* user_data) {
    CurrentCore()->FinishReceive(reinterpret_cast<uintptr_t>(user_data), status);
    ucp_request_free(request);
  };
  param.user_data = reinterpret_cast<void*>(static_cast<uintptr_t>(id));
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_, desc, op.slot->bytes.data(), op.length, &param);
  if (request == nullptr) {
    FinishReceive(id, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    FinishReceive(id, UCS_PTR_STATUS(request));
  }
}

void Core::FinishReceive(uint64_t id, ucs_status_t status) {
  auto it = receives_.find(id);
  if (it == receives_.end()) return;
  RecvOp op = std::move(it->second);
  receives_.erase(it);
  {
    std::lock_guard<std::mutex> lock(op.link->mu);
    --op.link->receives_in_flight;
    if (status == UCS_OK) {
      op.slot->ready = true;
      op.link->cv.notify_all();
      return;
    }
  }
  Fail(op.link,
       absl::UnavailableError(absl::StrCat(op.link->Who(), ": connection lost while receiving a message of ", op.length,
                                           " bytes (", ucs_status_string(status), ")")),
       true, false);
  CloseEp(op.link, true);
}

// ---- accept and connect ----

absl::StatusOr<std::shared_ptr<LinkState>> Core::Accept(int peer, absl::Time deadline) {
  const absl::Time start = absl::Now();
  std::unique_lock<std::mutex> lock(accept_mu_);
  for (;;) {
    if (auto it = accepted_.find(peer); it != accepted_.end()) {
      std::shared_ptr<LinkState> link = std::move(it->second);
      accepted_.erase(it);
      return link;
    }
    if (auto it = accept_failures_.find(peer); it != accept_failures_.end()) {
      absl::Status status = Detached(it->second);
      accept_failures_.erase(it);
      return status;
    }
    if (stopped_) return absl::UnavailableError("transport stopped");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node ", peer, " did not connect to node ", options_.rank, " listening on ", listen_address(), " within ",
          Seconds(absl::Now() - start), " (", refused_.load(), " connections refused so far)"));
    }
    WaitUntil(accept_cv_, lock, deadline);
  }
}

absl::StatusOr<std::shared_ptr<LinkState>> Core::Connect(int peer, const std::string& host, int port,
                                                         absl::Time deadline) {
  const std::string address = absl::StrCat(host, ":", port);
  if (peer < 0 || peer >= options_.group_size || peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", options_.rank, " cannot connect to node ", peer, " in a group of ", options_.group_size));
  }
  const absl::Time start = absl::Now();
  absl::Status last = absl::DeadlineExceededError("no attempt was made");
  while (absl::Now() < deadline) {
    auto resolved = Resolve(host, port, /*passive=*/false);
    if (resolved.ok()) {
      const absl::Time attempt_deadline = std::min(deadline, absl::Now() + kHandshakeLimit);
      auto link = std::make_shared<LinkState>(Role::kConnector, options_.rank, peer, address, attempt_deadline);
      const sockaddr_storage addr = resolved->first;
      const socklen_t len = resolved->second;
      if (!Post([this, link, addr, len] { CreateConnectorEp(link, addr, len); })) {
        return absl::UnavailableError("transport stopped");
      }
      std::unique_lock<std::mutex> lock(link->mu);
      while (link->phase != Phase::kEstablished && link->phase != Phase::kFailed) {
        if (absl::Now() >= attempt_deadline + absl::Seconds(1)) break;  // the sweep fails it first, normally
        WaitUntil(link->cv, lock, attempt_deadline + absl::Seconds(1));
      }
      if (link->phase == Phase::kEstablished) return link;
      const bool retryable = link->phase != Phase::kFailed || link->retryable;
      last = link->phase == Phase::kFailed ? Detached(link->failure)
                                           : absl::DeadlineExceededError("the handshake did not complete in time");
      lock.unlock();
      if (!retryable) return last;  // the link closes itself (after the peer has read this node's facts)
      Post([this, link] {
        Fail(link, absl::UnavailableError("connection attempt abandoned"), true, false);
        CloseEp(link, true);
      });
    } else {
      last = resolved.status();
    }
    const absl::Time next = std::min(deadline, absl::Now() + kConnectRetry);
    absl::SleepFor(next - absl::Now());
  }
  return absl::DeadlineExceededError(absl::StrCat("node ", options_.rank, " could not connect to node ", peer, " at ",
                                                  address, " within ", Seconds(absl::Now() - start), ": ",
                                                  last.message()));
}

void Core::Close(const std::shared_ptr<LinkState>& link) {
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->closed_here = true;
    link->phase = Phase::kFailed;
    link->hard_failure = true;
    link->failure = absl::UnavailableError(absl::StrCat(link->WhoLocked(), ": the link was closed on this node"));
    link->cv.notify_all();
  }
  Post([this, link] {
    if (link->ep == nullptr) return;
    auto op = std::make_shared<SendOp>();
    StartSend(link, op, kAmClose, nullptr, 0, nullptr, 0, false);
    CloseEp(link, /*force=*/false);
  });
}

}  // namespace internal

// ---- public faces ----

Link::Link(std::shared_ptr<internal::Core> core, std::shared_ptr<internal::LinkState> state)
    : core_(std::move(core)), state_(std::move(state)) {}

Link::~Link() { Close(); }

int Link::peer_rank() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->peer_rank;
}

std::string Link::peer_address() const { return state_->address; }

absl::Status Link::Send(uint32_t kind, absl::Span<const absl::string_view> parts) {
  return core_->Send(state_, kind, parts);
}

absl::StatusOr<Message> Link::Receive(absl::Time deadline) {
  const absl::Time start = absl::Now();
  internal::LinkState& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (s.closed_here) return internal::Detached(s.failure);
    auto front = s.inbox.begin();
    const bool ready = front != s.inbox.end() && front->first == s.next_deliver && front->second->ready;
    if (ready) {  // messages that arrived before the peer went away are still delivered
      Message message{front->second->kind, std::move(front->second->bytes)};
      s.inbox.erase(front);
      ++s.next_deliver;
      return message;
    }
    // A hard failure ends the wait for messages still in flight; after a polite close they still arrive.
    if (s.phase == internal::Phase::kFailed && (s.hard_failure || s.inbox.empty()))
      return internal::Detached(s.failure);
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(s.WhoLocked(), ": no message within ", internal::Seconds(now - start)));
    }
    internal::WaitUntil(s.cv, lock, deadline);
  }
}

void Link::Close() { core_->Close(state_); }

Transport::Transport(std::shared_ptr<internal::Core> core) : core_(std::move(core)) {}

Transport::~Transport() { core_->Stop(); }

absl::StatusOr<std::unique_ptr<Transport>> Transport::Start(const TransportOptions& options) {
  auto core = std::make_shared<internal::Core>(options);
  absl::Status status = core->Start();
  if (!status.ok()) return status;
  return std::unique_ptr<Transport>(new Transport(std::move(core)));
}

int Transport::port() const { return core_->port(); }

int64_t Transport::refused() const { return core_->refused(); }

absl::StatusOr<std::shared_ptr<Link>> Transport::Accept(int peer, absl::Time deadline) {
  auto state = core_->Accept(peer, deadline);
  if (!state.ok()) return state.status();
  return std::make_shared<Link>(core_, *std::move(state));
}

absl::StatusOr<std::shared_ptr<Link>> Transport::Connect(int peer, const std::string& host, int port,
                                                         absl::Time deadline) {
  auto state = core_->Connect(peer, host, port, deadline);
  if (!state.ok()) return state.status();
  return std::make_shared<Link>(core_, *std::move(state));
}

}  // namespace strata::runtime::transport
