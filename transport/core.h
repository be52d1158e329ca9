#pragma once
// The transport's progress core (internal): one UCX worker and the port, driven by one thread. Its members are
// defined by concern: core.cc (start, the loop, stop), acceptor.cc (the port and the acceptor's handshakes),
// connector.cc (the connector's handshakes), endpoints.cc (a link's UCX endpoint, failure and close), messages.cc
// (sending and receiving data messages).
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/frame.h"
#include "transport/group_handshake.h"
#include "transport/link_state.h"
#include "transport/peer_filter.h"
#include "transport/transport.h"

namespace strata::transport::internal {

constexpr size_t kReadChunk = 4096;  // a handshake's socket is read this much at most at a time

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

  // The Core whose progress thread this is: UCX's completion callbacks run there and find their Core here.
  static Core* Current();

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

}  // namespace strata::transport::internal
