#include "runtime/executor/group_wire.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "transport/wire_codec.h"

namespace strata::runtime::wire {
namespace {

using transport::WireDecoder;
using transport::WireEncoder;

// Each message's fields, once: a visitor (transport/wire_codec.h) encodes them from a const message, decodes them
// into a message, or adds up their fewest bytes. The field names are what decoding errors say.

template <typename V, typename T>
void TokenFields(V& v, T& t) {  // T: GeneratedToken
  v.Scalar("token id", t.id);
  v.Scalar("token logprob", t.logprob);
  v.List("top logprobs", t.top, [](auto& v, auto& top) {
    v.Scalar("top id", top.first);
    v.Scalar("top logprob", top.second);
  });
}

// A constrained row's mask travels with its micro-batch to the node that samples: encoding waits until the
// leader's mask thread filled it (the first stages' time overlaps the fill); decoding makes it ready.
template <typename V>
void AllowedField(V& v, const std::shared_ptr<AllowedTokens>& allowed) {
  std::optional<std::vector<int32_t>> words;
  if (allowed != nullptr) words = allowed->Get();
  v.Optional("allowed tokens", words, [](auto& v, auto& w) { v.Vector("allowed token words", w); });
}
template <typename V>
void AllowedField(V& v, std::shared_ptr<AllowedTokens>& allowed) {
  std::optional<std::vector<int32_t>> words;
  v.Optional("allowed tokens", words, [](auto& v, auto& w) { v.Vector("allowed token words", w); });
  allowed = words ? AllowedTokens::Ready(*std::move(words)) : nullptr;
}

template <typename V, typename S>
void SamplingFields(V& v, S& s) {  // S: RowSampling
  v.Scalar("temperature", s.temperature);
  v.Scalar("top_k", s.top_k);
  v.Scalar("top_p", s.top_p);
  v.Scalar("repetition_penalty", s.repetition_penalty);
  v.Scalar("frequency_penalty", s.frequency_penalty);
  v.Scalar("presence_penalty", s.presence_penalty);
  v.List("logit_bias", s.logit_bias, [](auto& v, auto& bias) {
    v.Scalar("logit_bias id", bias.first);
    v.Scalar("logit_bias value", bias.second);
  });
  v.Scalar("uniform", s.uniform);
  v.Scalar("top_logprobs", s.top_logprobs);
  AllowedField(v, s.allowed);
}

template <typename V, typename R>
void RowFields(V& v, R& row) {  // R: BatchRow
  v.Vector("row blocks", row.blocks);
  v.Scalar("row start", row.start);
  v.Vector("row tokens", row.tokens);
  v.Flag("row samples", row.samples);
  SamplingFields(v, row.sampling);
  v.Scalar("sequence", row.sequence);
  v.Vector("penalty_tokens", row.penalty_tokens);
  v.Vector("output_tokens", row.output_tokens);
  v.Flag("penalty_reset", row.penalty_reset);
  v.Scalar("prompt_logprobs", row.prompt_logprobs);
  v.Vector("prompt_targets", row.prompt_targets);
  v.Scalar("row length", row.length);
  v.Scalar("row verify", row.verify);
  v.Vector("verify uniforms", row.verify_uniforms);
  v.Vector("verify draft probs", row.verify_draft_probs);
  v.Vector("verify accept uniforms", row.verify_accept_uniforms);
  v.List("verify masks", row.verify_allowed, [](auto& v, auto& mask) { AllowedField(v, mask); });
  v.Scalar("row mtp next", row.mtp_next);
  v.Flag("row mtp wanted", row.mtp_wanted);
}

template <typename V, typename W>
void WorkFields(V& v, W& work) {  // W: MicroBatchWork
  v.Scalar("micro-batch id", work.id);
  v.List("rows", work.rows, [](auto& v, auto& row) { RowFields(v, row); });
  v.Vector("released", work.released);
}

template <typename V, typename S, typename W, typename A>
void HopFields(V& v, S& stage, W& work, A& activation) {  // S: uint32_t, W: MicroBatchWork, A: Activation
  v.Scalar("stage", stage);
  WorkFields(v, work);
  v.Scalar("activation dtype", activation.dtype);
  v.Vector("activation sizes", activation.sizes);
  v.Trailing("activation bytes", "the activation", activation.bytes);
}

template <typename V, typename R>
void ResultFields(V& v, R& result) {  // R: MicroBatchResult
  v.Scalar("micro-batch id", result.id);
  v.List("tokens", result.tokens,
         [](auto& v, auto& token) { v.Optional("token present", token, [](auto& v, auto& t) { TokenFields(v, t); }); });
  v.List("prompt logprob rows", result.prompt_logprobs,
         [](auto& v, auto& row) { v.List("prompt logprobs", row, [](auto& v, auto& t) { TokenFields(v, t); }); });
  v.Status("status", result.status);
  v.Bytes("failed stage", result.failed_stage);
  v.Bytes("failed device", result.failed_device);
  v.Flag("device lost", result.device_lost);
  v.List("row errors", result.row_errors, [](auto& v, auto& error) { v.Status("row error", error); });
  v.Bytes("last stage", result.last_stage);
  v.Bytes("last device", result.last_device);
  v.List("verified rows", result.verified,
         [](auto& v, auto& row) { v.List("verified tokens", row, [](auto& v, auto& t) { TokenFields(v, t); }); });
  v.List("mtp rows", result.mtp, [](auto& v, auto& row) { v.Vector("mtp proposals", row); });
}

template <typename V, typename J>
void JoinFields(V& v, J& join) {  // J: JoinRequest
  v.Vector("gpu bytes", join.gpu_bytes);
  v.Vector("gpu total bytes", join.gpu_total_bytes);
  v.Vector("gpu runs on cpu", join.gpu_runs_on_cpu);
  v.Scalar("host bytes", join.host_bytes);
  v.Flag("given", join.given);
  v.Scalar("cuda driver version", join.cuda_driver_version);
  v.Scalar("data port", join.data_port);
}

template <typename V, typename P>
void PlanFields(V& v, P& plan) {  // P: GroupPlan
  v.Bytes("device map", plan.device_map_json);
  v.Vector("gpu nodes", plan.gpu_nodes);
  v.Bytes("dtype", plan.dtype);
  v.Scalar("kv blocks", plan.kv_blocks);
  v.Scalar("kv block tokens", plan.kv_block_tokens);
  v.Scalar("max batch", plan.max_batch);
  v.Scalar("max context", plan.max_context);
  v.List("addresses", plan.addresses, [](auto& v, auto& address) { v.Bytes("address", address); });
  v.Flag("mtp", plan.mtp);
}

template <typename V, typename H>
void HeartbeatFields(V& v, H& report) {  // H: HeartbeatReport
  v.List("links", report.transfers, [](auto& v, auto& t) {
    v.Scalar("link from", t.from);
    v.Scalar("link to", t.to);
    v.Scalar("link messages", t.messages);
    v.Scalar("link bytes", t.bytes);
    v.Scalar("link seconds", t.seconds);
  });
  v.List("devices", report.memory, [](auto& v, auto& m) {
    v.Bytes("device", m.device);
    v.Bytes("physical device", m.physical_device);
    v.Scalar("allocated bytes", m.allocated_bytes);
    v.Scalar("reserved bytes", m.reserved_bytes);
    v.Scalar("total bytes", m.total_bytes);
    v.Scalar("free bytes", m.free_bytes);
  });
}

// A whole message: its fields, then nothing after them.
template <typename M, typename Fields>
absl::StatusOr<M> Decode(absl::string_view message, const char* what, Fields fields) {
  WireDecoder r(message, what);
  M decoded;
  fields(r, decoded);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return decoded;
}

template <typename M, typename Fields>
std::string Encode(const M& message, Fields fields) {
  WireEncoder w;
  fields(w, message);
  return w.Take();
}

}  // namespace

std::string KindName(uint32_t kind) {
  switch (kind) {
    case kHop:
      return "hop";
    case kResult:
      return "result";
    case kHeartbeat:
      return "heartbeat";
    case kGoodbye:
      return "goodbye";
    case kJoin:
      return "join";
    case kPlan:
      return "plan";
    case kReady:
      return "ready";
    case kFailed:
      return "failed";
    default:
      return absl::StrCat("kind ", kind);
  }
}

std::string EncodeHopHeader(uint32_t stage, const MicroBatchWork& work, const Activation& activation) {
  WireEncoder w;
  HopFields(w, stage, work, activation);
  return w.Take();
}

absl::StatusOr<Hop> DecodeHop(absl::string_view message) {
  return Decode<Hop>(message, "hop", [](auto& v, Hop& hop) { HopFields(v, hop.stage, hop.work, hop.activation); });
}

std::string EncodeResult(const MicroBatchResult& result) {
  return Encode(result, [](auto& v, auto& r) { ResultFields(v, r); });
}

absl::StatusOr<MicroBatchResult> DecodeResult(absl::string_view message) {
  return Decode<MicroBatchResult>(message, "result", [](auto& v, auto& r) { ResultFields(v, r); });
}

std::string EncodeJoin(const JoinRequest& join) {
  return Encode(join, [](auto& v, auto& j) { JoinFields(v, j); });
}

absl::StatusOr<JoinRequest> DecodeJoin(absl::string_view message) {
  WireDecoder r(message, "join");
  JoinRequest join;
  JoinFields(r, join);
  if (!r.ok()) return r.status();
  if (join.gpu_total_bytes.size() != join.gpu_bytes.size() || join.gpu_runs_on_cpu.size() != join.gpu_bytes.size()) {
    return absl::InvalidArgumentError("join: the GPU lists differ in length");
  }
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  return join;
}

std::string EncodeGroupPlan(const GroupPlan& plan) {
  return Encode(plan, [](auto& v, auto& p) { PlanFields(v, p); });
}

absl::StatusOr<GroupPlan> DecodeGroupPlan(absl::string_view message) {
  return Decode<GroupPlan>(message, "plan", [](auto& v, auto& p) { PlanFields(v, p); });
}

std::string EncodeHeartbeat(const HeartbeatReport& report) {
  return Encode(report, [](auto& v, auto& h) { HeartbeatFields(v, h); });
}

absl::StatusOr<HeartbeatReport> DecodeHeartbeat(absl::string_view message) {
  return Decode<HeartbeatReport>(message, "heartbeat", [](auto& v, auto& h) { HeartbeatFields(v, h); });
}

}  // namespace strata::runtime::wire
