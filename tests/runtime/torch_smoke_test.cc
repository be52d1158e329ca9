// Proves the LibTorch link: the wheel's libraries load, a tensor computes, and the CUDA query answers.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <iostream>

#include "runtime/executor/torch_info.h"

namespace strata::runtime {
namespace {

TEST(TorchSmoke, CreatesAndAddsATensorOnCpu) {
  at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor b = at::add(a, a);
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_FLOAT_EQ(b[1][2].item<float>(), 10.0f);
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
