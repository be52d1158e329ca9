# Included by the top-level CMakeLists.txt when STRATA_FUZZ is on, before any library is added: every
# library of the fuzz build gets libFuzzer's coverage instrumentation and ASan+UBSan, and nothing that
# needs LibTorch, prometheus-cpp or GoogleTest is configured. See tests/fuzz/README.md.
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "STRATA_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++ "
                      "-DCMAKE_C_COMPILER=clang in a build directory of its own (scripts/fuzz.sh does)")
endif()
# Normal variables shadow the cached options: runtime/ (LibTorch), server/ and the gtest suites stay out.
set(STRATA_BUILD_RUNTIME OFF)
set(STRATA_BUILD_SERVER OFF)
set(STRATA_BUILD_TESTS OFF)

# fuzzer-no-link: coverage for libFuzzer without its main(); the harness executables link -fsanitize=fuzzer.
# UBSan reports abort (no recover) so that libFuzzer keeps the input as a crash. _GLIBCXX_ASSERTIONS turns an
# out-of-range vector/string index, front() of an empty container and the like into an abort too.
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                    -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS)
add_link_options(-fsanitize=address,undefined)
