#include "runtime/executor/executor.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/index_select.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/executor/group.h"
#include "runtime/executor/group_wire.h"
#include "runtime/executor/pipeline.h"
#include "runtime/executor/sampler.h"
#include "runtime/executor/stage_workers.h"

namespace strata::runtime {
namespace {

std::string Describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// CUDA errors after which the context is unusable: every later call on it fails too (the CUDA
// runtime's "sticky" errors). An out-of-memory error is not one of them: the next micro-batch may fit.
bool IsStickyCudaError(const std::string& message) {
  constexpr const char* kSticky[] = {
      "an illegal memory access was encountered",
      "device-side assert triggered",
      "unspecified launch failure",
      "an illegal instruction was encountered",
      "misaligned address",
      "hardware stack error",
      "invalid program counter",
      "uncorrectable ECC error",
      "the launch timed out",
  };
  return std::any_of(std::begin(kSticky), std::end(kSticky),
                     [&](const char* s) { return message.find(s) != std::string::npos; });
}

}  // namespace

absl::StatusOr<FaultInjection> ParseFaultInjection(const std::string& text) {
  FaultInjection fault;
  bool has_stage = false;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.first == "repeat" && kv.second.empty()) {
      fault.repeat = true;
    } else if (kv.first == "device_lost" && kv.second.empty()) {
      fault.device_lost = true;
    } else if (kv.first == "stage" || kv.first == "call" || kv.first == "until") {
      int64_t value = 0;
      if (!absl::SimpleAtoi(kv.second, &value) || value < (kv.first == "stage" ? 0 : 1)) {
        return absl::InvalidArgumentError(absl::StrCat("fault injection: ", kv.first, "=\"", kv.second, "\" is not a ",
                                                       kv.first == "stage" ? "non-negative" : "positive", " integer"));
      }
      (kv.first == "stage" ? fault.stage : kv.first == "call" ? fault.call : fault.until) = value;
      has_stage = has_stage || kv.first == "stage";
    } else {
      return absl::InvalidArgumentError(absl::StrCat("fault injection: unknown field \"", std::string(part),
                                                     "\" (expected stage=N, call=N, repeat, until=N, device_lost)"));
    }
  }
  if (!has_stage) return absl::InvalidArgumentError("fault injection: stage=N is required");
  if (fault.until > 0 && (!fault.repeat || fault.until < fault.call)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault injection: until=", fault.until, " needs repeat and call=N at most ", fault.until));
  }
  return fault;
}

struct Executor::Impl {
  Impl(LoadedModel& m) : model(m), pipeline(m.pipeline()) {}

  // On the last stage's worker, after its units: sample the rows that sample and score the prompt
  // positions asked for, on its stream.
  void Sample(MicroBatch& mb) {
    if (mb.sampling_rows == 0 && !mb.score_index.defined() && !mb.mtp_next.defined()) return;
    const Stage& last = pipeline.stages().back();
    std::optional<c10::StreamGuard> guard;
    if (last.stream) guard.emplace(*last.stream);
    const at::Tensor& all = mb.activation.hidden;
    if (mb.sampling_rows > 0) {
      at::Tensor logits = all;
      if (mb.sample_index.defined()) {
        logits = logits.index_select(0, mb.sample_index.to(logits.device(), /*non_blocking=*/true));
      }
      mb.samples = SampleAsync(logits, mb.sampling, &penalty_pool);
    }
    if (mb.mtp_next.defined()) {
      // The MTP layer over every fed token (its KV pool follows the model's), each with the token after it: at the
      // sampled positions the one just chosen. It proposes at those positions.
      at::Tensor next = mb.mtp_next.to(all.device(), /*non_blocking=*/true);
      if (mb.sampling_rows > 0) {
        next.index_copy_(0, mb.mtp_rows.to(all.device(), /*non_blocking=*/true), mb.samples.ids);
      }
      at::Tensor proposals = pipeline.RunMtp(mb.batch, mb.activation.normed, next, mb.mtp_heads);
      if (proposals.defined()) mb.mtp = IdsToHostAsync(proposals);
    }
    if (mb.score_index.defined()) {
      at::Tensor logits = all.index_select(0, mb.score_index.to(all.device(), /*non_blocking=*/true));
      int64_t top = 0;
      for (int32_t k : mb.score_top) top = std::max<int64_t>(top, k);
      mb.scores = ScoreAsync(logits, mb.score_targets, top);
    }
  }

  // Stages a micro-batch's inputs once, in (pinned) host memory (Executor::Submit's work; a group's workers stage
  // each micro-batch that arrives). A failure is the micro-batch's error, at stage 0.
  std::unique_ptr<MicroBatch> StageInputs(MicroBatchWork work);

  // WaitCompleted's work on a completed micro-batch: its samples and scores from the device, or its error.
  MicroBatchResult Finish(std::unique_ptr<MicroBatch> mb);
  // A group (group.h): the micro-batch goes to `stage` on another node; see Executor::Start.
  void HandOff(size_t stage, std::unique_ptr<MicroBatch> mb);
  void OnMessage(int node, transport::Message message);
  void OnLost(const absl::Status& why);
  // Completes `mb` with `status` (UNAVAILABLE, the group's loss) instead of a result.
  void CompleteLost(std::unique_ptr<MicroBatch> mb, const absl::Status& status);
  // Whether a stage after `stage` runs here (the micro-batch comes back to this node).
  bool ReturnsHere(size_t stage) const {
    const std::vector<Stage>& stages = pipeline.stages();
    for (size_t s = stage + 1; s < stages.size(); ++s) {
      if (stages[s].local) return true;
    }
    return false;
  }

  LoadedModel& model;
  Pipeline& pipeline;
  NodeGroup* group = nullptr;
  std::function<void(const absl::Status&)> on_group_lost;
  // Staging runs on the engine's thread and, in a group, on the receiver threads: the penalty slots are shared.
  std::mutex staging;
  // A group: micro-batches sent to another node that come back here (the leader keeps every one until its result).
  std::mutex parked_mutex;
  std::map<uint64_t, std::unique_ptr<MicroBatch>> parked;
  absl::Status lost;  // under parked_mutex: the group's loss, once
  // The repetition penalty's state: slots assigned where micro-batches are staged (Submit, the caller's
  // thread), the seen ids where they are sampled (the last stage's worker).
  PenaltySlots penalty_slots;
  PenaltyPool penalty_pool;
  std::unique_ptr<StageWorkers> workers;
};

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() {
  // The group's receivers hand messages to this executor: they stop first. A node that stops serving while the
  // group is whole says goodbye, so the others end at once and cleanly (the leader's drain ends its workers).
  if (impl_->group != nullptr) {
    if (!impl_->group->lost()) impl_->group->Leave(absl::StrCat("node ", impl_->group->rank(), " stopped serving"));
    impl_->group->Stop();
  }
  impl_->workers.reset();
}

absl::StatusOr<std::unique_ptr<Executor>> Executor::Start(LoadedModel& model, const ExecutorOptions& options) {
  auto impl = std::make_unique<Impl>(model);
  const size_t stages = impl->pipeline.stages().size();
  if (options.fault && (options.fault->stage < 0 || static_cast<size_t>(options.fault->stage) >= stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault injection: stage ", options.fault->stage, " does not exist (the plan has ", stages, ")"));
  }
  Impl* raw = impl.get();
  std::function<void(size_t, std::unique_ptr<MicroBatch>)> hand_off;
  if (options.group != nullptr) {
    if (!options.stage_threads) {
      return absl::InvalidArgumentError("a group of nodes runs its stages on worker threads (stage_threads)");
    }
    impl->group = options.group;
    impl->on_group_lost = options.on_group_lost;
    hand_off = [raw](size_t stage, std::unique_ptr<MicroBatch> mb) { raw->HandOff(stage, std::move(mb)); };
  }
  impl->workers = std::make_unique<StageWorkers>(
      impl->pipeline, options.stage_threads, options.intra_op_threads, [raw](MicroBatch& mb) { raw->Sample(mb); },
      options.fault, std::move(hand_off));
  if (options.group != nullptr) {
    options.group->Serve({[raw](int node, transport::Message message) { raw->OnMessage(node, std::move(message)); },
                          [raw](int, const absl::Status& why) { raw->OnLost(why); }});
  }
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

namespace {

// One group of a pass: `members` are rows of `rows` that all feed `count` tokens; their ids are written
// to `ids` (the group's place among the pass's packed ids), row after row.
ForwardGroup StageGroup(const Pipeline& pipeline, const std::vector<BatchRow>& rows,
                        const std::vector<int64_t>& members, int64_t count, int64_t* ids) {
  const int64_t n = static_cast<int64_t>(members.size());
  const int64_t block_tokens = pipeline.kv_block_tokens();
  ForwardGroup b;
  b.rows = n;
  b.count = count;
  b.starts = pipeline.HostBuffer({n}, at::kLong);
  size_t width = 0;
  for (int64_t r : members) width = std::max(width, rows[r].blocks.size());
  // Rows with fewer blocks are padded with block 0: positions past a row's own are masked.
  b.blocks = pipeline.HostBuffer({n, static_cast<int64_t>(width)}, at::kLong).zero_();
  b.last = pipeline.HostBuffer({n}, at::kLong);
  b.lengths = pipeline.HostBuffer({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = members[i];
    const BatchRow& row = rows[r];
    std::copy(row.tokens.begin(), row.tokens.end(), ids + i * count);
    b.starts.data_ptr<int64_t>()[i] = row.start;
    if (static_cast<int64_t>(row.blocks.size()) * block_tokens < row.start + count) {
      throw std::invalid_argument(absl::StrCat("micro-batch row ", r, ": ", row.blocks.size(), " KV blocks of ",
                                               block_tokens, " tokens do not reach position ", row.start + count - 1));
    }
    for (size_t k = 0; k < row.blocks.size(); ++k) {
      if (row.blocks[k] < 0 || row.blocks[k] >= pipeline.kv_blocks()) {
        throw std::invalid_argument(absl::StrCat("micro-batch row ", r, ": KV block ", row.blocks[k],
                                                 " is outside the pool [0, ", pipeline.kv_blocks(), ")"));
      }
      b.blocks.data_ptr<int64_t>()[i * static_cast<int64_t>(width) + static_cast<int64_t>(k)] = row.blocks[k];
    }
    b.last.data_ptr<int64_t>()[i] = count - 1;
    b.lengths.data_ptr<int64_t>()[i] = row.length > 0 ? row.length : row.start + count;
    b.key_length = std::max(b.key_length, row.start + count);
  }
  Pipeline::DescribeBlocks(b);
  return b;
}

}  // namespace

void Executor::Submit(MicroBatchWork work) {
  const at::AutoDispatchBelowADInplaceOrView inference;  // as StageWorkers::RunOne
  std::unique_ptr<MicroBatch> mb = impl_->StageInputs(std::move(work));
  if (impl_->group != nullptr) {
    std::lock_guard lock(impl_->parked_mutex);
    if (!impl_->lost.ok()) {
      const absl::Status lost = impl_->lost;
      impl_->CompleteLost(std::move(mb), lost);
      return;
    }
  }
  impl_->workers->Submit(std::move(mb));
}

std::unique_ptr<MicroBatch> Executor::Impl::StageInputs(MicroBatchWork work) {
  std::lock_guard lock(staging);
  auto mb = std::make_unique<MicroBatch>();
  mb->work = std::move(work);
  // No row of a released sequence is in flight: its slot may be given to a sequence of this micro-batch,
  // which the pool empties first, in micro-batch order.
  for (uint64_t sequence : mb->work.released) penalty_slots.Release(sequence);
  try {
    // Stage every input once, in (pinned) host memory: stages copy what they need, non_blocking. The
    // tokens are packed (ForwardBatch); rows feeding the same number of tokens form a group for attention.
    const std::vector<BatchRow>& rows = mb->work.rows;
    const int64_t n = static_cast<int64_t>(rows.size());
    std::vector<int64_t> counts;                // the groups' token counts, in order of first appearance
    std::vector<std::vector<int64_t>> members;  // each group's rows
    for (int64_t r = 0; r < n; ++r) {
      const int64_t count = static_cast<int64_t>(rows[r].tokens.size());
      if (count < 1) throw std::invalid_argument(absl::StrCat("micro-batch row ", r, " feeds no token"));
      auto it = std::find(counts.begin(), counts.end(), count);
      if (it == counts.end()) {
        counts.push_back(count);
        members.emplace_back();
        it = counts.end() - 1;
      }
      members[it - counts.begin()].push_back(r);
    }
    // Logits come back group after group: where each row lands in that order. A row that scores its
    // prompt has the logits of every token it feeds (its last one's last), the others of their last token.
    int64_t tokens = 0;
    int64_t logits_rows = 0;
    for (const BatchRow& row : rows) {
      const int64_t count = static_cast<int64_t>(row.tokens.size());
      tokens += count;
      if (static_cast<int64_t>(row.prompt_targets.size()) > count) {
        throw std::invalid_argument(absl::StrCat("micro-batch row feeds ", count, " tokens and scores ",
                                                 row.prompt_targets.size(), " prompt tokens"));
      }
      if (row.verify < 0 || row.verify >= count || static_cast<int64_t>(row.verify_uniforms.size()) != row.verify) {
        throw std::invalid_argument(absl::StrCat("micro-batch row feeds ", count, " tokens and verifies ", row.verify,
                                                 " with ", row.verify_uniforms.size(), " draws"));
      }
      const size_t verify = static_cast<size_t>(row.verify);
      if (!row.verify_draft_probs.empty() && (row.verify_draft_probs.size() % std::max<size_t>(verify, 1) != 0 ||
                                              row.verify_draft_probs.size() / std::max<size_t>(verify, 1) == 0 ||
                                              row.verify_accept_uniforms.size() != verify)) {
        throw std::invalid_argument(absl::StrCat("micro-batch row verifies ", row.verify, " tokens with ",
                                                 row.verify_draft_probs.size(), " draft probabilities and ",
                                                 row.verify_accept_uniforms.size(), " acceptance draws"));
      }
      if (row.verify > 0 && (!row.samples || !row.prompt_targets.empty())) {
        throw std::invalid_argument(
            "a micro-batch row that verifies proposed tokens must sample, without prompt targets");
      }
      if (!row.verify_allowed.empty() && (row.sampling.allowed == nullptr || row.verify_allowed.size() != verify ||
                                          std::count(row.verify_allowed.begin(), row.verify_allowed.end(), nullptr))) {
        throw std::invalid_argument(absl::StrCat("micro-batch row verifies ", row.verify, " tokens with ",
                                                 row.verify_allowed.size(), " token masks"));
      }
      if (row.verify > 0 && row.sampling.allowed != nullptr && row.verify_allowed.empty()) {
        throw std::invalid_argument("a constrained micro-batch row that verifies proposed tokens needs their masks");
      }
      logits_rows += row.prompt_targets.empty() ? 1 + row.verify : count;
    }
    ForwardBatch& b = mb->batch;
    b.ids = pipeline.HostBuffer({1, tokens}, at::kLong);
    b.last = pipeline.HostBuffer({logits_rows}, at::kLong);
    std::vector<int64_t> logits_row(static_cast<size_t>(n));
    std::vector<int64_t> score_index, score_targets;
    mb->score_first.assign(static_cast<size_t>(n), 0);
    int64_t next = 0;
    int64_t offset = 0;
    const bool mtp = pipeline.mtp() != nullptr;
    if (mtp) mb->mtp_next = pipeline.HostBuffer({tokens}, at::kLong);
    for (size_t g = 0; g < counts.size(); ++g) {
      b.groups.push_back(StageGroup(pipeline, rows, members[g], counts[g], b.ids.data_ptr<int64_t>() + offset));
      for (int64_t r : members[g]) {
        if (mtp) {
          // Each fed token's next: the next fed one, after the last the known one (or the choice, written later).
          int64_t* next = mb->mtp_next.data_ptr<int64_t>() + offset;
          const std::vector<int32_t>& fed = rows[r].tokens;
          for (size_t k = 0; k + 1 < fed.size(); ++k) next[k] = fed[k + 1];
          next[fed.size() - 1] = std::max<int32_t>(rows[r].mtp_next, 0);
        }
        const std::vector<int32_t>& targets = rows[r].prompt_targets;
        mb->score_first[r] = score_index.size();
        for (size_t k = 0; k < targets.size(); ++k) {
          score_index.push_back(next + static_cast<int64_t>(k));
          score_targets.push_back(targets[k]);
          mb->score_top.push_back(std::max<int32_t>(0, rows[r].prompt_logprobs));
        }
        for (int64_t k = targets.empty() ? counts[g] - 1 - rows[r].verify : 0; k < counts[g]; ++k) {
          b.last.data_ptr<int64_t>()[next++] = offset + k;
        }
        logits_row[r] = next - 1;
        offset += counts[g];
      }
    }
    if (!score_index.empty()) {
      const int64_t scored = static_cast<int64_t>(score_index.size());
      mb->score_index = pipeline.HostBuffer({scored}, at::kLong);
      mb->score_targets = pipeline.HostBuffer({scored}, at::kLong);
      std::copy(score_index.begin(), score_index.end(), mb->score_index.data_ptr<int64_t>());
      std::copy(score_targets.begin(), score_targets.end(), mb->score_targets.data_ptr<int64_t>());
    }
    std::vector<const BatchRow*> sampling;
    std::vector<int64_t> sample_rows;
    bool in_order = true;
    auto add = [&](const BatchRow* row, int64_t logits) {
      sampling.push_back(row);
      sample_rows.push_back(logits);
      in_order = in_order && logits == static_cast<int64_t>(sample_rows.size()) - 1;
    };
    for (int64_t r = 0; r < n; ++r) {
      if (!rows[r].samples) continue;
      // A penalised row's positions share its sequence's penalty slot; each also counts the proposals before it.
      const bool penalised = rows[r].sequence != 0 && rows[r].verify > 0;
      const auto proposed = rows[r].tokens.end() - rows[r].verify;
      for (int32_t j = 0; j < rows[r].verify; ++j) {
        BatchRow& position = mb->verify_rows.emplace_back();
        position.samples = true;
        position.sampling = rows[r].sampling;
        position.mtp_wanted = rows[r].mtp_wanted;
        if (!rows[r].verify_allowed.empty()) position.sampling.allowed = rows[r].verify_allowed[j];
        if (penalised) {
          position.sequence = rows[r].sequence;
          position.penalty_pending.assign(proposed, proposed + j);
        }
        position.sampling.uniform = rows[r].verify_uniforms[j];
        position.sampling.return_probs = false;
        const std::vector<float>& q = rows[r].verify_draft_probs;
        if (!q.empty()) {
          const size_t vocab = q.size() / static_cast<size_t>(rows[r].verify);
          position.sampling.draft_token = rows[r].tokens[rows[r].tokens.size() - rows[r].verify + j];
          position.sampling.accept_uniform = rows[r].verify_accept_uniforms[j];
          position.sampling.draft_probs = std::span<const float>(q).subspan(j * vocab, vocab);
        }
        add(&position, logits_row[r] - rows[r].verify + j);
      }
      if (penalised) {
        // The last position (rows are const here): the row's sampling and penalty updates, after every proposal.
        BatchRow& last = mb->verify_rows.emplace_back();
        last.samples = true;
        last.sampling = rows[r].sampling;
        last.mtp_wanted = rows[r].mtp_wanted;
        last.sequence = rows[r].sequence;
        last.penalty_tokens = rows[r].penalty_tokens;
        last.output_tokens = rows[r].output_tokens;
        last.penalty_reset = rows[r].penalty_reset;
        last.penalty_pending.assign(proposed, rows[r].tokens.end());
        add(&last, logits_row[r]);
        continue;
      }
      add(&rows[r], logits_row[r]);
    }
    mb->sampling_rows = static_cast<int64_t>(sampling.size());
    if (mtp) {
      mb->mtp_rows = pipeline.HostBuffer({mb->sampling_rows}, at::kLong);
      std::vector<int64_t> heads;
      for (size_t k = 0; k < sample_rows.size(); ++k) {
        const int64_t position = b.last.data_ptr<int64_t>()[sample_rows[k]];
        mb->mtp_rows.data_ptr<int64_t>()[k] = position;
        mb->mtp_head_of.push_back(sampling[k]->mtp_wanted ? static_cast<int64_t>(heads.size()) : -1);
        if (sampling[k]->mtp_wanted) heads.push_back(position);
      }
      mb->mtp_heads = pipeline.HostBuffer({static_cast<int64_t>(heads.size())}, at::kLong);
      std::copy(heads.begin(), heads.end(), mb->mtp_heads.data_ptr<int64_t>());
    }
    if (!sampling.empty()) {
      mb->sampling = StageSamplingInputs(sampling, pipeline.uses_cuda(), &penalty_slots);
      if (mb->sampling_rows != logits_rows || !in_order) {
        mb->sample_index = pipeline.HostBuffer({mb->sampling_rows}, at::kLong);
        std::copy(sample_rows.begin(), sample_rows.end(), mb->sample_index.data_ptr<int64_t>());
      }
    }
  } catch (...) {
    mb->error = std::current_exception();
    mb->failed_stage = 0;
  }
  return mb;
}

void Executor::Impl::CompleteLost(std::unique_ptr<MicroBatch> mb, const absl::Status& status) {
  MicroBatchResult result;
  result.id = mb->work.id;
  result.tokens.assign(mb->work.rows.size(), std::nullopt);
  result.status = status;
  result.device_lost = true;
  result.failed_stage = "group";
  result.failed_device = "group";
  mb->remote_result = std::move(result);
  workers->Complete(std::move(mb));
}

void Executor::Impl::HandOff(size_t stage, std::unique_ptr<MicroBatch> mb) {
  const Stage& next = pipeline.stages().at(stage);
  wire::Activation activation;
  at::Tensor host;
  if (stage > 0) {
    // The activation reaches the host first (ordered after its producer's work on CUDA): the transport sends host
    // bytes. A CUDA-enabled UCX could send device memory directly (runtime/executor/README.md).
    const at::Tensor& hidden = mb->activation.hidden;
    std::optional<c10::StreamGuard> on_producer;  // the copy is ordered after the producer's work on its stream
    if (hidden.is_cuda() && mb->activation.producer != nullptr && mb->activation.producer->stream) {
      on_producer.emplace(*mb->activation.producer->stream);
    }
    host = hidden.to(at::kCPU).contiguous();
    activation.dtype = static_cast<int32_t>(host.scalar_type());
    activation.sizes.assign(host.sizes().begin(), host.sizes().end());
    activation.bytes = absl::string_view(static_cast<const char*>(host.data_ptr()), host.nbytes());
  }
  const std::string header = wire::EncodeHopHeader(static_cast<uint32_t>(stage), mb->work, activation);
  const uint64_t id = mb->work.id;
  // The leader keeps every micro-batch until its result; a node that runs a later stage keeps it until it returns.
  // Parked before sending: the reply may come before Send returns.
  const bool keep = group->rank() == 0 || ReturnsHere(stage);
  {
    std::lock_guard lock(parked_mutex);
    if (!lost.ok()) {
      const absl::Status why = lost;
      CompleteLost(std::move(mb), why);
      return;
    }
    if (keep) parked[id] = std::move(mb);
  }
  const absl::string_view parts[] = {header, activation.bytes};
  absl::Status sent = group->Send(next.node, wire::kHop, parts);
  mb.reset();  // unless parked, this node is done with it
  if (!sent.ok()) {
    OnLost(absl::UnavailableError(absl::StrCat("sending micro-batch ", id, " to stage ", stage, " on ",
                                               group->Describe(next.node), " failed: ", sent.message(),
                                               ": the group cannot go on")));
  }
}

void Executor::Impl::OnMessage(int node, transport::Message message) {
  if (message.kind == wire::kHop) {
    absl::StatusOr<wire::Hop> hop = wire::DecodeHop(message.bytes);
    if (!hop.ok() || hop->stage >= pipeline.stages().size() || !pipeline.stages()[hop->stage].local) {
      OnLost(absl::InternalError(absl::StrCat(
          group->Describe(node), " sent a hop this node cannot run: ",
          hop.ok() ? absl::StrCat("stage ", hop->stage, " is not here") : std::string(hop.status().message()))));
      return;
    }
    std::unique_ptr<MicroBatch> mb;
    {
      std::lock_guard lock(parked_mutex);
      if (auto it = parked.find(hop->work.id); it != parked.end()) {
        mb = std::move(it->second);
        parked.erase(it);
      }
    }
    if (mb == nullptr) mb = StageInputs(std::move(hop->work));
    if (hop->activation.dtype >= 0) {
      const auto dtype = static_cast<at::ScalarType>(hop->activation.dtype);
      at::Tensor hidden = at::empty(hop->activation.sizes, at::TensorOptions().dtype(dtype));
      if (static_cast<size_t>(hidden.nbytes()) != hop->activation.bytes.size()) {
        OnLost(absl::InternalError(absl::StrCat(group->Describe(node), " sent an activation of ",
                                                hop->activation.bytes.size(), " bytes for a tensor of ",
                                                hidden.nbytes())));
        return;
      }
      if (!hop->activation.bytes.empty()) {
        std::memcpy(hidden.data_ptr(), hop->activation.bytes.data(), hop->activation.bytes.size());
      }
      mb->activation.hidden = std::move(hidden);
      mb->activation.produced.reset();
      mb->activation.producer = nullptr;
    }
    workers->Inject(hop->stage, std::move(mb));
    return;
  }
  if (message.kind == wire::kResult) {
    absl::StatusOr<MicroBatchResult> result = wire::DecodeResult(message.bytes);
    if (!result.ok()) {
      OnLost(absl::InternalError(
          absl::StrCat(group->Describe(node), " sent a result this node cannot read: ", result.status().message())));
      return;
    }
    std::unique_ptr<MicroBatch> mb;
    {
      std::lock_guard lock(parked_mutex);
      auto it = parked.find(result->id);
      if (it == parked.end()) {
        std::cerr << "strata group: " << group->Describe(node) << " sent the result of micro-batch " << result->id
                  << ", which is not in flight here\n";
        return;
      }
      mb = std::move(it->second);
      parked.erase(it);
    }
    mb->remote_result = *std::move(result);
    workers->Complete(std::move(mb));
    return;
  }
  std::cerr << "strata group: " << group->Describe(node) << " sent a " << wire::KindName(message.kind)
            << " message while serving; ignored\n";
}

void Executor::Impl::OnLost(const absl::Status& why) {
  std::map<uint64_t, std::unique_ptr<MicroBatch>> failed;
  {
    std::lock_guard lock(parked_mutex);
    if (!lost.ok()) return;
    lost = absl::UnavailableError(why.message());
    failed.swap(parked);
  }
  for (auto& [id, mb] : failed) CompleteLost(std::move(mb), lost);
  if (on_group_lost) on_group_lost(why);
}

MicroBatchResult Executor::WaitCompleted() { return impl_->Finish(impl_->workers->WaitCompleted()); }

std::optional<MicroBatchResult> Executor::WaitCompletedFor(std::chrono::milliseconds timeout) {
  std::unique_ptr<MicroBatch> mb = impl_->workers->WaitCompleted(timeout);
  if (mb == nullptr) return std::nullopt;
  return impl_->Finish(std::move(mb));
}

MicroBatchResult Executor::Impl::Finish(std::unique_ptr<MicroBatch> mb) {
  if (mb->remote_result) return *std::move(mb->remote_result);
  const at::AutoDispatchBelowADInplaceOrView inference;  // as StageWorkers::RunOne
  MicroBatchResult result;
  result.id = mb->work.id;
  result.tokens.resize(mb->work.rows.size());
  const std::vector<Stage>& stages = pipeline.stages();
  if (!mb->error && mb->score_index.defined()) {
    try {
      // Waits on this micro-batch's copy event only.
      std::vector<GeneratedToken> scored = FinishScores(mb->scores, mb->score_top);
      result.prompt_logprobs.resize(mb->work.rows.size());
      for (size_t r = 0; r < mb->work.rows.size(); ++r) {
        for (size_t j = 0; j < mb->work.rows[r].prompt_targets.size(); ++j) {
          result.prompt_logprobs[r].push_back(std::move(scored.at(mb->score_first[r] + j)));
        }
      }
    } catch (...) {
      mb->error = std::current_exception();
      mb->failed_stage = stages.size() - 1;
    }
  }
  if (!mb->error && mb->sampling_rows > 0) {
    try {
      // Waits on this micro-batch's copy event only.
      std::vector<std::vector<float>> probs;
      std::vector<GeneratedToken> tokens = FinishSamples(mb->samples, mb->sampling, &probs);
      const int64_t* proposals = nullptr;  // the MTP layer's, one per sampling row that wants them
      if (mb->mtp_next.defined() && mb->sampling_rows > 0) {
        result.mtp.resize(mb->work.rows.size());
      }
      if (mb->mtp.host.defined()) {
        if (mb->mtp.ready) mb->mtp.ready->synchronize();
        proposals = mb->mtp.host.data_ptr<int64_t>();
      }
      size_t next_probs = 0;
      const Stage& last = stages.back();
      size_t k = 0;
      for (size_t r = 0; r < mb->work.rows.size(); ++r) {
        const BatchRow& row = mb->work.rows[r];
        if (!row.samples) continue;
        bool finite = true;
        if (row.verify > 0) {
          result.verified.resize(mb->work.rows.size());
          for (int32_t j = 0; j < row.verify; ++j) {
            finite = finite && std::isfinite(tokens.at(k).logprob);
            result.verified[r].push_back(std::move(tokens.at(k++)));
          }
        }
        if (row.sampling.return_probs && next_probs < probs.size()) {
          result.probs.resize(mb->work.rows.size());
          result.probs[r] = std::move(probs[next_probs++]);
        }
        if (!result.mtp.empty()) {
          for (size_t j = k - static_cast<size_t>(row.verify); j <= k; ++j) {
            const int64_t head = mb->mtp_head_of.at(j);
            result.mtp[r].push_back(head < 0 || proposals == nullptr ? -1 : static_cast<int32_t>(proposals[head]));
          }
        }
        GeneratedToken& token = tokens.at(k++);
        if (finite && std::isfinite(token.logprob)) {
          result.tokens[r] = std::move(token);
          continue;
        }
        if (!result.verified.empty()) result.verified[r].clear();
        result.row_errors.resize(mb->work.rows.size());
        result.row_errors[r] = absl::InternalError(
            absl::StrCat("stage ", stages.size() - 1, " (plan device ", last.label, " on ", last.device.str(),
                         "): the logits are not finite (NaN or inf) at position ",
                         mb->work.rows[r].start + static_cast<int64_t>(mb->work.rows[r].tokens.size()),
                         ": the weights or the activations overflowed"));
      }
      result.last_stage = std::to_string(stages.size() - 1);
      result.last_device = last.label;
    } catch (...) {
      mb->error = std::current_exception();
      mb->failed_stage = stages.size() - 1;
    }
  }
  if (mb->error) {
    const Stage& stage = stages.at(mb->failed_stage);
    const std::string message = Describe(mb->error);
    result.failed_stage = std::to_string(mb->failed_stage);
    result.failed_device = stage.label;
    result.device_lost = IsStickyCudaError(message);
    result.status = absl::InternalError(absl::StrCat("stage ", mb->failed_stage, " (plan device ", stage.label, " on ",
                                                     stage.device.str(), ") failed: ", message));
    result.tokens.assign(mb->work.rows.size(), std::nullopt);
    result.verified.clear();
    result.prompt_logprobs.clear();
    result.probs.clear();
    result.mtp.clear();
  }
  return result;
}

std::vector<StageBusy> Executor::Busy() const {
  const std::vector<double> busy = impl_->workers->BusySeconds();
  const std::vector<Stage>& stages = impl_->pipeline.stages();
  std::vector<StageBusy> out;
  for (size_t s = 0; s < stages.size(); ++s) out.push_back({stages[s].label, stages[s].device.str(), busy[s]});
  return out;
}

int64_t Executor::RefusedConnections() const { return impl_->group != nullptr ? impl_->group->refused() : 0; }

std::vector<LinkTransfer> Executor::Transfers() const {
  return impl_->group != nullptr ? impl_->group->Transfers() : std::vector<LinkTransfer>{};
}

}  // namespace strata::runtime
