# Helper functions for tests and benchmarks; used by tests/ and bench/.
#
#   sparsecp_add_test(name SOURCES...)            GoogleTest program, tests listed one by one
#   sparsecp_add_mpi_test(name NP n... SOURCES...) one CTest entry per rank count, under mpirun
#   sparsecp_add_bench(name SOURCES...)           Google Benchmark program
#
# Test programs get SPARSECP_TEST_DATA_DIR (tests/data) and SPARSECP_CLI_PATH (the built
# tool) as compile definitions, and tests/ on their include path.
set(SPARSECP_TEST_DIR ${PROJECT_SOURCE_DIR}/tests)

function(sparsecp_add_test name)
  if(NOT SPARSECP_BUILD_TESTS)
    return()
  endif()
  find_package(GTest REQUIRED)
  include(GoogleTest)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE sparsecp GTest::gtest GTest::gtest_main GTest::gmock
                        nlohmann_json::nlohmann_json sparsecp_build_flags sparsecp_driver_flags)
  target_include_directories(${name} PRIVATE ${SPARSECP_TEST_DIR})
  target_compile_definitions(${name} PRIVATE SPARSECP_TEST_DATA_DIR="${SPARSECP_TEST_DIR}/data"
                             SPARSECP_CLI_PATH="$<TARGET_FILE:sparsecp_cli>")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 300)
endfunction()

# Programs use tests/support/mpi_main.cpp as their main: it initialises MPI and makes every
# rank agree on the outcome.
function(sparsecp_add_mpi_test name)
  if(NOT SPARSECP_BUILD_TESTS)
    return()
  endif()
  find_package(GTest REQUIRED)
  cmake_parse_arguments(ARG "" "" "NP;SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${SPARSECP_TEST_DIR}/support/mpi_main.cpp)
  target_link_libraries(${name} PRIVATE sparsecp GTest::gtest GTest::gmock MPI::MPI_CXX
                        nlohmann_json::nlohmann_json sparsecp_build_flags sparsecp_driver_flags)
  target_include_directories(${name} PRIVATE ${SPARSECP_TEST_DIR})
  target_compile_definitions(${name} PRIVATE SPARSECP_TEST_DATA_DIR="${SPARSECP_TEST_DIR}/data")
  foreach(np IN LISTS ARG_NP)
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np ${np} $<TARGET_FILE:${name}>)
    # OpenMPI's own allocations are reported as leaks by LeakSanitizer; they are not ours.
    set_tests_properties(${name}.np${np} PROPERTIES TIMEOUT 300
                         ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;OMP_NUM_THREADS=1")
  endforeach()
endfunction()

function(sparsecp_add_bench name)
  if(NOT SPARSECP_BUILD_BENCH)
    return()
  endif()
  find_package(benchmark REQUIRED)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE sparsecp benchmark::benchmark sparsecp_build_flags)
endfunction()
