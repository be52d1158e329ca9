#include "planner/inventory.h"

#include <dlfcn.h>

#include <cstddef>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner/plan.h"

namespace strata::planner {

namespace {

struct ComputeCapability {
  int major = 0;
  int minor = 0;
};

// "8.9" -> {8, 9}.
absl::StatusOr<ComputeCapability> ParseComputeCapability(absl::string_view text, absl::string_view entry) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  ComputeCapability cc;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &cc.major) || !absl::SimpleAtoi(parts[1], &cc.minor) ||
      cc.major < 1 || cc.major > 99 || cc.minor < 0 || cc.minor > 9) {
    return absl::InvalidArgumentError(absl::StrCat("inventory: entry \"", entry, "\": compute capability \"", text,
                                                   "\" is not MAJOR.MINOR (e.g. 8.9)"));
  }
  return cc;
}

}  // namespace

absl::StatusOr<MachineInventory> ParseInventory(absl::string_view spec) {
  // "0=79GiB@8.9": the compute capability is cut off here, the sizes are ParseDeviceSizes'.
  std::map<std::string, ComputeCapability> capabilities;
  std::vector<std::string> sizes;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    const size_t at = entry.find('@');
    if (at == absl::string_view::npos) {
      sizes.emplace_back(entry);
      continue;
    }
    absl::StatusOr<ComputeCapability> cc = ParseComputeCapability(entry.substr(at + 1), entry);
    if (!cc.ok()) return cc.status();
    absl::string_view key = absl::StripAsciiWhitespace(entry.substr(0, entry.find('=')));
    int index = 0;
    if (!absl::SimpleAtoi(key, &index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("inventory: entry \"", entry, "\": only GPUs have a compute capability"));
    }
    capabilities[std::to_string(index)] = *cc;
    sizes.emplace_back(entry.substr(0, at));
  }
  absl::StatusOr<std::vector<DeviceSize>> entries = ParseDeviceSizes(absl::StrJoin(sizes, ","), "inventory");
  if (!entries.ok()) return entries.status();
  MachineInventory inventory;
  bool has_cpu = false;
  for (const DeviceSize& e : *entries) {  // sorted: GPUs by index, then cpu, then disk
    switch (e.device.kind) {
      case Device::Kind::kGpu:
        if (e.device.index != static_cast<int>(inventory.gpus.size())) {
          return absl::InvalidArgumentError(
              absl::StrCat("inventory: GPU ", inventory.gpus.size(), " is missing before entry \"", e.device.ToString(),
                           "\" (visible GPUs are numbered 0..n-1, as CUDA_VISIBLE_DEVICES renumbers them)"));
        }
        inventory.gpus.push_back({e.bytes, e.bytes, false});
        if (auto cc = capabilities.find(std::to_string(e.device.index)); cc != capabilities.end()) {
          inventory.gpus.back().compute_capability_major = cc->second.major;
          inventory.gpus.back().compute_capability_minor = cc->second.minor;
        }
        break;
      case Device::Kind::kCpu:
        has_cpu = true;
        inventory.host_available_bytes = e.bytes;
        break;
      case Device::Kind::kDisk:
        return absl::InvalidArgumentError(
            "inventory: entry \"disk\" is not memory of the machine (give disk budgets with --max-memory)");
    }
  }
  if (!has_cpu) {
    return absl::InvalidArgumentError(
        "inventory: no \"cpu\" entry: give the host's available memory too (e.g. 0=79GiB,cpu=200GiB)");
  }
  return inventory;
}

absl::StatusOr<MachineInventory> GroupInventory(const std::vector<MachineInventory>& nodes) {
  if (nodes.empty()) return absl::InvalidArgumentError("inventory: a group needs at least one node");
  MachineInventory group;
  group.host_available_bytes = nodes.front().host_available_bytes;
  for (size_t n = 0; n < nodes.size(); ++n) {
    for (const GpuMemory& gpu : nodes[n].gpus) {
      group.gpus.push_back(gpu);
      group.gpu_nodes.push_back(static_cast<int>(n));
    }
    const int driver = nodes[n].cuda_driver_version;
    if (driver > 0 && (group.cuda_driver_version == 0 || driver < group.cuda_driver_version)) {
      group.cuda_driver_version = driver;
    }
  }
  if (nodes.size() == 1) group.gpu_nodes.clear();
  return group;
}

std::string InventoryToString(const MachineInventory& inventory) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < inventory.gpus.size(); ++i) {
    const GpuMemory& gpu = inventory.gpus[i];
    if (inventory.nodes() > 1 && (i == 0 || inventory.NodeOf(i) != inventory.NodeOf(i - 1))) {
      parts.push_back(absl::StrCat("node ", inventory.NodeOf(i), ":"));
    }
    parts.push_back(absl::StrCat(
        i, "=", FormatBytes(static_cast<double>(gpu.free_bytes)), " free of ",
        FormatBytes(static_cast<double>(gpu.total_bytes)), gpu.integrated ? " (integrated)" : "",
        gpu.compute_capability_major > 0 ? absl::StrCat(" (compute capability ", gpu.compute_capability_major, ".",
                                                        gpu.compute_capability_minor, ")")
                                         : ""));
  }
  parts.push_back(absl::StrCat("cpu=", FormatBytes(static_cast<double>(inventory.host_available_bytes)), " available",
                               inventory.nodes() > 1 ? " (node 0, the leader's host)" : ""));
  std::string text = absl::StrJoin(parts, ", ");
  // "node 1:, 4=..." reads better as "node 1: 4=...".
  return absl::StrReplaceAll(text, {{":, ", ": "}});
}

namespace internal {

absl::StatusOr<int64_t> MemAvailableBytes(absl::string_view meminfo) {
  for (absl::string_view line : absl::StrSplit(meminfo, '\n')) {
    if (!absl::ConsumePrefix(&line, "MemAvailable:")) continue;
    line = absl::StripAsciiWhitespace(line);
    int64_t kib = 0;
    if (!absl::ConsumeSuffix(&line, "kB") || !absl::SimpleAtoi(line, &kib) || kib < 0) {
      return absl::InternalError(absl::StrCat("/proc/meminfo: cannot read the MemAvailable line \"", line, "\""));
    }
    return kib * 1024;  // the kernel's "kB" is KiB
  }
  return absl::InternalError("/proc/meminfo: no MemAvailable line (Linux 3.14 or newer has one)");
}

}  // namespace internal

namespace {

// psutil.virtual_memory().available reads MemAvailable on Linux.
absl::StatusOr<int64_t> HostAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  if (!in) return absl::InternalError("cannot open /proc/meminfo");
  std::string text(64 * 1024, '\0');  // /proc/meminfo is about 1.5 KiB; read no more than this
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return internal::MemAvailableBytes(text);
}

// The few CUDA driver API entry points discovery needs, declared here so that nothing includes or
// links CUDA: the driver is loaded at run time, and a machine without it simply has no GPUs.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorNoDevice = 100;
constexpr int kCuDeviceAttributeIntegrated = 18;
constexpr int kCuDeviceAttributeComputeCapabilityMajor = 75;
constexpr int kCuDeviceAttributeComputeCapabilityMinor = 76;

struct CudaDriver {
  CUresult (*cuInit)(unsigned int);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
  CUresult (*cuCtxPushCurrent_v2)(CUcontext);
  CUresult (*cuCtxPopCurrent_v2)(CUcontext*);
  CUresult (*cuMemGetInfo_v2)(size_t*, size_t*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);

  // "CUDA_ERROR_OUT_OF_MEMORY (2: out of memory)".
  std::string Describe(CUresult result) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (cuGetErrorName(result, &name) != kCudaSuccess || name == nullptr) name = "CUDA error";
    if (cuGetErrorString(result, &text) != kCudaSuccess || text == nullptr) text = "unknown";
    return absl::StrCat(name, " (", result, ": ", text, ")");
  }
};

// Loads libcuda.so.1 once. The library stays loaded for the life of the process: the runtime uses the
// same driver, and unloading a driver that was initialised is not safe. nullopt: no driver here.
absl::StatusOr<std::optional<CudaDriver>> LoadCudaDriver() {
  static void* const library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return std::optional<CudaDriver>();
  CudaDriver driver;
  absl::Status missing;
  auto bind = [&](auto& function, const char* name) {
    void* symbol = dlsym(library, name);
    if (symbol == nullptr && missing.ok()) {
      missing = absl::FailedPreconditionError(
          absl::StrCat("CUDA driver libcuda.so.1 has no ", name, " (the driver is too old)"));
    }
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(symbol);
  };
  bind(driver.cuInit, "cuInit");
  bind(driver.cuDriverGetVersion, "cuDriverGetVersion");
  bind(driver.cuDeviceGetCount, "cuDeviceGetCount");
  bind(driver.cuDeviceGet, "cuDeviceGet");
  bind(driver.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  bind(driver.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  bind(driver.cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2");
  bind(driver.cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2");
  bind(driver.cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2");
  bind(driver.cuMemGetInfo_v2, "cuMemGetInfo_v2");
  bind(driver.cuGetErrorName, "cuGetErrorName");
  bind(driver.cuGetErrorString, "cuGetErrorString");
  if (!missing.ok()) return missing;
  return std::optional<CudaDriver>(driver);
}

// Free and total memory of device `ordinal` with its primary context current. torch.cuda.mem_get_info
// queries inside the same primary context (accelerate creates it first with a tiny tensor), so the
// context's own footprint is already taken from "free", as it is here.
absl::StatusOr<GpuMemory> QueryGpu(const CudaDriver& cuda, int ordinal) {
  auto failed = [&](absl::string_view call, CUresult result) {
    return absl::InternalError(absl::StrCat("GPU ", ordinal, ": ", call, " failed: ", cuda.Describe(result)));
  };
  CUdevice device = 0;
  if (CUresult r = cuda.cuDeviceGet(&device, ordinal); r != kCudaSuccess) return failed("cuDeviceGet", r);
  int integrated = 0;
  if (CUresult r = cuda.cuDeviceGetAttribute(&integrated, kCuDeviceAttributeIntegrated, device); r != kCudaSuccess) {
    return failed("cuDeviceGetAttribute(INTEGRATED)", r);
  }
  int cc_major = 0;
  int cc_minor = 0;
  if (CUresult r = cuda.cuDeviceGetAttribute(&cc_major, kCuDeviceAttributeComputeCapabilityMajor, device);
      r != kCudaSuccess) {
    return failed("cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)", r);
  }
  if (CUresult r = cuda.cuDeviceGetAttribute(&cc_minor, kCuDeviceAttributeComputeCapabilityMinor, device);
      r != kCudaSuccess) {
    return failed("cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)", r);
  }
  CUcontext context = nullptr;
  if (CUresult r = cuda.cuDevicePrimaryCtxRetain(&context, device); r != kCudaSuccess) {
    return failed("cuDevicePrimaryCtxRetain", r);
  }
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  CUresult pushed = cuda.cuCtxPushCurrent_v2(context);
  CUresult queried = pushed == kCudaSuccess ? cuda.cuMemGetInfo_v2(&free_bytes, &total_bytes) : pushed;
  if (pushed == kCudaSuccess) {
    CUcontext popped = nullptr;
    cuda.cuCtxPopCurrent_v2(&popped);
  }
  // Releasing the last reference destroys the primary context and gives its memory back.
  cuda.cuDevicePrimaryCtxRelease_v2(device);
  if (pushed != kCudaSuccess) return failed("cuCtxPushCurrent", pushed);
  if (queried != kCudaSuccess) return failed("cuMemGetInfo", queried);
  return GpuMemory{static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes), integrated != 0, cc_major,
                   cc_minor};
}

}  // namespace

absl::StatusOr<MachineInventory> DiscoverInventory() {
  MachineInventory inventory;
  absl::StatusOr<int64_t> host = HostAvailableBytes();
  if (!host.ok()) return host.status();
  inventory.host_available_bytes = *host;

  absl::StatusOr<std::optional<CudaDriver>> driver = LoadCudaDriver();
  if (!driver.ok()) return driver.status();
  if (!driver->has_value()) return inventory;  // no driver: no GPUs
  const CudaDriver& cuda = **driver;
  if (cuda.cuDriverGetVersion(&inventory.cuda_driver_version) != kCudaSuccess) inventory.cuda_driver_version = 0;
  if (CUresult r = cuda.cuInit(0); r != kCudaSuccess) {
    if (r == kCudaErrorNoDevice) return inventory;
    return absl::InternalError(absl::StrCat("CUDA: cuInit failed: ", cuda.Describe(r)));
  }
  int count = 0;
  if (CUresult r = cuda.cuDeviceGetCount(&count); r != kCudaSuccess) {
    return absl::InternalError(absl::StrCat("CUDA: cuDeviceGetCount failed: ", cuda.Describe(r)));
  }
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<GpuMemory> gpu = QueryGpu(cuda, i);
    if (!gpu.ok()) return gpu.status();
    inventory.gpus.push_back(*gpu);
  }
  return inventory;
}

// Reproduces transformers 5.x from_pretrained(device_map=S) without max_memory:
// - accelerate's get_max_memory(None): GPU i -> torch.cuda.mem_get_info(i)[0], then "cpu" ->
//   psutil's available memory, except when a GPU is integrated (it shares host RAM: no "cpu").
// - transformers' get_max_memory wrapper adds each GPU's reserved-but-unallocated torch memory (none:
//   strata's planner allocates nothing) and, because the user gave no max_memory, scales "cpu" by 0.90.
// - get_balanced_memory (every strategy but "sequential"): when exactly one GPU has memory, the first
//   GPU in max_memory (GPU 0, even when it is not the one with memory) is scaled by 0.9.
// The rebalancing that follows is BalancedMaxMemory's, as for a max_memory the user gave.
MaxMemory DefaultMaxMemory(const MachineInventory& inventory, Strategy strategy) {
  MaxMemory max_memory;
  bool integrated = false;
  for (size_t i = 0; i < inventory.gpus.size(); ++i) {
    max_memory.push_back({Device::Gpu(static_cast<int>(i)), static_cast<double>(inventory.gpus[i].free_bytes)});
    integrated = integrated || inventory.gpus[i].integrated;
  }
  if (!integrated) max_memory.push_back({Device::Cpu(), static_cast<double>(inventory.host_available_bytes) * 0.90});
  const bool balances =
      strategy == Strategy::kAuto || strategy == Strategy::kBalanced || strategy == Strategy::kBalancedLow0;
  int gpus_with_memory = 0;
  for (const DeviceBudget& b : max_memory) gpus_with_memory += b.device.is_gpu() && b.bytes > 0;
  if (balances && gpus_with_memory == 1) max_memory.front().bytes *= 0.9;
  return max_memory;
}

}  // namespace strata::planner
