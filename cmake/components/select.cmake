# Selection component: worker-side Index-Q projection, RoPE and Lightning Indexer
# top-k over packed segments (include/sparsecp/select.hpp, tnd_plan.hpp, npy.hpp).
target_sources(sparsecp PRIVATE
  ${PROJECT_SOURCE_DIR}/src/select/tnd_plan.cpp
  ${PROJECT_SOURCE_DIR}/src/select/validate.cpp
  ${PROJECT_SOURCE_DIR}/src/select/reference.cpp
  ${PROJECT_SOURCE_DIR}/src/select/select.cpp
  ${PROJECT_SOURCE_DIR}/src/select/kernel_portable.cpp
)
# SIMD kernels are compiled for their own ISA whatever the global flags, and only
# called after a run-time CPU check (src/select/select.cpp).
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64")
  target_sources(sparsecp PRIVATE
    ${PROJECT_SOURCE_DIR}/src/select/kernel_avx2.cpp
    ${PROJECT_SOURCE_DIR}/src/select/kernel_avx512.cpp)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/select/kernel_avx2.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/select/kernel_avx512.cpp
    PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16")
endif()

sparsecp_add_test(select_kernel_test ${PROJECT_SOURCE_DIR}/tests/select_kernel_test.cpp)
target_sources(sparsecp PRIVATE ${PROJECT_SOURCE_DIR}/src/npy.cpp)
sparsecp_add_test(npy_test ${PROJECT_SOURCE_DIR}/tests/npy_test.cpp)
target_sources(sparsecp_cli PRIVATE ${PROJECT_SOURCE_DIR}/tools/sparsecp/cmd_select.cpp)
sparsecp_add_test(select_projection_test ${PROJECT_SOURCE_DIR}/tests/select_projection_test.cpp)
sparsecp_add_test(select_cli_test ${PROJECT_SOURCE_DIR}/tests/select_cli_test.cpp)
if(TARGET select_cli_test)
  add_dependencies(select_cli_test sparsecp_cli)
endif()
sparsecp_add_bench(bench_select ${PROJECT_SOURCE_DIR}/bench/bench_select.cpp)
