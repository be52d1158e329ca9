#pragma once
// One Generate call (gRPC callback API): validates the request (server/generate_validation.h), submits
// it to the engine and streams the engine's chunks as GenerateResponse messages. The engine calls back
// on its own thread; chunks that arrive while a write is in flight are merged into the next message,
// so a slow client never blocks the engine. The reactor deletes itself in OnDone, which can only come
// after the engine's last callback (Finish is called from it). While it generates it is listed in
// InFlightGenerations, so that a drain can wait for it and, at its timeout, cut it (UNAVAILABLE).

#include <grpcpp/grpcpp.h>

#include <chrono>
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

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `refusal` not OK: the call ends with it at once (still loading, plan only, draining); otherwise `model`
  // generates and the call is listed in `in_flight` until it ends.
  GenerateReactor(grpc::CallbackServerContext* context, const grpc::ByteBuffer& request, ServedModel* model,
                  const grpc::Status& refusal, Metrics* metrics, InFlightGenerations* in_flight);

  // The drain timeout passed: the request is cancelled and the call ends UNAVAILABLE once the tokens
  // generated before are written (unless it ended first). Any thread.
  void Cut();

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void OnChunk(runtime::GenerationChunk chunk);  // engine thread
  void WriteNextLocked();
  // Ends the call with `status` from the constructor (refused or invalid): nothing was submitted.
  void EndAtOnce(const grpc::Status& status);
  // Records the final status (under the mutex); FinishAfterUnlock then hands it to gRPC.
  void FinishWith(const grpc::Status& status);
  void FinishAfterUnlock(std::unique_lock<std::mutex>& lock);

  grpc::CallbackServerContext* context_;
  Metrics* metrics_;
  InFlightGenerations* in_flight_ = nullptr;  // set once the request is submitted
  std::string request_id_;
  std::shared_ptr<runtime::RequestHandle> handle_;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> last_token_;

  std::mutex mutex_;
  std::deque<runtime::GenerationChunk> pending_;
  grpc::ByteBuffer buffer_;  // the message being written
  bool writing_ = false;
  bool final_written_ = false;
  // The call ends with this error once the tokens before it are written: INTERNAL when the engine ended the
  // request with kError, UNAVAILABLE when it was cancelled by Cut().
  std::optional<grpc::Status> error_end_;
  bool cut_ = false;
  bool ended_by_cut_ = false;  // the call's status came from Cut(): read in OnDone
  bool client_gone_ = false;
  // OnCancel came after the call's deadline: the call ends, and is counted, DEADLINE_EXCEEDED.
  bool deadline_passed_ = false;
  bool finished_ = false;
  std::optional<grpc::Status> finish_status_;
};

}  // namespace strata::server
