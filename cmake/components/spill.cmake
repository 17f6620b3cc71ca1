# Component: the spill planner, lower bounds, the calibrated cost model and `auto`
# (issue 7). The strategies spill and auto live in src/strategies/ and are picked up by
# cmake/components/simulate.cmake.
target_sources(sparsecp PRIVATE
  ${PROJECT_SOURCE_DIR}/src/cost_model.cpp
  ${PROJECT_SOURCE_DIR}/src/lower_bound.cpp
  ${PROJECT_SOURCE_DIR}/src/spill.cpp
)
sparsecp_add_test(cost_model_test ${PROJECT_SOURCE_DIR}/tests/cost_model_test.cpp)
sparsecp_add_test(lower_bound_test ${PROJECT_SOURCE_DIR}/tests/lower_bound_test.cpp)
sparsecp_add_test(spill_test ${PROJECT_SOURCE_DIR}/tests/spill_test.cpp)
target_sources(sparsecp_cli PRIVATE ${PROJECT_SOURCE_DIR}/tools/sparsecp/cmd_spill.cpp)
sparsecp_add_bench(bench_spill ${PROJECT_SOURCE_DIR}/bench/bench_spill.cpp)
# spill end to end in the MPI executor: bit-identical to selecting locally ('none').
sparsecp_add_mpi_test(spill_mpi_test NP 1 2 3 4 SOURCES ${PROJECT_SOURCE_DIR}/tests/spill_mpi_test.cpp)
target_sources(sparsecp_cli PRIVATE ${PROJECT_SOURCE_DIR}/tools/sparsecp/cmd_calibrate.cpp)
if(TARGET spill_test)
  add_dependencies(spill_test sparsecp_cli)  # runs `sparsecp spill` and `sparsecp calibrate`
endif()
