#include "runtime/executor/torch_info.h"

#include <torch/cuda.h>
#include <torch/version.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
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
  info.cuda_version = STRATA_TORCH_CUDA_VERSION;
  return info;
}

namespace {
// 12080 -> "12.8", as cuDriverGetVersion and CUDART_VERSION encode versions.
std::string CudaVersionName(int version) { return absl::StrCat(version / 1000, ".", version % 1000 / 10); }
}  // namespace

absl::Status CheckTorchSeesTheGpus(int driver_gpus, int cuda_driver_version, const TorchInfo& torch) {
  if (driver_gpus == 0 || torch.cuda_device_count >= driver_gpus) return absl::OkStatus();
  std::string why;
  int major = 0;
  int minor = 0;
  if (!torch.built_with_cuda || torch.cuda_version.empty()) {
    why = absl::StrCat("this LibTorch (", torch.torch_version, ") was built without CUDA: install a CUDA torch wheel");
  } else if (std::sscanf(torch.cuda_version.c_str(), "%d.%d", &major, &minor) == 2 && cuda_driver_version > 0 &&
             cuda_driver_version < major * 1000 + minor * 10) {
    why = absl::StrCat("the NVIDIA driver supports CUDA up to ", CudaVersionName(cuda_driver_version),
                       ", and this LibTorch (", torch.torch_version, ") needs CUDA ", torch.cuda_version,
                       major >= 13 ? " (an R580 driver or newer)" : "",
                       ": update the driver, or install a torch wheel built for CUDA ",
                       CudaVersionName(cuda_driver_version), " or older");
  } else {
    why = absl::StrCat("driver CUDA ", cuda_driver_version > 0 ? CudaVersionName(cuda_driver_version) : "unknown",
                       ", LibTorch CUDA ", torch.cuda_version, "; CUDA: ", torch.cuda_load);
  }
  return absl::FailedPreconditionError(absl::StrCat("the CUDA driver sees ", driver_gpus, " GPU(s) but LibTorch sees ",
                                                    torch.cuda_device_count, ": ", why));
}

}  // namespace strata::runtime
