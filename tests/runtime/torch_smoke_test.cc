// Proves the LibTorch link: the wheel's libraries load, a tensor computes, and the CUDA query answers.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <iostream>

#include "runtime/executor/device_memory.h"
#include "runtime/executor/torch_info.h"

namespace strata::runtime {
namespace {

TEST(TorchSmoke, CreatesAndAddsATensorOnCpu) {
  at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor b = at::add(a, a);
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_FLOAT_EQ(b[1][2].item<float>(), 10.0f);
}

// device_memory.h's PageOutLibraryCode (LoadedModel::Load calls it for libtorch_cpu.so): LibTorch's read-only
// mappings are asked to leave the resident set and LibTorch runs on, its code faulted back in; a library that is not
// mapped is nothing.
TEST(TorchSmoke, LibTorchCodePagedOutRunsOn) {
  EXPECT_EQ(PageOutLibraryCode("no-such-library.so"), 0);
#ifdef MADV_PAGEOUT
  // Kernels before 5.4 refuse the advice (EINVAL): nothing is asked there.
  void* page = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  const bool supported = madvise(page, 4096, MADV_PAGEOUT) == 0;
  munmap(page, 4096);
  if (supported) {
    EXPECT_GT(PageOutLibraryCode("libtorch_cpu.so"), 0);
  }
#endif
  at::Tensor a = at::arange(6, at::kFloat);
  EXPECT_FLOAT_EQ(at::add(a, a)[5].item<float>(), 10.0f);
}

TEST(TorchSmoke, ReportsCudaAvailability) {
  TorchInfo info = QueryTorch();
  EXPECT_FALSE(info.torch_version.empty());
  std::cout << "LibTorch " << info.torch_version << ", built with CUDA: " << info.built_with_cuda
            << ", torch::cuda::is_available(): " << info.cuda_available << ", devices: " << info.cuda_device_count
            << "\n";
  if (!info.cuda_available) GTEST_SKIP() << "no CUDA device here; the CUDA half of this test runs on a GPU machine";
  at::Tensor t = at::ones({4}, at::TensorOptions().device(at::kCUDA));
  EXPECT_FLOAT_EQ(t.sum().item<float>(), 4.0f);
}

}  // namespace
}  // namespace strata::runtime

namespace strata::runtime {
namespace {

// The driver sees GPUs, LibTorch does not (issue 25, item 7): the message says which versions and what to do.
TEST(TorchSeesTheGpus, ADriverOlderThanTheWheelsCudaIsNamedWithBothVersions) {
  TorchInfo torch;
  torch.torch_version = "2.15.0";
  torch.built_with_cuda = true;
  torch.cuda_version = "13.2";
  torch.cuda_device_count = 0;
  const absl::Status s = CheckTorchSeesTheGpus(8, 12080, torch);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"the CUDA driver sees 8 GPU(s) but LibTorch sees 0", "supports CUDA up to 12.8",
                           "needs CUDA 13.2", "R580", "update the driver", "built for CUDA 12.8 or older"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
  }
}

TEST(TorchSeesTheGpus, ACpuBuildAndOtherCausesAreNamed) {
  TorchInfo cpu;
  cpu.torch_version = "2.15.0";
  EXPECT_NE(CheckTorchSeesTheGpus(2, 13020, cpu).message().find("built without CUDA"), std::string::npos);
  TorchInfo torch;
  torch.built_with_cuda = true;
  torch.cuda_version = "13.2";
  torch.cuda_device_count = 1;
  torch.cuda_load = "loaded libtorch_cuda.so";
  const absl::Status s = CheckTorchSeesTheGpus(2, 13020, torch);  // a new enough driver: another cause
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("driver CUDA 13.2, LibTorch CUDA 13.2"), std::string::npos) << s.message();
}

TEST(TorchSeesTheGpus, AgreeingCountsAndNoGpusAreFine) {
  TorchInfo torch;
  torch.built_with_cuda = true;
  torch.cuda_version = "13.2";
  torch.cuda_device_count = 2;
  EXPECT_TRUE(CheckTorchSeesTheGpus(2, 13020, torch).ok());
  EXPECT_TRUE(CheckTorchSeesTheGpus(0, 0, TorchInfo{}).ok());
  // The wheel this build links: its CUDA version is recorded (empty for a CPU wheel).
  EXPECT_EQ(QueryTorch().cuda_version.empty(), !QueryTorch().built_with_cuda);
}

}  // namespace
}  // namespace strata::runtime
