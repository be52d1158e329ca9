#include "runtime/model/mtp.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding.h>

#include "runtime/model/linear.h"
#include "runtime/model/llama_model.h"

namespace strata::runtime {

at::Tensor MtpLayerInput(const MtpWeights& w, const at::Tensor& hidden, const at::Tensor& next,
                         const at::Tensor& positions, double eps) {
  // vLLM's order: the embedding first, then the hidden state.
  const at::Tensor embedded = at::embedding(w.embed, next) * (positions != 0).unsqueeze(1).to(hidden.scalar_type());
  const at::Tensor both = at::cat({RmsNorm(embedded, w.enorm, eps), RmsNorm(hidden, w.hnorm, eps)}, -1);
  return Linear(both.unsqueeze(0), w.eh_proj);
}

at::Tensor MtpProposals(const MtpWeights& w, const at::Tensor& out, double eps) {
  return at::argmax(Linear(RmsNorm(out, w.head_norm, eps).unsqueeze(1), w.head).select(1, 0), -1);
}

}  // namespace strata::runtime
