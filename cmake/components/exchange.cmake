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
