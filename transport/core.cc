#include "transport/core.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <utility>

#include "transport/sockets.h"

namespace strata::transport::internal {
namespace {

constexpr int kIdleWakeMs = 100;  // the progress thread's longest sleep: handshake deadlines are checked this often

thread_local Core* current_core = nullptr;

}  // namespace

Core* Core::Current() { return current_core; }

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
  // The sockets UCX's TCP transport listens on are the ones the worker opens: guarded (peer_filter.h) before any
  // address can be learned, they admit members alone, each added as it passes the handshake.
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
        const size_t length = PutCloseHeader(op->header.data(), link->peer_token, /*abort=*/false);
        StartSend(link, op, kAmClose, op->header.data(), length, nullptr, 0, false);
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

}  // namespace strata::transport::internal
