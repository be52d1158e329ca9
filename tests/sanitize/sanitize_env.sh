# Sourced by scripts/sanitize.sh and read by tests/sanitize: the run-time options of the sanitizer
# lanes. Every report ends the process with a failure; suppressions are in this folder, each justified.
sanitize_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:exitcode=86:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=0:check_initialization_order=1:suppressions=$sanitize_dir/asan.supp"
export LSAN_OPTIONS="exitcode=86:suppressions=$sanitize_dir/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=86:suppressions=$sanitize_dir/ubsan.supp"
# UCX (the group transport, transport/transport.h) hooks malloc and mmap through libucm, patching their
# relocations, to keep its memory-registration cache true; under the sanitizers' own interceptors that patching
# crashes the process at UCX's start. Its registration cache serves RDMA, which these lanes do not use.
export UCX_MEM_EVENTS=no
export TSAN_OPTIONS="halt_on_error=1:exitcode=86:second_deadlock_stack=1:history_size=7:suppressions=$sanitize_dir/tsan.supp"
