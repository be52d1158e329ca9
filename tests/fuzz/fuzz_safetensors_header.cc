// libFuzzer harness: a safetensors file's first bytes, as the planner's header check and the runtime's
// mmap reader see them (checkpoint/safetensors_header.h). The input is the file: 8 bytes of header length,
// the JSON header, then the data section; the file size is the input's size, so data offsets past the end
// are exercised too. Whatever the bytes, the parser returns a header or an error, and a header it accepts
// keeps its documented promises (checked below: an abort here is a finding like a crash).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "checkpoint/safetensors_header.h"

namespace {

using strata::checkpoint::ParseSafetensorsHeader;
using strata::checkpoint::SafetensorsEntry;
using strata::checkpoint::SafetensorsHeader;
using strata::checkpoint::SafetensorsHeaderLength;

// What ParseSafetensorsHeader promises about a header it accepts: every tensor's bytes lie inside the
// data section and span exactly dtype size x shape, in name order, without overlapping.
void CheckAccepted(const SafetensorsHeader& header, uint64_t file_size) {
  if (header.data_offset > file_size || header.data_size != file_size - header.data_offset) std::abort();
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : header.tensors) {
    if (entry.begin > entry.end || entry.end > header.data_size) std::abort();
    unsigned __int128 bytes = static_cast<unsigned __int128>(entry.element_size);
    if (std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end()) bytes = 0;
    for (int64_t dim : entry.shape) {
      if (dim < 0) std::abort();
      bytes *= static_cast<unsigned __int128>(dim);
      if (bytes > header.data_size) break;
    }
    if (bytes != entry.end - entry.begin) std::abort();
    if (previous != nullptr && !(previous->name < entry.name)) std::abort();
    previous = &entry;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<uint64_t> length = SafetensorsHeaderLength("fuzz.safetensors", file.substr(0, 8), size);
  if (!length.ok()) return 0;
  if (*length > size - 8) std::abort();  // SafetensorsHeaderLength promised the header fits in the file
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader("fuzz.safetensors", file.substr(8, *length), size);
  if (header.ok()) CheckAccepted(*header, size);
  return 0;
}
