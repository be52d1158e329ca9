#include "runtime/model/weights.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/StreamGuard.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/quantized.h"
#include "runtime/model/linear.h"

namespace strata::runtime {

at::ScalarType ToScalarType(checkpoint::DType dtype) {
  switch (dtype) {
    case checkpoint::DType::kFloat16:
      return at::kHalf;
    case checkpoint::DType::kBFloat16:
      return at::kBFloat16;
    case checkpoint::DType::kFloat64:
      return at::kDouble;
    case checkpoint::DType::kInt64:
      return at::kLong;
    case checkpoint::DType::kInt32:
      return at::kInt;
    case checkpoint::DType::kInt8:
      return at::kChar;
    case checkpoint::DType::kUInt8:
      return at::kByte;
    case checkpoint::DType::kBool:
      return at::kBool;
    case checkpoint::DType::kFloat8E4M3:
      return at::kFloat8_e4m3fn;
    case checkpoint::DType::kFloat32:
      break;
  }
  return at::kFloat;
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// `bytes` of anonymous memory in a mapping of its own, unmapped with the last owner; null where mmap fails. With
// `huge_pages`, 2 MiB aligned and marked MADV_HUGEPAGE (where transparent huge pages are on, "madvise" or "always",
// the kernels' defaults, it then sits in 2 MiB pages).
std::shared_ptr<std::byte> AnonymousMemory(size_t bytes, bool huge_pages) {
  const size_t align = huge_pages ? kHugePage : 1;
  const size_t mapped = std::max<size_t>(1, huge_pages ? (bytes + align - 1) / align * align + align : bytes);
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return nullptr;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(base) + align - 1) / align * align;
  auto* data = reinterpret_cast<std::byte*>(start);
  if (huge_pages) madvise(data, mapped - (start - reinterpret_cast<uintptr_t>(base)), MADV_HUGEPAGE);  // advice
  return std::shared_ptr<std::byte>(data, [base, mapped](std::byte*) { munmap(base, mapped); });
}

std::shared_ptr<std::byte> HugePageMemory(size_t bytes) { return AnonymousMemory(bytes, /*huge_pages=*/true); }

// cudaHostRegister / cudaHostUnregister of the CUDA runtime LibTorch's CUDA half loaded (runtime/executor/
// cuda_loader.h), found at run time: strata links no CUDA library.
using CudaHostRegisterFn = int (*)(void*, size_t, unsigned);
using CudaHostUnregisterFn = int (*)(void*);
using CudaErrorStringFn = const char* (*)(int);
struct CudaHostApi {
  CudaHostRegisterFn reg = nullptr;
  CudaHostUnregisterFn unreg = nullptr;
  CudaErrorStringFn error = nullptr;
};
const CudaHostApi& HostApi() {
  static const CudaHostApi api = [] {
    CudaHostApi a;
    a.reg = reinterpret_cast<CudaHostRegisterFn>(dlsym(RTLD_DEFAULT, "cudaHostRegister"));
    a.unreg = reinterpret_cast<CudaHostUnregisterFn>(dlsym(RTLD_DEFAULT, "cudaHostUnregister"));
    a.error = reinterpret_cast<CudaErrorStringFn>(dlsym(RTLD_DEFAULT, "cudaGetErrorString"));
    return a;
  }();
  return api;
}

// `bytes` of anonymous memory (2 MiB pages) page-locked for the CUDA devices of the process (cudaHostRegister,
// portable): exactly as large as asked, where LibTorch's pinned allocator rounds a block up to a power of two (a
// 136 MB matrix took 256 MiB). Unregistered, then unmapped, with its last owner. Errors throw (c10::Error), naming
// the bytes and CUDA's reason.
std::shared_ptr<std::byte> PinnedMemory(size_t bytes) {
  const CudaHostApi& api = HostApi();
  TORCH_CHECK(api.reg != nullptr && api.unreg != nullptr,
              "pinning host memory for offloaded weights: the CUDA runtime (cudaHostRegister) is not loaded");
  std::shared_ptr<std::byte> memory = HugePageMemory(bytes);
  TORCH_CHECK(memory != nullptr, "pinning host memory for offloaded weights: mmap of ", bytes, " bytes failed");
  const int rc = api.reg(memory.get(), bytes, /*cudaHostRegisterPortable=*/1);
  TORCH_CHECK(rc == 0, "pinning ", bytes, " bytes of host memory for offloaded weights (cudaHostRegister) failed: ",
              api.error != nullptr ? api.error(rc) : "CUDA error", " (", rc,
              "); the locked-memory limit (ulimit -l) or the host's memory may be too small");
  std::shared_ptr<std::byte> keep = memory;
  return std::shared_ptr<std::byte>(memory.get(), [keep, unreg = api.unreg](std::byte* p) { unreg(p); });
}

}  // namespace

at::Tensor MappedEmpty(at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::shared_ptr<std::byte> memory = AnonymousMemory(static_cast<size_t>(numel) * at::elementSize(dtype), false);
  if (memory == nullptr) return at::empty(shape, at::TensorOptions().dtype(dtype));
  return at::from_blob(
      memory.get(), shape, [memory](void*) {}, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

// Chunks of kChunk bytes handed out in 64-byte aligned pieces; a tensor of half a chunk or more gets memory of
// its own. A piece's tensor holds its chunk, so a chunk goes when its last tensor does. A pinned arena
// page-locks its chunks (PinnedMemory): offloaded weights take what they hold, plus at most one chunk's tail.
class WeightArena {
 public:
  static constexpr size_t kChunk = size_t{32} << 20;
  explicit WeightArena(bool pinned = false) : pinned_(pinned) {}
  int64_t pinned_bytes() const { return pinned_bytes_; }
  at::Tensor Empty(at::IntArrayRef shape, at::ScalarType dtype) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const size_t bytes = static_cast<size_t>(numel) * at::elementSize(dtype);
    const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    std::shared_ptr<std::byte> memory;
    std::byte* place = nullptr;
    if (need >= kChunk / 2) {
      memory = Memory(need);
      place = memory.get();
    } else {
      if (chunk_ == nullptr || used_ + need > kChunk) {
        chunk_ = Memory(kChunk);
        used_ = 0;
      }
      memory = chunk_;
      place = chunk_ != nullptr ? chunk_.get() + used_ : nullptr;
      used_ += need;
    }
    if (place == nullptr) return at::empty(shape, at::TensorOptions().dtype(dtype));  // mmap failed
    return at::from_blob(
        place, shape, [memory](void*) {}, at::TensorOptions().dtype(dtype).device(at::kCPU));
  }
  // `t` (a CPU tensor, or undefined) in the arena, contiguous.
  at::Tensor Copy(const at::Tensor& t) {
    if (!t.defined()) return t;
    at::Tensor out = Empty(t.sizes(), t.scalar_type());
    out.copy_(t);
    return out;
  }

 private:
  std::shared_ptr<std::byte> Memory(size_t bytes) {
    if (!pinned_) return HugePageMemory(bytes);
    pinned_bytes_ += static_cast<int64_t>(bytes);
    return PinnedMemory(bytes);
  }
  bool pinned_;
  int64_t pinned_bytes_ = 0;
  std::shared_ptr<std::byte> chunk_;
  size_t used_ = 0;
};

WeightLoader::WeightLoader(const Checkpoint& checkpoint, at::ScalarType dtype, bool fp8_scaled_mm)
    : checkpoint_(checkpoint),
      dtype_(dtype),
      fp8_scaled_mm_(fp8_scaled_mm),
      arena_(std::make_unique<WeightArena>()),
      pinned_(std::make_unique<WeightArena>(/*pinned=*/true)) {}

const WeightLoadStats& WeightLoader::stats() {
  stats_.pinned_bytes = pinned_->pinned_bytes();
  return stats_;
}

WeightLoader::~WeightLoader() = default;

bool Weight::needs_fetch() const {
  if (panels) return false;  // resident on the CPU that runs it
  if (packed) return packed->data.device() != exec_device;
  return residency != Residency::kResident && (stored.device() != exec_device || stored.scalar_type() != dtype);
}

WeightTensor Weight::Use() const {
  if (panels) return {{}, nullptr, panels};
  if (packed) {
    if (!needs_fetch()) return {{}, packed, nullptr};
    return {
        {},
        std::make_shared<const PackedLinear>(packed->To(exec_device, /*non_blocking=*/residency == Residency::kHost)),
        nullptr};
  }
  if (!needs_fetch()) return {stored, nullptr, nullptr};
  // Pinned host memory copies asynchronously on the current stream; mapped pages are read as they are
  // touched by the copy (and cast in the same pass).
  return {stored.to(exec_device, dtype, /*non_blocking=*/residency == Residency::kHost, /*copy=*/false), nullptr,
          nullptr};
}

namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + OffloadBuffers::kAlignment - 1) / OffloadBuffers::kAlignment * OffloadBuffers::kAlignment;
}

// The packed weight's tensors, in one order for sizing and filling.
std::vector<at::Tensor PackedLinear::*> PackedTensors() {
  return {&PackedLinear::data, &PackedLinear::scale, &PackedLinear::zero, &PackedLinear::perm};
}

}  // namespace

int64_t OffloadBuffers::SlotBytes(const std::vector<const Weight*>& weights) {
  int64_t bytes = 0;
  for (const Weight* w : weights) {
    if (!w->needs_fetch()) continue;
    if (w->packed) {
      for (auto member : PackedTensors()) {
        const at::Tensor& t = (*w->packed).*member;
        if (t.defined()) bytes += Aligned(static_cast<int64_t>(t.nbytes()));
      }
    } else {
      bytes += Aligned(w->stored.numel() * static_cast<int64_t>(at::elementSize(w->dtype)));
    }
  }
  return bytes;
}

OffloadBuffers::OffloadBuffers(at::Device device, int64_t slot_bytes) : slot_bytes_(slot_bytes) {
  for (Slot& slot : slots_) slot.buffer = at::empty({slot_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
}

int OffloadBuffers::Fill(const std::vector<const Weight*>& weights, std::optional<c10::Stream> copy_stream) {
  const int index = next_;
  next_ = 1 - next_;
  Slot& slot = slots_[index];
  std::optional<c10::StreamGuard> guard;
  if (copy_stream) {
    guard.emplace(*copy_stream);
    if (slot.free) slot.free->block(*copy_stream);  // the compute stream is done with the slot's last unit
  }
  int64_t offset = 0;
  // A view of the slot's next `bytes` as `dtype` [shape].
  auto carve = [&](at::IntArrayRef shape, at::ScalarType dtype) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const int64_t bytes = numel * static_cast<int64_t>(at::elementSize(dtype));
    TORCH_CHECK(offset + bytes <= slot_bytes_, "offload slot of ", slot_bytes_, " bytes is too small");
    at::Tensor view = slot.buffer.narrow(0, offset, bytes).view(dtype).view(shape);
    offset += Aligned(bytes);
    return view;
  };
  const bool non_blocking = copy_stream.has_value();
  slot.tensors.clear();
  for (const Weight* w : weights) {
    if (!w->needs_fetch()) {
      slot.tensors.push_back(w->Use());
      continue;
    }
    if (w->packed) {
      PackedLinear copy = *w->packed;
      for (auto member : PackedTensors()) {
        at::Tensor& t = copy.*member;
        if (!t.defined()) continue;
        at::Tensor into = carve(t.sizes(), t.scalar_type());
        into.copy_(t, non_blocking);
        t = into;
      }
      slot.tensors.push_back({{}, std::make_shared<const PackedLinear>(std::move(copy)), nullptr});
    } else {
      at::Tensor into = carve(w->stored.sizes(), w->dtype);
      into.copy_(w->stored, non_blocking);  // pinned host memory: asynchronous; mapped pages: read by the copy
      slot.tensors.push_back({into, nullptr, nullptr});
    }
  }
  if (copy_stream) {
    slot.filled.emplace(copy_stream->device_type());
    slot.filled->record(*copy_stream);
  } else {
    slot.filled.reset();
  }
  return index;
}

std::vector<WeightTensor> OffloadBuffers::Take(int slot, std::optional<c10::Stream> compute_stream) {
  Slot& s = slots_[slot];
  if (s.filled && compute_stream) s.filled->block(*compute_stream);
  return s.tensors;
}

void OffloadBuffers::Release(int slot, std::optional<c10::Stream> compute_stream) {
  Slot& s = slots_[slot];
  s.tensors.clear();
  if (compute_stream) {
    s.free.emplace(compute_stream->device_type());
    s.free->record(*compute_stream);
  } else {
    s.free.reset();
  }
}

namespace {

// A dense checkpoint tensor as a CPU tensor over its mapped bytes (a copy when the file does not align them).
absl::StatusOr<at::Tensor> MappedDense(const Checkpoint& checkpoint, const std::string& name, const TensorView** out) {
  const TensorView* view = checkpoint.Find(name);
  if (view == nullptr) return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", name, " is missing"));
  if (view->dtype != checkpoint::DType::kFloat32 && view->dtype != checkpoint::DType::kFloat16 &&
      view->dtype != checkpoint::DType::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", name, " has dtype ",
                                                   std::string(checkpoint::DTypeName(view->dtype)),
                                                   ", expected float32, float16 or bfloat16 (a dense weight)"));
  }
  *out = view;
  const at::ScalarType file_dtype = ToScalarType(view->dtype);
  // The mapping is read-only: a view of it must never be written. Weights never are; the deleter is a
  // no-op because the shared_ptr captured here keeps the mapping alive instead.
  auto keep_alive = view->file;
  const bool aligned = reinterpret_cast<uintptr_t>(view->data()) % at::elementSize(file_dtype) == 0;
  if (aligned) {
    return at::from_blob(
        const_cast<std::byte*>(view->data()), view->shape, [keep_alive](void*) {},
        at::TensorOptions().dtype(file_dtype).device(at::kCPU));
  }
  // safetensors writers align data to the element size; a file that does not is read through a copy.
  at::Tensor copy = at::empty(view->shape, at::TensorOptions().dtype(file_dtype));
  std::memcpy(copy.data_ptr(), view->data(), view->bytes);
  return copy;
}

}  // namespace

absl::Status WeightLoader::LoadInto(const std::string& name, const at::Tensor& destination) {
  const TensorView* view = nullptr;
  absl::StatusOr<at::Tensor> mapped = MappedDense(checkpoint_, name, &view);
  if (!mapped.ok()) return mapped.status();
  if (!mapped->sizes().equals(destination.sizes())) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: tensor ", name, " has shape [",
                                                   absl::StrJoin(mapped->sizes(), ", "), "], expected [",
                                                   absl::StrJoin(destination.sizes(), ", "), "]"));
  }
  if (destination.is_cpu()) view->file->WillNeed(view->offset, view->bytes);
  // One pass over the file bytes; to a GPU, torch copies in the file's dtype and casts there.
  at::Tensor(destination).copy_(*mapped);
  view->file->Release(view->offset, view->bytes);
  ++stats_.copied;
  stats_.bytes_on_devices += static_cast<uint64_t>(destination.nbytes());
  return absl::OkStatus();
}

at::Tensor WeightLoader::Empty(at::IntArrayRef shape, at::Device device) {
  if (device.is_cpu()) return arena_->Empty(shape, dtype_);
  return at::empty(shape, at::TensorOptions().dtype(dtype_).device(device));
}

absl::StatusOr<Weight> WeightLoader::Load(const std::string& name, Residency residency, at::Device exec_device,
                                          bool linear, std::optional<at::ScalarType> as) {
  const at::ScalarType dtype = as.value_or(dtype_);
  Weight w{name, {}, nullptr, residency, exec_device, dtype, nullptr};
  const TensorView* view = nullptr;
  absl::StatusOr<at::Tensor> mapped_or = MappedDense(checkpoint_, name, &view);
  if (!mapped_or.ok()) return mapped_or.status();
  const at::Tensor mapped = *std::move(mapped_or);
  const at::ScalarType file_dtype = mapped.scalar_type();

  if (residency == Residency::kDisk) {
    w.stored = mapped;  // paged in on use, cast by Use() when the dtypes differ
    ++stats_.on_disk;
    return w;
  }
  at::Tensor out;
  if (residency == Residency::kHost) {
    // Offloaded to host while a GPU runs it: pinned so the per-use copy is asynchronous, in the pinned arena (sized
    // to what it holds).
    view->file->WillNeed(view->offset, view->bytes);
    out = pinned_->Empty(view->shape, dtype);
    out.copy_(mapped);
  } else if (exec_device.is_cpu()) {
    // Into 2 MiB pages even in the file's dtype: a decode step streams every weight, and the mapping's 4 KiB
    // page-cache pages cost a TLB miss per 4 KiB (bench/README.md, quantized_peer.py: copied against mapped in place).
    view->file->WillNeed(view->offset, view->bytes);
    if (linear && mapped.dim() == 2 && PanelsServe(dtype)) {
      // Packed from the file's bytes (cast first where the dtypes differ, a temporary of one layer).
      const at::Tensor dense = file_dtype == dtype ? mapped : mapped.to(dtype);
      auto panels = std::make_shared<PanelWeight>();
      panels->out_features = mapped.size(0);
      panels->in_features = mapped.size(1);
      panels->data = arena_->Empty({mapped.numel()}, dtype);
      PackPanels(dense, panels->data);
      view->file->Release(view->offset, view->bytes);
      ++stats_.copied;
      ++stats_.panels;
      stats_.bytes_on_devices += static_cast<uint64_t>(panels->data.nbytes());
      w.panels = std::move(panels);
      return w;
    }
    out = arena_->Empty(view->shape, dtype);
    out.copy_(mapped);  // one pass reads the file bytes (and casts)
  } else {
    // To the GPU in the file's dtype, then cast there: no host-side cast copy.
    out = mapped.to(exec_device, file_dtype, /*non_blocking=*/false, /*copy=*/true);
    if (file_dtype != dtype) out = out.to(dtype);
  }
  view->file->Release(view->offset, view->bytes);
  ++stats_.copied;
  stats_.bytes_on_devices += static_cast<uint64_t>(out.nbytes());
  w.stored = out;
  return w;
}

absl::StatusOr<Weight> WeightLoader::LoadPacked(const std::string& name, const planner::QuantizedLinear& q,
                                                Residency residency, at::Device exec_device) {
  Weight w{name, {}, nullptr, residency, exec_device, dtype_, nullptr};
  // A packed weight is small (a quarter to a half of the serving dtype's bytes): "disk" entries are read into
  // memory like "cpu" ones; a "cpu" entry of a GPU-run model waits in pinned memory and is copied on use.
  const bool host = residency != Residency::kResident && !exec_device.is_cpu();
  absl::StatusOr<PackedLinear> packed =
      LoadPackedLinear(checkpoint_, q, host ? at::Device(at::kCPU) : exec_device, /*pinned=*/false);
  if (!packed.ok()) return packed.status();
  if (host) {
    // Waits in the pinned arena (sized to what it holds) for its copies to the GPU.
    for (at::Tensor* t : {&packed->data, &packed->scale, &packed->zero, &packed->perm}) *t = pinned_->Copy(*t);
  }
  if (exec_device.is_cpu()) {
    // The bytes a decode step streams in 2 MiB pages (see Load), FP8's out of the mapping, whose pages go.
    packed->data = arena_->Copy(packed->data);
    packed->scale = arena_->Copy(packed->scale);
    packed->zero = arena_->Copy(packed->zero);
    if (packed->kind == PackedLinear::Kind::kFp8) {
      packed->fp8_nan_free = !kernels::Fp8HasNanCode(packed->data.data_ptr<uint8_t>(), packed->data.numel());
    }
    if (const TensorView* view = checkpoint_.Find(q.weight); view != nullptr)
      view->file->Release(view->offset, view->bytes);
  }
  if (fp8_scaled_mm_ && exec_device.is_cuda() && ScaledMmEligible(*packed)) {
    if (std::find(probed_.begin(), probed_.end(), exec_device) == probed_.end()) {
      if (absl::Status probe = ProbeFp8ScaledMm(exec_device); !probe.ok()) return probe;
      probed_.push_back(exec_device);
    }
    packed->scaled_mm = true;
    ++stats_.fp8_scaled_mm;
  }
  if (residency == Residency::kDisk) w.residency = exec_device.is_cpu() ? Residency::kResident : Residency::kHost;
  ++stats_.packed;
  stats_.bytes_on_devices += static_cast<uint64_t>(packed->bytes());
  w.packed = std::make_shared<const PackedLinear>(*std::move(packed));
  return w;
}

}  // namespace strata::runtime
