#pragma once
// Internal: the intra-op split of the decode step's kernels (Linear's rows, the quantized rows, decode
// attention, the pointwise rows) over the calling thread and its own team of workers that spin briefly
// before they sleep.
//
// Why not at::parallel_for: a decode step is ~100 short parallel regions (a 768 x 768 int4 layer is ~20 us),
// separated by a few microseconds of serial work. libgomp's workers spin only ~1000 iterations when it
// counts more threads than CPUs, which it does as soon as two threads have teams (the loader's and a
// stage's): they sleep between regions, and each region then pays a futex wake and a context switch per
// worker (measured: ~500 context switches per decoded token at 2 threads, and 2 threads decoding an int4
// model slower than one). These workers spin up to kSpinMicros after each job, as llama.cpp's do, then
// block on a futex; a job finding every worker awake costs two atomic stores and a cache line per worker.
// The other way round, libgomp's workers must not spin on these teams' cores between ATen's regions: the
// programs that run steps make libgomp wait passively (cli/openmp_wait.cc).
//
// Each calling thread has its own team (a pipeline stage's worker, the engine thread), sized to its
// at::get_num_threads() at the call and made on first use; a call from inside a job runs inline.
// Exceptions thrown by `fn` in any task reach the caller (the first one).

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace strata::runtime {

// Runs fn(begin, end) over [0, n) in at most kPiecesPerThread x at::get_num_threads() contiguous pieces, as many
// as `grain` allows (pieces of ceil(n / pieces)), which the caller and its workers claim one at a time (as ggml's
// threads claim chunks of a product): a thread slowed by another process or the hypervisor takes fewer pieces
// instead of holding every other thread at the join. fn(0, n) on the caller when one thread will do.
void ParallelRows(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

inline constexpr int kPiecesPerThread = 4;

// How long a worker spins for the next job before it sleeps.
inline constexpr int64_t kSpinMicros = 200;

}  // namespace strata::runtime
