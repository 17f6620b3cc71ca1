# Fuzzing (issue 8). The libFuzzer targets live in their own CMake project, fuzz/,
# built with clang (this build stays on whatever compiler it was configured with).
# Here: one CTest test, fuzz_smoke, that builds the cheap targets with clang and runs
# each for SPARSECP_FUZZ_SECONDS from the committed seed corpus. It is added only when
# clang++ can link a -fsanitize=fuzzer program (checked at configure time); otherwise
# it is skipped with a message. Longer local runs: fuzz/README.md.
option(SPARSECP_FUZZ_SMOKE "Add the fuzz_smoke CTest test (needs clang++ with libFuzzer)" ON)
set(SPARSECP_FUZZ_SECONDS 10 CACHE STRING "Seconds each target runs in fuzz_smoke")
set(SPARSECP_FUZZ_TARGETS "fuzz_plan;fuzz_kv_routes;fuzz_lengths;fuzz_npy" CACHE STRING
    "Targets fuzz_smoke builds and runs (fuzz_segments builds the kernels: ~1.5 CPU-minutes more)")

if(SPARSECP_BUILD_TESTS AND SPARSECP_FUZZ_SMOKE)
  find_program(SPARSECP_FUZZ_CXX NAMES clang++ clang++-18 clang++-17 clang++-16 clang++-15 clang++-14)
  set(_fuzz_ok FALSE)
  if(SPARSECP_FUZZ_CXX)
    set(_probe_dir ${PROJECT_BINARY_DIR}/fuzz-probe)
    file(WRITE ${_probe_dir}/probe.cpp
         "#include <cstddef>\n#include <cstdint>\n"
         "extern \"C\" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n")
    execute_process(COMMAND ${SPARSECP_FUZZ_CXX} -fsanitize=fuzzer,address,undefined
                            ${_probe_dir}/probe.cpp -o ${_probe_dir}/probe
                    RESULT_VARIABLE _probe_status OUTPUT_QUIET ERROR_QUIET)
    if(_probe_status EQUAL 0)
      set(_fuzz_ok TRUE)
    endif()
  endif()
  if(_fuzz_ok)
    add_test(NAME fuzz_smoke
             COMMAND ${CMAKE_COMMAND} -E env FUZZ_CXX=${SPARSECP_FUZZ_CXX}
                     FUZZ_BUILD_DIR=${PROJECT_BINARY_DIR}/fuzz FUZZ_WORK_DIR=${PROJECT_BINARY_DIR}/fuzz-work
                     bash ${PROJECT_SOURCE_DIR}/fuzz/run.sh ${SPARSECP_FUZZ_SECONDS} ${SPARSECP_FUZZ_TARGETS})
    set_tests_properties(fuzz_smoke PROPERTIES TIMEOUT 900 ENVIRONMENT "FUZZ_JOBS=2")
  else()
    message(STATUS "fuzz_smoke skipped: no clang++ that links -fsanitize=fuzzer "
                   "(install clang and libclang-rt-dev, or set SPARSECP_FUZZ_CXX)")
  endif()
endif()
