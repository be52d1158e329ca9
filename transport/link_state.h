#pragma once
// One link's state (internal to the transport): shared by its callers (Link::Send and Receive, under `mu`) and the
// progress thread (core.h), which alone touches its UCX endpoint.
#include <ucp/api/ucp.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace strata::transport::internal {

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

}  // namespace strata::transport::internal
