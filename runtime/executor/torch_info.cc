#include "runtime/executor/torch_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

namespace strata::runtime {

TorchInfo QueryTorch() {
  TorchInfo info;
  info.torch_version = TORCH_VERSION;
#ifdef STRATA_TORCH_CUDA
  info.built_with_cuda = true;
#endif
  // With no driver or no GPU this is simply false; it does not throw.
  info.cuda_available = torch::cuda::is_available();
  info.cuda_device_count = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
  return info;
}

}  // namespace strata::runtime
