#pragma once
// How a model is served, in plain C++ (no torch headers): the batch the KV pool is sized for, the pool's block size
// and the FP8 matmul path. The binaries fill it once from their flags (strata-server: server/flags.h's
// ServingFlags::runtime; strata-generate); planning (PlanLoad), loading (LoadOptions) and the engine read it as it is.

#include <cstdint>

namespace strata::runtime {

struct ServingOptions {
  int64_t max_batch = 1;         // --max-batch: sequences running at once
  int64_t max_context = 2048;    // --max-context: positions a sequence may reach
  int64_t kv_block_tokens = 16;  // --kv-block-tokens: positions per block of the paged KV cache, in [1, 4096]
  // --fp8-matmul scaled_mm: block-wise FP8 layers on GPUs run W8A8 through _scaled_mm (quantized_linear.h).
  bool fp8_scaled_mm = false;
};

}  // namespace strata::runtime
