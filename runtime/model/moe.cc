#include "runtime/model/moe.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/_grouped_mm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/index.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/model/linear.h"
#include "runtime/model/pointwise.h"
#include "runtime/model/quantized_linear.h"

namespace strata::runtime {

namespace {

// The top-k weights and expert ids of each token [N, k], on the layer's device.
std::pair<at::Tensor, at::Tensor> Route(const at::Tensor& flat, const at::Tensor& router, const planner::MoeConfig& moe,
                                        const at::Tensor& correction_bias, const at::Tensor& router_bias) {
  const int64_t k = moe.top_k;
  if (moe.router == planner::MoeConfig::Router::kTopkSoftmax) {
    // gpt-oss (GptOssTopKRouter): the top k of the logits (with the router's bias), softmax over them, in their dtype.
    at::Tensor logits = Linear(flat, router, router_bias);  // [N, E]
    auto [top_logits, top_ids] = at::topk(logits, k, -1);
    return {at::softmax(top_logits, -1), top_ids};
  }
  if (moe.router == planner::MoeConfig::Router::kSoftmax) {
    at::Tensor logits = Linear(flat, router);                // [N, E]
    at::Tensor probs = at::softmax(logits, -1, at::kFloat);  // softmax(dtype=float)
    auto [top_weights, top_ids] = at::topk(probs, k, -1);    // [N, k]
    if (moe.norm_topk_prob) top_weights = top_weights / top_weights.sum(-1, /*keepdim=*/true);
    if (!moe.weights_in_float32) top_weights = top_weights.to(logits.scalar_type());
    return {top_weights, top_ids};
  }
  if (moe.router == planner::MoeConfig::Router::kSigmoid) {
    // MiniMax-M2 (MiniMaxM2TopKRouter): logits in the weights' dtype, sigmoid in float32, the top k of the scores plus
    // the correction bias, their unbiased scores renormalised.
    at::Tensor scores = Linear(flat.to(router.scalar_type()), router).to(at::kFloat).sigmoid();  // [N, E]
    at::Tensor top_ids =
        std::get<1>(at::topk(scores + correction_bias.to(at::kFloat), k, -1, /*largest=*/true, /*sorted=*/false));
    at::Tensor top_weights = scores.gather(1, top_ids);
    return {top_weights / top_weights.sum(-1, /*keepdim=*/true), top_ids};
  }
  // DeepSeekMoE (transformers' DeepseekV3TopkRouter), in float32: sigmoid scores; the biased scores pick the
  // topk_group groups (a group's score: the sum of its two best) and, among their experts, the top k; the weights
  // are the unbiased scores of those, renormalised (norm_topk_prob) and scaled by routed_scaling_factor.
  const int64_t tokens = flat.size(0), experts = router.size(0), groups = moe.n_group;
  at::Tensor scores = at::linear(flat.to(at::kFloat), router.to(at::kFloat)).sigmoid();  // [N, E]
  at::Tensor choice = scores + correction_bias.to(at::kFloat);
  at::Tensor group_scores = std::get<0>(choice.view({tokens, groups, experts / groups}).topk(2, -1)).sum(-1);  // [N, G]
  at::Tensor group_ids = std::get<1>(at::topk(group_scores, moe.topk_group, -1, /*largest=*/true, /*sorted=*/false));
  at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, group_ids, 1);
  at::Tensor expert_mask =
      group_mask.unsqueeze(-1).expand({tokens, groups, experts / groups}).reshape({tokens, experts});
  choice = choice.masked_fill(expert_mask.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor top_ids = std::get<1>(at::topk(choice, k, -1, /*largest=*/true, /*sorted=*/false));
  at::Tensor top_weights = scores.gather(1, top_ids);
  if (moe.norm_topk_prob) top_weights = top_weights / (top_weights.sum(-1, /*keepdim=*/true) + 1e-20);
  return {top_weights * moe.routed_scaling_factor, top_ids};
}

// act(gate) x up of the experts' gate and up projections, as moe.activation says.
at::Tensor GatedActivation(const at::Tensor& gate, const at::Tensor& up, const planner::MoeConfig& moe) {
  if (moe.activation == planner::MoeConfig::Activation::kSiluGlu) return SiluMul(gate, up);
  // GptOssExperts._apply_gate: gate clamped above, up to +-limit, (up + 1) x gate x sigmoid(alpha x gate).
  if (FusedPointwiseApplies(gate, up) && gate.sizes() == up.sizes()) {
    return FusedClampedSwiglu(gate, up, moe.swiglu_limit, moe.swiglu_alpha);
  }
  const at::Tensor g = gate.clamp_max(moe.swiglu_limit);
  const at::Tensor u = up.clamp(-moe.swiglu_limit, moe.swiglu_limit);
  return (u + 1) * (g * at::sigmoid(g * moe.swiglu_alpha));
}

// The experts' biases (gpt-oss): rows' expert ids -> each row's bias; undefined when the experts have none.
at::Tensor RowBias(const at::Tensor& bias, const at::Tensor& ids) {
  return bias.defined() ? bias.index_select(0, ids.to(at::kLong)) : at::Tensor();
}

at::Tensor AddBias(const at::Tensor& x, const at::Tensor& bias) { return bias.defined() ? x + bias : x; }

}  // namespace

at::Tensor SparseMoe(const at::Tensor& hidden, const at::Tensor& router, const std::vector<Weight>& all_weights,
                     const planner::MoeConfig& moe, const at::Tensor& correction_bias, const at::Tensor& router_bias) {
  // gpt-oss's experts end with their biases {gate_up_bias [E, 2I] (gate columns, then up), down_bias [E, H]}.
  const bool biased = moe.activation == planner::MoeConfig::Activation::kClampedSwiglu;
  const std::vector<Weight> weights(all_weights.begin(), all_weights.end() - (biased ? 2 : 0));
  at::Tensor gate_up_bias, down_bias;
  if (biased) {
    gate_up_bias = all_weights[all_weights.size() - 2].stored;
    down_bias = all_weights.back().stored;
  }
  // Fused dense experts are two weights; per-expert ones (packed, or "disk" views of the file) three per expert.
  const bool per_expert = weights.size() != 2;
  const int64_t h = hidden.size(-1);
  const int64_t k = moe.top_k;
  const int64_t experts = per_expert ? static_cast<int64_t>(weights.size() / 3) : weights.at(0).stored.size(0);
  const at::Tensor flat = hidden.reshape({-1, h});
  const int64_t tokens = flat.size(0);

  // Routing, on the layer's device.
  auto [top_weights, top_ids] = Route(flat, router, moe, correction_bias, router_bias);

  // Pairs sorted by expert; each expert's rows are contiguous, its group ending at offsets[e].
  at::Tensor pair_experts = top_ids.reshape({-1});  // [N * k]
  auto [sorted_experts, order] = at::sort(pair_experts);
  at::Tensor rows = flat.index_select(0, order.div(k, "floor"));  // [S, H]
  at::Tensor pair_weights = top_weights.reshape({-1}).index_select(0, order);
  at::Tensor counts = at::histc(sorted_experts.to(at::kFloat), experts, 0, static_cast<double>(experts - 1));
  at::Tensor offsets = counts.cumsum(0, at::kInt);

  // The experts, on their device: only the routed rows travel.
  const at::Device home = hidden.device();
  const at::Device there = weights.front().exec_device;
  if (there != home && there.is_cpu()) {
    // Into pinned memory on the layer's stream, then wait for that copy alone.
    rows = rows.to(there, /*non_blocking=*/true);
    offsets = offsets.to(there, /*non_blocking=*/true);
    sorted_experts = sorted_experts.to(there, /*non_blocking=*/true);
    c10::Event copied(home.type());
    copied.record(c10::impl::getDeviceGuardImpl(home.type())->getStream(home));
    copied.synchronize();
  } else if (there != home) {
    rows = rows.to(there, /*non_blocking=*/true);
    offsets = offsets.to(there, /*non_blocking=*/true);
    sorted_experts = sorted_experts.to(there, /*non_blocking=*/true);
  }
  at::Tensor out;
  if (per_expert || there.is_cpu()) {
    // Each expert's routed rows through its three projections: packed (the kernels read the packed bytes), "disk"
    // views of the file (paged in, and cast, as they are used), or fused CPU experts' slices. The group sizes are read
    // on the host (as LibTorch's grouped matmul does off CUDA's SM80+ path).
    const at::Tensor ends = offsets.to(at::kCPU);
    const int32_t* end = ends.data_ptr<int32_t>();
    std::vector<at::Tensor> parts;
    for (int64_t e = 0, begin = 0; e < experts; begin = end[e], ++e) {
      if (end[e] == begin) continue;
      const at::Tensor x = rows.narrow(0, begin, end[e] - begin);
      if (biased) {
        // gpt-oss: each projection with its expert's bias, the clamped SwiGLU between.
        const int64_t inter = gate_up_bias.size(-1) / 2;
        const at::Tensor b = gate_up_bias.select(0, e);
        at::Tensor gate, up, down;
        if (per_expert) {
          gate = Linear(x, weights[3 * e].Use(), b.narrow(0, 0, inter));
          up = Linear(x, weights[3 * e + 1].Use(), b.narrow(0, inter, inter));
          parts.push_back(Linear(GatedActivation(gate, up, moe), weights[3 * e + 2].Use(), down_bias.select(0, e)));
        } else {
          const at::Tensor gate_up = weights[0].stored.select(0, e);
          gate = Linear(x, gate_up.narrow(0, 0, inter), b.narrow(0, 0, inter));
          up = Linear(x, gate_up.narrow(0, inter, inter), b.narrow(0, inter, inter));
          parts.push_back(
              Linear(GatedActivation(gate, up, moe), weights[1].stored.select(0, e), down_bias.select(0, e)));
        }
        continue;
      }
      if (!per_expert) {
        // Fused experts on the CPU: each expert's rows through row views of its slices, on Linear's kernels (few rows:
        // streamed once). LibTorch's CPU grouped matmul made each projection's transposed experts contiguous, a copy
        // of every expert of the layer per step (a 171M DeepSeek-V3-shaped model decoded at half speed on 2 threads).
        const at::Tensor gate_up = weights[0].stored.select(0, e);
        const int64_t inter = weights[1].stored.size(-1);
        parts.push_back(
            Linear(SiluMul(Linear(x, gate_up.narrow(0, 0, inter)), Linear(x, gate_up.narrow(0, inter, inter))),
                   weights[1].stored.select(0, e)));
        continue;
      }
      const WeightTensor gate = weights[3 * e].Use();
      const WeightTensor up = weights[3 * e + 1].Use();
      const WeightTensor down = weights[3 * e + 2].Use();
      parts.push_back(Linear(SiluMul(Linear(x, gate), Linear(x, up)), down));
    }
    out = parts.size() == 1 ? parts.front() : at::cat(parts, 0);  // [S, H], in expert order as `rows`
  } else {
    const at::Tensor& gate_up = weights.at(0).stored;
    const at::Tensor& down = weights.at(1).stored;
    // On CUDA, LibTorch's grouped matmul is sync-free for bfloat16 (SM90+); other dtypes take the padded form while
    // it fits (decode and short chunks), so that the group sizes stay on the device.
    const int64_t widest = std::max(gate_up.size(1), down.size(1));
    const bool padded = there.is_cuda() && gate_up.scalar_type() != at::kBFloat16 &&
                        experts * tokens * widest * static_cast<int64_t>(gate_up.element_size()) <= kPaddedExpertsBytes;
    if (biased) {
      // gpt-oss on a GPU: the grouped products with each row's expert bias added (a gather of the bias rows).
      const int64_t inter = down.size(-1);
      at::Tensor projected = at::_grouped_mm(rows.to(gate_up.scalar_type()), gate_up.transpose(-2, -1), offsets);
      projected = AddBias(projected, RowBias(gate_up_bias, sorted_experts));
      const at::Tensor activated =
          GatedActivation(projected.narrow(-1, 0, inter), projected.narrow(-1, inter, inter), moe);
      out = AddBias(at::_grouped_mm(activated, down.transpose(-2, -1), offsets), RowBias(down_bias, sorted_experts));
    } else {
      out = padded ? PaddedExpertsMlp(rows, sorted_experts, offsets, gate_up, down, tokens)
                   : GroupedExpertsMlp(rows, offsets, gate_up, down);  // [S, H]
    }
  }
  if (there != home) {
    // From pinned memory when the experts ran on the CPU: an asynchronous copy on the layer's stream.
    if (out.is_cpu() && home.is_cuda()) out = out.pin_memory();
    out = out.to(home, /*non_blocking=*/true);
  }

  // Weighted, back in (token, choice) order, summed over the k choices.
  at::Tensor weighted = out * pair_weights.unsqueeze(-1);
  at::Tensor inverse = at::empty_like(order);
  inverse.index_put_({order}, at::arange(order.size(0), order.options()));
  weighted = weighted.index_select(0, inverse);
  return weighted.view({tokens, k, h}).sum(1).to(hidden.scalar_type()).view(hidden.sizes());
}

at::Tensor GroupedExpertsMlp(const at::Tensor& rows, const at::Tensor& offsets, const at::Tensor& gate_up,
                             const at::Tensor& down) {
  const int64_t inter = down.size(-1);
  at::Tensor projected = at::_grouped_mm(rows.to(gate_up.scalar_type()), gate_up.transpose(-2, -1), offsets);
  at::Tensor activated = at::silu(projected.narrow(-1, 0, inter)) * projected.narrow(-1, inter, inter);
  return at::_grouped_mm(activated, down.transpose(-2, -1), offsets);
}

at::Tensor PaddedExpertsMlp(const at::Tensor& rows, const at::Tensor& sorted_experts, const at::Tensor& offsets,
                            const at::Tensor& gate_up, const at::Tensor& down, int64_t tokens) {
  const int64_t experts = gate_up.size(0);
  const int64_t inter = down.size(-1);
  // Row i (sorted by expert) is row i - start(expert) of its expert's group.
  const at::Tensor ids = sorted_experts.to(at::kLong);
  const at::Tensor ends = offsets.to(at::kLong);
  const at::Tensor starts = at::cat({at::zeros({1}, ends.options()), ends.narrow(0, 0, experts - 1)});
  const at::Tensor position = at::arange(rows.size(0), ids.options()) - starts.index_select(0, ids);
  at::Tensor padded = at::zeros({experts, tokens, rows.size(1)}, rows.options().dtype(gate_up.scalar_type()));
  padded.index_put_({ids, position}, rows.to(gate_up.scalar_type()));
  at::Tensor projected = at::bmm(padded, gate_up.transpose(1, 2));  // [E, tokens, 2I]
  at::Tensor activated = at::silu(projected.narrow(-1, 0, inter)) * projected.narrow(-1, inter, inter);
  at::Tensor result = at::bmm(activated, down.transpose(1, 2));  // [E, tokens, H]
  return result.index({ids, position});
}

namespace {

// gpt-oss's dense experts, stored as the tree has them (x @ W: gate_up_proj [E, H, 2I] with gate column j at 2j and
// up column j at 2j + 1; down_proj [E, I, H]): read through views of the file and copied, transposed and
// de-interleaved, into strata's fused layout {gate_up [E, 2I, H] (gate rows, then up rows), down [E, H, I]}, then
// the biases {gate_up_bias [E, 2I] in the same order, down_bias [E, H]}.
absl::StatusOr<std::vector<Weight>> LoadFusedInterleavedExperts(WeightLoader& loader,
                                                                const planner::ExpertsStorage& storage,
                                                                at::Device device, bool mxfp4) {
  const int64_t experts = storage.num_experts, inter = storage.intermediate, hidden = storage.hidden;
  std::vector<Weight> out;
  if (mxfp4) {
    // MXFP4 (gate_up_proj_blocks [E, 2I, H / 32, 16]: rows, not columns, interleaved): three packed projections per
    // expert, as other packed experts (moe.h), then the biases below.
    const std::string prefix = storage.stored_prefix + ".";
    absl::StatusOr<std::vector<PackedLinear>> gate =
        LoadMxfp4Experts(loader.checkpoint(), prefix + "gate_up_proj", experts, 2 * inter, hidden, 0, 2, device);
    if (!gate.ok()) return gate.status();
    absl::StatusOr<std::vector<PackedLinear>> up =
        LoadMxfp4Experts(loader.checkpoint(), prefix + "gate_up_proj", experts, 2 * inter, hidden, 1, 2, device);
    if (!up.ok()) return up.status();
    absl::StatusOr<std::vector<PackedLinear>> down =
        LoadMxfp4Experts(loader.checkpoint(), prefix + "down_proj", experts, hidden, inter, 0, 1, device);
    if (!down.ok()) return down.status();
    for (int64_t e = 0; e < experts; ++e) {
      for (auto [part, packed] :
           {std::pair{"gate", &(*gate)[e]}, std::pair{"up", &(*up)[e]}, std::pair{"down", &(*down)[e]}}) {
        loader.CountPacked(static_cast<uint64_t>(packed->bytes()));
        Weight w;
        w.name = absl::StrCat(storage.module, ".", e, ".", part);
        w.packed = std::make_shared<const PackedLinear>(std::move(*packed));
        w.residency = Residency::kResident;
        w.exec_device = device;
        w.dtype = loader.dtype();
        out.push_back(std::move(w));
      }
    }
  }
  auto mapped = [&](const char* local) -> absl::StatusOr<at::Tensor> {
    absl::StatusOr<Weight> w = loader.Load(absl::StrCat(storage.stored_prefix, ".", local), Residency::kDisk, device);
    if (!w.ok()) return w.status();
    return w->stored;
  };
  if (!mxfp4) {
    absl::StatusOr<at::Tensor> gate_up = mapped("gate_up_proj");
    if (!gate_up.ok()) return gate_up.status();
    absl::StatusOr<at::Tensor> down = mapped("down_proj");
    if (!down.ok()) return down.status();
    out.resize(2);
    out[0].name = storage.module + ".gate_up_proj";
    out[0].stored = loader.Empty({experts, 2 * inter, hidden}, device);
    // [E, H, 2I] -> [E, 2I, H] -> [E, I, 2, H] -> [E, 2, I, H]: gate rows, then up rows.
    out[0]
        .stored.view({experts, 2, inter, hidden})
        .copy_(gate_up->transpose(1, 2).unflatten(1, {inter, 2}).transpose(1, 2));
    out[1].name = storage.module + ".down_proj";
    out[1].stored = loader.Empty({experts, hidden, inter}, device);
    out[1].stored.copy_(down->transpose(1, 2));
  }
  absl::StatusOr<at::Tensor> gate_up_bias = mapped("gate_up_proj_bias");
  if (!gate_up_bias.ok()) return gate_up_bias.status();
  absl::StatusOr<at::Tensor> down_bias = mapped("down_proj_bias");
  if (!down_bias.ok()) return down_bias.status();
  Weight up_bias, down_b;
  up_bias.name = storage.module + ".gate_up_proj_bias";
  up_bias.stored = loader.Empty({experts, 2 * inter}, device);
  up_bias.stored.view({experts, 2, inter}).copy_(gate_up_bias->unflatten(1, {inter, 2}).transpose(1, 2));
  down_b.name = storage.module + ".down_proj_bias";
  down_b.stored = loader.Empty({experts, hidden}, device);
  down_b.stored.copy_(*down_bias);
  out.push_back(std::move(up_bias));
  out.push_back(std::move(down_b));
  for (Weight& w : out) {
    if (w.packed != nullptr) continue;
    w.residency = Residency::kResident;
    w.exec_device = device;
    w.dtype = w.stored.scalar_type();
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Weight>> LoadExperts(WeightLoader& loader, const planner::ExpertsStorage& storage,
                                                at::Device device, const planner::SpecQuantization* quantized,
                                                bool on_disk) {
  auto packed_of = [&](const std::string& name) -> const planner::QuantizedLinear* {
    if (quantized == nullptr) return nullptr;
    auto it = quantized->linears.find(name);
    return it == quantized->linears.end() ? nullptr : &it->second;
  };
  if (packed_of(absl::StrCat(storage.stored_prefix, ".0.", storage.gate)) != nullptr) {
    std::vector<Weight> out;
    for (int64_t e = 0; e < storage.num_experts; ++e) {
      for (const std::string* part : {&storage.gate, &storage.up, &storage.down}) {
        const std::string name = absl::StrCat(storage.stored_prefix, ".", e, ".", *part);
        const planner::QuantizedLinear* q = packed_of(name);
        if (q == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat("checkpoint: expert tensor ", name, " is not quantized while expert 0's are"));
        }
        absl::StatusOr<Weight> w = loader.LoadPacked(name, *q, Residency::kResident, device);
        if (!w.ok()) return w.status();
        out.push_back(*std::move(w));
      }
    }
    return out;
  }
  if (storage.fused_interleaved) {
    const bool mxfp4 = quantized != nullptr &&
                       std::find(quantized->mxfp4_experts.begin(), quantized->mxfp4_experts.end(), storage.module) !=
                           quantized->mxfp4_experts.end();
    return LoadFusedInterleavedExperts(loader, storage, device, mxfp4);
  }
  if (on_disk) {
    // "disk" experts stay in the file: three views per expert, never fused (fusing would copy them into memory).
    std::vector<Weight> out;
    for (int64_t e = 0; e < storage.num_experts; ++e) {
      for (const std::string* part : {&storage.gate, &storage.up, &storage.down}) {
        absl::StatusOr<Weight> w =
            loader.Load(absl::StrCat(storage.stored_prefix, ".", e, ".", *part), Residency::kDisk, device);
        if (!w.ok()) return w.status();
        out.push_back(*std::move(w));
      }
    }
    return out;
  }
  // The fused tensors are allocated once, on their device, and each expert's tensors are copied into their slices:
  // the layer's experts cost their own size while loading (stacking loaded copies cost up to 3x).
  const int64_t experts = storage.num_experts, inter = storage.intermediate, hidden = storage.hidden;
  std::vector<Weight> out(2);
  out[0].name = storage.module + ".gate_up_proj";
  out[0].stored = loader.Empty({experts, 2 * inter, hidden}, device);
  out[1].name = storage.module + ".down_proj";
  out[1].stored = loader.Empty({experts, hidden, inter}, device);
  for (int64_t e = 0; e < experts; ++e) {
    const std::string p = absl::StrCat(storage.stored_prefix, ".", e, ".");
    const at::Tensor gate_up = out[0].stored.select(0, e);
    if (absl::Status s = loader.LoadInto(p + storage.gate, gate_up.narrow(0, 0, inter)); !s.ok()) return s;
    if (absl::Status s = loader.LoadInto(p + storage.up, gate_up.narrow(0, inter, inter)); !s.ok()) return s;
    if (absl::Status s = loader.LoadInto(p + storage.down, out[1].stored.select(0, e)); !s.ok()) return s;
  }
  for (Weight& w : out) {
    w.residency = Residency::kResident;
    w.exec_device = device;
    w.dtype = w.stored.scalar_type();
  }
  return out;
}

}  // namespace strata::runtime
