# Installs the already-built project into a scratch prefix, then configures and builds
# tests/consumer against it with find_package(sparsecp), and runs the result.
file(REMOVE_RECURSE ${WORK_DIR})
# A sanitized library needs the sanitizer runtime in the consumer too.
set(LINK_FLAGS "")
if(SANITIZE)
  set(LINK_FLAGS "-fsanitize=${SANITIZE}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE status OUTPUT_QUIET)
if(status)
  message(FATAL_ERROR "install failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
                        "-DCMAKE_EXE_LINKER_FLAGS=${LINK_FLAGS}"
                RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "configuring the consumer failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "building the consumer failed: ${status}")
endif()
# full_consumer initialises Open MPI, whose own allocations LeakSanitizer reports as leaks
# (hwloc, ompi_op_base_op_select, ...; none from sparsecp): it runs with leak detection
# off, as the MPI tests do (tests/CMakeLists.txt). plan_consumer keeps it on.
execute_process(COMMAND ${WORK_DIR}/build/plan_consumer RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "plan_consumer failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=0 ${WORK_DIR}/build/full_consumer
                RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "full_consumer failed: ${status}")
endif()

# The planning layer without kernels or MPI (planning, transport, io): configured with
# kernels and MPI off, it must build, install
# and serve a consumer without MPI, OpenMP or BLAS being looked for.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/planning-build -G ${GENERATOR}
                        -DCMAKE_BUILD_TYPE=Release -DSPARSECP_WITH_KERNELS=OFF -DSPARSECP_WITH_MPI=OFF
                RESULT_VARIABLE status OUTPUT_VARIABLE configure_log ERROR_VARIABLE configure_log)
if(status)
  message(FATAL_ERROR "configuring the planning-only build failed: ${status}\n${configure_log}")
endif()
if(configure_log MATCHES "Found (MPI|OpenMP)|openblas")
  message(FATAL_ERROR "the planning-only build looked for MPI, OpenMP or BLAS:\n${configure_log}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/planning-build
                RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "building the planning-only layers failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --install ${WORK_DIR}/planning-build --prefix ${WORK_DIR}/planning-prefix
                RESULT_VARIABLE status OUTPUT_QUIET)
if(status)
  message(FATAL_ERROR "installing the planning layer alone failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/planning-consumer
                        -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/planning-prefix -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "configuring the planning-only consumer failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/planning-consumer RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "building the planning-only consumer failed: ${status}")
endif()
execute_process(COMMAND ${WORK_DIR}/planning-consumer/plan_consumer RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "the planning-only consumer failed: ${status}")
endif()
