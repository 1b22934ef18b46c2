# Compile options shared by every Strata target: warnings, sanitizers, and the helper functions
# the folders use to declare their library and test targets.
add_library(strata_options INTERFACE)
target_include_directories(strata_options INTERFACE ${PROJECT_SOURCE_DIR})
target_compile_options(strata_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-psabi -fno-math-errno>)
if(STRATA_WERROR)
  target_compile_options(strata_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
endif()
target_compile_options(strata_options INTERFACE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-fno-math-errno>)
if(STRATA_HAVE_CUDA)
  target_compile_definitions(strata_options INTERFACE STRATA_HAVE_CUDA=1)
endif()
# STRATA_DEBUG_INFO=lines (CMakeLists.txt): the later -g1 overrides RelWithDebInfo's -g.
if(STRATA_DEBUG_INFO STREQUAL "lines")
  target_compile_options(strata_options INTERFACE $<$<AND:$<CONFIG:RelWithDebInfo>,$<COMPILE_LANGUAGE:CXX>>:-g1>)
endif()
# Debug builds poison freed sim-device memory (see core/device/sim_allocator.h).
target_compile_definitions(strata_options INTERFACE $<$<CONFIG:Debug>:STRATA_DEBUG_POISON=1>)
if(STRATA_SANITIZE)
  target_compile_options(strata_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${STRATA_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(strata_options INTERFACE -fsanitize=${STRATA_SANITIZE})
  target_compile_definitions(strata_options INTERFACE STRATA_SANITIZER=1)
endif()

# strata_library(NAME SOURCES ... DEPS ...): one static library per folder.
function(strata_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_SOURCES)
    # A folder with headers only (or not yet written): an interface target keeps the graph intact.
    add_library(${name} INTERFACE)
    target_link_libraries(${name} INTERFACE strata_options ${ARG_DEPS})
    return()
  endif()
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC strata_options ${ARG_DEPS})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# strata_test(NAME SOURCES ... DEPS ... LABELS ...): one GoogleTest executable, each test a ctest case.
function(strata_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_SOURCES)
    return()
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE strata_options ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  include(GoogleTest)
  # gtest_discover_tests (CMake 3.25) splits a list-valued property into separate arguments, so
  # several labels are joined into one ("core_tsan"); ctest -L takes a regular expression, so
  # `-L tsan` and `-L core` both select it.
  string(REPLACE ";" "_" labels "${ARG_LABELS}")
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# strata_sources(OUT DIR...): the .cc files of the given folders (not recursive), plus
#   *.cu and *_cuda.cc   only when the CUDA backend is built,
#   *_nocuda.cc          only when it is not (stubs that say the build has no CUDA).
function(strata_sources out)
  set(result "")
  foreach(dir ${ARGN})
    file(GLOB cc CONFIGURE_DEPENDS ${dir}/*.cc)
    file(GLOB cu CONFIGURE_DEPENDS ${dir}/*.cu)
    foreach(f ${cc})
      if(f MATCHES "_cuda\\.cc$")
        if(STRATA_HAVE_CUDA)
          list(APPEND result ${f})
        endif()
      elseif(f MATCHES "_nocuda\\.cc$")
        if(NOT STRATA_HAVE_CUDA)
          list(APPEND result ${f})
        endif()
      else()
        list(APPEND result ${f})
      endif()
    endforeach()
    if(STRATA_HAVE_CUDA)
      list(APPEND result ${cu})
    endif()
  endforeach()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# Multi-rank tests run OpenMPI, whose own allocations (held by MCA components it dlcloses before
# exit) LeakSanitizer reports as leaks in every rank. For these tests only, leak checking is off;
# AddressSanitizer and UBSan still check every access. Strata's own code is leak-checked by the
# single-process suites, which run the same engine over the local communicator.
function(strata_mpi_test_environment)
  set_tests_properties(${ARGN} PROPERTIES ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1")
endfunction()
