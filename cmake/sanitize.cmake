# STRATA_SANITIZE: build strata's own targets with GCC/Clang sanitizers (tests/sanitize/README.md).
#   -DSTRATA_SANITIZE=address,undefined   ASan + UBSan; undefined behaviour aborts (no recovery)
#   -DSTRATA_SANITIZE=thread              TSan
# Only strata's code is instrumented: LibTorch (the PyPI wheel) and Debian's gRPC, Protobuf and Abseil
# are used as they are. scripts/sanitize.sh configures build-asan/ and build-tsan/ with it.
set(STRATA_SANITIZE "" CACHE STRING "Sanitizers for strata's targets: address,undefined | thread (empty: none)")

if(STRATA_SANITIZE)
  string(REPLACE "," ";" strata_sanitizers "${STRATA_SANITIZE}")
  foreach(s IN LISTS strata_sanitizers)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "STRATA_SANITIZE: unknown sanitizer \"${s}\" in \"${STRATA_SANITIZE}\" "
                          "(address, undefined or thread)")
    endif()
  endforeach()
  if("thread" IN_LIST strata_sanitizers AND "address" IN_LIST strata_sanitizers)
    message(FATAL_ERROR "STRATA_SANITIZE: \"thread\" cannot be combined with \"address\"")
  endif()
  # Frame pointers give the sanitizers' fast unwinder whole stacks.
  add_compile_options(-fsanitize=${STRATA_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${STRATA_SANITIZE})
  if("undefined" IN_LIST strata_sanitizers)
    # Undefined behaviour ends the process instead of printing and going on, so that a test fails.
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
  message(STATUS "strata: sanitizers ${STRATA_SANITIZE}")
endif()
