#include "sparsecp/transport/mpi_communicator.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <string>

#include "sparsecp/error.hpp"

namespace sparsecp {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

namespace {

// Point-to-point fallback messages use one tag on the private duplicate; MPI's
// non-overtaking rule matches them in posting order.
constexpr int kRowTag = 0x5C9;

// The first failure a communicator saw (empty while healthy).
using Failure = std::shared_ptr<std::string>;

// Throws TransportError for a failed MPI call and records it as the communicator's
// first failure.
void check_mpi(int code, const char* call, const Failure& failure) {
  if (code == MPI_SUCCESS) [[likely]] {
    return;
  }
  const std::string text = std::string(call) + " failed: " + mpi_error_text(code);
  if (failure->empty()) *failure = text;
  SPARSECP_FAIL_AS(ErrorKind::kTransport, text);
}

// One posted operation: its requests, and the count/displacement arrays MPI may read
// until completion (MPI-3.1 section 5.12). A failure while posting is kept and reported
// by wait() and test(), so that the Work keeps what was posted (and the caller its
// buffers) alive. After a failed wait the Work never destroys this object (comm.hpp,
// rule 3), so the requests are never freed under MPI; after a successful one they are
// all MPI_REQUEST_NULL.
class MpiPending final : public Work::Pending {
 public:
  explicit MpiPending(Failure failure) : failure_(std::move(failure)) {}

  std::vector<MPI_Request>& requests() { return requests_; }
  std::vector<int>& arguments() { return arguments_; }
  // Records a failed MPI_I* call; nothing more is posted after it.
  void posting_failed(int code, const char* call) {
    try {
      check_mpi(code, call, failure_);
    } catch (const Error&) {
      posting_failure_ = std::current_exception();
    }
  }
  bool posting_ok() const { return posting_failure_ == nullptr; }

  void wait() override {
    if (posting_failure_) std::rethrow_exception(posting_failure_);
    if (requests_.empty()) return;
    check_healthy();
    check_mpi(
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
        "MPI_Waitall", failure_);
    requests_.clear();
    arguments_.clear();
  }
  bool test() override {
    if (posting_failure_) std::rethrow_exception(posting_failure_);
    if (requests_.empty()) return true;
    check_healthy();
    int done = 0;
    check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall", failure_);
    if (done) {
      requests_.clear();
      arguments_.clear();
    }
    return done != 0;
  }

 private:
  // Another operation on the communicator failed: do not wait on MPI (it may never
  // return); fail, so that the Work keeps this operation too.
  void check_healthy() const {
    SPARSECP_CHECK_AS(ErrorKind::kTransport, failure_->empty(),
                      "MPI communicator is unusable after an earlier transport failure (",
                      *failure_, ")");
  }

  Failure failure_;
  std::vector<MPI_Request> requests_;
  std::vector<int> arguments_;
  std::exception_ptr posting_failure_;
};

// A contiguous datatype of `row_bytes` bytes, freed on scope exit (MPI keeps it
// alive for operations already posted with it).
class RowType {
 public:
  RowType(int64_t row_bytes, const Failure& failure) {
    check_mpi(MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &type_),
              "MPI_Type_contiguous", failure);
    const int committed = MPI_Type_commit(&type_);
    if (committed != MPI_SUCCESS) MPI_Type_free(&type_);
    check_mpi(committed, "MPI_Type_commit", failure);
  }
  ~RowType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

int64_t checked_rows(std::span<const int64_t> counts, int64_t size, const char* side) {
  SPARSECP_CHECK(static_cast<int64_t>(counts.size()) == size, "all_to_all_rows ", side,
                 " counts have ", counts.size(), " entries for a group of ", size, " ranks");
  int64_t total = 0;
  for (size_t peer = 0; peer < counts.size(); ++peer) {
    SPARSECP_CHECK(counts[peer] >= 0, "all_to_all_rows ", side, " count for peer ", peer,
                   " is negative: ", counts[peer]);
    SPARSECP_CHECK(counts[peer] <= std::numeric_limits<int64_t>::max() - total, "all_to_all_rows ",
                   side, " counts overflow 64 bits");
    total += counts[peer];
  }
  return total;
}

// True when every count and every displacement (in rows) fits one MPI call.
bool fits(std::span<const int64_t> counts, int64_t limit) {
  int64_t displacement = 0;
  for (const int64_t count : counts) {
    if (count > limit || displacement > limit) return false;
    displacement += count;
  }
  return true;
}

// One all_to_all_rows call's arguments, and the communicator's side of it.
struct Exchange {
  std::span<const std::byte> send;
  std::span<const int64_t> send_counts;
  std::span<std::byte> receive;
  std::span<const int64_t> receive_counts;
  int64_t row_bytes;
  int64_t rank;
  int64_t size;
  int64_t limit;  // max_message_rows
  MPI_Comm comm;
};

// What an exchange needs before anything is posted.
struct Prepared {
  explicit Prepared(const Failure& failure) : pending(std::make_unique<MpiPending>(failure)) {}
  int64_t send_total = 0;
  int64_t receive_total = 0;
  bool fits_here = true;  // every count and displacement fits one MPI call
  std::unique_ptr<RowType> row_type;
  std::unique_ptr<MpiPending> pending;
};

// Validation and allocation: everything that can fail on this rank alone, so that the
// agreement below knows before any rank posts.
void prepare(const Exchange& x, Prepared& p, const Failure& failure) {
  SPARSECP_CHECK(x.row_bytes >= 0 && x.row_bytes <= INT_MAX, "all_to_all_rows row size ",
                 x.row_bytes, " bytes is outside [0, ", INT_MAX, "]");
  p.send_total = checked_rows(x.send_counts, x.size, "send");
  p.receive_total = checked_rows(x.receive_counts, x.size, "receive");
  const int64_t max_rows = x.row_bytes == 0 ? std::numeric_limits<int64_t>::max()
                                            : std::numeric_limits<int64_t>::max() / x.row_bytes;
  SPARSECP_CHECK(p.send_total <= max_rows && p.receive_total <= max_rows,
                 "all_to_all_rows byte count overflows 64 bits");
  SPARSECP_CHECK(static_cast<int64_t>(x.send.size()) == p.send_total * x.row_bytes,
                 "all_to_all_rows send buffer holds ", x.send.size(), " bytes, the counts need ",
                 p.send_total * x.row_bytes);
  SPARSECP_CHECK(static_cast<int64_t>(x.receive.size()) == p.receive_total * x.row_bytes,
                 "all_to_all_rows receive buffer holds ", x.receive.size(),
                 " bytes, the counts need ", p.receive_total * x.row_bytes);
  SPARSECP_CHECK(x.send_counts[x.rank] == x.receive_counts[x.rank], "all_to_all_rows sends ",
                 x.send_counts[x.rank], " rows to itself but expects ", x.receive_counts[x.rank]);
  p.fits_here = fits(x.send_counts, x.limit) && fits(x.receive_counts, x.limit);
  if (x.row_bytes == 0) return;
  p.row_type = std::make_unique<RowType>(x.row_bytes, failure);
  // Room for every request either path posts, so that posting never allocates (a
  // std::bad_alloc between two posts would lose the requests already posted).
  int64_t messages = 1;
  for (int64_t peer = 0; peer < x.size; ++peer) {
    if (peer == x.rank) continue;
    for (const int64_t count : {x.send_counts[peer], x.receive_counts[peer]}) {
      const int64_t pieces = count / x.limit + (count % x.limit != 0 ? 1 : 0);
      if (__builtin_add_overflow(messages, pieces, &messages)) {
        messages = std::numeric_limits<int64_t>::max();
      }
    }
  }
  try {
    p.pending->arguments().resize(4 * static_cast<size_t>(x.size));
    p.pending->requests().reserve(static_cast<size_t>(messages));
  } catch (const std::exception&) {  // std::bad_alloc, std::length_error
    SPARSECP_FAIL_AS(ErrorKind::kResource, "all_to_all_rows could not allocate the argument ",
                     "arrays of ", messages, " messages");
  }
}

// One all-reduce of (first rank whose arguments failed, path, row size range): every
// rank throws if any rank failed or the row sizes differ, and every rank takes the same
// path (one rank in MPI_Ialltoallv while a peer posts point-to-point messages deadlocks
// both; only this rank knows whether its own counts fit). True: one MPI_Ialltoallv.
bool agree_on_path(const Exchange& x, const Prepared& p, const std::exception_ptr& local_failure,
                   const Failure& failure) {
  int64_t verdict[4] = {local_failure ? x.rank : x.size, p.fits_here ? 1 : 0, x.row_bytes,
                        -x.row_bytes};
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, verdict, 4, MPI_INT64_T, MPI_MIN, x.comm), "MPI_Allreduce",
            failure);
  if (local_failure) std::rethrow_exception(local_failure);
  SPARSECP_CHECK(verdict[0] == x.size, "all_to_all_rows aborted: rank ", verdict[0],
                 " rejected its arguments");
  SPARSECP_CHECK(verdict[2] == -verdict[3], "all_to_all_rows row size differs between ranks (",
                 verdict[2], " to ", -verdict[3], " bytes)");
  return verdict[1] == 1;
}

// Every count and displacement fits an int on every rank: one MPI_Ialltoallv in rows.
void post_collective(const Exchange& x, Prepared& p) {
  const size_t n = static_cast<size_t>(x.size);
  int* counts_out = p.pending->arguments().data();
  int* displs_out = counts_out + n;
  int* counts_in = displs_out + n;
  int* displs_in = counts_in + n;
  int64_t out = 0;
  int64_t in = 0;
  for (size_t peer = 0; peer < n; ++peer) {
    counts_out[peer] = static_cast<int>(x.send_counts[peer]);
    displs_out[peer] = static_cast<int>(out);
    counts_in[peer] = static_cast<int>(x.receive_counts[peer]);
    displs_in[peer] = static_cast<int>(in);
    out += x.send_counts[peer];
    in += x.receive_counts[peer];
  }
  MPI_Request request = MPI_REQUEST_NULL;
  const int code =
      MPI_Ialltoallv(x.send.data(), counts_out, displs_out, p.row_type->get(), x.receive.data(),
                     counts_in, displs_in, p.row_type->get(), x.comm, &request);
  if (code == MPI_SUCCESS) {
    p.pending->requests().push_back(request);
  } else {
    p.pending->posting_failed(code, "MPI_Ialltoallv");
  }
}

// Split path: per-peer messages of at most `limit` rows, addressed by pointer, into the
// request list reserved by prepare(); rows to itself are copied.
void post_point_to_point(const Exchange& x, Prepared& p) {
  MpiPending& pending = *p.pending;
  const auto post = [&](int code, const MPI_Request& request, const char* call) {
    if (code == MPI_SUCCESS) {
      pending.requests().push_back(request);
    } else {
      pending.posting_failed(code, call);
    }
    return pending.posting_ok();
  };
  const int64_t row_bytes = x.row_bytes;
  int64_t in = 0;
  for (int64_t peer = 0; peer < x.size && pending.posting_ok(); ++peer) {
    for (int64_t done = 0; done < x.receive_counts[peer] && peer != x.rank; done += x.limit) {
      const int64_t rows = std::min(x.limit, x.receive_counts[peer] - done);
      MPI_Request request = MPI_REQUEST_NULL;
      const int code =
          MPI_Irecv(x.receive.data() + (in + done) * row_bytes, static_cast<int>(rows),
                    p.row_type->get(), static_cast<int>(peer), kRowTag, x.comm, &request);
      if (!post(code, request, "MPI_Irecv")) break;
    }
    in += x.receive_counts[peer];
  }
  int64_t out = 0;
  int64_t self_in = 0;
  for (int64_t peer = 0; peer < x.rank; ++peer) self_in += x.receive_counts[peer];
  for (int64_t peer = 0; peer < x.size && pending.posting_ok(); ++peer) {
    if (peer == x.rank) {
      if (x.send_counts[peer] > 0) {
        std::memcpy(x.receive.data() + self_in * row_bytes, x.send.data() + out * row_bytes,
                    static_cast<size_t>(x.send_counts[peer] * row_bytes));
      }
    } else {
      for (int64_t done = 0; done < x.send_counts[peer]; done += x.limit) {
        const int64_t rows = std::min(x.limit, x.send_counts[peer] - done);
        MPI_Request request = MPI_REQUEST_NULL;
        const int code =
            MPI_Isend(x.send.data() + (out + done) * row_bytes, static_cast<int>(rows),
                      p.row_type->get(), static_cast<int>(peer), kRowTag, x.comm, &request);
        if (!post(code, request, "MPI_Isend")) break;
      }
    }
    out += x.send_counts[peer];
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm group, MpiCommunicatorOptions options)
    : options_(options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  SPARSECP_CHECK(initialized, "MpiCommunicator needs MPI to be initialised (MPI_Init)");
  SPARSECP_CHECK(group != MPI_COMM_NULL, "MpiCommunicator needs a communicator, got MPI_COMM_NULL");
  SPARSECP_CHECK(options.max_message_rows >= 1 && options.max_message_rows <= INT_MAX,
                 "MpiCommunicator max_message_rows must be in [1, ", INT_MAX, "], got ",
                 options.max_message_rows);
  check_mpi(MPI_Comm_dup(group, &comm_), "MPI_Comm_dup", failure_);
  // Errors come back as codes and become sparsecp::Error instead of aborting the job.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  rank_ = rank;
  size_ = size;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check_usable() const {
  SPARSECP_CHECK_AS(ErrorKind::kTransport, failure_->empty(),
                    "MPI communicator is unusable after an earlier transport failure (", *failure_,
                    ")");
}

Work MpiCommunicator::all_to_all_rows(std::span<const std::byte> send,
                                      std::span<const int64_t> send_counts,
                                      std::span<std::byte> receive,
                                      std::span<const int64_t> receive_counts, int64_t row_bytes) {
  check_usable();
  const Exchange exchange{send,      send_counts, receive, receive_counts,
                          row_bytes, rank_,       size_,   options_.max_message_rows,
                          comm_};
  // Local checks and preparations that can fail on this rank alone come first; their
  // verdict is agreed before anything is posted (comm.hpp, rule 1).
  Prepared prepared(failure_);
  std::exception_ptr local_failure;
  try {
    prepare(exchange, prepared, failure_);
  } catch (...) {
    local_failure = std::current_exception();
  }
  const bool collective = agree_on_path(exchange, prepared, local_failure, failure_);
  record_exchange((prepared.send_total - send_counts[rank_]) * row_bytes,
                  (prepared.receive_total - receive_counts[rank_]) * row_bytes);
  if (row_bytes == 0) return Work();
  if (collective) {
    post_collective(exchange, prepared);
  } else {
    post_point_to_point(exchange, prepared);
  }
  return Work(std::move(prepared.pending));
}

void MpiCommunicator::all_reduce(std::span<int64_t> values, ReduceOp op) {
  SPARSECP_CHECK(values.size() <= static_cast<size_t>(INT_MAX), "all_reduce of ", values.size(),
                 " values exceeds one MPI call");
  check_usable();
  MPI_Op mpi_op = MPI_SUM;
  if (op == ReduceOp::kMin) mpi_op = MPI_MIN;
  if (op == ReduceOp::kMax) mpi_op = MPI_MAX;
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T,
                          mpi_op, comm_),
            "MPI_Allreduce", failure_);
}

std::vector<int64_t> MpiCommunicator::all_to_all_counts(std::span<const int64_t> counts) {
  check_usable();
  SPARSECP_CHECK(static_cast<int64_t>(counts.size()) == size_, "all_to_all_counts has ",
                 counts.size(), " entries for a group of ", size_, " ranks");
  std::vector<int64_t> received(static_cast<size_t>(size_));
  check_mpi(MPI_Alltoall(counts.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T, comm_),
            "MPI_Alltoall", failure_);
  return received;
}

}  // namespace sparsecp
