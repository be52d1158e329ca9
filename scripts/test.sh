#!/usr/bin/env bash
# The test command: set-up, the formatting check (scripts/check_format.sh), build, every C++ test (CTest) and every Python parity/integration test
# (pytest, two shards side by side), the sanitizer lanes (tests/sanitize: the C++ suites and a serving scenario under ASan + UBSan
# and TSan, built into build-asan/ and build-tsan/ by scripts/sanitize.sh) included. Exits non-zero on
# any failure; the last line sums up.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
venv=${STRATA_VENV:-$HOME/.cache/strata/venv}
export STRATA_BUILD_DIR=${STRATA_BUILD_DIR:-$here/build}

scripts/setup.sh || exit 1
# Formatting first: it takes seconds, and its verdict counts in the exit status like a failed test.
scripts/check_format.sh
format_rc=$?
scripts/build.sh || exit 1
# The libFuzzer harnesses: a clang build of their own ($STRATA_FUZZ_BUILD_DIR, default build-fuzz/);
# tests/fuzz runs each for $STRATA_FUZZ_SECONDS (30) under pytest.
scripts/fuzz.sh build || exit 1
# The aarch64 lane: kernels/ cross-compiled into build-aarch64/; tests/cross runs its suite under qemu-aarch64.
scripts/cross-aarch64.sh || exit 1
# The sanitizer lanes: build-asan/ (ASan+UBSan) and build-tsan/ (TSan); tests/sanitize runs them under pytest.
scripts/sanitize.sh || exit 1

logs=$(mktemp -d)
ctest --test-dir "$STRATA_BUILD_DIR" --output-on-failure -j 2 2>&1 | tee "$logs/ctest.log"
ctest_rc=${PIPESTATUS[0]}

# pytest in two processes side by side, each with the folders' own conftests, session fixtures (the image is
# built once, in the first) and summaries: most cases are one Python process and one strata process taking
# turns, so one core idles in a single run. No test may depend on an idle machine: a time bound in a test is a
# generous fraction of the alternative it rules out, or an order of events (issue 40).
# The second shard (STRATA_PYTEST_SHARD2: folders) prints after the first; every folder it does not name runs
# in the first, so a new folder is never left out. Each shard's wall time is printed at the end (to rebalance).
# Measured alone on 2 cores (2026-11-27): the second shard 16 min of tests plus 5 of sanitizer lanes, the first
# about as long.
shard2=()
for d in ${STRATA_PYTEST_SHARD2:-tests/parity tests/chat_template_parity tests/tokenizer_parity tests/fuzz tests/gpu_check
  tests/sanitize}; do
  [[ -e $d ]] && shard2+=("$d")
done
ignored=()
for d in "${shard2[@]}"; do ignored+=("--ignore=$d"); done
started=$SECONDS
{
  "$venv/bin/python" -m pytest "${shard2[@]}" -q -p no:cacheprovider >"$logs/pytest2.log" 2>&1
  echo $? >"$logs/pytest2.rc"
  echo $((SECONDS - started)) >"$logs/pytest2.seconds"
} &
shard2_pid=$!
"$venv/bin/python" -m pytest tests clients/python/tests "${ignored[@]}" -q -p no:cacheprovider 2>&1 | tee "$logs/pytest1.log"
pytest1_rc=${PIPESTATUS[0]}
shard1_seconds=$((SECONDS - started))
wait "$shard2_pid"
pytest2_rc=$(cat "$logs/pytest2.rc" 2>/dev/null || echo 1)
echo "=== pytest, second shard: ${shard2[*]}"
cat "$logs/pytest2.log"
echo "pytest shards: first ${shard1_seconds} s, second $(cat "$logs/pytest2.seconds" 2>/dev/null || echo '?') s"
pytest_rc=$((pytest1_rc != 0 || pytest2_rc != 0))

# "N tests failed out of M" / "X% tests passed, N tests failed out of M"
ctest_line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$logs/ctest.log" | tail -n 1)
ctest_failed=$(sed -nE 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/p' <<<"$ctest_line")
ctest_total=$(sed -nE 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/p' <<<"$ctest_line")
ctest_skipped=$(grep -cE '\*\*\*Skipped|Not Run \(Disabled\)' "$logs/ctest.log" || true)
ctest_failed=${ctest_failed:-0} ctest_total=${ctest_total:-0}
ctest_passed=$((ctest_total - ctest_failed - ctest_skipped))

# Each shard's last line: "N passed, M skipped in ..." (or "failed", "error").
count() { sed -nE "s/.*[^0-9]([0-9]+) $1.*/\1/p; s/^([0-9]+) $1.*/\1/p" <<<"$2" | head -n 1; }
py_passed=0 py_failed=0 py_errors=0 py_skipped=0
for log in "$logs/pytest1.log" "$logs/pytest2.log"; do
  py_line=$(grep -E '^[=]* ?[0-9]+ (passed|failed)|[0-9]+ passed|[0-9]+ failed|[0-9]+ errors? in ' "$log" | tail -n 1)
  n=$(count passed "$py_line") && py_passed=$((py_passed + ${n:-0}))
  n=$(count failed "$py_line") && py_failed=$((py_failed + ${n:-0}))
  n=$(count error "$py_line") && py_errors=$((py_errors + ${n:-0}))
  n=$(count skipped "$py_line") && py_skipped=$((py_skipped + ${n:-0}))
done

passed=$((ctest_passed + py_passed))
failed=$((ctest_failed + py_failed + py_errors))
skipped=$((ctest_skipped + py_skipped))
rm -rf "$logs"
echo "ctest: $ctest_passed passed, $ctest_failed failed, $ctest_skipped skipped; pytest: $py_passed passed, $((py_failed + py_errors)) failed, $py_skipped skipped"
if [[ $format_rc -ne 0 ]]; then
  echo "format: scripts/check_format.sh failed (listed above)"
  failed=$((failed + 1))
fi
if [[ $ctest_rc -ne 0 || $pytest_rc -ne 0 ]] && [[ $failed -eq 0 ]]; then failed=1; fi
echo "summary: $passed passed, $failed failed, $skipped skipped"
[[ $ctest_rc -eq 0 && $pytest_rc -eq 0 && $format_rc -eq 0 ]]
