#include "runtime/executor/torch_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include "runtime/executor/cuda_loader.h"

namespace strata::runtime {

TorchInfo QueryTorch() {
  TorchInfo info;
  info.torch_version = TORCH_VERSION;
  const CudaLoad& cuda = LoadCuda();
  info.built_with_cuda = cuda.built_with_cuda;
  info.cuda_load = cuda.detail;
  info.cuda_load_failed = cuda.failed;
  // With no driver or no GPU this is simply false; it does not throw.
  info.cuda_available = torch::cuda::is_available();
  info.cuda_device_count = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
  return info;
}

}  // namespace strata::runtime
