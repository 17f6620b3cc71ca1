# Component: KV dispatch routes, document compression plan, sequence gathers (issue 5).
target_sources(sparsecp PRIVATE
  ${PROJECT_SOURCE_DIR}/src/dispatch.cpp
  ${PROJECT_SOURCE_DIR}/src/compression_plan.cpp
  ${PROJECT_SOURCE_DIR}/src/sequence_gather.cpp
)
sparsecp_add_test(dispatch_test ${PROJECT_SOURCE_DIR}/tests/dispatch_test.cpp)
