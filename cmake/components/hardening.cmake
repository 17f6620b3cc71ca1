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

# `sparsecp run` launched with different arguments per rank (MPMD): every rank must
# stop with the agreement error instead of hanging (different --no-overlap used to hang).
if(SPARSECP_BUILD_TESTS)
  set(_run_small --lengths 600,400 --mode greedy --block 64 --heads 2 --head-dim 16 --rope-dim 8
                 --q-rank 12 --topk 9 --repeats 1)
  add_test(NAME cli_run_disagree.np2
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
                   -np 1 $<TARGET_FILE:sparsecp_cli> run ${_run_small} --no-overlap
                   : -np 1 $<TARGET_FILE:sparsecp_cli> run ${_run_small})
  set_tests_properties(cli_run_disagree.np2 PROPERTIES TIMEOUT 60
                       PASS_REGULAR_EXPRESSION "error: CP ranks disagree on the planning inputs: rank 1 has fingerprint [0-9a-f]+, rank 0 has [0-9a-f]+ \\(overlap differs: rank 1 has 1, rank 0 has 0\\)"
                       ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;OMP_NUM_THREADS=1")
endif()

# A rank that fails alone in the middle of an exchange (SPARSECP_RUN_FAIL_RANK is the
# tool's fault-injection hook): the job must stop with the error, not hang with the
# other rank blocked in the exchange and the failed one in MPI_Finalize.
if(SPARSECP_BUILD_TESTS)
  add_test(NAME cli_run_rank_failure.np2
           COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe
                   -np 1 $<TARGET_FILE:sparsecp_cli> run ${_run_small}
                   : -np 1 env SPARSECP_RUN_FAIL_RANK=1 $<TARGET_FILE:sparsecp_cli> run ${_run_small})
  set_tests_properties(cli_run_rank_failure.np2 PROPERTIES TIMEOUT 90
                       PASS_REGULAR_EXPRESSION "error: rank 1 failed while other ranks were still running; aborting the job"
                       ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0;OMP_NUM_THREADS=1")
endif()
