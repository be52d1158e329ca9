#pragma once
// The one way strata reads a whole JSON or text file (config.json, tokenizer.json, index JSON, module
// trees, device-map files): regular files only, never blocking, and never more than a cap per kind of
// file. A FIFO, a device such as /dev/zero, a directory or a file over its cap is an InvalidArgument
// naming the path, so every binary exits 2 on it instead of hanging or running out of memory.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace strata::base {

// Caps per kind of file. Real files are far smaller: a 256k-token tokenizer.json is ~20 MB, a config.json
// a few KB, a 1000-layer module tree a few MB.
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kMaxConfigFileBytes =
    16 * kMiB;  // config.json, generation_config.json, tokenizer_config.json
inline constexpr uint64_t kMaxTokenizerFileBytes = 256 * kMiB;   // tokenizer.json
inline constexpr uint64_t kMaxIndexFileBytes = 64 * kMiB;        // model.safetensors.index.json
inline constexpr uint64_t kMaxModuleTreeFileBytes = 256 * kMiB;  // --module-tree FILE
inline constexpr uint64_t kMaxDeviceMapFileBytes = 16 * kMiB;    // --device-map @FILE

// The whole file at `path`. The file is opened with O_NONBLOCK (a FIFO without a writer cannot block the
// open) and fstat'ed before any read: anything but a regular file, or a file over `max_bytes`, is an
// error "PATH: ..." naming what it is. Every failure, a missing file included, is InvalidArgument.
absl::StatusOr<std::string> ReadRegularFile(const std::filesystem::path& path, uint64_t max_bytes);

// As ReadRegularFile, but a path where nothing exists (ENOENT, a dangling symlink excluded) reads as
// nullopt: for optional files such as generation_config.json.
absl::StatusOr<std::optional<std::string>> ReadRegularFileIfPresent(const std::filesystem::path& path,
                                                                    uint64_t max_bytes);

// Whether anything is at `path` (a file, a directory, a symlink, even a dangling or looping one), or
// whether that cannot be told (no permission to look): in both cases reading it gives the error worth
// showing. False only when the path certainly names nothing. Never throws.
bool PathMayExist(const std::filesystem::path& path);

}  // namespace strata::base
