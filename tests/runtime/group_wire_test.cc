// The group's messages (runtime/executor/group_wire.h): what is encoded decodes to the same, and what a peer could
// send wrongly (cut short, lengths that lie, bytes left over) is an error naming the field, never an overrun or a
// large allocation.

#include "runtime/executor/group_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace strata::runtime::wire {
namespace {

MicroBatchWork SomeWork() {
  MicroBatchWork work;
  work.id = 77;
  BatchRow row;
  row.blocks = {3, 4, 5};
  row.start = 40;
  row.tokens = {11, 12};
  row.samples = true;
  row.sampling.temperature = 0.7f;
  row.sampling.top_k = 5;
  row.sampling.top_p = 0.9f;
  row.sampling.repetition_penalty = 1.1f;
  row.sampling.frequency_penalty = 0.2f;
  row.sampling.presence_penalty = 0.3f;
  row.sampling.logit_bias = {{2, -1.5f}, {9, 4.0f}};
  row.sampling.uniform = 0.123456789;
  row.sampling.top_logprobs = 3;
  row.sampling.allowed = AllowedTokens::Ready({0x12345678, -1, 7});  // a constrained row's mask travels too
  row.sequence = 1234567890123ull;
  row.penalty_tokens = {1, 2, 3};
  row.output_tokens = {3};
  row.penalty_reset = true;
  row.prompt_logprobs = 2;
  row.prompt_targets = {12};
  row.length = 42;
  row.verify = 1;  // speculative decoding: the proposal's draws travel with it
  row.verify_uniforms = {0.987654321};
  row.verify_draft_probs = {0.25f, 0.75f};  // a draft model's q, and its acceptance draw
  row.verify_accept_uniforms = {0.123456789};
  row.verify_allowed = {AllowedTokens::Ready({-2, 0, 9})};  // the verified position's mask
  row.mtp_next = 77;                                        // an MTP layer's next token
  row.mtp_wanted = false;
  work.rows.push_back(row);
  work.rows.push_back(BatchRow{});
  work.released = {5, 6};
  return work;
}

void ExpectSameWork(const MicroBatchWork& a, const MicroBatchWork& b) {
  ASSERT_EQ(a.id, b.id);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const BatchRow& x = a.rows[i];
    const BatchRow& y = b.rows[i];
    EXPECT_EQ(x.blocks, y.blocks);
    EXPECT_EQ(x.start, y.start);
    EXPECT_EQ(x.tokens, y.tokens);
    EXPECT_EQ(x.samples, y.samples);
    EXPECT_EQ(x.sampling.temperature, y.sampling.temperature);
    EXPECT_EQ(x.sampling.top_k, y.sampling.top_k);
    EXPECT_EQ(x.sampling.top_p, y.sampling.top_p);
    EXPECT_EQ(x.sampling.repetition_penalty, y.sampling.repetition_penalty);
    EXPECT_EQ(x.sampling.frequency_penalty, y.sampling.frequency_penalty);
    EXPECT_EQ(x.sampling.presence_penalty, y.sampling.presence_penalty);
    EXPECT_EQ(x.sampling.logit_bias, y.sampling.logit_bias);
    EXPECT_EQ(x.sampling.uniform, y.sampling.uniform);
    EXPECT_EQ(x.sampling.top_logprobs, y.sampling.top_logprobs);
    ASSERT_EQ(x.sampling.allowed == nullptr, y.sampling.allowed == nullptr);
    if (x.sampling.allowed != nullptr) {
      EXPECT_EQ(x.sampling.allowed->Get(), y.sampling.allowed->Get());
    }
    EXPECT_EQ(x.sequence, y.sequence);
    EXPECT_EQ(x.penalty_tokens, y.penalty_tokens);
    EXPECT_EQ(x.output_tokens, y.output_tokens);
    EXPECT_EQ(x.penalty_reset, y.penalty_reset);
    EXPECT_EQ(x.prompt_logprobs, y.prompt_logprobs);
    EXPECT_EQ(x.prompt_targets, y.prompt_targets);
    EXPECT_EQ(x.length, y.length);
    EXPECT_EQ(x.verify, y.verify);
    EXPECT_EQ(x.verify_uniforms, y.verify_uniforms);
    EXPECT_EQ(x.verify_draft_probs, y.verify_draft_probs);
    EXPECT_EQ(x.verify_accept_uniforms, y.verify_accept_uniforms);
    ASSERT_EQ(x.verify_allowed.size(), y.verify_allowed.size());
    for (size_t j = 0; j < x.verify_allowed.size(); ++j) {
      EXPECT_EQ(x.verify_allowed[j]->Get(), y.verify_allowed[j]->Get());
    }
    EXPECT_EQ(x.mtp_next, y.mtp_next);
    EXPECT_EQ(x.mtp_wanted, y.mtp_wanted);
  }
  EXPECT_EQ(a.released, b.released);
}

TEST(GroupWire, AHopDecodesToWhatWasSent) {
  const std::string bytes(6 * 4, 'x');
  Activation activation{6, {1, 2, 3}, bytes};  // float32 [1, 2, 3]
  const std::string message = EncodeHopHeader(4, SomeWork(), activation) + bytes;
  absl::StatusOr<Hop> hop = DecodeHop(message);
  ASSERT_TRUE(hop.ok()) << hop.status();
  EXPECT_EQ(hop->stage, 4u);
  ExpectSameWork(hop->work, SomeWork());
  EXPECT_EQ(hop->activation.dtype, 6);
  EXPECT_EQ(hop->activation.sizes, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(hop->activation.bytes, bytes);
}

TEST(GroupWire, AResultDecodesToWhatWasSent) {
  MicroBatchResult result;
  result.id = 9;
  result.tokens = {GeneratedToken{5, -0.25, {{5, -0.25}, {7, -2.5}}}, std::nullopt};
  result.prompt_logprobs = {{GeneratedToken{3, -1.0, {}}}, {}};
  result.status = absl::UnavailableError("node 1 is gone");
  result.failed_stage = "1";
  result.failed_device = "cpu";
  result.device_lost = true;
  result.row_errors = {absl::OkStatus(), absl::InternalError("not finite")};
  result.last_stage = "2";
  result.last_device = "1";
  result.verified = {{GeneratedToken{4, -0.5, {}}, GeneratedToken{6, -0.75, {{6, -0.75}}}}, {}};
  result.mtp = {{11, 12, 13}, {}};  // an MTP layer's proposals
  absl::StatusOr<MicroBatchResult> back = DecodeResult(EncodeResult(result));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, 9u);
  ASSERT_EQ(back->tokens.size(), 2u);
  EXPECT_EQ(back->tokens[0]->id, 5);
  EXPECT_EQ(back->tokens[0]->logprob, -0.25);
  EXPECT_EQ(back->tokens[0]->top, result.tokens[0]->top);
  EXPECT_FALSE(back->tokens[1].has_value());
  ASSERT_EQ(back->prompt_logprobs.size(), 2u);
  EXPECT_EQ(back->prompt_logprobs[0][0].id, 3);
  EXPECT_EQ(back->status, result.status);
  EXPECT_EQ(back->failed_stage, "1");
  EXPECT_EQ(back->failed_device, "cpu");
  EXPECT_TRUE(back->device_lost);
  EXPECT_EQ(back->row_errors, result.row_errors);
  EXPECT_EQ(back->last_stage, "2");
  EXPECT_EQ(back->last_device, "1");
  ASSERT_EQ(back->verified.size(), 2u);
  ASSERT_EQ(back->verified[0].size(), 2u);
  EXPECT_EQ(back->verified[0][1].id, 6);
  EXPECT_EQ(back->verified[0][1].logprob, -0.75);
  EXPECT_EQ(back->verified[0][1].top, result.verified[0][1].top);
  EXPECT_TRUE(back->verified[1].empty());
  EXPECT_EQ(back->mtp, result.mtp);
}

TEST(GroupWire, JoinsAndPlansDecodeToWhatWasSent) {
  JoinRequest join{{100, 200}, {150, 250}, {1, 0}, 4096, true, 12080, 41000};
  absl::StatusOr<JoinRequest> j = DecodeJoin(EncodeJoin(join));
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->gpu_bytes, join.gpu_bytes);
  EXPECT_EQ(j->gpu_total_bytes, join.gpu_total_bytes);
  EXPECT_EQ(j->gpu_runs_on_cpu, join.gpu_runs_on_cpu);
  EXPECT_EQ(j->host_bytes, 4096);
  EXPECT_TRUE(j->given);
  EXPECT_EQ(j->data_port, 41000);
  GroupPlan plan{R"({"model.embed_tokens": 0})", {0, 0, 1}, "bfloat16", 64, 16, 8, 2048, {"", "10.0.0.2:41000"}, true};
  absl::StatusOr<GroupPlan> p = DecodeGroupPlan(EncodeGroupPlan(plan));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->device_map_json, plan.device_map_json);
  EXPECT_EQ(p->gpu_nodes, plan.gpu_nodes);
  EXPECT_EQ(p->dtype, "bfloat16");
  EXPECT_EQ(p->kv_blocks, 64);
  EXPECT_EQ(p->max_context, 2048);
  EXPECT_EQ(p->addresses, plan.addresses);
  EXPECT_TRUE(p->mtp);
}

TEST(GroupWire, AHeartbeatCarriesLinksAndDeviceMemory) {
  HeartbeatReport report;
  report.transfers = {LinkTransfer{1, 2, 3, 4096, 0.5}, LinkTransfer{1, 0, 7, 100, 0.25}};
  report.memory = {DeviceMemory{"2", "cuda:0", 10, 20, 80, 60}};
  absl::StatusOr<HeartbeatReport> back = DecodeHeartbeat(EncodeHeartbeat(report));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->transfers.size(), 2u);
  EXPECT_EQ(back->transfers[0].to, 2);
  EXPECT_EQ(back->transfers[0].bytes, 4096u);
  EXPECT_EQ(back->transfers[1].seconds, 0.25);
  ASSERT_EQ(back->memory.size(), 1u);
  EXPECT_EQ(back->memory[0].physical_device, "cuda:0");
  EXPECT_EQ(back->memory[0].free_bytes, 60);
  const std::string encoded = EncodeHeartbeat(report);
  for (size_t n = 0; n < encoded.size(); ++n) EXPECT_FALSE(DecodeHeartbeat(encoded.substr(0, n)).ok()) << n;
}

TEST(GroupWire, EveryTruncationIsAnErrorNotAnOverrun) {
  MicroBatchResult result;
  result.id = 1;
  result.tokens = {GeneratedToken{5, -0.25, {{5, -0.25}}}};
  result.status = absl::InternalError("x");
  const std::string encoded = EncodeResult(result);
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_FALSE(DecodeResult(encoded.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeResult(encoded + "z").ok());  // bytes after the last field
  const std::string hop = EncodeHopHeader(1, SomeWork(), Activation{});
  for (size_t n = 0; n < hop.size(); ++n) {
    // A hop is its header, then exactly the bytes it announces: a cut header never decodes.
    EXPECT_FALSE(DecodeHop(hop.substr(0, n)).ok()) << n;
  }
  EXPECT_TRUE(DecodeHop(hop).ok());
  EXPECT_FALSE(DecodeHop(hop + "extra").ok());
}

TEST(GroupWire, ACountThatLiesIsRefusedBeforeAllocating) {
  // A result claiming 2^60 tokens in a 17-byte message: refused by the count check, naming the field.
  std::string message(8, '\0');
  const uint64_t huge = uint64_t{1} << 60;
  message.append(reinterpret_cast<const char*>(&huge), 8);
  message.push_back('\1');
  absl::StatusOr<MicroBatchResult> result = DecodeResult(message);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("tokens says"), std::string::npos) << result.status();
  // A status code outside absl's range.
  MicroBatchResult r;
  std::string encoded = EncodeResult(r);
  // id(8) tokens(8) prompt rows(8), then the status code.
  const int32_t bad = 99;
  std::memcpy(encoded.data() + 24, &bad, 4);
  absl::StatusOr<MicroBatchResult> bad_code = DecodeResult(encoded);
  ASSERT_FALSE(bad_code.ok());
  EXPECT_NE(bad_code.status().message().find("not a status code"), std::string::npos) << bad_code.status();
}

}  // namespace
}  // namespace strata::runtime::wire
