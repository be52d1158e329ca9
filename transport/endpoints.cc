// A link's UCX endpoint (progress thread): made by the peer's worker address once the handshake is done, failed once
// (the first reason kept), closed politely (a close message, then a flushing close) or by force after an error.
#include <utility>

#include "transport/core.h"

namespace strata::transport::internal {

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
  if (header_length != kTokenBytes && header_length != kMaxCloseHeaderBytes) return;
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
    const size_t length = PutCloseHeader(op->header.data(), link->peer_token, /*abort=*/true);
    StartSend(link, op, kAmClose, op->header.data(), length, nullptr, 0, false);
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
    const size_t length = PutCloseHeader(op->header.data(), link->peer_token, /*abort=*/false);
    StartSend(link, op, kAmClose, op->header.data(), length, nullptr, 0, false);
    CloseEp(link, /*force=*/false);
  });
}

}  // namespace strata::transport::internal
