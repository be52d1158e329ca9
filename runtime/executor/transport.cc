#include "runtime/executor/transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
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

#include "absl/strings/str_cat.h"
#include "runtime/executor/group_handshake.h"
#include "runtime/executor/peer_filter.h"

namespace strata::runtime::transport {
namespace internal {
namespace {

// A Status another thread also holds, as a Status of its own (its own payload): absl::Status shares its payload by
// a reference count that Debian's uninstrumented Abseil releases where ThreadSanitizer cannot see the order, so a
// stored failure is never handed to a caller as a copy (the engine's output thread does the same).
absl::Status Detached(const absl::Status& status) {
  return status.ok() ? absl::OkStatus() : absl::Status(status.code(), std::string(status.message()));
}

// Active message ids. Data may be rendezvous; the polite close is a small eager message. Both carry the receiver's
// token (handed over in the handshake), which is how a message finds its link: UCX's reply endpoint is not used.
constexpr unsigned kAmData = 0x5702;
constexpr unsigned kAmClose = 0x5703;

// kind (4), reserved (4), sequence number (8), the receiver's token (8); little-endian.
constexpr size_t kDataHeaderBytes = 24;
constexpr size_t kTokenBytes = 8;
// How far ahead of the next message to deliver a sequence number may be (UCX keeps one endpoint's messages in
// order on its default single eager lane; the numbers only guard against lanes that do not).
constexpr uint64_t kMaxSequenceGap = uint64_t{1} << 24;
// A connection refused with a reason keeps its socket this long (reading and discarding), so the peer reads the
// refusal before the connection goes.
constexpr absl::Duration kLinger = absl::Seconds(1);
constexpr absl::Duration kConnectRetry = absl::Milliseconds(200);
constexpr int kIdleWakeMs = 100;  // the progress thread's longest sleep: handshake deadlines are checked this often
constexpr size_t kReadChunk = 4096;
constexpr int kMaxAcceptsPerWake = 64;

void PutLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

uint64_t RandomToken() {
  const std::string bytes = HandshakeNonce();
  uint64_t token = GetLe(reinterpret_cast<const uint8_t*>(bytes.data()), 8);
  return token == 0 ? 1 : token;
}

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

// The network interface that holds `addr` ("lo" for any loopback address); "" for a wildcard address or when no
// interface holds it.
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

int PollMs(absl::Time deadline) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1, 0, 1000));
}

// The connector's socket: connected to `addr` by `deadline`, or an error naming the peer (retryable).
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

// Drives the connector's side of the handshake over `fd` until it ends or `deadline` passes.
void RunConnectorHandshake(int fd, Handshake& handshake, absl::Time deadline) {
  char buffer[kReadChunk];
  for (;;) {
    const std::string out = handshake.TakeOutput();
    for (size_t at = 0; at < out.size();) {
      const ssize_t n = send(fd, out.data() + at, out.size() - at, MSG_NOSIGNAL);
      if (n > 0) {
        at += static_cast<size_t>(n);
        continue;
      }
      pollfd p{fd, POLLOUT, 0};
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        handshake.PeerClosed();
        break;
      }
      if (absl::Now() >= deadline) {
        handshake.Expired();
        break;
      }
      poll(&p, 1, PollMs(deadline));
    }
    if (handshake.outcome() != Handshake::Outcome::kPending) return;
    pollfd p{fd, POLLIN, 0};
    if (absl::Now() >= deadline) {
      handshake.Expired();
      continue;
    }
    if (poll(&p, 1, PollMs(deadline)) <= 0) continue;
    const ssize_t n = recv(fd, buffer, std::min(handshake.wanted(), sizeof buffer), 0);
    if (n > 0) {
      handshake.Feed(absl::string_view(buffer, static_cast<size_t>(n)));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      handshake.PeerClosed();
    }
  }
}

}  // namespace

class Core;
namespace {
// The Core whose progress thread this is: UCX's completion callbacks run there and find their Core here.
thread_local Core* current_core = nullptr;
Core* CurrentCore() { return current_core; }

// Held while this process's transports open or close a listening socket (their own, or UCX's in
// ucp_worker_create / ucp_worker_destroy): the sockets a worker's creation adds are then UCX's alone, not another
// transport's (several run in one process in tests), and no descriptor number is reused meanwhile.
std::mutex& ListenerChanges() {
  static std::mutex changes;
  return changes;
}
}  // namespace

enum class Role { kAcceptor, kConnector };
enum class Phase {
  kConnecting,  // connector: the handshake is running on the connecting thread; data may already arrive
  kEstablished,
  kFailed,
};

struct Slot {
  uint32_t kind = 0;
  std::string bytes;
  bool ready = false;  // a rendezvous message is in the map before its bytes have arrived
};

struct LinkState {
  LinkState(Role role, int self_rank, int peer_rank, std::string address, uint64_t token)
      : role(role), self_rank(self_rank), address(std::move(address)), token(token), peer_rank(peer_rank) {}

  const Role role;
  const int self_rank;
  const std::string address;  // the peer's "host:port" as seen from here
  const uint64_t token;       // on every message the peer sends here

  std::mutex mu;
  std::condition_variable cv;
  int peer_rank;
  Phase phase = Phase::kConnecting;
  absl::Status failure;       // why the link is gone; or, once the peer closed politely, why it will be
  bool hard_failure = false;  // false: the peer closed; its messages in flight still arrive
  bool closed_here = false;   // Close() was called: nothing more is delivered
  std::map<uint64_t, std::unique_ptr<Slot>> inbox;
  uint64_t next_deliver = 0;

  // The progress thread's alone.
  ucp_ep_h ep = nullptr;
  uint64_t peer_token = 0;  // on every message sent from here
  uint64_t next_send = 0;
  int receives_in_flight = 0;
  absl::Time close_at = absl::InfiniteFuture();  // failed: when to close the endpoint

  std::string Who() {
    std::lock_guard<std::mutex> lock(mu);
    return WhoLocked();
  }
  std::string WhoLocked() const { return absl::StrCat("node ", peer_rank, " (", address, ")"); }
};

// A TCP connection to this node's port that has not completed the handshake (or is being closed after it).
struct PendingConnection {
  int fd = -1;
  uint64_t order = 0;  // accept order: the oldest is dropped first
  std::string address;
  sockaddr_storage peer{};  // where it connected from
  std::unique_ptr<Handshake> handshake;
  absl::Time deadline;
  std::string out;        // bytes to write
  int claimed_rank = -1;  // a rank it proved it may claim, held until it ends
  bool closing = false;   // done: write `out`, then read and discard until EOF or `linger_until`
  absl::Time linger_until = absl::InfiniteFuture();
  bool want_write = false;  // registered for EPOLLOUT
};

// One UCX worker driven by one progress thread: every UCX call happens on that thread, and so does the listening
// socket's work (accepts and the acceptor's handshakes). Other threads hand it tasks (a queue and an eventfd) and
// wait on condition variables. It sleeps in epoll on the worker's event fd and the sockets.
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
  // Runs `task` on the progress thread and waits for it; false once the transport stopped.
  bool RunOnProgressThread(std::function<void()> task);

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
  };
  struct RecvOp {
    std::shared_ptr<LinkState> link;
    Slot* slot;
    size_t length;
  };
  // One connect attempt: the connector's handshake on this thread, then its endpoint on the progress thread.
  struct Attempt {
    absl::StatusOr<std::shared_ptr<LinkState>> link;
    bool retryable = false;
  };

  void Run(std::promise<absl::Status> started);
  absl::Status InitUcx();
  absl::Status SetAmHandlers();
  absl::Status Listen();
  void TeardownUcx();
  bool RunTasks();
  void Sweep();
  void ReapClosing();

  // Progress thread: the listening socket and the acceptor's handshakes.
  void AcceptConnections();
  void OnConnectionEvent(int fd, uint32_t events);
  void Advance(PendingConnection& conn);  // after the handshake moved: refuse, establish or write
  void OnRefused(PendingConnection& conn);
  std::shared_ptr<LinkState> EstablishAccepted(PendingConnection& conn);
  std::string Admit(int fd, int rank);
  void Flush(PendingConnection& conn);
  void StartClosing(PendingConnection& conn, absl::Duration linger);
  void DropConnection(int fd);
  HandshakeSide Side(uint64_t token) const;

  // Progress thread: UCX.
  void OnEpError(ucp_ep_h ep, ucs_status_t status);
  absl::StatusOr<ucp_ep_h> CreateEp(const std::string& worker_address);
  ucs_status_t OnData(const void* header, size_t header_length, void* data, size_t length, bool rendezvous);
  void OnPeerClose(const void* header, size_t header_length);
  void StartReceive(uint64_t op_id, void* desc);
  void FinishReceive(uint64_t op_id, ucs_status_t status);
  void FinishSend(SendOp* op, ucs_status_t status);
  void StartSend(const std::shared_ptr<LinkState>& link, const std::shared_ptr<SendOp>& op, unsigned id,
                 const void* header, size_t header_length, const void* buffer, size_t count, bool iov);
  // Marks the link failed (once); the endpoint closes now.
  void Fail(const std::shared_ptr<LinkState>& link, absl::Status status, bool hard);
  void CloseEp(const std::shared_ptr<LinkState>& link, bool force);
  // Fails the link for an error on this side and tells the peer so (a close message marked "abort").
  void Abort(const std::shared_ptr<LinkState>& link, absl::Status status);
  void Established(const std::shared_ptr<LinkState>& link);

  Attempt ConnectOnce(int peer, const std::string& at, const std::string& address, const sockaddr_storage& addr,
                      socklen_t len, absl::Time deadline);

  static std::shared_ptr<LinkState> Find(const std::unordered_map<ucp_ep_h, std::shared_ptr<LinkState>>& eps,
                                         ucp_ep_h ep) {
    auto it = eps.find(ep);
    return it == eps.end() ? nullptr : it->second;
  }

  TransportOptions options_;
  int port_ = 0;
  std::string worker_address_;  // set before Start returns, then read-only
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
  int ucx_fd_ = -1;
  int listen_fd_ = -1;
  PeerAddressFilter ucx_filter_;              // who may connect to UCX's own listeners (any thread)
  std::map<int, PendingConnection> pending_;  // by socket
  std::map<int, int> claimed_;                // rank -> the pending connection's socket that proved it
  uint64_t next_order_ = 0;
  std::unordered_map<ucp_ep_h, std::shared_ptr<LinkState>> eps_;
  std::unordered_map<uint64_t, std::shared_ptr<LinkState>> tokens_;  // every live link by its token
  std::map<int, std::weak_ptr<LinkState>> ranks_;                    // acceptor: the link each rank holds
  std::vector<void*> closing_;                                       // ucp_ep_close_nbx requests in flight
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
  if (options_.max_pending_connections < 1 || options_.handshake_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("transport: max_pending_connections and handshake_timeout must be positive");
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

bool Core::RunOnProgressThread(std::function<void()> task) {
  auto done = std::make_shared<std::promise<bool>>();
  std::future<bool> ran = done->get_future();
  // A task still queued when the progress thread stops is destroyed unrun: its promise then reports false.
  struct Guard {
    std::shared_ptr<std::promise<bool>> done;
    bool set = false;
    ~Guard() {
      if (!set) done->set_value(false);
    }
  };
  auto guard = std::make_shared<Guard>();
  guard->done = done;
  if (!Post([task = std::move(task), guard] {
        task();
        guard->set = true;
        guard->done->set_value(true);
      })) {
    guard->set = true;
    return false;
  }
  guard.reset();
  return ran.get();
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
  // NULL, NULL: the UCX_* environment applies (UCX_TLS, UCX_NET_DEVICES, ...).
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_config_read: ", ucs_status_string(st)));
  std::vector<std::pair<const char*, std::string>> settings;
  // A decode step's hop (a few KiB to a few hundred) goes eagerly, in one send, rather than by rendezvous (a
  // round trip before the data): 32 KiB one-way 194 -> 70 us over TCP on loopback (bench/README.md, group_speed).
  // UCX_RNDV_THRESH in the environment still decides.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr) settings.emplace_back("RNDV_THRESH", "262144");
  // UCX's TCP transport listens on every network device it may use, and that listener parses a stranger's bytes
  // (and asserts on a crafted header in UCX 1.13.1): it may use the interface of bind_host alone. A wildcard
  // bind_host, or UCX_NET_DEVICES / UCX_TLS in the environment, leaves UCX's own choice.
  if (std::getenv("UCX_NET_DEVICES") == nullptr && std::getenv("UCX_TLS") == nullptr) {
    auto bind = Resolve(options_.bind_host, 0, /*passive=*/true);
    const std::string device = bind.ok() ? InterfaceOf(bind->first) : "";
    if (!device.empty()) settings.emplace_back("NET_DEVICES", device);
  }
  for (const auto& [name, value] : settings) {
    st = ucp_config_modify(config, name, value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InternalError(absl::StrCat("transport: UCX ", name, "=", value, ": ", ucs_status_string(st)));
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
  // The sockets UCX's TCP transport listens on are the ones the worker opens: guarded (runtime/executor/
  // peer_filter.h) before any address can be learned, they admit members alone, each added as it passes the
  // handshake.
  std::vector<int> ucx_listeners;
  {
    std::lock_guard<std::mutex> changes(ListenerChanges());
    const std::set<int> listening_before = ListeningTcpSockets();
    st = ucp_worker_create(context_, &wparams, &worker_);
    if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_worker_create: ", ucs_status_string(st)));
    for (int fd : ListeningTcpSockets()) {
      if (listening_before.count(fd) == 0) ucx_listeners.push_back(fd);
    }
  }
  // Where socket filters are not permitted (some container sandboxes refuse SO_ATTACH_FILTER), the group still
  // forms, unguarded, and says so: --group-bind and the NetworkPolicy are then all that keep strangers out.
  if (absl::Status guarded = ucx_filter_.Guard(std::move(ucx_listeners)); !guarded.ok()) {
    std::fprintf(stderr,
                 "strata transport: node %d: WARNING: UCX's listening sockets are not guarded (%s): any host that "
                 "reaches --group-bind can connect to them\n",
                 options_.rank, std::string(guarded.message()).c_str());
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker_, &address, &address_length);
  if (st != UCS_OK) {
    return absl::InternalError(absl::StrCat("transport: ucp_worker_get_address: ", ucs_status_string(st)));
  }
  worker_address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);
  if (worker_address_.size() > kMaxWorkerAddressBytes) {
    return absl::InternalError(absl::StrCat("transport: UCX's worker address has ", worker_address_.size(),
                                            " bytes, more than ", kMaxWorkerAddressBytes));
  }

  st = ucp_worker_get_efd(worker_, &ucx_fd_);
  if (st != UCS_OK) return absl::InternalError(absl::StrCat("transport: ucp_worker_get_efd: ", ucs_status_string(st)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = ucx_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ucx_fd_, &ev);
  if (absl::Status handlers = SetAmHandlers(); !handlers.ok()) return handlers;
  return Listen();
}

absl::Status Core::SetAmHandlers() {
  struct Handler {
    unsigned id;
    ucp_am_recv_callback_t cb;
  };
  const Handler handlers[] = {
      {kAmData,
       [](void* arg, const void* header, size_t header_length, void* data, size_t length,
          const ucp_am_recv_param_t* param) -> ucs_status_t {
         const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
         return static_cast<Core*>(arg)->OnData(header, header_length, data, length, rndv);
       }},
      {kAmClose,
       [](void* arg, const void* header, size_t header_length, void*, size_t,
          const ucp_am_recv_param_t* param) -> ucs_status_t {
         static_cast<Core*>(arg)->OnPeerClose(header, header_length);
         return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 ? UCS_ERR_REJECTED : UCS_OK;
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
    const ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &hp);
    if (st != UCS_OK) {
      return absl::InternalError(absl::StrCat("transport: ucp_worker_set_am_recv_handler: ", ucs_status_string(st)));
    }
  }
  return absl::OkStatus();
}

// The port: a TCP socket of strata's own on bind_host:port, read by the handshake alone.
absl::Status Core::Listen() {
  const std::string where = absl::StrCat(options_.bind_host, ":", options_.port);
  auto bind_to = Resolve(options_.bind_host, options_.port, /*passive=*/true);
  if (!bind_to.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport: cannot listen on ", where, ": ", bind_to.status().message()));
  }
  std::lock_guard<std::mutex> changes(ListenerChanges());
  listen_fd_ = socket(bind_to->first.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (listen_fd_ < 0 || setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(listen_fd_, reinterpret_cast<const sockaddr*>(&bind_to->first), bind_to->second) != 0 ||
      listen(listen_fd_, 128) != 0) {
    return absl::UnavailableError(absl::StrCat("transport: cannot listen on ", where, ": ", strerror(errno)));
  }
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(bound).sin6_port)
                                      : ntohs(reinterpret_cast<const sockaddr_in&>(bound).sin_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  return absl::OkStatus();
}

void Core::Run(std::promise<absl::Status> started) {
  current_core = this;
  absl::Status status = InitUcx();
  const bool ok = status.ok();
  started.set_value(std::move(status));
  if (ok) {
    epoll_event events[64];
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
      bool busy;
      {
        std::lock_guard<std::mutex> lock(tasks_mu_);
        busy = !tasks_.empty() || stopping_;
      }
      // Busy: look at the sockets without sleeping, then go round again.
      if (!busy) busy = ucp_worker_arm(worker_) == UCS_ERR_BUSY;
      const int n = epoll_wait(epoll_fd_, events, 64, busy ? 0 : kIdleWakeMs);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd_) {
          uint64_t count;
          [[maybe_unused]] ssize_t r = read(wake_fd_, &count, sizeof count);
        } else if (fd == listen_fd_) {
          AcceptConnections();
        } else if (fd != ucx_fd_) {
          OnConnectionEvent(fd, events[i].events);
        }
      }
    }
  }
  TeardownUcx();
}

void Core::TeardownUcx() {
  tearing_down_ = true;
  if (listen_fd_ >= 0) {
    std::lock_guard<std::mutex> changes(ListenerChanges());
    close(listen_fd_);
  }
  listen_fd_ = -1;
  while (!pending_.empty()) DropConnection(pending_.begin()->first);
  if (worker_ != nullptr) {
    std::vector<std::shared_ptr<LinkState>> links;
    for (auto& [token, link] : tokens_) links.push_back(link);
    // Each peer hears that the link closed (after what was sent before), then the endpoints close with a
    // flush, for at most 2 s.
    for (auto& link : links) {
      bool established;
      {
        std::lock_guard<std::mutex> lock(link->mu);
        established = link->phase == Phase::kEstablished;
      }
      Fail(link, absl::UnavailableError(absl::StrCat(link->Who(), ": this node's transport stopped")), true);
      if (established) {
        auto op = std::make_shared<SendOp>();
        PutLe(op->header.data(), link->peer_token, kTokenBytes);
        StartSend(link, op, kAmClose, op->header.data(), kTokenBytes, nullptr, 0, false);
      }
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
    tokens_.clear();
    {
      std::lock_guard<std::mutex> changes(ListenerChanges());
      ucp_worker_destroy(worker_);
    }
    worker_ = nullptr;
  } else {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    accepting_tasks_ = false;
  }
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_.clear();  // unrun: RunOnProgressThread's waiters hear false
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

// Handshakes past their deadline, connections done lingering, and failed links whose endpoints may now go.
void Core::Sweep() {
  const absl::Time now = absl::Now();
  std::vector<int> late, done;
  for (auto& [fd, conn] : pending_) {
    if (conn.closing && now >= conn.linger_until) done.push_back(fd);
    if (!conn.closing && now >= conn.deadline) late.push_back(fd);
  }
  for (int fd : done) DropConnection(fd);
  for (int fd : late) {
    auto it = pending_.find(fd);
    if (it == pending_.end()) continue;
    it->second.handshake->Expired();
    Advance(it->second);
  }
  std::vector<std::shared_ptr<LinkState>> to_close;
  for (auto& [ep, link] : eps_) {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->phase == Phase::kFailed && now >= link->close_at &&
        (link->receives_in_flight == 0 || now >= link->close_at + absl::Seconds(5))) {
      to_close.push_back(link);
    }
  }
  for (auto& link : to_close) CloseEp(link, /*force=*/false);
}

// ---- the port: accepts and the acceptor's handshakes ----

HandshakeSide Core::Side(uint64_t token) const {
  HandshakeSide side;
  side.rank = options_.rank;
  side.group_size = options_.group_size;
  side.secret = options_.secret;
  side.facts = options_.facts;
  side.worker_address = worker_address_;
  side.token = token;
  return side;
}

void Core::AcceptConnections() {
  for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
    sockaddr_storage from{};
    socklen_t from_length = sizeof from;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &from_length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; EMFILE and the like: the next wake tries again
    // At the cap, the oldest connection goes: a real peer completes its handshake in a round trip or two, so the
    // oldest is the likeliest squatter, and a peer dropped by mistake retries (Connect).
    while (pending_.size() >= static_cast<size_t>(options_.max_pending_connections)) {
      auto oldest = pending_.begin();
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->second.order < oldest->second.order) oldest = it;
      }
      if (!oldest->second.closing) {
        refused_.fetch_add(1);
        std::fprintf(stderr,
                     "strata transport: node %d refused a connection from %s: dropped for a newer one (%d "
                     "connections in the handshake at most)\n",
                     options_.rank, oldest->second.address.c_str(), options_.max_pending_connections);
      }
      DropConnection(oldest->first);
    }
    PendingConnection& conn = pending_[fd];
    conn.fd = fd;
    conn.order = next_order_++;
    conn.address = AddressString(from);
    conn.peer = from;
    conn.deadline = absl::Now() + options_.handshake_timeout;
    conn.handshake =
        Handshake::ForAcceptor(Side(RandomToken()), HandshakeNonce(), [this, fd](int rank) { return Admit(fd, rank); });
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    Advance(conn);  // writes the hello
  }
}

// A rank that proved the secret: refused while it holds a live link; a newer connection claiming it replaces an
// older one still in the handshake (the older is a connect attempt its node gave up on).
std::string Core::Admit(int fd, int rank) {
  if (auto it = ranks_.find(rank); it != ranks_.end()) {
    if (auto held = it->second.lock()) {
      std::lock_guard<std::mutex> lock(held->mu);
      if (held->phase != Phase::kFailed) {
        return absl::StrCat("node ", rank, " already has a link to node ", options_.rank);
      }
    }
  }
  if (auto it = claimed_.find(rank); it != claimed_.end() && it->second != fd) {
    if (auto older = pending_.find(it->second); older != pending_.end()) {
      older->second.claimed_rank = -1;
      older->second.deadline = absl::InfinitePast();  // the sweep drops it
    }
  }
  claimed_[rank] = fd;
  pending_.at(fd).claimed_rank = rank;
  return "";
}

void Core::OnConnectionEvent(int fd, uint32_t events) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  PendingConnection& conn = it->second;
  if (events & EPOLLOUT) Flush(conn);
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
  char buffer[kReadChunk];
  // Never more than the current frame still needs: a peer cannot make this node buffer more than one frame.
  const size_t want = conn.closing ? sizeof buffer : std::min(conn.handshake->wanted(), sizeof buffer);
  const ssize_t n = recv(fd, buffer, want, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (conn.closing) {
    if (n <= 0) DropConnection(fd);  // the peer has read what it was told and gone
    return;
  }
  if (n > 0) {
    conn.handshake->Feed(absl::string_view(buffer, static_cast<size_t>(n)));
  } else {
    conn.handshake->PeerClosed();
  }
  Advance(conn);
}

void Core::Advance(PendingConnection& conn) {
  Handshake& handshake = *conn.handshake;
  switch (handshake.outcome()) {
    case Handshake::Outcome::kPending:
      conn.out += handshake.TakeOutput();
      Flush(conn);
      return;
    case Handshake::Outcome::kRefused:
      OnRefused(conn);
      return;
    case Handshake::Outcome::kEstablished:
      // The link, its endpoint and its token exist before the peer reads "ready" and may send.
      if (std::shared_ptr<LinkState> link = EstablishAccepted(conn)) {
        conn.out += handshake.TakeOutput();
        StartClosing(conn, kLinger);
        Established(link);
      } else {
        DropConnection(conn.fd);
      }
      return;
    case Handshake::Outcome::kFailed:  // a connector's outcome; not reached here
      DropConnection(conn.fd);
      return;
  }
}

void Core::OnRefused(PendingConnection& conn) {
  const Handshake& handshake = *conn.handshake;
  refused_.fetch_add(1);
  std::fprintf(stderr, "strata transport: node %d refused a connection from %s%s: %s\n", options_.rank,
               conn.address.c_str(), handshake.claim().c_str(), std::string(handshake.status().message()).c_str());
  if (handshake.status().code() == absl::StatusCode::kFailedPrecondition) {  // a member whose facts differ
    {
      std::lock_guard<std::mutex> lock(accept_mu_);
      accept_failures_[handshake.peer_rank()] = Detached(handshake.status());
    }
    accept_cv_.notify_all();
  }
  if (handshake.refusal().empty()) {
    DropConnection(conn.fd);
    return;
  }
  conn.out += conn.handshake->TakeOutput();
  StartClosing(conn, kLinger);
}

std::shared_ptr<LinkState> Core::EstablishAccepted(PendingConnection& conn) {
  const Handshake& handshake = *conn.handshake;
  const int rank = handshake.peer_rank();
  // A newer connection from the same rank took the claim while this one was finishing: that one goes on.
  // The member's host may reach UCX's listeners from now on (before it reads "ready" and connects there).
  const absl::Status allowed = ucx_filter_.Allow(conn.peer);
  absl::StatusOr<ucp_ep_h> ep = !allowed.ok() ? absl::StatusOr<ucp_ep_h>(allowed)
                                : conn.claimed_rank != rank
                                    ? absl::AbortedError("a newer connection from that rank replaced it")
                                    : CreateEp(handshake.peer_worker_address());
  if (!ep.ok()) {
    refused_.fetch_add(1);
    std::fprintf(stderr, "strata transport: node %d refused a connection from %s (rank %d): %s\n", options_.rank,
                 conn.address.c_str(), rank, std::string(ep.status().message()).c_str());
    return nullptr;
  }
  auto link = std::make_shared<LinkState>(Role::kAcceptor, options_.rank, rank, conn.address, handshake.self_token());
  link->ep = *ep;
  link->peer_token = handshake.peer_token();
  eps_[*ep] = link;
  tokens_[link->token] = link;
  ranks_[rank] = link;
  return link;
}

void Core::Flush(PendingConnection& conn) {
  while (!conn.out.empty()) {
    const ssize_t n = send(conn.fd, conn.out.data(), conn.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      conn.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    conn.out.clear();  // the peer is gone: reading will say so
    break;
  }
  const bool want_write = !conn.out.empty();
  if (want_write != conn.want_write) {
    conn.want_write = want_write;
    epoll_event ev{};
    ev.events = want_write ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    ev.data.fd = conn.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, conn.fd, &ev);
  }
  if (conn.closing && conn.out.empty()) shutdown(conn.fd, SHUT_WR);
}

// The handshake is over: what is left to say is written, then the socket lingers (reading and discarding) until
// the peer closes or `linger` passes, so that closing with unread bytes does not reset the connection first.
void Core::StartClosing(PendingConnection& conn, absl::Duration linger) {
  conn.closing = true;
  conn.linger_until = absl::Now() + linger;
  if (conn.claimed_rank >= 0) {
    if (auto it = claimed_.find(conn.claimed_rank); it != claimed_.end() && it->second == conn.fd) claimed_.erase(it);
    conn.claimed_rank = -1;
  }
  Flush(conn);
}

void Core::DropConnection(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  if (const int rank = it->second.claimed_rank; rank >= 0) {
    if (auto c = claimed_.find(rank); c != claimed_.end() && c->second == fd) claimed_.erase(c);
  }
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  pending_.erase(it);
}

// ---- links: endpoints, failure and close ----

// Peer error mode: a peer that dies or resets is reported at once (OnEpError), not at a timeout.
absl::StatusOr<ucp_ep_h> Core::CreateEp(const std::string& worker_address) {
  if (tearing_down_) return absl::UnavailableError("this node's transport stopped");
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<Core*>(arg)->OnEpError(ep, status);
  };
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
  if (st != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("cannot reach its UCX worker (", ucs_status_string(st), ")"));
  }
  return ep;
}

void Core::Fail(const std::shared_ptr<LinkState>& link, absl::Status status, bool hard) {
  {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->phase != Phase::kFailed) {
      link->phase = Phase::kFailed;
      link->failure = std::move(status);
      link->hard_failure = hard;
    } else if (hard && !link->hard_failure) {
      link->hard_failure = true;  // keep the first reason (the peer closed), stop waiting for its messages
    }
    link->close_at = std::min(link->close_at, absl::Now());
    link->cv.notify_all();
  }
  if (link->role == Role::kAcceptor) accept_cv_.notify_all();
}

void Core::CloseEp(const std::shared_ptr<LinkState>& link, bool force) {
  if (auto it = tokens_.find(link->token); it != tokens_.end() && it->second == link) tokens_.erase(it);
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

void Core::OnEpError(ucp_ep_h ep, ucs_status_t status) {
  auto link = Find(eps_, ep);
  if (link == nullptr) return;
  Fail(link, absl::UnavailableError(absl::StrCat(link->Who(), ": connection lost (", ucs_status_string(status), ")")),
       true);
  CloseEp(link, /*force=*/true);  // UCX requires a forced close after an endpoint error
}

void Core::OnPeerClose(const void* header, size_t header_length) {
  if (header_length != kTokenBytes && header_length != kTokenBytes + 1) return;
  auto it = tokens_.find(GetLe(static_cast<const uint8_t*>(header), kTokenBytes));
  if (it == tokens_.end()) return;
  std::shared_ptr<LinkState> link = it->second;
  if (header_length == kTokenBytes) {
    Fail(link, absl::UnavailableError(absl::StrCat(link->Who(), " closed the link")), /*hard=*/false);
    return;
  }
  // The peer failed the link (a message it refused): what is in flight is cancelled at once, not at UCX's
  // keepalive timeout (an endpoint made by worker address hears of the peer's close no other way).
  Fail(link, absl::UnavailableError(absl::StrCat(link->Who(), " closed the link after an error on its side")), true);
  CloseEp(link, /*force=*/true);
}

void Core::Abort(const std::shared_ptr<LinkState>& link, absl::Status status) {
  Fail(link, std::move(status), true);
  if (link->ep != nullptr) {
    auto op = std::make_shared<SendOp>();
    PutLe(op->header.data(), link->peer_token, kTokenBytes);
    op->header[kTokenBytes] = 1;
    StartSend(link, op, kAmClose, op->header.data(), kTokenBytes + 1, nullptr, 0, false);
  }
  CloseEp(link, /*force=*/false);  // flushes the close message first
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
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
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
    PutLe(op->header.data(), kind, 4);
    PutLe(op->header.data() + 8, link->next_send++, 8);
    PutLe(op->header.data() + 16, link->peer_token, kTokenBytes);
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

ucs_status_t Core::OnData(const void* header, size_t header_length, void* data, size_t length, bool rendezvous) {
  const ucs_status_t drop = rendezvous ? UCS_ERR_REJECTED : UCS_OK;
  // The token finds the link; a message without a live link's token (a closed link's stragglers, or bytes from
  // someone who never passed the handshake) is dropped unread.
  if (header_length != kDataHeaderBytes) return drop;
  const auto* h = static_cast<const uint8_t*>(header);
  auto found = tokens_.find(GetLe(h + 16, kTokenBytes));
  if (found == tokens_.end()) return drop;
  std::shared_ptr<LinkState> link = found->second;
  const uint32_t kind = static_cast<uint32_t>(GetLe(h, 4));
  const uint64_t seq = GetLe(h + 8, 8);
  std::unique_lock<std::mutex> lock(link->mu);
  if (link->phase == Phase::kFailed) return drop;
  if (seq < link->next_deliver || seq - link->next_deliver >= kMaxSequenceGap || link->inbox.count(seq) != 0) {
    const std::string who = link->WhoLocked();
    lock.unlock();
    Abort(link, absl::UnavailableError(absl::StrCat(who, " sent a malformed message header; the link is closed")));
    return drop;
  }
  if (length > options_.max_message_bytes) {
    const std::string who = link->WhoLocked();
    lock.unlock();
    Abort(link, absl::InvalidArgumentError(absl::StrCat(who, " sent a message of ", length,
                                                        " bytes, more than max_message_bytes (",
                                                        options_.max_message_bytes, "); the link is closed")));
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
       true);
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
  const std::string at = absl::StrCat("node ", peer, " at ", address);
  const absl::Time start = absl::Now();
  absl::Status last = absl::DeadlineExceededError("no attempt was made");
  while (absl::Now() < deadline) {
    auto resolved = Resolve(host, port, /*passive=*/false);
    if (resolved.ok()) {
      const absl::Time attempt_deadline = std::min(deadline, absl::Now() + options_.handshake_timeout);
      Attempt attempt = ConnectOnce(peer, at, address, resolved->first, resolved->second, attempt_deadline);
      if (attempt.link.ok() || !attempt.retryable) return std::move(attempt.link);
      last = attempt.link.status();
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

// The handshake runs on the calling thread over a socket of its own; the progress thread only registers the link's
// token first (the acceptor may send as soon as it has said "ready") and makes the endpoint after.
Core::Attempt Core::ConnectOnce(int peer, const std::string& at, const std::string& address,
                                const sockaddr_storage& addr, socklen_t len, absl::Time deadline) {
  absl::StatusOr<int> fd = ConnectSocket(addr, len, at, deadline);
  if (!fd.ok()) return Attempt{fd.status(), true};
  auto link = std::make_shared<LinkState>(Role::kConnector, options_.rank, peer, address, RandomToken());
  const absl::Status stopped = absl::UnavailableError("transport stopped");
  if (!RunOnProgressThread([this, link] { tokens_[link->token] = link; })) {
    close(*fd);
    return Attempt{stopped, false};
  }
  // The acceptor's UCX connects here once it has read this side's facts: its host may, from now on (the address
  // this node chose to connect to, so no stranger's).
  if (absl::Status allowed = ucx_filter_.Allow(addr); !allowed.ok()) {
    close(*fd);
    RunOnProgressThread([this, link] { tokens_.erase(link->token); });
    return Attempt{absl::UnavailableError(absl::StrCat(at, ": ", allowed.message())), false};
  }
  std::unique_ptr<Handshake> handshake = Handshake::ForConnector(Side(link->token), peer, at, HandshakeNonce());
  RunConnectorHandshake(*fd, *handshake, deadline);
  close(*fd);
  absl::Status failed = handshake->status();
  const bool established = handshake->outcome() == Handshake::Outcome::kEstablished;
  bool ran = RunOnProgressThread([&] {
    if (established) {
      absl::StatusOr<ucp_ep_h> ep = CreateEp(handshake->peer_worker_address());
      if (ep.ok()) {
        link->ep = *ep;
        link->peer_token = handshake->peer_token();
        eps_[*ep] = link;
        Established(link);
        return;
      }
      failed = absl::UnavailableError(absl::StrCat(at, ": ", ep.status().message()));
    }
    Fail(link, failed, true);
    CloseEp(link, true);  // forgets the token
  });
  if (!ran) return Attempt{stopped, false};
  if (established && failed.ok()) return Attempt{link, false};
  return Attempt{Detached(failed), !established && handshake->retryable()};
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
    PutLe(op->header.data(), link->peer_token, kTokenBytes);
    StartSend(link, op, kAmClose, op->header.data(), kTokenBytes, nullptr, 0, false);
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
