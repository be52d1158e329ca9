#pragma once
// Internal (ATen): DeepSeek-V3's multi-token-prediction layer (GLM-4.5's is the same) as a one-token proposer (vLLM's
// DeepSeekMultiTokenPredictorLayer, SGLang's DeepseekV3ForCausalLMNextN). At position p it combines the model's hidden
// state there (the final norm's output, what the LM head reads) with the embedding of the token after p, and predicts
// the token after that one:
//
//   x = eh_proj(cat(enorm(embed(t[p + 1])), hnorm(h[p])))    (the embedding zero at position 0, as vLLM)
//   x = decoder_layer(x)                                    (the family's layer, over a KV pool of its own)
//   proposal[p] = argmax(lm_head(shared_head.norm(x)))       (DeepSeek shares the output head)
//
// The executor runs it on the last stage after sampling, so the token after a sampled position is the one chosen
// there (Pipeline::RunMtp).

#include <ATen/core/Tensor.h>

#include "runtime/model/weights.h"

namespace strata::runtime {

struct MtpWeights {
  WeightTensor embed, enorm, hnorm, eh_proj, head_norm, head;
};

// The decoder layer's input [1, n, hidden] for n packed tokens: `hidden` [n, hidden] (the final norm's output),
// `next` int64 [n] each token's next token, `positions` int64 [n] each token's position.
at::Tensor MtpLayerInput(const MtpWeights& w, const at::Tensor& hidden, const at::Tensor& next,
                         const at::Tensor& positions, double eps);

// The proposals of the decoder layer's output rows `out` [k, hidden]: int64 [k].
at::Tensor MtpProposals(const MtpWeights& w, const at::Tensor& out, double eps);

}  // namespace strata::runtime
