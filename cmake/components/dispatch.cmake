# Component: KV dispatch routes, document compression plan, sequence gathers (issue 5).
target_sources(sparsecp PRIVATE
  ${PROJECT_SOURCE_DIR}/src/dispatch.cpp
  ${PROJECT_SOURCE_DIR}/src/compression_plan.cpp
  ${PROJECT_SOURCE_DIR}/src/sequence_gather.cpp
)
sparsecp_add_test(dispatch_test ${PROJECT_SOURCE_DIR}/tests/dispatch_test.cpp)
sparsecp_add_mpi_test(sequence_gather_mpi_test NP 1 2 3 5 8
                      SOURCES ${PROJECT_SOURCE_DIR}/tests/sequence_gather_mpi_test.cpp)
target_sources(sparsecp_cli PRIVATE ${PROJECT_SOURCE_DIR}/tools/sparsecp/cmd_dispatch.cpp)
if(TARGET dispatch_test)
  add_dependencies(dispatch_test sparsecp_cli)  # DispatchCommand tests run the tool
endif()
