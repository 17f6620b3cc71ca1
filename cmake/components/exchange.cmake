# Component: MPI communicator, row exchange and balanced selection (issue 4).
target_sources(sparsecp PRIVATE
  ${PROJECT_SOURCE_DIR}/src/comm/mpi_communicator.cpp
  ${PROJECT_SOURCE_DIR}/src/exchange.cpp
)

# Multi-rank tests (tests/mpi_main.cpp is their main): 1, 2, 3, 4 and 8 ranks.
sparsecp_add_mpi_test(exchange_comm_test NP 1 2 3 4 8 SOURCES ${PROJECT_SOURCE_DIR}/tests/exchange_comm_test.cpp)
sparsecp_add_mpi_test(exchange_route_test NP 1 2 3 4 8 SOURCES ${PROJECT_SOURCE_DIR}/tests/exchange_route_test.cpp)
sparsecp_add_mpi_test(exchange_misuse_test NP 1 2 4 SOURCES ${PROJECT_SOURCE_DIR}/tests/exchange_misuse_test.cpp)

# `sparsecp run`: the main job under mpirun.
target_sources(sparsecp_cli PRIVATE ${PROJECT_SOURCE_DIR}/tools/sparsecp/cmd_run.cpp)
sparsecp_add_mpi_test(exchange_select_test NP 1 2 3 4 SOURCES ${PROJECT_SOURCE_DIR}/tests/exchange_select_test.cpp)

# The main job end to end on a small batch: 3 ranks, every mode's check must pass.
if(SPARSECP_BUILD_TESTS)
  foreach(run_mode IN ITEMS zigzag greedy hybrid spill)
    add_test(NAME cli_run_${run_mode}.np3
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:sparsecp_cli>
                     run --mode ${run_mode} --tokens 3000 --heads 2 --head-dim 16 --rope-dim 8 --q-rank 12
                     --topk 9 --repeats 1 --json)
    set_tests_properties(cli_run_${run_mode}.np3 PROPERTIES TIMEOUT 300
                         PASS_REGULAR_EXPRESSION "\"verified\": true"
                         FAIL_REGULAR_EXPRESSION "\"verified\": false|\"bytes_match_route\": false"
                         ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;OMP_NUM_THREADS=1")
  endforeach()
endif()
