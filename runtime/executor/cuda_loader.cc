#include "runtime/executor/cuda_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace strata::runtime {

const CudaLoad& LoadCuda() {
  static std::once_flag once;
  static CudaLoad load;
  std::call_once(once, [] {
#ifndef STRATA_TORCH_CUDA_LIBRARY
    load.detail = "this LibTorch has no CUDA half";
#else
    load.built_with_cuda = true;
    const char* env = std::getenv("STRATA_CUDA");
    const std::string mode = env != nullptr ? env : "";
    if (mode == "0") {
      load.detail = "not loaded: STRATA_CUDA=0";
      return;
    }
    // The driver first: without it the CUDA half could load but never see a device. STRATA_CUDA=1 loads
    // it regardless (a driver found only later, or a check of the loading itself).
    if (void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); driver == nullptr && mode != "1") {
      const char* why = ::dlerror();
      load.detail = absl::StrCat("not loaded: no NVIDIA driver (", why != nullptr ? why : "libcuda.so.1", ")");
      return;
    }
    // Found like a linked library: through the executable's RUNPATH (the wheel's torch/lib).
    if (::dlopen(STRATA_TORCH_CUDA_LIBRARY, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* why = ::dlerror();
      load.failed = true;
      load.detail = absl::StrCat(mode == "1" ? "STRATA_CUDA=1" : "an NVIDIA driver is present", " but ",
                                 STRATA_TORCH_CUDA_LIBRARY,
                                 " did not load: ", why != nullptr ? why : "unknown error");
      return;
    }
    load.loaded = true;
    load.detail = absl::StrCat("loaded ", STRATA_TORCH_CUDA_LIBRARY);
#endif
  });
  return load;
}

namespace {
// Before main: LibTorch decides once, at the first use of its CUDA hooks, whether CUDA exists in this
// process ("if you try to call any CUDA functionality before libATen_cuda.so is loaded, CUDA is permanently
// disabled", ATen/detail/CUDAHooksInterface.cpp). Loading here, as the executable starts, puts every such use
// after it. Shared libraries (LibTorch's CPU half among them) are initialized before the executable.
[[maybe_unused]] const bool kLoadedAtStart = (LoadCuda(), true);
}  // namespace

}  // namespace strata::runtime
