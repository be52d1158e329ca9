#include "runtime/executor/sampler.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cummax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scatter.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace strata::runtime {
namespace {

// Columns of SamplingInputs::params.
enum ParamColumn : int64_t {
  kTemperature = 0,
  kTopK = 1,
  kTopP = 2,
  kPenalty = 3,
  kUniform = 4,
  kFrequency = 5,
  kPresence = 6
};

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// A staged host tensor on `device`: pinned sources make this an asynchronous copy on the current stream.
at::Tensor OnDevice(const at::Tensor& host, at::Device device) {
  return host.to(at::TensorOptions().device(device), /*non_blocking=*/true);
}

// One parameter of every row, [rows, 1], to broadcast against [rows, vocab].
at::Tensor Param(const at::Tensor& params, ParamColumn column) { return params.select(1, column).unsqueeze(1); }

c10::Stream CurrentStream(at::Device device) {
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStream(device);
}

// vLLM's order: logit_bias first (its logits processors run before the penalties), then transformers'
// RepetitionPenaltyLogitsProcessor: every token id present in the row's context has its logit l replaced
// by l * p when l < 0 and l / p otherwise (float32, as transformers computes it); then OpenAI's frequency
// and presence penalties over the row's generated ids (vLLM's apply_penalties, in that order).
at::Tensor Penalised(const at::Tensor& logits, const SamplingInputs& inputs, const at::Tensor& params,
                     PenaltyPool* pool) {
  at::Tensor scores = logits;
  const int64_t vocab = logits.size(1);
  if (inputs.any_bias) {
    // Each row's biases summed into a [rows, vocab + 1] table (padding lands in the last column).
    at::Tensor bias = at::zeros({logits.size(0), vocab + 1}, logits.options());
    at::Tensor ids = OnDevice(inputs.bias_ids, logits.device());
    ids = at::where(ids.ge(0).logical_and(ids.lt(vocab)), ids, vocab);
    bias.scatter_add_(1, ids, OnDevice(inputs.bias_values, logits.device()));
    scores = scores + bias.narrow(1, 0, vocab);
  }
  PenaltyPool local;
  PenaltyPool& state = pool != nullptr ? *pool : local;
  if (inputs.any_penalty) {
    const at::Tensor present = state.Present(inputs, logits.device(), vocab);
    at::Tensor penalty = Param(params, kPenalty).to(at::kFloat);
    scores = at::where(present, at::where(scores.lt(0), scores * penalty, scores / penalty), scores);
  }
  if (inputs.any_output_penalty) {
    const at::Tensor counts = state.Counts(inputs, logits.device(), vocab);
    scores = scores - Param(params, kFrequency).to(at::kFloat) * counts;
    scores = scores - Param(params, kPresence).to(at::kFloat) * counts.gt(0).to(at::kFloat);
  }
  return scores;
}

// transformers' warpers in generate's order, each row with its own parameters; rows with temperature 0
// keep their (penalised) scores, as generate applies no warper without do_sample.
at::Tensor Warped(const at::Tensor& scores, const SamplingInputs& inputs, const at::Tensor& params) {
  const int64_t vocab = scores.size(1);
  at::Tensor sampled = Param(params, kTemperature).gt(0);
  at::Tensor temperature = at::where(sampled, Param(params, kTemperature), 1.0).to(at::kFloat);
  at::Tensor warped = scores / temperature;
  if (inputs.any_top_k) {
    // TopKLogitsWarper: drop what is below the k-th largest score (k clamped to the vocabulary; ties
    // with the k-th all stay). Rows without top_k take k = vocab: nothing is below the smallest score.
    at::Tensor k = Param(params, kTopK).to(at::kLong);
    k = at::where(sampled.logical_and(k.gt(0)), k.clamp(1, vocab), vocab);
    at::Tensor kth = std::get<0>(at::sort(warped, /*dim=*/1, /*descending=*/true)).gather(1, k - 1);
    warped = warped.masked_fill(warped.lt(kth), kNegativeInfinity);
  }
  if (inputs.any_top_p) {
    // TopPLogitsWarper: sort ascending, drop the tokens whose cumulative probability stays at or below
    // 1 - top_p, always keep the most likely one. The limit is 1 - top_p in double rounded to float32,
    // as transformers' comparison of a float32 tensor with a Python float; rows without top_p get -1.
    at::Tensor top_p = Param(params, kTopP);
    at::Tensor limit = at::where(sampled.logical_and(top_p.lt(1)), (-top_p) + 1.0, -1.0).to(at::kFloat);
    auto [sorted, order] = at::sort(warped, /*dim=*/1, /*descending=*/false);
    at::Tensor remove = at::softmax(sorted, 1).cumsum(1).le(limit);
    remove.narrow(1, vocab - 1, 1).fill_(false);
    warped = warped.masked_fill(remove.scatter(1, order, remove), kNegativeInfinity);
  }
  return at::where(sampled, warped, scores);
}

// Per row [rows, 1]: sampled rows take the first token, in vocabulary order, whose cumulative probability
// (float64) exceeds uniform x total; the others the argmax (the first of equal maxima). A sampled row
// whose scores overflowed to +inf (a repetition penalty or a temperature so small that l / p or l / t
// leaves float32) has no finite distribution: softmax would be NaN everywhere and the draw meaningless.
// It takes the argmax, the first +inf: the limit of that distribution as its scale grows.
// The draw itself, [rows, 1]: where the cumulative `probabilities` (float64, [rows, vocab], each row's sum positive)
// first exceed uniform x their total, never at a probability of zero.
at::Tensor Draw(const at::Tensor& probabilities, const at::Tensor& params) {
  const int64_t vocab = probabilities.size(1);
  at::Tensor cdf = probabilities.cumsum(1);
  at::Tensor target = Param(params, kUniform) * cdf.narrow(1, vocab - 1, 1);
  at::Tensor index = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true).clamp_max(vocab - 1);
  // Never a token of probability zero: uniform x total can round up to the total, and a parallel scan on
  // a device need not keep the cdf flat over zeros. Step back to the last positive token at or before
  // the index (the first positive one when there is none before).
  at::Tensor positive = probabilities.gt(0);
  at::Tensor positions = at::arange(vocab, probabilities.options().dtype(at::kLong));
  at::Tensor last_positive = std::get<0>(at::cummax(at::where(positive, positions, -1), 1)).gather(1, index);
  at::Tensor first_positive = at::argmax(positive.to(at::kInt), 1, /*keepdim=*/true);
  return at::where(last_positive.lt(0), first_positive, last_positive);
}

at::Tensor Choose(const at::Tensor& scores, const at::Tensor& params) {
  at::Tensor drawn = Draw(at::softmax(scores.to(at::kDouble), 1), params);
  at::Tensor finite = at::isfinite(at::amax(scores, 1, /*keepdim=*/true));
  return at::where(Param(params, kTemperature).gt(0).logical_and(finite), drawn,
                   at::argmax(scores, 1, /*keepdim=*/true));
}

// Leviathan et al.'s rejection step for the rows with a draft model's proposal (RowSampling::draft_token): keep the
// proposed d when accept x q(d) < p(d), else draw from max(p - q, 0) normalised (p itself where that is all zero:
// p <= q everywhere means p = q up to rounding, and then d is kept but for rounding). `scores` are the warped
// scores, `ids` what the rows chose without the proposal (kept by greedy rows, rows without one, and rows whose
// scores overflowed: Choose's argmax).
at::Tensor Rejected(const at::Tensor& scores, const at::Tensor& ids, const SamplingInputs& inputs,
                    const at::Tensor& params) {
  const at::Device device = scores.device();
  at::Tensor draft = OnDevice(inputs.draft, device);
  at::Tensor proposed = draft.select(1, 0).unsqueeze(1).to(at::kLong);
  at::Tensor finite = at::isfinite(at::amax(scores, 1, /*keepdim=*/true));
  at::Tensor applies = proposed.ge(0).logical_and(Param(params, kTemperature).gt(0)).logical_and(finite);
  at::Tensor d = proposed.clamp_min(0);
  at::Tensor p = at::softmax(scores.to(at::kDouble), 1);
  TORCH_CHECK(inputs.draft_probs.size(1) == scores.size(1), "sampler: draft distributions over ",
              inputs.draft_probs.size(1), " ids for logits over ", scores.size(1));
  at::Tensor q = OnDevice(inputs.draft_probs, device).to(at::kDouble);
  at::Tensor accept = (draft.select(1, 1).unsqueeze(1) * q.gather(1, d)).lt(p.gather(1, d));
  at::Tensor residual = (p - q).clamp_min(0);
  residual = at::where(residual.sum(1, /*keepdim=*/true).gt(0), residual, p);
  return at::where(applies, at::where(accept, d, Draw(residual, params)), ids);
}

// Structured outputs: the ids a constrained row's grammar does not allow get -inf before anything else, so
// every later step (and the log-probabilities) sees the masked distribution. The masks are waited for here
// (the engine's mask thread fills them while the forward pass runs) and expanded from their bits on the device.
at::Tensor Masked(const at::Tensor& logits, const SamplingInputs& inputs, bool device_ops = false) {
  if (!inputs.any_allowed) return logits;
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  const int64_t words = (vocab + 31) / 32;
  at::Tensor host = at::empty({rows, words}, at::TensorOptions().dtype(at::kInt).pinned_memory(logits.is_cuda()));
  int32_t* data = host.data_ptr<int32_t>();
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* row = data + r * words;
    const AllowedTokens* allowed = inputs.allowed[static_cast<size_t>(r)].get();
    if (allowed == nullptr) {
      std::fill(row, row + words, -1);
      continue;
    }
    const std::vector<int32_t>& bits = allowed->Get();
    TORCH_CHECK(static_cast<int64_t>(bits.size()) >= words, "sampler: the grammar's mask of row ", r, " covers ",
                bits.size() * 32, " ids, the logits have ", vocab);
    std::copy(bits.begin(), bits.begin() + words, row);
  }
  if (logits.is_cpu() && logits.scalar_type() == at::kFloat && !device_ops) {
    // On the CPU the bits are read in place: one pass over the rows that have a mask (ATen's expansion below makes
    // five passes over [rows, words x 32]).
    at::Tensor masked = logits.contiguous().clone();
    float* scores = masked.data_ptr<float>();
    const float forbidden = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      if (inputs.allowed[static_cast<size_t>(r)] == nullptr) continue;
      const int32_t* bits = data + r * words;
      float* row = scores + r * vocab;
      for (int64_t w = 0; w < words; ++w) {
        const uint32_t word = static_cast<uint32_t>(bits[w]);
        if (word == 0xffffffffu) continue;
        const int64_t end = std::min<int64_t>(32, vocab - w * 32);
        for (int64_t b = 0; b < end; ++b) {
          if (((word >> b) & 1u) == 0) row[w * 32 + b] = forbidden;
        }
      }
    }
    return masked;
  }
  at::Tensor shifts = at::arange(32, at::TensorOptions().dtype(at::kInt).device(logits.device()));
  at::Tensor allowed = at::bitwise_and(at::bitwise_right_shift(OnDevice(host, logits.device()).unsqueeze(2), shifts), 1)
                           .view({rows, words * 32})
                           .narrow(1, 0, vocab)
                           .to(at::kBool);
  return logits.masked_fill(allowed.logical_not(), kNegativeInfinity);
}

// Staged ids on `device`, padding (-1) and ids outside the vocabulary at `vocab`: the penalty tables' last column.
at::Tensor InVocabulary(const at::Tensor& staged, at::Device device, int64_t vocab) {
  const at::Tensor ids = OnDevice(staged, device);
  return at::where(ids.ge(0).logical_and(ids.lt(vocab)), ids, vocab);
}

bool HasPenalty(const RowSampling& s) {
  return s.repetition_penalty != 1 || s.frequency_penalty != 0 || s.presence_penalty != 0;
}

// Rows x the longest of `ids` per row, -1 past each row's end (rows without a penalty stay empty).
at::Tensor PaddedIds(const std::vector<const BatchRow*>& rows, const at::TensorOptions& host,
                     std::vector<int32_t> BatchRow::*ids) {
  const int64_t n = static_cast<int64_t>(rows.size());
  size_t longest = 1;
  for (const BatchRow* row : rows) {
    if (HasPenalty(row->sampling)) longest = std::max(longest, (row->*ids).size());
  }
  const int64_t width = static_cast<int64_t>(longest);
  at::Tensor out = at::empty({n, width}, host.dtype(at::kLong));
  int64_t* data = out.data_ptr<int64_t>();
  std::fill(data, data + n * width, -1);
  for (int64_t r = 0; r < n; ++r) {
    if (HasPenalty(rows[r]->sampling)) std::copy((rows[r]->*ids).begin(), (rows[r]->*ids).end(), data + r * width);
  }
  return out;
}

// The penalties' part of SamplingInputs: each penalised row's slot, the ids it adds and the slots that
// start empty. Rows staged without PenaltySlots take fresh slots of a local table.
void StagePenalty(const std::vector<const BatchRow*>& rows, const at::TensorOptions& host, PenaltySlots* slots,
                  SamplingInputs& inputs) {
  PenaltySlots local;
  PenaltySlots& table = slots != nullptr ? *slots : local;
  const int64_t n = static_cast<int64_t>(rows.size());
  inputs.penalty_slots = at::empty({n}, host.dtype(at::kLong));
  inputs.penalty_tokens = PaddedIds(rows, host, &BatchRow::penalty_tokens);
  inputs.output_tokens = PaddedIds(rows, host, &BatchRow::output_tokens);
  const bool pending = std::any_of(rows.begin(), rows.end(), [](const BatchRow* row) {
    return HasPenalty(row->sampling) && !row->penalty_pending.empty();
  });
  if (pending) inputs.penalty_pending = PaddedIds(rows, host, &BatchRow::penalty_pending);
  int64_t* slot = inputs.penalty_slots.data_ptr<int64_t>();
  std::vector<int64_t> resets;
  for (int64_t r = 0; r < n; ++r) {
    const BatchRow& row = *rows[r];
    slot[r] = 0;
    if (!HasPenalty(row.sampling)) continue;
    const auto [s, fresh] = slots != nullptr ? table.SlotOf(row.sequence) : table.SlotOf(static_cast<uint64_t>(r));
    slot[r] = s;
    if (fresh || row.penalty_reset) resets.push_back(s);
  }
  inputs.penalty_resets = at::empty({static_cast<int64_t>(resets.size())}, host.dtype(at::kLong));
  std::copy(resets.begin(), resets.end(), inputs.penalty_resets.data_ptr<int64_t>());
  inputs.penalty_capacity = table.capacity();
}

// logit_bias of every row as [rows, longest] ids (vocab: padding) and values.
void StageBias(const std::vector<const BatchRow*>& rows, const at::TensorOptions& host, SamplingInputs& inputs) {
  const int64_t n = static_cast<int64_t>(rows.size());
  size_t longest = 1;
  for (const BatchRow* row : rows) longest = std::max(longest, row->sampling.logit_bias.size());
  const int64_t width = static_cast<int64_t>(longest);
  inputs.bias_ids = at::empty({n, width}, host.dtype(at::kLong));
  inputs.bias_values = at::zeros({n, width}, host.dtype(at::kFloat));
  int64_t* ids = inputs.bias_ids.data_ptr<int64_t>();
  float* values = inputs.bias_values.data_ptr<float>();
  // Padding points past the vocabulary: the scatter's last column, dropped. The vocabulary is not known
  // here, so the padding id is the largest int32 and clamped on the device.
  std::fill(ids, ids + n * width, std::numeric_limits<int32_t>::max());
  for (int64_t r = 0; r < n; ++r) {
    const auto& bias = rows[r]->sampling.logit_bias;
    for (size_t k = 0; k < bias.size(); ++k) {
      ids[r * width + static_cast<int64_t>(k)] = bias[k].first;
      values[r * width + static_cast<int64_t>(k)] = bias[k].second;
    }
  }
}

// Packs ids [n, 1] and their log-probabilities among `logprobs` [n, vocab], with the `top` best of each
// row, as float64 (ids are exact below 2^53), and starts their one copy to the host.
PendingSamples PackAsync(const at::Tensor& ids, const at::Tensor& logprobs, int64_t top,
                         const at::Tensor& probs = at::Tensor()) {
  const at::Device device = logprobs.device();
  std::vector<at::Tensor> parts{ids.to(at::kDouble), logprobs.gather(1, ids).to(at::kDouble)};
  top = std::min(top, logprobs.size(1));
  if (top > 0) {
    auto [values, indices] = at::topk(logprobs, top, 1);
    parts.push_back(indices.to(at::kDouble));
    parts.push_back(values.to(at::kDouble));
  }
  at::Tensor packed = at::cat(parts, 1);
  PendingSamples pending;
  if (device.is_cpu()) {
    pending.host = packed.contiguous();
    if (probs.defined()) pending.probs = probs.contiguous();
    return pending;
  }
  pending.host = at::empty(packed.sizes(), at::TensorOptions().dtype(at::kDouble).pinned_memory(device.is_cuda()));
  pending.host.copy_(packed, /*non_blocking=*/true);
  if (probs.defined()) {
    pending.probs = at::empty(probs.sizes(), at::TensorOptions().dtype(at::kFloat).pinned_memory(device.is_cuda()));
    pending.probs.copy_(probs, /*non_blocking=*/true);
  }
  pending.ready.emplace(device.type());
  pending.ready->record(CurrentStream(device));
  return pending;
}

// Waits for PackAsync's copy and unpacks one token per row, row r keeping row_top[r] of its top tokens.
std::vector<GeneratedToken> Unpack(PendingSamples& pending, const std::vector<int32_t>& row_top) {
  if (pending.ready) pending.ready->synchronize();
  const at::Tensor& host = pending.host;
  const int64_t rows = static_cast<int64_t>(row_top.size());
  TORCH_CHECK(host.dim() == 2 && host.size(0) == rows, "sampler: results for ", host.size(0), " rows, ", rows,
              " expected");
  const int64_t width = host.size(1);
  const int64_t top = (width - 2) / 2;
  const double* data = host.data_ptr<double>();
  std::vector<GeneratedToken> tokens(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = data + r * width;
    GeneratedToken& token = tokens[r];
    token.id = static_cast<int32_t>(row[0]);
    token.logprob = row[1];
    const int64_t wanted = std::min<int64_t>(top, row_top[r]);
    for (int64_t j = 0; j < wanted; ++j) token.top.push_back({static_cast<int32_t>(row[2 + j]), row[2 + top + j]});
  }
  return tokens;
}

// RowSampling's draft proposals as SamplingInputs::draft and draft_probs (every q of one vocabulary's size).
void StageDraft(const std::vector<const BatchRow*>& rows, const at::TensorOptions& host, SamplingInputs& inputs) {
  const int64_t n = static_cast<int64_t>(rows.size());
  int64_t vocab = 0;
  for (const BatchRow* row : rows)
    vocab = std::max<int64_t>(vocab, static_cast<int64_t>(row->sampling.draft_probs.size()));
  inputs.draft = at::empty({n, 2}, host.dtype(at::kDouble));
  inputs.draft_probs = at::zeros({n, vocab}, host.dtype(at::kFloat));
  double* draft = inputs.draft.data_ptr<double>();
  float* probs = inputs.draft_probs.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    const RowSampling& s = rows[r]->sampling;
    const bool proposes = s.draft_token >= 0 && !s.draft_probs.empty();
    TORCH_CHECK(!proposes || (static_cast<int64_t>(s.draft_probs.size()) == vocab && s.draft_token < vocab),
                "sampler: row ", r, " proposes id ", s.draft_token, " with a draft distribution over ",
                s.draft_probs.size(), " ids, other rows over ", vocab);
    draft[2 * r] = proposes ? s.draft_token : -1;
    draft[2 * r + 1] = s.accept_uniform;
    if (proposes) std::copy(s.draft_probs.begin(), s.draft_probs.end(), probs + r * vocab);
  }
}

// The processed distributions of the rows that asked for them (SamplingInputs::probs_rows), float32 [k, vocab]:
// softmax of the warped scores for sampled rows, the point mass on the chosen id for greedy ones.
at::Tensor ReturnedProbs(const at::Tensor& scores, const at::Tensor& ids, const SamplingInputs& inputs,
                         const at::Tensor& params) {
  const at::Device device = scores.device();
  const int64_t k = static_cast<int64_t>(inputs.probs_rows.size());
  at::Tensor index = at::empty({k}, at::TensorOptions().dtype(at::kLong));
  std::copy(inputs.probs_rows.begin(), inputs.probs_rows.end(), index.data_ptr<int64_t>());
  index = index.to(device);
  at::Tensor picked = scores.index_select(0, index);
  at::Tensor chosen = ids.index_select(0, index);
  at::Tensor point = at::zeros_like(picked).scatter(1, chosen, 1.0);
  at::Tensor sampled = Param(params, kTemperature).index_select(0, index).gt(0);
  at::Tensor finite = at::isfinite(at::amax(picked, 1, /*keepdim=*/true));
  return at::where(sampled.logical_and(finite), at::softmax(picked, 1), point);
}

}  // namespace

std::pair<int64_t, bool> PenaltySlots::SlotOf(uint64_t sequence) {
  if (auto it = slots_.find(sequence); it != slots_.end()) return {it->second, false};
  int64_t slot = next_;
  if (free_.empty()) {
    ++next_;
  } else {
    slot = free_.back();
    free_.pop_back();
  }
  slots_.emplace(sequence, slot);
  return {slot, true};
}

void PenaltySlots::Release(uint64_t sequence) {
  auto it = slots_.find(sequence);
  if (it == slots_.end()) return;
  free_.push_back(it->second);
  slots_.erase(it);
}

at::Tensor PenaltyPool::Present(const SamplingInputs& inputs, at::Device device, int64_t vocab) {
  const int64_t width = vocab + 1;
  if (pool_.defined()) {
    TORCH_CHECK(pool_.size(1) == width && pool_.device() == device, "sampler: penalty pool of ", pool_.sizes(), " on ",
                pool_.device(), " for a vocabulary of ", vocab, " on ", device);
  }
  if (!pool_.defined() || pool_.size(0) < inputs.penalty_capacity) {
    // Grows by doubling; the slots already in use keep their ids.
    const int64_t rows = std::max<int64_t>(inputs.penalty_capacity, pool_.defined() ? 2 * pool_.size(0) : 8);
    at::Tensor grown = at::zeros({rows, width}, at::TensorOptions().dtype(at::kBool).device(device));
    if (pool_.defined()) grown.narrow(0, 0, pool_.size(0)).copy_(pool_);
    pool_ = std::move(grown);
  }
  const at::Tensor slots = OnDevice(inputs.penalty_slots, device);
  if (inputs.penalty_resets.numel() > 0) pool_.index_fill_(0, OnDevice(inputs.penalty_resets, device), false);
  // Each row's new ids (padding and ids outside the vocabulary land in the last column), set in one
  // index_fill_ over the flattened pool.
  const at::Tensor ids = InVocabulary(inputs.penalty_tokens, device, vocab);
  pool_.view({-1}).index_fill_(0, (slots.unsqueeze(1) * width + ids).view({-1}), true);
  at::Tensor present = pool_.index_select(0, slots);
  if (inputs.penalty_pending.defined()) present.scatter_(1, InVocabulary(inputs.penalty_pending, device, vocab), true);
  return present.narrow(1, 0, vocab);
}

at::Tensor PenaltyPool::Counts(const SamplingInputs& inputs, at::Device device, int64_t vocab) {
  const int64_t width = vocab + 1;
  if (counts_.defined()) {
    TORCH_CHECK(counts_.size(1) == width && counts_.device() == device, "sampler: penalty counts of ", counts_.sizes(),
                " on ", counts_.device(), " for a vocabulary of ", vocab, " on ", device);
  }
  if (!counts_.defined() || counts_.size(0) < inputs.penalty_capacity) {
    const int64_t rows = std::max<int64_t>(inputs.penalty_capacity, counts_.defined() ? 2 * counts_.size(0) : 8);
    at::Tensor grown = at::zeros({rows, width}, at::TensorOptions().dtype(at::kFloat).device(device));
    if (counts_.defined()) grown.narrow(0, 0, counts_.size(0)).copy_(counts_);
    counts_ = std::move(grown);
  }
  const at::Tensor slots = OnDevice(inputs.penalty_slots, device);
  if (inputs.penalty_resets.numel() > 0) counts_.index_fill_(0, OnDevice(inputs.penalty_resets, device), 0);
  // index_add_ adds once per occurrence: an id generated twice in the ids sent counts twice. Padding and
  // ids outside the vocabulary count in the last column.
  const at::Tensor ids = InVocabulary(inputs.output_tokens, device, vocab);
  const at::Tensor flat = (slots.unsqueeze(1) * width + ids).view({-1});
  counts_.view({-1}).index_add_(0, flat, at::ones({flat.size(0)}, counts_.options()));
  // The empty slot 0 (rows without a penalty) collected their padding only in its last column.
  at::Tensor counts = counts_.index_select(0, slots);
  if (inputs.penalty_pending.defined()) {
    const at::Tensor pending = InVocabulary(inputs.penalty_pending, device, vocab);
    counts.scatter_add_(1, pending, at::ones(pending.sizes(), counts.options()));
  }
  return counts.narrow(1, 0, vocab);
}

SamplingInputs StageSamplingInputs(const std::vector<const BatchRow*>& rows, bool pinned, PenaltySlots* slots) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const at::TensorOptions host = at::TensorOptions().pinned_memory(pinned);
  SamplingInputs inputs;
  inputs.params = at::empty({n, kSamplingParams}, host.dtype(at::kDouble));
  double* params = inputs.params.data_ptr<double>();
  for (int64_t r = 0; r < n; ++r) {
    const BatchRow& row = *rows[r];
    const RowSampling& s = row.sampling;
    double* p = params + r * kSamplingParams;
    // Below the minimum a row is greedy (kMinSamplingTemperature): temperature 0 in what the device sees.
    const bool sampled = s.temperature >= kMinSamplingTemperature;
    p[kTemperature] = sampled ? s.temperature : 0;
    p[kTopK] = s.top_k;
    p[kTopP] = s.top_p;
    p[kPenalty] = s.repetition_penalty;
    p[kUniform] = s.uniform;
    p[kFrequency] = s.frequency_penalty;
    p[kPresence] = s.presence_penalty;
    inputs.greedy_only = inputs.greedy_only && !sampled;
    inputs.any_top_k = inputs.any_top_k || (sampled && s.top_k > 0);
    inputs.any_top_p = inputs.any_top_p || (sampled && s.top_p < 1);
    inputs.any_penalty = inputs.any_penalty || s.repetition_penalty != 1;
    inputs.any_output_penalty = inputs.any_output_penalty || s.frequency_penalty != 0 || s.presence_penalty != 0;
    inputs.any_bias = inputs.any_bias || !s.logit_bias.empty();
    inputs.row_top_logprobs.push_back(std::max<int32_t>(0, s.top_logprobs));
    inputs.allowed.push_back(s.allowed);
    inputs.any_allowed = inputs.any_allowed || s.allowed != nullptr;
    inputs.top_logprobs = std::max<int64_t>(inputs.top_logprobs, inputs.row_top_logprobs.back());
    inputs.any_draft = inputs.any_draft || (sampled && s.draft_token >= 0 && !s.draft_probs.empty());
    if (s.return_probs) inputs.probs_rows.push_back(r);
  }
  if (inputs.any_draft) StageDraft(rows, host, inputs);
  if (inputs.any_penalty || inputs.any_output_penalty) StagePenalty(rows, host, slots, inputs);
  if (inputs.any_bias) StageBias(rows, host, inputs);
  return inputs;
}

at::Tensor AllowedLogits(const at::Tensor& logits, const SamplingInputs& inputs, bool device_ops) {
  return Masked(logits, inputs, device_ops);
}

at::Tensor ProcessedScores(const at::Tensor& logits, const SamplingInputs& inputs, PenaltyPool* pool) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) == inputs.rows(), "sampler: logits ", logits.sizes(), " for ",
              inputs.rows(), " sampling rows");
  at::Tensor params = OnDevice(inputs.params, logits.device());
  at::Tensor scores = Penalised(Masked(logits, inputs), inputs, params, pool);
  return inputs.greedy_only ? scores : Warped(scores, inputs, params);
}

PendingSamples SampleAsync(const at::Tensor& logits, const SamplingInputs& inputs, PenaltyPool* pool) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(0) == inputs.rows(), "sampler: logits ", logits.sizes(), " for ",
              inputs.rows(), " sampling rows");
  at::Tensor params = OnDevice(inputs.params, logits.device());
  const at::Tensor masked = Masked(logits, inputs);
  at::Tensor scores = Penalised(masked, inputs, params, pool);
  at::Tensor ids;
  if (inputs.greedy_only) {
    ids = at::argmax(scores, 1, /*keepdim=*/true);
  } else {
    scores = Warped(scores, inputs, params);
    ids = Choose(scores, params);
    if (inputs.any_draft) ids = Rejected(scores, ids, inputs, params);
  }
  at::Tensor probs;
  if (!inputs.probs_rows.empty()) probs = ReturnedProbs(scores, ids, inputs, params);
  PendingSamples pending = PackAsync(ids, at::log_softmax(masked, 1), inputs.top_logprobs, probs);
  pending.ids = ids.reshape({-1}).to(at::kLong);
  return pending;
}

std::vector<GeneratedToken> FinishSamples(PendingSamples& pending, const SamplingInputs& inputs,
                                          std::vector<std::vector<float>>* probs) {
  std::vector<GeneratedToken> tokens = Unpack(pending, inputs.row_top_logprobs);
  if (probs != nullptr && pending.probs.defined()) {
    const int64_t rows = pending.probs.size(0);
    const int64_t vocab = pending.probs.size(1);
    const float* data = pending.probs.data_ptr<float>();
    probs->clear();
    for (int64_t r = 0; r < rows; ++r) probs->emplace_back(data + r * vocab, data + (r + 1) * vocab);
  }
  return tokens;
}

PendingSamples ScoreAsync(const at::Tensor& logits, const at::Tensor& targets, int64_t top) {
  TORCH_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0), "sampler: logits ",
              logits.sizes(), " for ", targets.size(0), " prompt targets");
  return PackAsync(OnDevice(targets, logits.device()).unsqueeze(1), at::log_softmax(logits, 1), top);
}

std::vector<GeneratedToken> FinishScores(PendingSamples& pending, const std::vector<int32_t>& row_top) {
  return Unpack(pending, row_top);
}

PendingSamples IdsToHostAsync(const at::Tensor& ids) {
  PendingSamples pending;
  const at::Device device = ids.device();
  if (device.is_cpu()) {
    pending.host = ids.contiguous();
    return pending;
  }
  pending.host = at::empty(ids.sizes(), at::TensorOptions().dtype(ids.scalar_type()).pinned_memory(device.is_cuda()));
  pending.host.copy_(ids, /*non_blocking=*/true);
  pending.ready.emplace(device.type());
  pending.ready->record(CurrentStream(device));
  return pending;
}

}  // namespace strata::runtime
