#!/usr/bin/env bash
# The test command: set-up, the formatting check (scripts/check_format.sh), build, every C++ test (CTest) and every Python parity/integration test
# (pytest), the sanitizer lanes (tests/sanitize: the C++ suites and a serving scenario under ASan + UBSan
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
"$venv/bin/python" -m pytest tests clients/python/tests -q -p no:cacheprovider 2>&1 | tee "$logs/pytest.log"
pytest_rc=${PIPESTATUS[0]}

# "N tests failed out of M" / "X% tests passed, N tests failed out of M"
ctest_line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$logs/ctest.log" | tail -n 1)
ctest_failed=$(sed -nE 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/p' <<<"$ctest_line")
ctest_total=$(sed -nE 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\2/p' <<<"$ctest_line")
ctest_skipped=$(grep -cE '\*\*\*Skipped|Not Run \(Disabled\)' "$logs/ctest.log" || true)
ctest_failed=${ctest_failed:-0} ctest_total=${ctest_total:-0}
ctest_passed=$((ctest_total - ctest_failed - ctest_skipped))

py_line=$(grep -E '^[=]* ?[0-9]+ (passed|failed)|[0-9]+ passed|[0-9]+ failed' "$logs/pytest.log" | tail -n 1)
count() { sed -nE "s/.*[^0-9]([0-9]+) $1.*/\1/p; s/^([0-9]+) $1.*/\1/p" <<<"$py_line" | head -n 1; }
py_passed=$(count passed) py_failed=$(count failed) py_errors=$(count error) py_skipped=$(count skipped)
py_passed=${py_passed:-0} py_failed=${py_failed:-0} py_errors=${py_errors:-0} py_skipped=${py_skipped:-0}

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
