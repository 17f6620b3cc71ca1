# Component: MPI communicator, row exchange and balanced selection (issue 4).
target_sources(sparsecp PRIVATE
  ${PROJECT_SOURCE_DIR}/src/comm/mpi_communicator.cpp
)
