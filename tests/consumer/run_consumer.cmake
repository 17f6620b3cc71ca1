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
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE status)
if(status)
  message(FATAL_ERROR "the consumer failed: ${status}")
endif()
