#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors_header.h"

namespace strata::checkpoint {
namespace {

absl::Status CheckpointError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", what));
}

// madvise needs page-aligned starts; widen the range to whole pages it touches.
std::pair<uintptr_t, size_t> PageRange(const std::byte* base, uint64_t offset, uint64_t length) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base) + offset;
  const uintptr_t aligned = begin & ~(page - 1);
  return {aligned, static_cast<size_t>(begin + length - aligned)};
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::filesystem::path& path) {
  const std::string name = path.filename().string();
  // O_NONBLOCK: a FIFO named like a shard must not block the open; the fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return CheckpointError(absl::StrCat(name, ": cannot open (", std::strerror(errno), ")"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return CheckpointError(absl::StrCat(name, ": cannot stat (", std::strerror(err), ")"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return CheckpointError(absl::StrCat(name, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* data = nullptr;
  if (size > 0) {
    data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return CheckpointError(absl::StrCat(name, ": cannot mmap ", size, " bytes (", std::strerror(err), ")"));
    }
  }
  ::close(fd);  // the mapping keeps the file open
  return std::shared_ptr<const MappedFile>(new MappedFile(name, static_cast<const std::byte*>(data), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void MappedFile::WillNeed(uint64_t offset, uint64_t length) const {
  if (length == 0) return;
  auto [start, len] = PageRange(data_, offset, length);
  ::madvise(reinterpret_cast<void*>(start), len, MADV_WILLNEED);  // a hint: failure changes nothing
}

void MappedFile::Release(uint64_t offset, uint64_t length) const {
  if (length == 0) return;
  auto [start, len] = PageRange(data_, offset, length);
  // The mapping is private and never written, so dropping pages loses nothing: they are read again
  // from the file if touched. Neighbouring tensors sharing an edge page are simply paged in again.
  ::madvise(reinterpret_cast<void*>(start), len, MADV_DONTNEED);
}

absl::StatusOr<DType> RuntimeDType(const std::string& safetensors_dtype) {
  if (safetensors_dtype == "F32") return DType::kFloat32;
  if (safetensors_dtype == "F16") return DType::kFloat16;
  if (safetensors_dtype == "BF16") return DType::kBFloat16;
  // Quantized checkpoints (planner/quantization.h): FP8 weights, packed integer codes, zero points, ue8m0 scale
  // exponents and compressed-tensors' weight_shape. Which tensor may hold which is the loader's check.
  if (safetensors_dtype == "F8_E4M3") return DType::kFloat8E4M3;
  if (safetensors_dtype == "I32") return DType::kInt32;
  if (safetensors_dtype == "I64") return DType::kInt64;
  if (safetensors_dtype == "U8") return DType::kUInt8;
  // float8_e8m0fnu (ue8m0 FP8 scales) is one exponent byte, 2^(e - 127), 255 NaN: read as the bytes it is.
  if (safetensors_dtype == "F8_E8M0") return DType::kUInt8;
  if (safetensors_dtype == "I8") return DType::kInt8;
  return absl::InvalidArgumentError(absl::StrCat("dtype ", safetensors_dtype,
                                                 " is not one the runtime loads (F32, F16, BF16; F8_E4M3, F8_E8M0, "
                                                 "I32, I64, U8 and I8 in quantized checkpoints)"));
}

absl::StatusOr<std::vector<TensorView>> OpenSafetensors(const std::filesystem::path& dir, const std::string& file) {
  absl::StatusOr<std::shared_ptr<const MappedFile>> mapped = MappedFile::Open(dir / file);
  if (!mapped.ok()) return mapped.status();
  const MappedFile& m = **mapped;
  const char* bytes = reinterpret_cast<const char*>(m.data());
  absl::StatusOr<uint64_t> header_length =
      SafetensorsHeaderLength(file, absl::string_view(bytes, m.size() >= 8 ? 8 : 0), m.size());
  if (!header_length.ok()) return header_length.status();
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(file, absl::string_view(bytes + 8, *header_length), m.size());
  if (!header.ok()) return header.status();

  std::vector<TensorView> views;
  views.reserve(header->tensors.size());
  for (SafetensorsEntry& entry : header->tensors) {
    absl::StatusOr<DType> dtype = RuntimeDType(entry.dtype);
    if (!dtype.ok())
      return CheckpointError(absl::StrCat(file, ": tensor ", entry.name, ": ", dtype.status().message()));
    views.push_back(TensorView{std::move(entry.name), *dtype, std::move(entry.shape), *mapped,
                               header->data_offset + entry.begin, entry.end - entry.begin});
  }
  return views;
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::filesystem::path& dir) {
  absl::StatusOr<std::optional<CheckpointFiles>> files = FindCheckpointFiles(dir);
  if (!files.ok()) return files.status();
  if (!files->has_value()) {
    return CheckpointError(
        absl::StrCat(dir.string(), ": no model.safetensors or model.safetensors.index.json (weights are needed)"));
  }
  Checkpoint checkpoint;
  for (const std::string& file : (*files)->files) {
    absl::StatusOr<std::vector<TensorView>> views = OpenSafetensors(dir, file);
    if (!views.ok()) return views.status();
    if (!views->empty()) checkpoint.files_.push_back(views->front().file);
    for (TensorView& view : *views) {
      const std::string name = view.name;
      auto [it, inserted] = checkpoint.tensors_.emplace(name, std::move(view));
      if (!inserted) {
        return CheckpointError(
            absl::StrCat("tensor ", name, " appears in both ", it->second.file->name(), " and ", file));
      }
    }
  }
  // The index must tell the truth about where each tensor is.
  for (const auto& [name, shard] : (*files)->weight_map) {
    const TensorView* view = checkpoint.Find(name);
    if (view == nullptr || view->file->name() != shard) {
      return CheckpointError(absl::StrCat("tensor ", name, " is listed in model.safetensors.index.json under ", shard,
                                          ", but that shard does not hold it"));
    }
  }
  return checkpoint;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& file : files_) total += file->size();
  return total;
}

}  // namespace strata::checkpoint
