#pragma once
// One Generate call (gRPC callback API): InferenceService validates the request
// (server/generate_validation.h) and submits it through the reactor, which streams the engine's chunks
// as GenerateResponse messages. The engine calls back on its own thread; chunks that arrive while a
// write is in flight are merged into the next message, so a slow client never blocks the engine; one
// that leaves more than --max-stream-buffer-bytes unread has its generation cancelled (RESOURCE_EXHAUSTED).
// The reactor deletes itself in OnDone, which can only come after the engine's last callback (Finish is
// called from it). While it generates it is listed in InFlightGenerations, so that a drain can wait for
// it and, at its timeout, cut it (UNAVAILABLE).

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/engine/engine.h"
#include "server/in_flight_generations.h"
#include "server/metrics.h"
#include "server/served_model.h"

namespace strata::server {

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public CuttableGeneration {
 public:
  // Counted in `open_streams` from here until OnDone. `max_buffer_bytes`: response bytes it may hold for a
  // client that does not read them (--max-stream-buffer-bytes). `metrics` may be null.
  GenerateReactor(grpc::CallbackServerContext* context, Metrics* metrics, std::atomic<int64_t>* open_streams,
                  int64_t max_buffer_bytes);

  // The Generate calls open with this one (counted by the constructor).
  int64_t open_streams() const { return open_at_start_; }
  // Ends the call with `status` at once (still loading, plan only, draining, an invalid request, ...).
  void Refuse(const grpc::Status& status);
  // Lists the call in `in_flight` and hands the validated request to `engine`. Not OK: the engine
  // refused it (queue full, stopping); the caller then Refuses with it. Any thread.
  absl::Status Submit(runtime::Engine& engine, runtime::GenerationRequest request, InFlightGenerations* in_flight);
  // The client cancelled (or its deadline passed) before the request was submitted: no need to tokenize it.
  bool abandoned();

  // The drain timeout passed: the request is cancelled and the call ends UNAVAILABLE once the tokens
  // generated before are written (unless it ended first). Any thread.
  void Cut() override;

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void OnChunk(runtime::GenerationChunk chunk);  // engine thread
  void WriteNextLocked();
  // Records the final status (under the mutex); FinishAfterUnlock then hands it to gRPC.
  void FinishWith(const grpc::Status& status);
  void FinishAfterUnlock(std::unique_lock<std::mutex>& lock);
  // OnCancel, or a write that failed: the client cancelled, gave up at its deadline, or is gone.
  void PeerGoneLocked();
  bool DeadlinePassed(std::chrono::milliseconds slack) const;

  grpc::CallbackServerContext* context_;
  Metrics* metrics_;
  std::atomic<int64_t>* open_streams_;
  int64_t open_at_start_ = 0;
  const int64_t max_buffer_bytes_;
  InFlightGenerations* in_flight_ = nullptr;  // set once the request is submitted
  std::string request_id_;
  std::shared_ptr<runtime::RequestHandle> handle_;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> last_token_;

  std::mutex mutex_;
  std::deque<runtime::GenerationChunk> pending_;
  int64_t pending_bytes_ = 0;  // about what pending_ will take on the wire
  // The client left more than max_buffer_bytes_ unread: the generation is cancelled and the call ends
  // with this RESOURCE_EXHAUSTED once the engine's last chunk is in.
  std::optional<grpc::Status> overflow_;
  bool cancel_call_ = false;  // FinishAfterUnlock cancels the call (a write stuck behind a client that does not read)
  grpc::ByteBuffer buffer_;   // the message being written
  bool writing_ = false;
  bool final_written_ = false;
  // The call ends with this error once the tokens before it are written: INTERNAL when the engine ended the
  // request with kError, UNAVAILABLE when it was cancelled by Cut().
  std::optional<grpc::Status> error_end_;
  bool cut_ = false;
  bool ended_by_cut_ = false;  // the call's status came from Cut(): read in OnDone
  bool client_gone_ = false;
  // OnCancel came (the client cancelled, or gave up at its deadline); and whether the call's deadline had
  // passed (DeadlinePassed) then or when the call ended: it ends, and is counted, DEADLINE_EXCEEDED.
  bool peer_cancelled_ = false;
  bool deadline_passed_ = false;
  bool finished_ = false;
  std::optional<grpc::Status> finish_status_;
};

}  // namespace strata::server
