# xgrammar (Apache-2.0), the grammar engine structured/ is built on, from its PyPI sdist: the sdist holds the whole
# C++ core. Nothing of it is committed: the tarball is fetched at configure time, verified by its SHA-256, kept in a
# cache outside the build folder (every build folder of scripts/test.sh, a fresh clone, the image build through a
# mount, reuse it) and extracted into the build folder.
#
#   STRATA_DEPS_CACHE (cache variable, or the environment variable): where the tarball is kept
#                     (default ~/.cache/strata/deps). Put xgrammar-0.2.8.tar.gz there to build offline.
#   PIP_INDEX_URL (environment): the package index the file's address is read from (as pip's; default PyPI's
#                     simple index). The pinned address below is the fallback when the index cannot be read.
#
# Its own CMakeLists.txt is not used: its config.cmake turns the Python bindings on and it adds -Werror and
# -flto=auto to the global flags. strata_xgrammar is its C++ core (cpp/ and its subfolders but cpp/tvm_ffi/,
# the Python bindings) as a static library, compiled as C++17 (what it is written for) at -O2 without warnings
# (its code, not ours to fix), with XGRAMMAR_LOG_CUSTOMIZE: structured/xgrammar_log.cc turns its fatal errors into
# exceptions with its message alone and collects its warnings (structured.cc refuses what they say is dropped).

set(STRATA_XGRAMMAR_VERSION 0.2.8)
set(STRATA_XGRAMMAR_SHA256 8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80)
# What https://pypi.org/simple/xgrammar/ lists for the sdist of 0.2.8.
set(STRATA_XGRAMMAR_PINNED_URL
    "https://files.pythonhosted.org/packages/03/0f/29f521535729be740779c2c98b630ef6607cf28be9b669895dd2b821ff63/xgrammar-0.2.8.tar.gz")

if(DEFINED ENV{STRATA_DEPS_CACHE} AND NOT "$ENV{STRATA_DEPS_CACHE}" STREQUAL "")
  set(strata_deps_cache_default "$ENV{STRATA_DEPS_CACHE}")
else()
  set(strata_deps_cache_default "$ENV{HOME}/.cache/strata/deps")
endif()
set(STRATA_DEPS_CACHE "${strata_deps_cache_default}" CACHE PATH
    "Where third-party source tarballs fetched at configure time are kept (xgrammar's sdist)")

# `url` without the user and password an index address may carry (for messages).
function(strata_url_for_messages url out)
  string(REGEX REPLACE "://[^/@]+@" "://" shown "${url}")
  set(${out} "${shown}" PARENT_SCOPE)
endfunction()

# The sdist's address as the package index lists it (PEP 503 simple index), or "" when the index cannot be read.
function(strata_resolve_sdist_url package file out)
  set(index "https://pypi.org/simple")
  if(DEFINED ENV{PIP_INDEX_URL} AND NOT "$ENV{PIP_INDEX_URL}" STREQUAL "")
    set(index "$ENV{PIP_INDEX_URL}")
  endif()
  string(REGEX REPLACE "/+$" "" index "${index}")
  set(page "${index}/${package}/")
  set(listing "${CMAKE_BINARY_DIR}/_deps/${package}-index.html")
  file(DOWNLOAD "${page}" "${listing}" STATUS status INACTIVITY_TIMEOUT 30 TIMEOUT 120 TLS_VERIFY ON)
  list(GET status 0 code)
  set(${out} "" PARENT_SCOPE)
  if(NOT code EQUAL 0)
    list(GET status 1 reason)
    strata_url_for_messages("${page}" shown)
    message(STATUS "xgrammar: cannot read ${shown} (${reason}); using the pinned address")
    return()
  endif()
  file(READ "${listing}" html)
  string(REPLACE "." "\\." file_regex "${file}")
  if(NOT html MATCHES "href=\"([^\"#]*${file_regex})(#[^\"]*)?\"")
    strata_url_for_messages("${page}" shown)
    message(STATUS "xgrammar: ${shown} does not list ${file}; using the pinned address")
    return()
  endif()
  set(href "${CMAKE_MATCH_1}")
  string(REPLACE "&amp;" "&" href "${href}")
  if(href MATCHES "^https?://")
    set(url "${href}")
  elseif(href MATCHES "^/" AND page MATCHES "^(https?://[^/]+)")
    set(url "${CMAKE_MATCH_1}${href}")
  else()
    set(url "${page}${href}")  # relative to the package's page
  endif()
  set(${out} "${url}" PARENT_SCOPE)
endfunction()

set(strata_xgrammar_file "xgrammar-${STRATA_XGRAMMAR_VERSION}.tar.gz")
set(strata_xgrammar_tarball "${STRATA_DEPS_CACHE}/${strata_xgrammar_file}")
set(strata_xgrammar_ok FALSE)
if(EXISTS "${strata_xgrammar_tarball}")
  file(SHA256 "${strata_xgrammar_tarball}" have)
  if(have STREQUAL STRATA_XGRAMMAR_SHA256)
    set(strata_xgrammar_ok TRUE)
  else()
    message(STATUS "xgrammar: ${strata_xgrammar_tarball} has SHA-256 ${have}, not ${STRATA_XGRAMMAR_SHA256}; "
                   "fetching it again")
  endif()
endif()
if(NOT strata_xgrammar_ok)
  strata_resolve_sdist_url(xgrammar "${strata_xgrammar_file}" url)
  if(url STREQUAL "")
    set(url "${STRATA_XGRAMMAR_PINNED_URL}")
  endif()
  file(MAKE_DIRECTORY "${STRATA_DEPS_CACHE}")
  # A name of this configure's own, renamed into place once verified: configures running side by side never see
  # half a file.
  string(RANDOM LENGTH 8 suffix)
  set(partial "${strata_xgrammar_tarball}.${suffix}.part")
  strata_url_for_messages("${url}" shown)
  message(STATUS "xgrammar: fetching ${shown}")
  file(DOWNLOAD "${url}" "${partial}" STATUS status EXPECTED_HASH SHA256=${STRATA_XGRAMMAR_SHA256}
       INACTIVITY_TIMEOUT 60 TIMEOUT 600 TLS_VERIFY ON)
  list(GET status 0 code)
  if(NOT code EQUAL 0)
    list(GET status 1 reason)
    file(REMOVE "${partial}")
    message(FATAL_ERROR "xgrammar: could not fetch ${shown} (${reason}). Without network, put ${strata_xgrammar_file} "
                        "(SHA-256 ${STRATA_XGRAMMAR_SHA256}) in ${STRATA_DEPS_CACHE} (STRATA_DEPS_CACHE).")
  endif()
  file(RENAME "${partial}" "${strata_xgrammar_tarball}")
endif()

# strata's fixes to xgrammar's sources, applied to the extracted copy: each replaces an exact text that must occur
# once (a new release that changed it fails the configure here, to be looked at again).
function(strata_xgrammar_fix file old new why)
  set(path "${strata_xgrammar_root}/${file}")
  file(READ "${path}" text)
  string(REPLACE "${old}" "" without "${text}")
  string(LENGTH "${text}" n_text)
  string(LENGTH "${without}" n_without)
  string(LENGTH "${old}" n_old)
  math(EXPR occurrences "(${n_text} - ${n_without}) / ${n_old}")
  if(NOT occurrences EQUAL 1)
    message(FATAL_ERROR "xgrammar: the fix \"${why}\" expects its text once in ${file}, found ${occurrences}")
  endif()
  string(REPLACE "${old}" "${new}" text "${text}")
  file(WRITE "${path}" "${text}")
endfunction()

# Extracted once per build folder (the stamp names the tarball's hash and the fixes' revision): only the C++ core,
# its headers, the two header-only libraries it includes and its license.
set(strata_xgrammar_root "${CMAKE_BINARY_DIR}/_deps/xgrammar-${STRATA_XGRAMMAR_VERSION}")
set(strata_xgrammar_stamp "${CMAKE_BINARY_DIR}/_deps/xgrammar.stamp")
set(strata_xgrammar_stamp_text "${STRATA_XGRAMMAR_SHA256} fixes 2")
set(stamp "")
if(EXISTS "${strata_xgrammar_stamp}")
  file(READ "${strata_xgrammar_stamp}" stamp)
endif()
if(NOT stamp STREQUAL strata_xgrammar_stamp_text OR NOT EXISTS "${strata_xgrammar_root}/cpp")
  file(REMOVE_RECURSE "${strata_xgrammar_root}")
  set(top "xgrammar-${STRATA_XGRAMMAR_VERSION}")
  file(ARCHIVE_EXTRACT INPUT "${strata_xgrammar_tarball}" DESTINATION "${CMAKE_BINARY_DIR}/_deps"
       PATTERNS "${top}/cpp" "${top}/include" "${top}/3rdparty/picojson" "${top}/3rdparty/dlpack/include"
                "${top}/LICENSE" "${top}/NOTICE")
  # A JSON string with minLength or maxLength took any character but the quote, the backslash, CR and LF: the
  # other control characters went out raw, which JSON forbids (JSONSchemaConverter::GenerateString; the string
  # rule without bounds excludes U+0000..U+001F, as this now does).
  strata_xgrammar_fix(cpp/json_schema_converter.cc
    [[builder_.AddCharacterClass({{'"', '"'}, {'\\', '\\'}, {'\r', '\r'}, {'\n', '\n'}}, true);]]
    [[builder_.AddCharacterClass({{0, 0x1f}, {'"', '"'}, {'\\', '\\'}}, true);]]
    "control characters in length-bounded JSON strings")
  # A JSON string's `pattern` is built into an automaton (RegexIR, fsm.cc) whose `?` joined the group's start to
  # its end with an empty edge; a group ending in a loop (`+`, `*`) goes back from its end into its body, so
  # "^[0-9](x[a-z]+)?$" also took "5ab". The optional now has a start and an end of its own. (The regex kind goes
  # through xgrammar's EBNF instead and was right.)
  strata_xgrammar_fix(cpp/fsm.cc
    [[FSMWithStartEnd FSMWithStartEnd::Optional() const {
  FSM fsm = fsm_.Copy();
  if (!ends_.empty()) {
    fsm.AddEpsilonEdge(start_, ends_.front());
  }
  return FSMWithStartEnd(fsm, start_, ends_);
}]]
    [[FSMWithStartEnd FSMWithStartEnd::Optional() const {
  FSM fsm = fsm_.Copy();
  auto new_start = fsm.AddState();
  auto new_end = fsm.AddState();
  fsm.AddEpsilonEdge(new_start, start_);
  fsm.AddEpsilonEdge(new_start, new_end);
  for (auto end : ends_) {
    fsm.AddEpsilonEdge(end, new_end);
  }
  return FSMWithStartEnd(fsm, new_start, {new_end});
}]]
    "an optional group ending in a loop")
  file(WRITE "${strata_xgrammar_stamp}" "${strata_xgrammar_stamp_text}")
endif()

# Every source under cpp/ but the Python bindings (as its own CMakeLists.txt). testing.cc stays: compiled_grammar.cc
# and grammar_matcher.cc call its debug printers.
file(GLOB_RECURSE strata_xgrammar_sources "${strata_xgrammar_root}/cpp/*.cc")
list(FILTER strata_xgrammar_sources EXCLUDE REGEX "/cpp/tvm_ffi/")
list(LENGTH strata_xgrammar_sources count)
if(count LESS 20)
  message(FATAL_ERROR "xgrammar: ${strata_xgrammar_root}/cpp holds ${count} sources; the extraction failed")
endif()
set_source_files_properties(${strata_xgrammar_sources} PROPERTIES COMPILE_OPTIONS "-w;-O2;-g1")

find_package(Threads REQUIRED)
add_library(strata_xgrammar STATIC ${strata_xgrammar_sources} ${CMAKE_CURRENT_LIST_DIR}/xgrammar_log.cc)
set_target_properties(strata_xgrammar PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
                                                 POSITION_INDEPENDENT_CODE ON)
target_include_directories(strata_xgrammar SYSTEM
  PUBLIC "${strata_xgrammar_root}/include" "${strata_xgrammar_root}/3rdparty/dlpack/include"
  PRIVATE "${strata_xgrammar_root}/cpp" "${strata_xgrammar_root}/3rdparty/picojson")
target_include_directories(strata_xgrammar PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(strata_xgrammar
  PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0
  PRIVATE XGRAMMAR_LOG_CUSTOMIZE=1)
target_link_libraries(strata_xgrammar PUBLIC Threads::Threads)
