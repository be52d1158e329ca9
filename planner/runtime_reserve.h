#pragma once
// The GPU memory a serving process allocates beyond its weights and KV cache, kept out of the budgets the
// placement runs with (strata's addition to transformers' budgets, as the KV reserve is): cuBLAS workspaces,
// one micro-batch's activations and attention work per stage, and on the GPU that computes the logits the
// sampler's float32 work and the penalty tables. transformers places against the free memory alone and
// leaves the rest to chance; vLLM measures a profile run and keeps gpu_memory_utilization. strata sizes the
// reserve from the serving limits before placing (the plan must hold before any weight moves), each term a
// bound the runtime's tests measure its CPU path against (tests/runtime/runtime_reserve_test.cc).
// Plain C++ (no torch).

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/device.h"
#include "planner/model_spec.h"

namespace strata::planner {

// The limits a server or strata-generate runs with (their flags of the same names).
struct ServingLimits {
  int64_t max_batch = 1;         // sequences running at once
  int64_t max_context = 2048;    // positions a sequence may reach
  int64_t max_batch_tokens = 0;  // tokens one micro-batch carries (0: max_batch x max_context)
  int64_t micro_batches = 1;     // micro-batches in flight across the stages (0: one per stage)
  bool prompt_logprobs = true;   // a request may ask for its prompt's log-probabilities (logits of every token)
};

// --runtime-reserve: none (transformers' budgets: strata-plan's default), auto (from the serving limits: the
// server's and strata-generate's default), or a fixed number of bytes on every GPU that runs a stage.
struct RuntimeReserve {
  enum class Kind { kNone, kAuto, kFixed };
  Kind kind = Kind::kNone;
  int64_t bytes = 0;     // kFixed
  ServingLimits limits;  // kAuto
  // kAuto: plan GPUs that execute on the CPU (--physical-devices N=cpu) get none: nothing of theirs is GPU
  // memory. A fixed size applies to them too.
  std::set<int> runs_on_cpu;
};

// "auto", "none" or a size ("2GiB", "512MB", "0"); the error names the text.
absl::StatusOr<RuntimeReserve> ParseRuntimeReserve(absl::string_view text);

// One GPU's reserve, term by term (bytes).
struct RuntimeReserveParts {
  int64_t workspaces = 0;   // cuBLAS and cuBLASLt workspaces of the streams running there
  int64_t activations = 0;  // a micro-batch through the widest layer there, and the activations held between stages
  int64_t attention = 0;    // keys and values gathered from the pool, masks and scores of the largest group
  int64_t sampler = 0;      // the logits' float32 work and the penalty tables (the GPU computing the logits)
  // "cpu" and "disk" entries run on the lowest GPU of the map through two persistent slots per stage, each the size
  // of its largest unit (runtime/model/weights.h, OffloadBuffers); transformers' placement already keeps one largest
  // layer free there when it offloads, so this is the rest: (2 x offload stages - 1) x the largest offloaded unit.
  int64_t offload = 0;
  int64_t fixed = 0;             // --runtime-reserve SIZE
  int64_t total() const;         // the sum, saturating at int64's largest value
  std::string Describe() const;  // "1.2 GiB (workspaces 128 MiB, activations ..., ...)"
};

// Every GPU that executes part of `map` ("cpu" and "disk" entries execute on the lowest-numbered GPU of the
// map, as the runtime runs them) with its reserve; empty for kNone and for maps without a GPU.
std::map<Device, RuntimeReserveParts> RuntimeReserveBytes(const ModelSpec& spec,
                                                          const std::vector<std::pair<std::string, Device>>& map,
                                                          const RuntimeReserve& reserve);

// The sampler's work over `rows` rows of `vocab` logits with `penalty_slots` sequences' penalty tables: per logit,
// the processed float32 scores, the sorts' keys and int64 indices, float64 probabilities and their cumulative sum,
// the draw's int64 positions and running maximum (the CPU path measures 48 B, tests/runtime/runtime_reserve_test.cc;
// the term adds half again for CUDA's sorts, whose radix passes double-buffer keys and indices); per vocabulary
// entry, what does not grow with the rows (measured 39 B); the penalty tables' bool and float32 per slot and entry.
inline constexpr int64_t kSamplerBytesPerLogit = 72;
inline constexpr int64_t kSamplerBytesPerVocab = 64;
int64_t SamplerWorkBytes(int64_t rows, int64_t vocab, int64_t penalty_slots);
// Prompt log-probabilities over `rows` rows: float32 log_softmax and top-k per logit (the CPU path measures 4 B).
inline constexpr int64_t kScoreBytesPerLogit = 16;
int64_t ScoreWorkBytes(int64_t rows, int64_t vocab);
// Per stream: torch's cuBLAS workspace (32 MiB on compute capability 9.0 and newer, CUBLAS_WORKSPACE_CONFIG's
// default) and cuBLASLt's, which torch sizes the same.
inline constexpr int64_t kWorkspaceBytesPerStream = int64_t{64} << 20;

// The activation bytes one token needs in one decoder layer of `spec` (read from the layer's tensors, so it
// holds for module trees): the residual stream and the normed copy, every linear output, the largest one once
// more for the elementwise product, float32 copies the norms take; MoE layers route each token through top_k
// experts (decoder config; every expert when the spec has none).
int64_t LayerActivationBytesPerToken(const ModelSpec& spec, const ModuleSpec& layer);

}  // namespace strata::planner
