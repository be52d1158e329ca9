#include "runtime/executor/sampler.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>

#include <algorithm>
#include <limits>
#include <set>

namespace strata::runtime {
namespace {

void FillTop(const at::Tensor& logprobs, int64_t top_k, GreedyStep& step) {
  if (top_k <= 0) return;
  auto [values, indices] = at::topk(logprobs, std::min(top_k, logprobs.size(-1)), -1);
  at::Tensor v = values.to(at::kCPU, at::kDouble).contiguous();
  at::Tensor i = indices.to(at::kCPU).contiguous();
  const int64_t k = v.size(1);
  for (int64_t r = 0; r < logprobs.size(0); ++r) {
    step.top[r].clear();
    for (int64_t j = 0; j < k; ++j) {
      step.top[r].push_back({i.data_ptr<int64_t>()[r * k + j], v.data_ptr<double>()[r * k + j]});
    }
  }
}

// One row's processed scores [vocab] -> the chosen id.
int64_t ChooseOne(at::Tensor scores, const RowChoice& row) {
  if (row.repetition_penalty != 1.0 && row.context != nullptr && !row.context->empty()) {
    std::set<int64_t> unique(row.context->begin(), row.context->end());
    std::vector<int64_t> ids(unique.begin(), unique.end());
    at::Tensor index = at::from_blob(ids.data(), {static_cast<int64_t>(ids.size())}, at::kLong).to(scores.device());
    at::Tensor picked = scores.index_select(0, index);
    picked = at::where(picked < 0, picked * row.repetition_penalty, picked / row.repetition_penalty);
    scores = scores.clone();
    scores.index_put_({index}, picked);
  }
  if (row.temperature <= 0) return at::argmax(scores).item<int64_t>();
  scores = scores / static_cast<double>(row.temperature);
  const double negative_infinity = -std::numeric_limits<double>::infinity();
  const int64_t vocab = scores.size(0);
  if (row.top_k > 0 && row.top_k < vocab) {
    at::Tensor kth = std::get<0>(at::topk(scores, row.top_k)).select(0, row.top_k - 1);
    scores = at::where(scores < kth, at::full_like(scores, negative_infinity), scores);
  }
  if (row.top_p < 1.0) {
    // transformers' TopPLogitsWarper: sort ascending, drop tokens whose cumulative probability stays at
    // or below 1 - top_p, always keep the most likely one.
    auto [sorted, order] = at::sort(scores, /*dim=*/0, /*descending=*/false);
    at::Tensor cumulative = at::softmax(sorted, 0).cumsum(0);
    at::Tensor remove = cumulative <= (1.0 - row.top_p);
    remove.select(0, vocab - 1).fill_(false);
    at::Tensor removed = at::empty_like(remove).scatter_(0, order, remove);
    scores = at::where(removed, at::full_like(scores, negative_infinity), scores);
  }
  at::Tensor cdf = at::softmax(scores.to(at::kDouble), 0).cumsum(0).to(at::kCPU).contiguous();
  const double* c = cdf.data_ptr<double>();
  const double target = row.uniform * c[vocab - 1];
  int64_t id = std::upper_bound(c, c + vocab, target) - c;
  id = std::min(id, vocab - 1);
  // Never a token of probability zero (target landing on a flat end of the cdf).
  while (id > 0 && c[id] == c[id - 1]) --id;
  return id;
}

}  // namespace

GreedyStep SampleGreedy(const at::Tensor& logits, int64_t top_k) {
  at::Tensor logprobs = at::log_softmax(logits, -1);
  at::Tensor ids = at::argmax(logits, -1, /*keepdim=*/true);
  at::Tensor chosen = logprobs.gather(-1, ids);
  at::Tensor ids_cpu = ids.to(at::kCPU).contiguous();
  at::Tensor chosen_cpu = chosen.to(at::kCPU, at::kDouble).contiguous();
  const int64_t rows = logits.size(0);
  GreedyStep step;
  step.ids.resize(rows);
  step.logprobs.resize(rows);
  step.top.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    step.ids[r] = ids_cpu.data_ptr<int64_t>()[r];
    step.logprobs[r] = chosen_cpu.data_ptr<double>()[r];
  }
  FillTop(logprobs, top_k, step);
  return step;
}

GreedyStep SampleRows(const at::Tensor& logits, const std::vector<RowChoice>& rows) {
  int64_t top_k = 0;
  bool plain = true;  // every row greedy without penalty: one batched argmax
  for (const RowChoice& row : rows) {
    top_k = std::max(top_k, row.top_logprobs);
    plain = plain && row.temperature <= 0 && row.repetition_penalty == 1.0;
  }
  GreedyStep step = SampleGreedy(logits, top_k);
  if (!plain) {
    at::Tensor logprobs = at::log_softmax(logits, -1);
    std::vector<int64_t> ids = step.ids;
    for (size_t r = 0; r < rows.size(); ++r) {
      const RowChoice& row = rows[r];
      if (row.temperature <= 0 && row.repetition_penalty == 1.0) continue;
      ids[r] = ChooseOne(logits.select(0, static_cast<int64_t>(r)), row);
    }
    at::Tensor index = at::from_blob(ids.data(), {static_cast<int64_t>(ids.size()), 1}, at::kLong).to(logits.device());
    at::Tensor chosen = logprobs.gather(-1, index).to(at::kCPU, at::kDouble).contiguous();
    for (size_t r = 0; r < rows.size(); ++r) {
      step.ids[r] = ids[r];
      step.logprobs[r] = chosen.data_ptr<double>()[r];
    }
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    if (static_cast<int64_t>(step.top[r].size()) > rows[r].top_logprobs) step.top[r].resize(rows[r].top_logprobs);
  }
  return step;
}

SamplingInputs StageSamplingInputs(const std::vector<const BatchRow*>& rows, bool) {
  SamplingInputs inputs;
  for (const BatchRow* row : rows) {
    inputs.rows.push_back(row->sampling);
    inputs.contexts.push_back(row->context);
  }
  return inputs;
}

PendingSamples SampleAsync(const at::Tensor& logits, const SamplingInputs& inputs) {
  std::vector<RowChoice> choices;
  for (size_t r = 0; r < inputs.rows.size(); ++r) {
    const RowSampling& s = inputs.rows[r];
    RowChoice c;
    c.temperature = s.temperature;
    c.top_k = s.top_k;
    c.top_p = s.top_p;
    c.repetition_penalty = s.repetition_penalty;
    c.context = &inputs.contexts[r];
    c.uniform = s.uniform;
    c.top_logprobs = s.top_logprobs;
    choices.push_back(c);
  }
  GreedyStep step = SampleRows(logits, choices);
  PendingSamples pending;
  for (size_t r = 0; r < choices.size(); ++r) {
    SampledToken token{static_cast<int32_t>(step.ids[r]), step.logprobs[r], {}};
    for (const auto& [id, lp] : step.top[r]) token.top.push_back({static_cast<int32_t>(id), lp});
    pending.done.push_back(std::move(token));
  }
  return pending;
}

std::vector<SampledToken> FinishSamples(PendingSamples& pending, const SamplingInputs&) { return pending.done; }

}  // namespace strata::runtime
