#pragma once
// One Generate call (gRPC callback API): validates the request (server/generate_validation.h), submits
// it to the engine and streams the engine's chunks as GenerateResponse messages. The engine calls back
// on its own thread; chunks that arrive while a write is in flight are merged into the next message,
// so a slow client never blocks the engine. The reactor deletes itself in OnDone, which can only come
// after the engine's last callback (Finish is called from it).

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/engine/engine.h"
#include "server/metrics.h"
#include "server/served_model.h"

namespace strata::server {

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `model` null: not loaded yet (UNAVAILABLE); `plan_only`: the server has no weights.
  GenerateReactor(grpc::CallbackServerContext* context, const grpc::ByteBuffer& request, ServedModel* model,
                  bool plan_only, Metrics* metrics);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void OnChunk(runtime::GenerationChunk chunk);  // engine thread
  void WriteNextLocked();
  // Records the final status (under the mutex); FinishAfterUnlock then hands it to gRPC.
  void FinishWith(const grpc::Status& status);
  void FinishAfterUnlock(std::unique_lock<std::mutex>& lock);

  grpc::CallbackServerContext* context_;
  Metrics* metrics_;
  std::string request_id_;
  std::shared_ptr<runtime::RequestHandle> handle_;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> last_token_;

  std::mutex mutex_;
  std::deque<runtime::GenerationChunk> pending_;
  grpc::ByteBuffer buffer_;  // the message being written
  bool writing_ = false;
  bool final_written_ = false;
  std::optional<absl::Status> failure_;  // the engine ended the request with kError
  bool client_gone_ = false;
  bool finished_ = false;
  std::optional<grpc::Status> finish_status_;
};

}  // namespace strata::server
