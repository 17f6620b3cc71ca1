# Hardening (issue 8): cross-rank agreement on the planning inputs, bad inputs against
# the CLI, and (optionally) the fuzz targets. See include/sparsecp/agreement.hpp,
# fuzz/README.md and docs/RESULTS.md.
target_sources(sparsecp PRIVATE ${PROJECT_SOURCE_DIR}/src/agreement.cpp)

# Every rank of a mismatched group must fail with the same error; a hang is a failure
# (short timeouts: a healthy run takes about a second).
sparsecp_add_mpi_test(agreement_mpi_test NP 2 3 SOURCES ${PROJECT_SOURCE_DIR}/tests/agreement_mpi_test.cpp)
if(SPARSECP_BUILD_TESTS)
  set_tests_properties(agreement_mpi_test.np2 agreement_mpi_test.np3 PROPERTIES TIMEOUT 90)
endif()

# Bad inputs against the tool: one "error:" line and exit status 2 each.
sparsecp_add_test(limits_test ${PROJECT_SOURCE_DIR}/tests/limits_test.cpp)
if(TARGET limits_test)
  add_dependencies(limits_test sparsecp_cli)
endif()
