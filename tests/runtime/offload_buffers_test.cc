// OffloadBuffers (weights.h), the persistent slots offloaded units' weights are copied into before use, on the CPU:
// the path a "disk" entry served in another dtype takes there, and the one a GPU stage takes with streams and events
// (whose ordering only a GPU can show: tests/runtime_parity/test_cuda_parity.py's offload plans, scripts/gpu-check.sh).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "runtime/model/weights.h"
#include "tests/runtime/counting_allocator.h"

namespace strata::runtime {
namespace {

// A "disk" weight in bfloat16 served in float32: fetched (and cast) on every use.
Weight OnDisk(const std::string& name, std::vector<int64_t> shape) {
  Weight w;
  w.name = name;
  w.stored = at::randn(shape).to(at::kBFloat16);
  w.residency = Residency::kDisk;
  w.exec_device = at::kCPU;
  w.dtype = at::kFloat;
  return w;
}

bool Inside(const at::Tensor& t, const at::Tensor& buffer) {
  const auto* begin = static_cast<const uint8_t*>(buffer.data_ptr());
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return p >= begin && p + t.nbytes() <= begin + buffer.nbytes();
}

TEST(OffloadBuffers, UnitsAlternateBetweenTwoSlotsWithNoAllocationPerUse) {
  // Four units of different sizes, each with a resident weight beside its fetched ones.
  std::vector<std::vector<Weight>> units;
  for (int u = 0; u < 4; ++u) {
    std::vector<Weight> weights;
    weights.push_back(OnDisk("w" + std::to_string(u), {64 + 32 * u, 48}));
    Weight resident;
    resident.name = "norm";
    resident.stored = at::ones({48});
    weights.push_back(resident);
    weights.push_back(OnDisk("b" + std::to_string(u), {7, 3 + u}));
    units.push_back(std::move(weights));
  }
  auto pointers = [](const std::vector<Weight>& weights) {
    std::vector<const Weight*> out;
    for (const Weight& w : weights) out.push_back(&w);
    return out;
  };
  int64_t largest = 0;
  for (const auto& unit : units) largest = std::max(largest, OffloadBuffers::SlotBytes(pointers(unit)));
  // The largest unit: [160, 48] and [7, 6] float32, each aligned to 256 bytes; the resident weight takes nothing.
  EXPECT_EQ(largest, 160 * 48 * 4 + 256);
  OffloadBuffers buffers(at::kCPU, largest);
  EXPECT_EQ(buffers.bytes(), 2 * largest);

  for (int round = 0; round < 3; ++round) {
    int64_t allocations = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      const std::vector<const Weight*> weights = pointers(units[u]);
      int slot = 0;
      std::vector<WeightTensor> got;
      {
        Measure measure;
        slot = buffers.Fill(weights, std::nullopt);
        got = buffers.Take(slot, std::nullopt);
        allocations += measure.allocations();
      }
      EXPECT_EQ(slot, static_cast<int>(u % 2)) << "unit " << u;
      ASSERT_EQ(got.size(), 3u);
      for (size_t i : {size_t{0}, size_t{2}}) {
        EXPECT_TRUE(Inside(got[i].tensor, buffers.slot_buffer(slot))) << "unit " << u << " weight " << i;
        EXPECT_EQ(got[i].tensor.scalar_type(), at::kFloat);
        EXPECT_TRUE(at::equal(got[i].tensor, units[u][i].stored.to(at::kFloat))) << "unit " << u << " weight " << i;
      }
      // The resident weight is the stored tensor itself.
      EXPECT_EQ(got[1].tensor.data_ptr(), units[u][1].stored.data_ptr());
      buffers.Release(slot, std::nullopt);
    }
    // Copies into the slots, casts included, allocate nothing (the per-use path allocated every weight).
    EXPECT_EQ(allocations, 0) << "round " << round;
  }
}

TEST(OffloadBuffers, AWeightLargerThanItsSlotIsAnErrorNotAnOverrun) {
  Weight big = OnDisk("big", {64, 64});
  OffloadBuffers buffers(at::kCPU, 1024);
  EXPECT_THROW(buffers.Fill({&big}, std::nullopt), c10::Error);
}

}  // namespace
}  // namespace strata::runtime
