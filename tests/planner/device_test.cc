#include "planner/device.h"

#include <gtest/gtest.h>

namespace strata::planner {
namespace {

TEST(ParseMemorySize, ReadsUnitsAsAccelerateDoes) {
  EXPECT_EQ(*ParseMemorySize("20GiB"), 21474836480);
  EXPECT_EQ(*ParseMemorySize("1.5GiB"), 1610612736);
  EXPECT_EQ(*ParseMemorySize("512MiB"), 536870912);
  EXPECT_EQ(*ParseMemorySize("3KiB"), 3072);
  EXPECT_EQ(*ParseMemorySize("20GB"), 20000000000);
  EXPECT_EQ(*ParseMemorySize("20gb"), 20000000000 / 8);  // a lowercase final b means bits
  EXPECT_EQ(*ParseMemorySize("5Gb"), 625000000);
  EXPECT_EQ(*ParseMemorySize("1.5MB"), 1500000);
  EXPECT_EQ(*ParseMemorySize("20gib"), 21474836480);  // units are case-insensitive
  EXPECT_EQ(*ParseMemorySize("123456"), 123456);
  EXPECT_EQ(*ParseMemorySize("1TB"), 1000000000000);
  EXPECT_EQ(*ParseMemorySize("2TiB"), 2199023255552);
}

TEST(ParseMemorySize, RejectsWhatAccelerateRejects) {
  for (const char* bad : {"", "20XB", "GiB", "abcGiB", "-1GiB", "1.5", "twenty"}) {
    absl::StatusOr<int64_t> size = ParseMemorySize(bad);
    EXPECT_FALSE(size.ok()) << bad;
    if (!size.ok()) {
      EXPECT_NE(size.status().message().find(bad), std::string::npos) << size.status();
    }
  }
}

TEST(ParseMaxMemory, SortsGpusThenCpuThenDisk) {
  absl::StatusOr<MaxMemory> m = ParseMaxMemory("disk=1TB,cpu=64GiB,1=20GiB,0=10GiB");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 4u);
  EXPECT_EQ((*m)[0].device, Device::Gpu(0));
  EXPECT_EQ((*m)[0].bytes, 10737418240.0);
  EXPECT_EQ((*m)[1].device, Device::Gpu(1));
  EXPECT_EQ((*m)[2].device, Device::Cpu());
  EXPECT_EQ((*m)[3].device, Device::Disk());
}

TEST(ParseMaxMemory, ErrorsNameTheEntry) {
  struct Case {
    const char* spec;
    const char* mentions;
  };
  for (const Case& c : {Case{"0=20XB", "device 0"}, Case{"gpu=1GiB", "gpu"}, Case{"0:20GiB", "0:20GiB"},
                        Case{"0=1GiB,0=2GiB", "device 0 is given twice"}, Case{"", "no devices"}}) {
    absl::StatusOr<MaxMemory> m = ParseMaxMemory(c.spec);
    ASSERT_FALSE(m.ok()) << c.spec;
    EXPECT_NE(m.status().message().find(c.mentions), std::string::npos) << m.status();
  }
}

TEST(ParseDevice, AcceptsIndexCudaCpuDisk) {
  EXPECT_EQ(*ParseDevice("3"), Device::Gpu(3));
  EXPECT_EQ(*ParseDevice("cuda:1"), Device::Gpu(1));
  EXPECT_EQ(*ParseDevice("cpu"), Device::Cpu());
  EXPECT_EQ(*ParseDevice("disk"), Device::Disk());
  EXPECT_FALSE(ParseDevice("tpu").ok());
  EXPECT_FALSE(ParseDevice("-1").ok());
}

}  // namespace
}  // namespace strata::planner
