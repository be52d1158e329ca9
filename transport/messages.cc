// Data messages (progress thread, and the sending caller waiting on its operation): UCX active messages with a
// data header (frame.h), eager up to UCX's rendezvous threshold and fetched by rendezvous past it, delivered to the
// link's inbox in sequence order.
#include <cstdint>
#include <utility>

#include "transport/core.h"
#include "transport/waiting.h"

namespace strata::transport::internal {

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
    Core::Current()->FinishSend(op, status);
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
    PutDataHeader(op->header.data(), DataHeader{kind, link->next_send++, link->peer_token});
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
  const DataHeader h = ReadDataHeader(static_cast<const uint8_t*>(header));
  auto found = tokens_.find(h.token);
  if (found == tokens_.end()) return drop;
  std::shared_ptr<LinkState> link = found->second;
  const uint32_t kind = h.kind;
  const uint64_t seq = h.sequence;
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
    Core::Current()->FinishReceive(reinterpret_cast<uintptr_t>(user_data), status);
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

}  // namespace strata::transport::internal
