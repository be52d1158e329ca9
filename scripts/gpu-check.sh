#!/usr/bin/env bash
# Runs ON THE GPU MACHINE, in the repository root (the device tool's working directory): builds strata
# there against the Debian packages of .gpu-bundle/ (scripts/gpu-bundle.sh, unpacked with dpkg -x into
# a private prefix, never into /) and that machine's torch wheel, then runs the GPU checks and records
# them into OUTDIR: summary.md and summary.json (each step's pass/fail), logs.tar.gz (every step's
# log), gpu_bench.{md,json} and default_plan.{md,json}. A failing step does not stop the later ones;
# the exit status is 1 if any step failed or did not run, 2 on bad arguments.
#
# Steps (--steps, comma-separated; default all, in this order):
#   preflight  (always first; needs no GPU) what the steps need and what is missing: the Python modules and
#              their versions (torch with CUDA, transformers, accelerate, safetensors, pytest), the tools (cmake,
#              ninja, dpkg, nvidia-smi, compute-sanitizer), the bundle, the GPUs torch and the driver see
#   build      unpack the bundle, configure (no server: gRPC is not bundled), build only what the steps run:
#              strata-plan, strata-generate, strata_runtime_tests, strata_dequantize_probe
#   gtest      the runtime gtest suite (TorchSmoke, SamplerCuda, ScaledMm use the GPU; it links LibTorch's CPU
#              half and reaches libtorch_cuda through strata's run-time loader, as the binaries do)
#   parity     tests/runtime_parity/test_cuda_parity.py and test_quantized_cuda_parity.py (FP8 packed, and W8A8
#              on the GPU) (+ the CPU suite's one CUDA case) vs
#              transformers on the same GPU
#   sync       CudaSync: the engine's decode loop under LibTorch's sync-debug mode "error"
#   sanitizer  compute-sanitizer on a short 2-stage decode on cuda:0: memcheck without the caching allocator,
#              memcheck and racecheck with it
#   plan       bench/gpu_default_plan.py: the default plan (no --max-memory) vs from_pretrained(device_map=S)
#   bench      bench/gpu_bench.py: decode tok/s vs transformers, HBM roofline, offload vs accelerate
#   multi      when two GPUs are visible: a 2-stage plan on cuda:0 and cuda:1 gives the ids of the same plan on
#              cuda:0 alone (greedy, float32), with the activations crossing devices; skipped (a pass that says
#              so) with one GPU
# --dry-run runs the preflight and, for every other step, prints what it would run and its time budget,
# then writes the summary: everything but the GPU work, on any machine.
# A device-tool command may run 10 minutes: --deadline (default 560 s) stops starting steps that would
# not finish, marks them "not run", and writes the summary in time. All steps take longer than one
# call; split them over two calls made back to back (the machine stays warm, build-gpu/ is reused):
#   scripts/gpu-check.sh --steps build,gtest,parity,sync,sanitizer $OUT
#   scripts/gpu-check.sh --steps build,plan,bench,multi $OUT
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: scripts/gpu-check.sh [--steps LIST] [--bundle DIR] [--build-dir DIR] [--python PY] [--deadline SECONDS]
                           [--configure-only] [--dry-run] OUTDIR
  Builds strata on the GPU machine against the .debs of --bundle (default .gpu-bundle/) and runs the GPU
  checks, writing summary.md, summary.json, logs.tar.gz and the bench tables into OUTDIR.
  --steps      comma-separated subset of: build,gtest,parity,sync,sanitizer,plan,bench,multi (default: all;
               the preflight always runs)
  --build-dir  default build-gpu/ (ignored by git)
  --python     the Python with torch, transformers, accelerate, pytest (default: python3)
  --deadline   seconds after which no step starts and running ones are stopped (default 560)
  --configure-only  the build step unpacks the bundle and configures, but builds nothing (to check a
               bundle on another machine; the other steps then need an earlier build)
  --dry-run    run the preflight, print the other steps' commands and budgets, write the summary
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
all_steps=(build gtest parity sync sanitizer plan bench multi)
steps_arg=$(IFS=,; echo "${all_steps[*]}")
bundle=$here/.gpu-bundle
build=$here/build-gpu
python=python3
deadline=560
configure_only=
dry_run=
outdir=

need_value() { [[ $# -ge 2 && -n $2 ]] || { echo "gpu-check.sh: $1 needs a value" >&2; usage; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) need_value "$@"; steps_arg=$2; shift 2 ;;
    --bundle) need_value "$@"; bundle=$2; shift 2 ;;
    --build-dir) need_value "$@"; build=$2; shift 2 ;;
    --python) need_value "$@"; python=$2; shift 2 ;;
    --deadline) need_value "$@"; deadline=$2; shift 2 ;;
    --configure-only) configure_only=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu-check.sh: unknown option: $1" >&2; usage; exit 2 ;;
    *)
      [[ -z $outdir ]] || { echo "gpu-check.sh: one OUTDIR only (got '$outdir' and '$1')" >&2; usage; exit 2; }
      outdir=$1
      shift
      ;;
  esac
done
[[ -n $outdir ]] || { echo "gpu-check.sh: OUTDIR is required" >&2; usage; exit 2; }
[[ $deadline =~ ^[0-9]+$ ]] || { echo "gpu-check.sh: --deadline: '$deadline' is not a number of seconds" >&2; exit 2; }
IFS=, read -r -a steps <<<"$steps_arg"
for s in "${steps[@]}"; do
  [[ " ${all_steps[*]} " == *" $s "* ]] || { echo "gpu-check.sh: --steps: unknown step '$s'" >&2; usage; exit 2; }
done
wants() { [[ ",$steps_arg," == *",$1,"* ]]; }

mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)
logs=$(mktemp -d)
work=$build/gpu-check-work  # checkpoints made by the steps
prefix=$build/bundle-prefix
mkdir -p "$build" "$work"
started=$SECONDS

# ---- steps: each runs in a subshell with its log as stdout/stderr; $budget is its time limit -------

# What each step needs, checked before any runs: what is there, what is missing and which steps need it.
step_preflight() {
  local missing=() elsewhere=()  # missing here; missing, needed only on the GPU machine (--dry-run)
  "$python" - "$steps_arg" <<'PY' || missing+=("python modules (above)")
import importlib, sys
steps = set(sys.argv[1].split(","))
need = {  # module: (minimum version, steps that import it)
    "torch": ("2.6", {"build", "gtest", "parity", "sync", "sanitizer", "plan", "bench", "multi"}),
    "transformers": ("5.0", {"parity", "sanitizer", "plan", "bench", "multi"}),
    "accelerate": ("1.0", {"plan", "bench"}),
    "safetensors": ("0.4", {"parity", "sanitizer", "bench", "multi"}),
    "pytest": ("8.0", {"parity"}),
    "numpy": ("1.24", {"parity", "bench"}),
}
def version(text):
    return tuple(int(p) for p in text.split("+")[0].split(".")[:2] if p.isdigit())
bad = []
for name, (least, used) in need.items():
    if not used & steps:
        continue
    try:
        module = importlib.import_module(name)
        have = getattr(module, "__version__", "?")
        ok = version(have) >= version(least)
        print(f"{name:13} {have:12} {'ok' if ok else 'TOO OLD'} (>= {least}; for {', '.join(sorted(used & steps))})")
        if not ok:
            bad.append(name)
    except Exception as e:  # noqa: BLE001 - report whatever keeps it from importing
        print(f"{name:13} MISSING      ({type(e).__name__}: {e}; for {', '.join(sorted(used & steps))})")
        bad.append(name)
try:
    import torch
    print(f"torch CUDA {torch.version.cuda}, available {torch.cuda.is_available()}, devices {torch.cuda.device_count()}")
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"  cuda:{i} {p.name}, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
except Exception as e:  # noqa: BLE001
    print(f"torch CUDA: {e}")
sys.exit(1 if bad else 0)
PY
  local tool
  for tool in cmake ninja dpkg git nvidia-smi compute-sanitizer; do
    if command -v "$tool" >/dev/null; then
      printf '%-18s %s\n' "$tool" "$(command -v "$tool")"
    else
      printf '%-18s MISSING\n' "$tool"
      case $tool in
        nvidia-smi) if [[ -n $dry_run ]]; then elsewhere+=("$tool"); else missing+=("$tool"); fi ;;
        compute-sanitizer)
          if ! wants sanitizer; then :; elif [[ -n $dry_run ]]; then elsewhere+=("$tool"); else missing+=("$tool (sanitizer)"); fi ;;
        *) missing+=("$tool") ;;
      esac
    fi
  done
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: no GPU listed"
  local debs
  debs=$( (compgen -G "$bundle/*.deb" || true) | wc -l)
  echo "bundle: $debs .deb files in $bundle"
  if ((debs == 0)) && wants build; then
    if [[ -n $dry_run ]]; then elsewhere+=("the bundle"); else missing+=("the bundle (scripts/gpu-bundle.sh)"); fi
  fi
  ((${#elsewhere[@]} == 0)) || echo "not here, needed on the GPU machine: ${elsewhere[*]}"
  if ((${#missing[@]})); then
    echo "missing: ${missing[*]}"
    return 1
  fi
  echo "preflight: everything the steps need here is here"
}

step_build() {
  [[ -d $bundle ]] && compgen -G "$bundle/*.deb" >/dev/null ||
    { echo "no .deb files in $bundle: run scripts/gpu-bundle.sh on the development machine and carry .gpu-bundle"; return 1; }
  [[ -f $bundle/MANIFEST ]] && cat "$bundle/MANIFEST"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$bundle"/*.deb; do dpkg -x "$f" "$prefix"; done
  # The .pc files name /usr: point them at the prefix.
  find "$prefix" -name '*.pc' -exec sed -i "s#=/usr#=$prefix/usr#g; s#-I/usr#-I$prefix/usr#g; s#-L/usr#-L$prefix/usr#g" {} +
  local torch_prefix
  torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  cmake --version | head -n 1
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH=/usr/local/cuda/bin:$PATH; fi
  command -v nvcc && nvcc --version | tail -n 1
  # The machine's pkg-config if it has one (PKG_CONFIG names another), else the bundle's pkgconf; either
  # way only the prefix's .pc files are searched.
  local pkg_config=${PKG_CONFIG:-$(command -v pkg-config || true)}
  [[ -n $pkg_config ]] || pkg_config=$prefix/usr/bin/pkgconf
  export PKG_CONFIG_LIBDIR=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
  export PKG_CONFIG_PATH=$PKG_CONFIG_LIBDIR
  echo "pkg-config: $pkg_config; oniguruma $("$pkg_config" --modversion oniguruma), libutf8proc $("$pkg_config" --modversion libutf8proc)"
  timeout "$budget" cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_prefix" -DPKG_CONFIG_EXECUTABLE="$pkg_config" \
    -DPython3_EXECUTABLE="$(command -v "$python")" -DSTRATA_BUILD_SERVER=OFF -DTORCH_CUDA_ARCH_LIST=9.0
  grep -E '^(absl_DIR|GTest_DIR|nlohmann_json_DIR|Torch_DIR|pkgcfg_lib_)' "$build/CMakeCache.txt"
  if [[ -n $configure_only ]]; then return 0; fi
  # Only what the steps run (the bench's micro-benchmarks and the other suites are not needed on the GPU machine).
  timeout "$((budget - (SECONDS - step_started)))" cmake --build "$build" -j "$(nproc)" \
    --target strata-plan strata-generate strata_runtime_tests strata_dequantize_probe
  grep -q '^STRATA_BUILD_SERVER:BOOL=OFF' "$build/CMakeCache.txt"
  ls -la "$build/runtime/strata-generate" "$build/planner/strata-plan"
}

step_gtest() {
  # CudaSync has its own step; every other runtime test, CUDA ones included.
  timeout "$budget" "$build/tests/runtime/strata_runtime_tests" --gtest_filter='-*CudaSync*' --gtest_brief=1
  "$build/tests/runtime/strata_runtime_tests" --gtest_filter='TorchSmoke.*' 2>&1 | tee "$logs/torch_smoke.txt"
  # The GPU half must have run here, not skipped.
  ! grep -q 'SKIPPED ] TorchSmoke' "$logs/torch_smoke.txt"
}

step_parity() {
  STRATA_BUILD_DIR=$build timeout "$budget" "$python" -m pytest -v -rs -p no:cacheprovider \
    tests/runtime_parity/test_cuda_parity.py tests/runtime_parity/test_quantized_cuda_parity.py \
    "tests/runtime_parity/test_generate_parity.py::test_two_logical_stages_on_one_gpu" 2>&1 |
    tee "$logs/parity_pytest.txt"
  local rc=${PIPESTATUS[0]}
  # Skips here mean the GPU was not used: a failure of this step.
  if grep -qE '[0-9]+ skipped' "$logs/parity_pytest.txt"; then echo "parity: cases were skipped on the GPU machine"; return 1; fi
  return "$rc"
}

step_sync() {
  timeout "$budget" "$build/tests/runtime/strata_runtime_tests" --gtest_filter='*CudaSync*' 2>&1 | tee "$logs/sync.txt"
  local rc=${PIPESTATUS[0]}
  if grep -q 'SKIPPED ] .*CudaSync' "$logs/sync.txt"; then echo "sync: the test skipped on the GPU machine"; return 1; fi
  return "$rc"
}

step_sanitizer() {
  command -v compute-sanitizer || { echo "compute-sanitizer is not on PATH"; return 1; }
  local model=$work/sanitizer-model
  if [[ ! -f $model/config.json ]]; then
    "$python" -c "import sys, pathlib; sys.path.insert(0, 'tests/runtime_parity'); import runtime_helpers as H; \
H.make_checkpoint(pathlib.Path(sys.argv[1]), 'llama_llama3_gqa')" "$model"
  fi
  local map='{"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}'
  local args=("$build/runtime/strata-generate" --model "$model" --prompt-ids 5,6,7,8 --prompt-ids 3,4
    --max-new-tokens 4 --max-batch 2 --max-context 64 --device-map "$map"
    --physical-devices 0=cuda:0,1=cuda:0 --max-memory 0=1GiB,1=1GiB,cpu=1GiB --dtype float32)
  local rc=0 run tool caching each=$((budget / 3))
  # memcheck without the caching allocator sees every allocation's real bounds; with it (as strata serves), memcheck
  # and racecheck see blocks reused across streams (record_stream is a no-op without the cache, every free synchronous).
  for run in memcheck:0 memcheck:1 racecheck:1; do
    tool=${run%:*} caching=${run#*:}
    local log=$logs/sanitizer_${tool}_caching$caching.txt
    if ((caching)); then
      timeout "$each" compute-sanitizer --tool "$tool" --error-exitcode 3 --log-file "$log" "${args[@]}" || rc=1
    else
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$each" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        --log-file "$log" "${args[@]}" || rc=1
    fi
    local summary
    summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1 || true)
    echo "$tool (caching allocator $( ((caching)) && echo on || echo off)): $summary"
    echo "$tool, caching allocator $( ((caching)) && echo on || echo off): $summary" >>"$logs/sanitizer_summary.txt"
  done
  return "$rc"
}

step_plan() {
  timeout "$budget" "$python" bench/gpu_default_plan.py --strata-plan "$build/planner/strata-plan" \
    --work "$work" --out "$outdir"
}

step_bench() {
  timeout "$budget" "$python" bench/gpu_bench.py --strata-generate "$build/runtime/strata-generate" \
    --work "$work" --out "$outdir"
}

step_multi() {
  local gpus
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  if ((gpus < 2)); then
    echo "multi: $gpus GPU visible, two are needed: skipped"
    return 0
  fi
  local model=$work/sanitizer-model
  if [[ ! -f $model/config.json ]]; then
    "$python" -c "import sys, pathlib; sys.path.insert(0, 'tests/runtime_parity'); import runtime_helpers as H; \
H.make_checkpoint(pathlib.Path(sys.argv[1]), 'llama_llama3_gqa')" "$model"
  fi
  local map='{"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "model.rotary_emb": 1, "lm_head": 1}'
  local args=(--model "$model" --prompt-ids 5,6,7,8 --prompt-ids 3,4,9 --max-new-tokens 16 --max-batch 2
    --max-context 64 --device-map "$map" --max-memory 0=1GiB,1=1GiB,cpu=1GiB --dtype float32 --json)
  timeout "$((budget / 2))" "$build/runtime/strata-generate" "${args[@]}" --physical-devices 0=cuda:0,1=cuda:1 \
    >"$logs/multi_two.json"
  timeout "$((budget / 2))" "$build/runtime/strata-generate" "${args[@]}" --physical-devices 0=cuda:0,1=cuda:0 \
    >"$logs/multi_one.json"
  "$python" - "$logs/multi_two.json" "$logs/multi_one.json" <<'PY'
import json, sys
two, one = (json.load(open(p)) for p in sys.argv[1:3])
ids = lambda r: [s["ids"] for s in r["results"]]
print("two GPUs:", ids(two)); print("one GPU: ", ids(one))
sys.exit(0 if ids(two) == ids(one) else 1)
PY
}

# ---- driver ---------------------------------------------------------------------------------------

declare -A limit=([preflight]=60 [build]=300 [gtest]=150 [parity]=240 [sync]=90 [sanitizer]=240 [plan]=240
  [bench]=360 [multi]=120)
declare -A least=([preflight]=5 [build]=30 [gtest]=30 [parity]=60 [sync]=20 [sanitizer]=60 [plan]=90 [bench]=150
  [multi]=30)
results=()
failed=0
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 CMAKE_POLICY_VERSION_MINIMUM=3.5
# Each step runs in a subshell: the CUDA tools (nvcc, compute-sanitizer) go on PATH here, for all of them.
# (A toolkit installs compute-sanitizer in compute-sanitizer/ and links it from bin/; either will do.)
for dir in /usr/local/cuda/compute-sanitizer /usr/local/cuda/bin; do [[ -d $dir ]] && export PATH=$dir:$PATH; done

for s in preflight "${all_steps[@]}"; do
  [[ $s == preflight ]] || wants "$s" || continue
  left=$((deadline - (SECONDS - started)))
  if [[ -n $dry_run && $s != preflight ]]; then
    budget=$((left < limit[$s] ? left : limit[$s]))
    echo "gpu-check: $s (dry run: would run at most $budget s):"
    declare -f "step_$s" | sed 's/^/    /'
    status="dry run"
    secs=0
  elif ((left < least[$s])); then
    status="not run"
    secs=0
    echo "gpu-check: $s: not run ($left s left before the deadline)"
  else
    budget=$((left < limit[$s] ? left : limit[$s]))
    step_started=$SECONDS
    echo "gpu-check: $s (at most $budget s) ..."
    set +e
    (set -euo pipefail; "step_$s") >"$logs/$s.log" 2>&1
    rc=$?
    set -e
    secs=$((SECONDS - step_started))
    if ((rc == 0)); then status=pass; elif ((rc == 124 || rc == 137)); then status="fail (timeout)"; else status="fail (exit $rc)"; fi
    echo "gpu-check: $s: $status in $secs s"
    [[ $rc -eq 0 ]] || tail -n 15 "$logs/$s.log" | sed 's/^/    /'
  fi
  [[ $status == pass || $status == "dry run" ]] || failed=1
  results+=("$s|$status|$secs")
done

# ---- summary --------------------------------------------------------------------------------------
{
  echo "# strata GPU check"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1),"\
    "$("$python" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null), commit $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  for r in "${results[@]}"; do IFS='|' read -r s st secs <<<"$r"; echo "| $s | $st | $secs |"; done
  if [[ -f $logs/sanitizer_summary.txt ]]; then echo; echo "compute-sanitizer:"; sed 's/^/    /' "$logs/sanitizer_summary.txt"; fi
  for table in default_plan gpu_bench; do
    if [[ -f $outdir/$table.md ]]; then echo; cat "$outdir/$table.md"; fi
  done
  echo
  echo "Logs: logs.tar.gz (one log per step)."
} >"$outdir/summary.md"
"$python" - "$outdir/summary.json" "${results[@]}" <<'EOF' || echo '{"error": "could not write JSON"}' >"$outdir/summary.json"
import json, sys
steps = [dict(zip(("step", "result", "seconds"), r.split("|"))) for r in sys.argv[2:]]
for s in steps:
    s["seconds"] = int(s["seconds"])
json.dump({"steps": steps, "passed": all(s["result"] == "pass" for s in steps)}, open(sys.argv[1], "w"), indent=1)
EOF
tar -czf "$outdir/logs.tar.gz" -C "$logs" .
rm -rf "$logs"
cat "$outdir/summary.md"
exit "$failed"
