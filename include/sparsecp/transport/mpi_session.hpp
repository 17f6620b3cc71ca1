// sparsecp: an MPI program's life around MpiCommunicator — initialising and finalising
// MPI, leaving cleanly when one rank fails, and waiting without spinning.
//
// The `sparsecp run` job uses these; so can any program that is itself the MPI program
// (under mpirun) rather than a library inside one.
#pragma once

#include <mpi.h>

#include "sparsecp/transport/mpi_communicator.hpp"

namespace sparsecp {

// Initialises MPI (MPI_THREAD_FUNNELED) unless it already is, and finalises it on
// destruction if it initialised it, after every communicator is gone.
class MpiSession {
 public:
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  // Call on the error path before the error propagates. MPI_Finalize waits for every
  // rank, so a rank that failed alone (a transport error, out of memory, a bug) and then
  // finalised would leave the others blocked in a collective, and itself in
  // MPI_Finalize, forever. Errors that every rank raised together (input checks, the
  // agreement checks) reach this point on every rank within moments (a non-blocking
  // barrier, 10 s); otherwise it prints `what`, names this rank and aborts the job
  // (MPI_Abort, status 2). Does nothing when this session did not initialise MPI.
  void leave_on_error(const char* what) const;

 private:
  bool owned_ = false;
};

// A barrier that sleeps while it waits (0.2 ms polls). Ranks often outnumber cores, and a
// rank spinning in MPI while it waits for a slower one steals the core that rank needs;
// the library's waits spin (as MPI and NCCL do), so a job parks ranks here before
// collectives that follow uneven work. A failed MPI call throws TransportError, never
// loops.
void sleeping_barrier(const MpiCommunicator& comm);

}  // namespace sparsecp
