#include "sparsecp/transport/exchange.hpp"

#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "sparsecp/error.hpp"
#include "sparsecp/transport/agreement.hpp"

namespace sparsecp {

// Grants the implementation access to the handles' private constructors.
struct ExchangeAccess {
  static auto pending_state() { return std::make_unique<PendingRows::State>(); }
  static auto exchange_state() { return std::make_unique<IndexerInputExchange::State>(); }
  template <typename State>
  static auto make(std::unique_ptr<State> state) {
    if constexpr (std::is_same_v<State, PendingRows::State>) {
      return PendingRows(std::move(state));
    } else {
      return IndexerInputExchange(std::move(state));
    }
  }
};

namespace {

// memcpy that accepts empty ranges with null pointers (memcpy itself does not).
void copy_bytes(std::byte* target, const std::byte* source, int64_t bytes) {
  if (bytes > 0) std::memcpy(target, source, static_cast<size_t>(bytes));
}

// ---------------------------------------------------------------------------------
// Agreement: every rank learns whether every rank may proceed.

// A 62-bit fingerprint (so that its negation fits int64) of values that must be
// identical on every rank.
class Fingerprint {
 public:
  void add(int64_t value) {
    uint64_t z = state_ ^ (static_cast<uint64_t>(value) + 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    state_ = z ^ (z >> 31);
  }
  int64_t value() const { return static_cast<int64_t>(state_ >> 2); }

 private:
  uint64_t state_ = 0x5EED5EED5EED5EEDULL;
};

// What a local check threw: nullptr when it passed.
using LocalFailure = std::exception_ptr;

// Runs `check` and keeps what it threw for agree(), whatever it was: an exception
// escaping on one rank only would leave the others blocked in the agreement.
template <typename Check>
LocalFailure capture(Check&& check) {
  try {
    check();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// Runs on every rank, whatever happened locally, and issues the same collectives
// everywhere: with `exchange_counts` (identical on all ranks) an all-to-all of the
// route's row counts (zeros from a rank without a valid route), then one allreduce
// of (first failing rank and its error kind, first rank with mismatched counts,
// fingerprint range). Unless all ranks passed, the counts match and the fingerprints
// agree, throws on every rank: the failing rank its own exception (kind and message
// kept), the others an Error of the same kind naming that rank.
// When the row counts or fingerprints differ and `planning` is given, every rank names
// the differing planning inputs (agreement.hpp) if they are the cause.
void agree(Communicator& comm, const LocalFailure& local_error, bool exchange_counts,
           const IndexerRoute* route, int64_t fingerprint, const char* what,
           const PlanningFingerprint* planning = nullptr) {
  const int64_t size = comm.size();
  const int64_t rank = comm.rank();
  const bool has_route = route != nullptr && !local_error;
  int64_t count_failure = size;
  std::string count_message;
  if (exchange_counts) {
    std::vector<int64_t> counts(static_cast<size_t>(size), 0);
    if (has_route) counts = route->input_splits;
    const std::vector<int64_t> arriving = comm.all_to_all_counts(counts);
    for (int64_t peer = 0; peer < size && has_route; ++peer) {
      if (arriving[peer] != route->output_splits[peer]) {
        count_failure = rank;
        count_message = std::string(what) + " row counts disagree: rank " + std::to_string(rank) +
                        " expects " + std::to_string(route->output_splits[peer]) +
                        " rows from rank " + std::to_string(peer) + ", which sends " +
                        std::to_string(arriving[peer]);
        break;
      }
    }
  }
  // The lowest failing rank and its error kind: the minimum of rank * kKinds + kind.
  constexpr int64_t kKinds = 4;
  const int64_t failed = local_error
                             ? rank * kKinds + static_cast<int64_t>(error_kind_of(local_error))
                             : size * kKinds;
  int64_t verdict[4] = {failed, count_failure, fingerprint, -fingerprint};
  comm.all_reduce(verdict, ReduceOp::kMin);
  if (verdict[0] < size * kKinds) {
    if (local_error) std::rethrow_exception(local_error);
    const int64_t failing = verdict[0] / kKinds;
    const auto kind = static_cast<ErrorKind>(verdict[0] % kKinds);
    if (kind == ErrorKind::kInvalidInput) {
      SPARSECP_FAIL(what, " aborted: rank ", failing, " rejected its inputs");
    }
    SPARSECP_FAIL_AS(kind, what, " aborted: rank ", failing, " failed (", error_kind_name(kind),
                     ")");
  }
  if ((verdict[1] < size || verdict[2] != -verdict[3]) && planning != nullptr) {
    check_agreement(comm, *planning, what);  // every rank is here; names what differs
  }
  if (verdict[1] < size) {
    if (count_failure < size) SPARSECP_FAIL(count_message);
    SPARSECP_FAIL(what, " aborted: rank ", verdict[1], " received row counts that disagree with ",
                  "its route (routes differ between ranks)");
  }
  SPARSECP_CHECK(verdict[2] == -verdict[3], what,
                 " inputs differ between ranks: lengths, ratio, options, field widths, dtypes "
                 "and topk must be identical on every rank");
}

// ---------------------------------------------------------------------------------
// Sizes and allocations. Every buffer is sized from inputs, so its size is checked
// against 64 bits (InvalidInputError) and a failed allocation becomes a
// ResourceError naming the size; both happen before the agreement, so that a rank
// that cannot allocate fails every rank instead of leaving them in the exchange.

int64_t checked_product(int64_t a, int64_t b, const char* what) {
  int64_t product = 0;
  SPARSECP_CHECK(a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, &product), what, " of ", a,
                 " x ", b, " overflows 64 bits");
  return product;
}

template <typename T>
void allocate(std::vector<T>& buffer, int64_t count, const char* what) {
  try {
    buffer.resize(static_cast<size_t>(count));
  } catch (const std::exception&) {  // std::bad_alloc, std::length_error
    SPARSECP_FAIL_AS(ErrorKind::kResource, what, ": could not allocate ",
                     static_cast<double>(count) * static_cast<double>(sizeof(T)), " bytes");
  }
}

// ---------------------------------------------------------------------------------
// Validation.

int64_t owner_rows(const IndexerRoute& route) {
  return static_cast<int64_t>(route.send_rows.size() + route.local_sources.size());
}

int64_t sum_of(std::span<const int64_t> values, const char* name) {
  int64_t total = 0;
  for (const int64_t value : values) {
    SPARSECP_CHECK(value >= 0, "Indexer route ", name, " holds a negative count ", value);
    SPARSECP_CHECK(!__builtin_add_overflow(total, value, &total), "Indexer route ", name,
                   " overflows 64 bits");
  }
  return total;
}

// Every row index in range and every owner row / worker position used exactly
// once, so that no output row is left unwritten and no copy leaves its buffer.
void check_route(const IndexerRoute& route, int64_t size, int64_t rank) {
  SPARSECP_CHECK(static_cast<int64_t>(route.input_splits.size()) == size &&
                     static_cast<int64_t>(route.output_splits.size()) == size,
                 "Indexer route has ", route.input_splits.size(), " input and ",
                 route.output_splits.size(), " output splits for a CP group of ", size, " ranks");
  SPARSECP_CHECK(route.input_splits[rank] == 0 && route.output_splits[rank] == 0,
                 "Indexer route sends ", route.input_splits[rank], " rows to its own rank ", rank,
                 "; local rows must use local_sources/local_targets");
  SPARSECP_CHECK(
      sum_of(route.input_splits, "input_splits") == static_cast<int64_t>(route.send_rows.size()),
      "Indexer route input_splits add up to ", sum_of(route.input_splits, ""),
      " rows but send_rows holds ", route.send_rows.size());
  SPARSECP_CHECK(sum_of(route.output_splits, "output_splits") ==
                     static_cast<int64_t>(route.receive_rows.size()),
                 "Indexer route output_splits add up to ", sum_of(route.output_splits, ""),
                 " rows but receive_rows holds ", route.receive_rows.size());
  SPARSECP_CHECK(route.local_sources.size() == route.local_targets.size(), "Indexer route has ",
                 route.local_sources.size(), " local sources but ", route.local_targets.size(),
                 " local targets");
  SPARSECP_CHECK(route.query_count ==
                     static_cast<int64_t>(route.receive_rows.size() + route.local_targets.size()),
                 "Indexer route query_count ", route.query_count, " differs from the ",
                 route.receive_rows.size() + route.local_targets.size(),
                 " received and local rows");
  const auto check_cover = [](std::span<const int64_t> first, std::span<const int64_t> second,
                              int64_t count, const char* what) {
    std::vector<bool> seen(static_cast<size_t>(count), false);
    for (const auto rows : {first, second}) {
      for (const int64_t row : rows) {
        SPARSECP_CHECK(row >= 0 && row < count, "Indexer route ", what, " row ", row,
                       " is outside [0, ", count, ")");
        SPARSECP_CHECK(!seen[static_cast<size_t>(row)], "Indexer route ", what, " row ", row,
                       " appears twice");
        seen[static_cast<size_t>(row)] = true;
      }
    }
  };
  check_cover(route.send_rows, route.local_sources, owner_rows(route), "owner");
  check_cover(route.receive_rows, route.local_targets, route.query_count, "worker");
}

// Field matrices of the owner inputs, after the seed's checks. `axes_text` is the
// seed's message for mismatched axes (it differs between the sync and the launch
// path). Returns the fields in the seed's order (qr, weights, cos, sin).
std::vector<MatrixView> owner_fields(const IndexerInputs& inputs, const char* axes_text) {
  const TensorView* tensors[] = {&inputs.query_residual, &inputs.weights, &inputs.cos, &inputs.sin};
  const TensorView& qr = inputs.query_residual;
  std::vector<MatrixView> fields;
  for (const TensorView* tensor : tensors) {
    SPARSECP_CHECK(tensor->shape.size() == 3 && tensor->shape[0] == qr.shape[0] &&
                       tensor->shape[1] == qr.shape[1],
                   axes_text);
    const int64_t rows = tensor->shape[1];
    const int64_t cols = tensor->shape[2];
    SPARSECP_CHECK(rows >= 0 && cols >= 0, "Indexer input shape [", tensor->shape[0], ", ", rows,
                   ", ", cols, "] has a negative extent");
    int64_t bytes = 0;
    SPARSECP_CHECK(!__builtin_mul_overflow(rows, cols, &bytes) &&
                       !__builtin_mul_overflow(bytes, dtype_bytes(tensor->dtype), &bytes),
                   "Indexer input of ", rows, " x ", cols, " elements overflows 64 bits");
    SPARSECP_CHECK(bytes == 0 || tensor->data != nullptr, "Indexer input of ", rows, " x ", cols,
                   " elements has no data");
    fields.push_back({tensor->data, tensor->dtype, rows, cols});
  }
  return fields;
}

void check_batch_one(const IndexerInputs& inputs) {
  const auto& shape = inputs.query_residual.shape;
  SPARSECP_CHECK(shape.size() == 3 && shape[0] == 1,
                 "Indexer balance requires batch one and equal contiguous source query shards");
}

void add_fields(Fingerprint& fingerprint, std::span<const MatrixView> fields) {
  fingerprint.add(static_cast<int64_t>(fields.size()));
  for (const MatrixView& field : fields) {
    fingerprint.add(static_cast<int64_t>(field.dtype));
    fingerprint.add(field.cols);
  }
}

// ---------------------------------------------------------------------------------
// Moving rows.

const std::byte* row_of(const MatrixView& field, int64_t row) {
  return static_cast<const std::byte*>(field.data) + row * field.cols * dtype_bytes(field.dtype);
}

std::byte* row_of(RowMatrix& matrix, int64_t row) {
  return matrix.bytes.data() + row * matrix.row_bytes();
}

// One dtype group's all-to-all. Its buffers outlive the transfer: the destructor
// settles the Work first and, if the transfer failed, keeps the buffers until the
// process exits (comm.hpp, rule 3).
struct GroupTransfer {
  std::vector<size_t> fields;  // indices into the field list
  int64_t row_bytes = 0;
  std::vector<std::byte> send;
  std::vector<std::byte> received;
  Work work;

  GroupTransfer() = default;
  GroupTransfer(GroupTransfer&&) noexcept = default;
  // Member-wise assignment would free the buffers before settling the Work.
  GroupTransfer& operator=(GroupTransfer&&) = delete;
  ~GroupTransfer() {
    if (!work.settle()) keep_until_exit(std::make_pair(std::move(send), std::move(received)));
  }
};

struct FieldLaunch {
  std::vector<RowMatrix> outputs;
  std::vector<GroupTransfer> transfers;
};

// Seed `_exchange_inputs` (local half): allocates every output and transfer buffer
// (sizes checked), packs each dtype group's send rows and copies local rows. Throws
// before any communication, so it runs inside the agreement's local checks.
FieldLaunch prepare_fields(std::span<const MatrixView> fields, const IndexerRoute& route) {
  FieldLaunch launch;
  for (const MatrixView& field : fields) {
    launch.outputs.emplace_back(field.dtype, route.query_count, field.cols);
  }
  std::vector<DType> order;
  for (const MatrixView& field : fields) {
    bool known = false;
    for (const DType dtype : order) known = known || dtype == field.dtype;
    if (!known) order.push_back(field.dtype);
  }
  launch.transfers.reserve(order.size());
  const int64_t sent_rows = static_cast<int64_t>(route.send_rows.size());
  const int64_t received_rows = static_cast<int64_t>(route.receive_rows.size());
  for (const DType dtype : order) {
    GroupTransfer& transfer = launch.transfers.emplace_back();
    for (size_t index = 0; index < fields.size(); ++index) {
      if (fields[index].dtype != dtype) continue;
      transfer.fields.push_back(index);
      const int64_t bytes =
          checked_product(fields[index].cols, dtype_bytes(dtype), "Indexer field row width");
      SPARSECP_CHECK(!__builtin_add_overflow(transfer.row_bytes, bytes, &transfer.row_bytes),
                     "Indexer packed row of the ", dtype_name(dtype), " fields overflows 64 bits");
    }
    allocate(transfer.send, checked_product(sent_rows, transfer.row_bytes, "Indexer send buffer"),
             "Indexer send buffer");
    allocate(transfer.received,
             checked_product(received_rows, transfer.row_bytes, "Indexer receive buffer"),
             "Indexer receive buffer");
    for (int64_t i = 0; i < sent_rows; ++i) {
      std::byte* packed = transfer.send.data() + i * transfer.row_bytes;
      for (const size_t index : transfer.fields) {
        const int64_t bytes = fields[index].cols * dtype_bytes(dtype);
        copy_bytes(packed, row_of(fields[index], route.send_rows[i]), bytes);
        packed += bytes;
      }
    }
  }
  for (size_t k = 0; k < route.local_sources.size(); ++k) {
    for (size_t index = 0; index < fields.size(); ++index) {
      RowMatrix& output = launch.outputs[index];
      copy_bytes(row_of(output, route.local_targets[k]),
                 row_of(fields[index], route.local_sources[k]), output.row_bytes());
    }
  }
  return launch;
}

// Seed `_exchange_inputs` (launch half): one all-to-all per dtype group. Collective;
// runs after the agreement.
void post_fields(FieldLaunch& launch, const IndexerRoute& route, Communicator& comm) {
  for (GroupTransfer& transfer : launch.transfers) {
    transfer.work = comm.all_to_all_rows(transfer.send, route.input_splits, transfer.received,
                                         route.output_splits, transfer.row_bytes);
  }
}

// Seed `_PendingRows.wait` for every input group: completes the transfers, unpacks
// received rows into worker order and releases the transfer storage.
std::vector<RowMatrix> finish_fields(FieldLaunch& launch, const IndexerRoute& route) {
  for (GroupTransfer& transfer : launch.transfers) {
    transfer.work.wait();
    for (size_t i = 0; i < route.receive_rows.size(); ++i) {
      const std::byte* packed =
          transfer.received.data() + static_cast<int64_t>(i) * transfer.row_bytes;
      for (const size_t index : transfer.fields) {
        RowMatrix& output = launch.outputs[index];
        copy_bytes(row_of(output, route.receive_rows[i]), packed, output.row_bytes());
        packed += output.row_bytes();
      }
    }
  }
  launch.transfers.clear();
  return std::move(launch.outputs);
}

void check_selected(const SelectedKeys& selected, const IndexerRoute& route) {
  SPARSECP_CHECK(selected.rows == route.query_count, "Indexer selection returned ", selected.rows,
                 " rows for ", route.query_count, " worker queries");
  SPARSECP_CHECK(selected.topk >= 1, "Indexer selection topk must be positive, got ",
                 selected.topk);
  int64_t values = 0;
  SPARSECP_CHECK(!__builtin_mul_overflow(selected.rows, selected.topk, &values) &&
                     static_cast<int64_t>(selected.ids.size()) == values,
                 "Indexer selection holds ", selected.ids.size(), " ids for ", selected.rows,
                 " rows of topk ", selected.topk);
}

}  // namespace

// -----------------------------------------------------------------------------------
// Plain types.

RowMatrix::RowMatrix(DType type, int64_t row_count, int64_t col_count)
    : dtype(type), rows(row_count), cols(col_count) {
  SPARSECP_CHECK(row_count >= 0 && col_count >= 0, "Indexer ", dtype_name(type), " matrix of ",
                 row_count, " x ", col_count, " elements has a negative extent");
  int64_t size = 0;
  SPARSECP_CHECK(!__builtin_mul_overflow(row_count, col_count, &size) &&
                     !__builtin_mul_overflow(size, dtype_bytes(type), &size),
                 "Indexer ", dtype_name(type), " matrix of ", row_count, " x ", col_count,
                 " elements overflows 64 bits");
  allocate(bytes, size, "Indexer worker field");
}

int64_t input_row_bytes(const IndexerInputs& inputs) {
  int64_t bytes = 0;
  for (const TensorView* tensor :
       {&inputs.query_residual, &inputs.weights, &inputs.cos, &inputs.sin}) {
    if (tensor->shape.empty()) continue;
    const int64_t field =
        checked_product(tensor->shape.back(), dtype_bytes(tensor->dtype), "Indexer input row");
    SPARSECP_CHECK(!__builtin_add_overflow(bytes, field, &bytes),
                   "Indexer input row bytes overflow 64 bits");
  }
  return bytes;
}

// -----------------------------------------------------------------------------------
// Handles.

struct PendingRows::State {
  std::shared_ptr<const IndexerRoute> route;
  std::vector<int32_t> send;
  std::vector<int32_t> received;
  SelectedKeys output;
  Work work;  // after the buffers; settled first by the destructor
  bool consumed = false;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    if (!work.settle()) keep_until_exit(std::make_pair(std::move(send), std::move(received)));
  }
};

PendingRows::PendingRows() = default;
PendingRows::PendingRows(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingRows::PendingRows(PendingRows&&) noexcept = default;
PendingRows& PendingRows::operator=(PendingRows&&) noexcept = default;
PendingRows::~PendingRows() = default;

SelectedKeys PendingRows::wait() {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_ && !state_->consumed,
                    "Indexer communication handle cannot be consumed twice");
  state_->consumed = true;
  state_->work.wait();
  const IndexerRoute& route = *state_->route;
  SelectedKeys output = std::move(state_->output);
  const int64_t topk = output.topk;
  for (size_t i = 0; i < route.send_rows.size(); ++i) {
    std::memcpy(output.ids.data() + route.send_rows[i] * topk,
                state_->received.data() + static_cast<int64_t>(i) * topk,
                static_cast<size_t>(topk) * sizeof(int32_t));
  }
  // Release transfer storage now, as the seed does, not when the handle dies.
  state_->send = {};
  state_->received = {};
  state_->route.reset();
  return output;
}

bool PendingRows::test() {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_ && !state_->consumed,
                    "Indexer communication handle cannot be consumed twice");
  return state_->work.test();
}

struct IndexerInputExchange::State {
  std::shared_ptr<const IndexerRoute> route;
  Communicator* comm = nullptr;
  int64_t owner_queries = 0;
  FieldLaunch launch;
  bool consumed = false;         // wait() was called
  bool result_launched = false;  // launch_result() launched the result exchange
};

IndexerInputExchange::IndexerInputExchange() = default;
IndexerInputExchange::IndexerInputExchange(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
IndexerInputExchange::IndexerInputExchange(IndexerInputExchange&&) noexcept = default;
IndexerInputExchange& IndexerInputExchange::operator=(IndexerInputExchange&&) noexcept = default;
IndexerInputExchange::~IndexerInputExchange() = default;

WorkerInputs IndexerInputExchange::wait() {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_ && !state_->consumed,
                    "Indexer input exchange cannot be consumed twice");
  state_->consumed = true;
  std::vector<RowMatrix> fields = finish_fields(state_->launch, *state_->route);
  return {std::move(fields[0]), std::move(fields[1]), std::move(fields[2]), std::move(fields[3])};
}

bool IndexerInputExchange::test() {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_ && !state_->consumed,
                    "Indexer input exchange cannot be consumed twice");
  bool done = true;
  for (GroupTransfer& transfer : state_->launch.transfers) done = transfer.work.test() && done;
  return done;
}

const IndexerRoute& IndexerInputExchange::route() const {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_,
                    "Indexer input exchange handle is empty (moved from)");
  return *state_->route;
}

int64_t IndexerInputExchange::owner_queries() const {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_,
                    "Indexer input exchange handle is empty (moved from)");
  return state_->owner_queries;
}

PendingRows IndexerInputExchange::launch_result(const SelectedKeys& selected) {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, state_,
                    "Indexer input exchange handle is empty (moved from)");
  // Local, before any collective: a rank that launches twice must not enter the
  // agreement alone.
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, !state_->result_launched,
                    "Indexer result exchange cannot be consumed twice");
  const IndexerRoute& route = *state_->route;
  Communicator& comm = *state_->comm;
  auto pending = ExchangeAccess::pending_state();
  const LocalFailure error = capture([&] {
    check_selected(selected, route);
    const int64_t topk = selected.topk;
    const auto row_size = static_cast<size_t>(topk) * sizeof(int32_t);
    const char* what = "Indexer result buffer";
    allocate(pending->send,
             checked_product(static_cast<int64_t>(route.receive_rows.size()), topk, what), what);
    for (size_t i = 0; i < route.receive_rows.size(); ++i) {
      std::memcpy(pending->send.data() + static_cast<int64_t>(i) * topk,
                  selected.ids.data() + route.receive_rows[i] * topk, row_size);
    }
    allocate(pending->received,
             checked_product(static_cast<int64_t>(route.send_rows.size()), topk, what), what);
    pending->output.rows = state_->owner_queries;
    pending->output.topk = topk;
    allocate(pending->output.ids, checked_product(state_->owner_queries, topk, what), what);
    std::fill(pending->output.ids.begin(), pending->output.ids.end(), -1);
    for (size_t k = 0; k < route.local_sources.size(); ++k) {
      std::memcpy(pending->output.ids.data() + route.local_sources[k] * topk,
                  selected.ids.data() + route.local_targets[k] * topk, row_size);
    }
  });
  Fingerprint fingerprint;
  fingerprint.add(error ? 0 : selected.topk);
  agree(comm, error, false, nullptr, fingerprint.value(), "Indexer result exchange");

  // Every rank passed: the result exchange is launched now, once. (A launch that the
  // agreement rejected on every rank did not consume the handle.)
  state_->result_launched = true;
  pending->route = state_->route;
  pending->work = all_to_all_rows<int32_t>(comm, pending->send, route.output_splits,
                                           pending->received, route.input_splits, selected.topk);
  return ExchangeAccess::make(std::move(pending));
}

// -----------------------------------------------------------------------------------
// Launches.

namespace {

// Shared tail of both launch_indexer_inputs overloads: inputs were validated, the
// buffers prepared and all ranks agreed.
IndexerInputExchange launch_agreed(FieldLaunch launch, std::shared_ptr<const IndexerRoute> route,
                                   Communicator& comm) {
  auto state = ExchangeAccess::exchange_state();
  state->comm = &comm;
  state->owner_queries = owner_rows(*route);
  state->launch = std::move(launch);
  state->route = std::move(route);
  post_fields(state->launch, *state->route, comm);
  return ExchangeAccess::make(std::move(state));
}

// Seed texts for mismatched axes: the launch path and the synchronous path differ.
constexpr const char* kLaunchAxesText =
    "Indexer qr, weights and rotary embeddings must share token axes and device";
constexpr const char* kSelectAxesText =
    "Indexer qr, weights and rotary embeddings must have matching batch/token axes and device";

}  // namespace

IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs, const RouteRequest& request,
                                           Communicator& comm) {
  const char* axes_text = request.synchronous ? kSelectAxesText : kLaunchAxesText;
  std::vector<MatrixView> fields;
  std::shared_ptr<const IndexerRoute> route;
  FieldLaunch launch;
  const LocalFailure error = capture([&] {
    check_batch_one(inputs);
    int64_t total = 0;
    for (const int64_t length : request.lengths) {
      SPARSECP_CHECK(!__builtin_add_overflow(total, length, &total),
                     "Indexer balance document lengths overflow 64 bits");
    }
    int64_t shards = 0;
    SPARSECP_CHECK(!__builtin_mul_overflow(inputs.query_residual.shape[1], comm.size(), &shards) &&
                       shards == total,
                   "Indexer balance requires batch one and equal contiguous source query shards");
    fields = owner_fields(inputs, axes_text);
    SPARSECP_CHECK(request.build != nullptr, "Indexer input exchange needs a route, got none");
    route = std::make_shared<const IndexerRoute>(request.build());
    check_route(*route, comm.size(), comm.rank());
    SPARSECP_CHECK(fields[0].rows == owner_rows(*route), "Indexer route sends or keeps ",
                   owner_rows(*route), " owner rows of ", fields[0].rows);
    launch = prepare_fields(fields, *route);
  });
  Fingerprint fingerprint;
  fingerprint.add(static_cast<int64_t>(request.planning.value() >> 2));
  add_fields(fingerprint, fields);
  agree(comm, error, true, route.get(), fingerprint.value(), "Indexer input exchange",
        &request.planning);
  return launch_agreed(std::move(launch), std::move(route), comm);
}

IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs,
                                           std::shared_ptr<const IndexerRoute> route,
                                           Communicator& comm) {
  std::vector<MatrixView> fields;
  FieldLaunch launch;
  const LocalFailure error = capture([&] {
    SPARSECP_CHECK(route != nullptr, "Indexer input exchange needs a route, got none");
    check_batch_one(inputs);
    fields = owner_fields(inputs, kLaunchAxesText);
    check_route(*route, comm.size(), comm.rank());
    SPARSECP_CHECK(fields[0].rows == owner_rows(*route), "Indexer input holds ", fields[0].rows,
                   " owner rows but the route sends or keeps ", owner_rows(*route));
    launch = prepare_fields(fields, *route);
  });
  Fingerprint fingerprint;
  add_fields(fingerprint, fields);
  agree(comm, error, true, route.get(), fingerprint.value(), "Indexer input exchange");
  return launch_agreed(std::move(launch), std::move(route), comm);
}

std::vector<RowMatrix> exchange_rows(std::span<const MatrixView> fields, const IndexerRoute& route,
                                     Communicator& comm) {
  FieldLaunch launch;
  const LocalFailure error = capture([&] {
    check_route(route, comm.size(), comm.rank());
    for (const MatrixView& field : fields) {
      SPARSECP_CHECK(field.rows == owner_rows(route) && field.cols >= 0, "Indexer field of ",
                     field.rows, " x ", field.cols, " does not match the route's ",
                     owner_rows(route), " owner rows");
      SPARSECP_CHECK(
          checked_product(field.rows, field.cols, "Indexer field") == 0 || field.data != nullptr,
          "Indexer field of ", field.rows, " x ", field.cols, " has no data");
    }
    launch = prepare_fields(fields, route);
  });
  Fingerprint fingerprint;
  add_fields(fingerprint, fields);
  agree(comm, error, true, &route, fingerprint.value(), "Indexer row exchange");
  post_fields(launch, route, comm);
  return finish_fields(launch, route);
}

SelectedKeys return_rows(const SelectedKeys& selected, const IndexerRoute& route,
                         Communicator& comm) {
  // Reuses the handle path: a launch with no input fields, then its result.
  const LocalFailure error = capture([&] { check_route(route, comm.size(), comm.rank()); });
  agree(comm, error, true, &route, 0, "Indexer result exchange");
  auto state = ExchangeAccess::exchange_state();
  state->comm = &comm;
  state->owner_queries = owner_rows(route);
  state->route = std::make_shared<const IndexerRoute>(route);
  state->consumed = true;
  IndexerInputExchange exchange = ExchangeAccess::make(std::move(state));
  return exchange.launch_result(selected).wait();
}

SelectedKeys select_and_return(IndexerInputExchange exchange, const Selector& selector,
                               Communicator& comm) {
  const WorkerInputs worker = exchange.wait();
  SelectedKeys selected;
  // A selector failing on one rank must not leave its peers in the result
  // exchange: report through the result agreement instead of returning early (the
  // failing rank rethrows the selector's own exception).
  const LocalFailure failure =
      capture([&] { selected = selector(worker, exchange.route().segments); });
  if (failure) {
    agree(comm, failure, false, nullptr, 0, "Indexer result exchange");
  }
  return exchange.launch_result(selected).wait();
}

}  // namespace sparsecp
