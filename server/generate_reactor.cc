#include "server/generate_reactor.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc_handoff.h"
#include "strata/v1/strata.pb.h"

namespace strata::server {
namespace {

v1::GenerateResponse::FinishReason ToProto(runtime::FinishReason reason) {
  switch (reason) {
    case runtime::FinishReason::kLength:
      return v1::GenerateResponse::LENGTH;
    case runtime::FinishReason::kStop:
      return v1::GenerateResponse::STOP;
    case runtime::FinishReason::kEos:
      return v1::GenerateResponse::EOS;
    case runtime::FinishReason::kCancelled:
      return v1::GenerateResponse::CANCELLED;
    case runtime::FinishReason::kError:
      break;  // never written: the call ends with INTERNAL instead
  }
  return v1::GenerateResponse::FINISH_REASON_UNSPECIFIED;
}

// About what a chunk adds to a GenerateResponse on the wire: its text, and per token its id and logprob
// (a TokenLogprob message) and its top logprobs. Bounds what a stream buffers, so it need not be exact.
int64_t WireBytes(const runtime::GenerationChunk& chunk) {
  int64_t bytes = static_cast<int64_t>(chunk.text.size()) + 8;
  for (const runtime::GeneratedToken& token : chunk.tokens) bytes += 16 + 12 * static_cast<int64_t>(token.top.size());
  return bytes;
}

// A token's log-probability and its alternatives, as the wire carries them.
void SetLogprob(const runtime::GeneratedToken& token, v1::TokenLogprob& out) {
  out.set_token_id(token.id);
  out.set_logprob(static_cast<float>(token.logprob));
  for (const auto& [id, value] : token.top) {
    v1::TopLogprob* top = out.add_top_logprobs();
    top->set_token_id(id);
    top->set_logprob(static_cast<float>(value));
  }
}

}  // namespace

GenerateReactor::GenerateReactor(grpc::CallbackServerContext* context, Metrics* metrics,
                                 std::atomic<int64_t>* open_streams, int64_t max_buffer_bytes)
    : context_(context),
      metrics_(metrics),
      open_streams_(open_streams),
      open_at_start_(open_streams->fetch_add(1) + 1),
      max_buffer_bytes_(max_buffer_bytes),
      start_(std::chrono::steady_clock::now()) {}

void GenerateReactor::Refuse(const grpc::Status& status) {
  // The reactor may be gone when this returns (OnDone).
  std::unique_lock lock(mutex_);
  FinishWith(status);
  FinishAfterUnlock(lock);
}

absl::Status GenerateReactor::Submit(runtime::Engine& engine, runtime::GenerationRequest request,
                                     InFlightGenerations* in_flight) {
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  // Listed first (outside the mutex: CutAll holds InFlightGenerations' mutex while it takes the
  // reactor's), so that a drain beginning now counts it; OnDone removes it, however the call ends.
  if (in_flight != nullptr) in_flight->Add(this);
  // Held while the engine takes the request: its first callback (which may end the call, and then OnDone
  // deletes the reactor) waits until the handle is stored. From an admission pool thread nothing else
  // keeps the call alive meanwhile.
  std::lock_guard lock(mutex_);
  in_flight_ = in_flight;
  request_id_ = request.request_id;
  absl::StatusOr<std::shared_ptr<runtime::RequestHandle>> handle =
      engine.Submit(std::move(request), [this](runtime::GenerationChunk chunk) { OnChunk(std::move(chunk)); });
  if (!handle.ok()) return handle.status();
  if (metrics_ != nullptr) metrics_->RecordPromptTokens(prompt_tokens);
  handle_ = *std::move(handle);
  // A cancellation (or a cut) that came before the handle existed.
  if (client_gone_ || cut_) handle_->Cancel();
  return absl::OkStatus();
}

bool GenerateReactor::abandoned() {
  std::lock_guard lock(mutex_);
  return client_gone_;
}

void GenerateReactor::Cut() {
  std::lock_guard lock(mutex_);
  cut_ = true;
  if (handle_) handle_->Cancel();
}

void GenerateReactor::OnChunk(runtime::GenerationChunk chunk) {
  const auto now = std::chrono::steady_clock::now();
  if (metrics_ != nullptr && !chunk.tokens.empty()) {
    if (!last_token_) {
      metrics_->ObserveTimeToFirstToken(Api::kGrpc, std::chrono::duration<double>(now - start_).count());
    } else {
      metrics_->ObserveInterTokenLatency(Api::kGrpc, std::chrono::duration<double>(now - *last_token_).count());
    }
    metrics_->RecordGeneratedTokens(static_cast<int64_t>(chunk.tokens.size()));
    last_token_ = now;
  }
  std::unique_lock lock(mutex_);
  // Nobody reads any more: only the engine's last chunk matters (it ends the call).
  if (client_gone_ && !chunk.finish) return;
  pending_bytes_ += WireBytes(chunk);
  pending_.push_back(std::move(chunk));
  if (!client_gone_ && pending_bytes_ > max_buffer_bytes_) {
    // The client does not read (a zero flow-control window): its write is stuck and the chunks pile up.
    // The generation stops, the call is cancelled (the stuck write cannot deliver a status) and counted
    // RESOURCE_EXHAUSTED once the engine's last chunk is in.
    overflow_ = grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("the client did not read: ", pending_bytes_,
                     " response bytes waiting, more than the server's limit of ", max_buffer_bytes_, " bytes"));
    client_gone_ = true;
    cancel_call_ = true;
    if (handle_) handle_->Cancel();
    if (!pending_.back().finish) pending_.clear();
    pending_bytes_ = 0;
  }
  if (!writing_) WriteNextLocked();
  FinishAfterUnlock(lock);
}

void GenerateReactor::WriteNextLocked() {
  if (final_written_) return;
  // A failed generation ends the call with INTERNAL (the message names the stage, its device and the
  // error) once the tokens streamed before it are written; it is never a normal last message. A group that
  // lost a node ends it UNAVAILABLE naming the node (the client may retry once the group is recreated). Nor is
  // a generation cut by the drain: its call ends UNAVAILABLE (the client may retry elsewhere), not CANCELLED.
  if (!pending_.empty() && pending_.back().finish == runtime::FinishReason::kError) {
    const absl::Status& error = pending_.back().error;
    error_end_ = grpc::Status(absl::IsUnavailable(error) ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::INTERNAL,
                              std::string(error.message()));
    pending_.pop_back();
  } else if (!pending_.empty() && pending_.back().finish == runtime::FinishReason::kCancelled && cut_ &&
             !client_gone_) {
    error_end_ = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              "the server is draining: its --drain-timeout ended this generation");
    ended_by_cut_ = true;
    runtime::GenerationChunk& last = pending_.back();
    last.finish.reset();
    if (last.tokens.empty() && last.text.empty()) pending_.pop_back();
  }
  if (pending_.empty()) {
    if (error_end_) FinishWith(client_gone_ && overflow_ ? *overflow_ : *error_end_);
    return;
  }
  if (client_gone_) {
    // Nobody reads any more: wait for the engine's last chunk (it comes, the request is cancelled) and end.
    if (error_end_ || pending_.back().finish) FinishWith(overflow_.value_or(grpc::Status::CANCELLED));
    pending_.clear();
    pending_bytes_ = 0;
    return;
  }
  v1::GenerateResponse response;
  response.set_request_id(request_id_);
  std::optional<runtime::FinishReason> finish;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (runtime::GenerationChunk& chunk : pending_) {
    response.mutable_text()->append(chunk.text);
    for (const runtime::GeneratedToken& token : chunk.tokens) {
      response.add_token_ids(token.id);
      SetLogprob(token, *response.add_logprobs());
    }
    // Set on the engine's first chunk only: entry 0 (the first prompt token, unscored) is not sent.
    for (size_t i = 1; i < chunk.prompt_logprobs.size(); ++i) {
      if (!chunk.prompt_logprobs[i]) continue;
      SetLogprob(*chunk.prompt_logprobs[i], *response.add_prompt_logprobs());
    }
    if (chunk.finish) finish = chunk.finish;
    prompt_tokens = chunk.prompt_tokens;
    completion_tokens = chunk.completion_tokens;
  }
  pending_.clear();
  pending_bytes_ = 0;
  if (finish) {
    response.set_finish_reason(ToProto(*finish));
    response.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
    response.mutable_usage()->set_completion_tokens(static_cast<uint32_t>(completion_tokens));
    final_written_ = true;
  }
  std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes);
  buffer_ = grpc::ByteBuffer(&slice, 1);
  writing_ = true;
  HandToGrpc(this);
  StartWrite(&buffer_);
}

void GenerateReactor::OnWriteDone(bool ok) {
  TakeFromGrpc(this);
  std::unique_lock lock(mutex_);
  writing_ = false;
  if (!ok) {
    // The stream is gone: the client cancelled or gave up at its deadline (this can come before OnCancel).
    PeerGoneLocked();
    if (handle_) handle_->Cancel();
    if (final_written_) {
      FinishWith(grpc::Status::CANCELLED);
    } else {
      // Ends the call if the engine's last chunk is already here; otherwise that chunk ends it.
      WriteNextLocked();
    }
  } else if (final_written_) {
    FinishWith(grpc::Status::OK);
  } else {
    WriteNextLocked();
  }
  FinishAfterUnlock(lock);
}

void GenerateReactor::OnCancel() {
  TakeFromGrpc(this);
  // The client cancelled or its deadline passed: the engine drops the request within one iteration and
  // then sends its last chunk, which ends the call.
  std::unique_lock lock(mutex_);
  PeerGoneLocked();
  if (handle_) handle_->Cancel();
  if (!writing_ && !pending_.empty() && pending_.back().finish) WriteNextLocked();
  FinishAfterUnlock(lock);
}

void GenerateReactor::PeerGoneLocked() {
  client_gone_ = true;
  peer_cancelled_ = true;
  deadline_passed_ = deadline_passed_ || DeadlinePassed(std::chrono::milliseconds(50));
}

bool GenerateReactor::DeadlinePassed(std::chrono::milliseconds slack) const {
  // The client's deadline timer and the server's run on different clocks from different starts: the
  // server's from when the call's headers arrived, which under load is later than when the client started
  // its timer. A client that gives up at its deadline sends the same cancel (RST_STREAM CANCEL) as one
  // that cancels, and it can reach the server before the server's own deadline. So the cancel is the
  // deadline's (DEADLINE_EXCEEDED, as the client sees it) when the server's deadline is less than `slack`
  // away as OnCancel runs (50 ms), or has passed when the call ends (an iteration later). A deadline-less
  // call has deadline() in the far future.
  return std::chrono::system_clock::now() + slack >= context_->deadline();
}

void GenerateReactor::FinishWith(const grpc::Status& given) {
  if (finished_) return;
  finished_ = true;
  // Cancelled by gRPC because the deadline passed, not by the client: say so, and count it apart.
  // Looked at again now, an iteration or more after OnCancel: see DeadlinePassed.
  if (peer_cancelled_ && !deadline_passed_) deadline_passed_ = DeadlinePassed(std::chrono::milliseconds(0));
  const grpc::Status status = given.error_code() == grpc::StatusCode::CANCELLED && deadline_passed_
                                  ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed")
                                  : given;
  if (metrics_ != nullptr) {
    metrics_->RecordRequest(Api::kGrpc, status.error_code(),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  finish_status_ = status;
}

void GenerateReactor::FinishAfterUnlock(std::unique_lock<std::mutex>& lock) {
  // Finish may run OnDone, which deletes this reactor (and its mutex), on another thread at once: it is
  // called with the mutex released, as the last thing the caller does.
  std::optional<grpc::Status> status = std::move(finish_status_);
  finish_status_.reset();
  const bool cancel = std::exchange(cancel_call_, false);
  lock.unlock();
  // TryCancel may run OnCancel on this thread, which takes the mutex.
  if (cancel) context_->TryCancel();
  if (status) {
    HandToGrpc(this);
    Finish(*status);
  }
}

void GenerateReactor::OnDone() {
  TakeFromGrpc(this);
  // gRPC calls OnDone after Finish, and Finish after the last callback that touched this reactor, but it
  // orders them with its own synchronization, which ThreadSanitizer cannot see in Debian's uninstrumented
  // gRPC and Abseil. Taking the mutex once orders every earlier critical section (the engine's OnChunk
  // included) before the members are read here and destroyed, visibly to TSan.
  { std::lock_guard lock(mutex_); }
  if (in_flight_ != nullptr) in_flight_->Remove(this, ended_by_cut_);
  open_streams_->fetch_sub(1);
  delete this;
}

}  // namespace strata::server
