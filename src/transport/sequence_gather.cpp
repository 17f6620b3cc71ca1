#include "sparsecp/transport/sequence_gather.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <string>

#include "sparsecp/error.hpp"
#include "sparsecp/transport/agreement.hpp"

namespace sparsecp {

namespace {

// Runs the local checks (and allocations) and keeps what they threw (nullptr when
// they passed), whatever it was: an exception escaping on one rank would leave the
// others blocked in the agreement.
template <typename Checks>
std::exception_ptr local_error(Checks&& checks) {
  try {
    checks();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// Makes every rank see the same verdict before any data moves (see the header), in one
// 3-value allreduce: the failure kinds and the range of the fingerprints of what every
// rank must agree on (`inputs`: the route's defining inputs or the shard layout, the
// row width and the element size). A rank that rejected its inputs rethrows its own
// error and the others raise one of the same kind; otherwise differing inputs raise on
// every rank naming the difference (check_agreement, which every rank then enters).
void agree_on_inputs(Communicator& comm, const std::exception_ptr& error,
                     const PlanningFingerprint& inputs, const char* what) {
  const auto value = static_cast<int64_t>(inputs.value());
  // MIN of -(1 + kind) is -(1 + the largest kind); 0 when every rank is valid.
  int64_t verdict[3] = {error ? -1 - static_cast<int64_t>(error_kind_of(error)) : 0, value, ~value};
  comm.all_reduce(std::span<int64_t>(verdict, 3), ReduceOp::kMin);
  // A rank that rejected its own inputs is reported first (its fingerprint may differ
  // only because of the bad input, e.g. a zero width); every rank takes the same branch.
  if (verdict[0] == 0 && verdict[1] != ~verdict[2]) {
    check_agreement(comm, inputs, what);  // throws on every rank, naming what differs
    SPARSECP_FAIL(what, ": CP ranks disagree on their inputs");  // not reached
  }
  if (error) std::rethrow_exception(error);
  if (verdict[0] == 0) return;
  const auto kind = static_cast<ErrorKind>(-verdict[0] - 1);
  if (kind == ErrorKind::kInvalidInput) {
    SPARSECP_FAIL("sequence gather input was rejected on another rank");
  }
  SPARSECP_FAIL_AS(kind, "sequence gather failed on another rank (", error_kind_name(kind), ")");
}

// What the ranks of a dispatch (or its backward) must agree on.
template <typename T>
PlanningFingerprint dispatch_inputs(const SequenceDispatchRoute& route, int64_t width,
                                    int64_t direction) {
  PlanningFingerprint inputs = dispatch_route_fingerprint(route);
  inputs.add("row width", width)
      .add("element bytes", static_cast<int64_t>(sizeof(T)))
      .add("backward", direction);
  return inputs;
}

// What the ranks of an all-gather (or its backward) must agree on.
template <typename T>
PlanningFingerprint gather_inputs(std::span<const int64_t> shard_offsets, const Communicator& comm,
                                  int64_t width, int64_t direction) {
  std::vector<int64_t> extents;
  for (size_t r = 1; r < shard_offsets.size(); ++r) {
    extents.push_back(shard_offsets[r] - shard_offsets[r - 1]);
  }
  PlanningFingerprint inputs(extents, comm.size(), 1);
  inputs.add("shard offsets", static_cast<int64_t>(shard_offsets.size()))
      .add("row width", width)
      .add("element bytes", static_cast<int64_t>(sizeof(T)))
      .add("backward", direction);
  return inputs;
}

// Sizes `buffer` to `rows` x `width` values: InvalidInputError when that overflows,
// ResourceError when it cannot be allocated.
template <typename T>
void allocate(std::vector<T>& buffer, int64_t rows, int64_t width, const char* what) {
  int64_t values = 0;
  SPARSECP_CHECK(
      rows >= 0 && width >= 0 && !__builtin_mul_overflow(rows, width, &values) &&
          values <= std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(T)),
      what, " of ", rows, " rows x ", width, " values overflows 64 bits");
  try {
    buffer.resize(static_cast<size_t>(values));
  } catch (const std::exception&) {  // std::bad_alloc, std::length_error
    SPARSECP_FAIL_AS(ErrorKind::kResource, what, ": could not allocate ",
                     static_cast<double>(values) * static_cast<double>(sizeof(T)), " bytes");
  }
}

// values == rows * width, without overflow.
bool holds_rows(size_t values, int64_t rows, int64_t width) {
  int64_t expected = 0;
  return rows >= 0 && width > 0 && !__builtin_mul_overflow(rows, width, &expected) &&
         static_cast<size_t>(expected) == values;
}

void check_route_matches(const SequenceDispatchRoute& route, const Communicator& comm) {
  SPARSECP_CHECK(route.size == comm.size() && route.rank == comm.rank(),
                 "sequence dispatch route was made for rank ", route.rank, " of ", route.size,
                 ", but the communicator is rank ", comm.rank(), " of ", comm.size());
  const auto size = static_cast<size_t>(route.size);
  SPARSECP_CHECK(route.send_begin.size() == size && route.send_splits.size() == size &&
                     route.receive_splits.size() == size,
                 "sequence dispatch route splits need ", route.size, " entries");
}

void check_shard_offsets(std::span<const int64_t> offsets, const Communicator& comm) {
  SPARSECP_CHECK(static_cast<int64_t>(offsets.size()) == comm.size() + 1,
                 "all-gather shard offsets need ", comm.size() + 1, " entries, got ",
                 offsets.size());
  SPARSECP_CHECK(offsets[0] == 0, "all-gather shard offsets must start at 0, got ", offsets[0]);
  for (size_t r = 1; r < offsets.size(); ++r) {
    SPARSECP_CHECK(offsets[r] >= offsets[r - 1], "all-gather shard offsets must not decrease, got ",
                   offsets[r - 1], " then ", offsets[r], " at rank ", r - 1);
  }
}

template <typename T>
SequenceGatherHandle<T> completed(std::vector<T> result, int64_t rows, int64_t width) {
  return SequenceGatherHandle<T>(
      Work(), [result = std::move(result)]() mutable { return std::move(result); }, rows, width);
}

}  // namespace

template <typename T>
std::vector<T> SequenceGatherHandle<T>::wait() {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, !consumed_,
                    "Sequence gather handle cannot be consumed twice");
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, static_cast<bool>(finish_),
                    "Sequence gather handle holds no transfer");
  consumed_ = true;
  work_.wait();
  std::function<std::vector<T>()> finish = std::move(finish_);
  finish_ = nullptr;
  return finish();  // `finish` and the buffers it owns die on return
}

template <typename T>
bool SequenceGatherHandle<T>::test() {
  SPARSECP_CHECK_AS(ErrorKind::kMisuse, !consumed_,
                    "Sequence gather handle cannot be consumed twice");
  return work_.test();
}

// ---------------------------------------------------------------------------

template <typename T>
SequenceGatherHandle<T> launch_sequence_dispatch(std::span<const T> local, int64_t width,
                                                 const SequenceDispatchRoute& route,
                                                 Communicator& comm) {
  std::vector<T> send;
  std::vector<T> block;
  const std::exception_ptr error = local_error([&] {
    check_route_matches(route, comm);
    SPARSECP_CHECK(width > 0, "sequence dispatch row width must be positive, got ", width);
    SPARSECP_CHECK(holds_rows(local.size(), route.local_length, width),
                   "sequence dispatch owner length does not match the bank's physical layout");
    if (!route.exchange_needed) return;
    allocate(send, route.sent_rows(), width, "sequence dispatch send buffer");
    allocate(block, route.block_rows(), width, "sequence dispatch block");
  });
  const auto w = static_cast<size_t>(width);
  // Every rank agrees, even when its own route needs no exchange: a rank handed other
  // inputs may need one (and would otherwise pair with an unrelated collective).
  if (comm.size() > 1) {
    agree_on_inputs(comm, error, dispatch_inputs<T>(route, width, 0), "Sequence dispatch");
  } else if (error) {
    std::rethrow_exception(error);
  }
  if (!route.exchange_needed) {
    return completed(std::vector<T>(local.begin(), local.end()), route.local_length, width);
  }

  T* out = send.data();
  for (int64_t q = 0; q < route.size; ++q) {
    const size_t count = static_cast<size_t>(route.send_splits[q]) * w;
    if (count == 0) continue;
    std::memcpy(out, local.data() + static_cast<size_t>(route.send_begin[q]) * w,
                count * sizeof(T));
    out += count;
  }
  const size_t received = static_cast<size_t>(route.received_rows()) * w;
  if (!local.empty()) std::memcpy(block.data() + received, local.data(), local.size() * sizeof(T));
  Work work = all_to_all_rows<T>(comm, send, route.send_splits, std::span<T>(block).first(received),
                                 route.receive_splits, width);
  return SequenceGatherHandle<T>(
      std::move(work),
      [send = std::move(send), block = std::move(block)]() mutable { return std::move(block); },
      route.block_rows(), width);
}

template <typename T>
std::vector<T> sequence_dispatch(std::span<const T> local, int64_t width,
                                 const SequenceDispatchRoute& route, Communicator& comm) {
  return launch_sequence_dispatch(local, width, route, comm).wait();
}

template <typename T>
SequenceGatherHandle<T> launch_sequence_dispatch_backward(std::span<const T> block_grad,
                                                          int64_t width,
                                                          const SequenceDispatchRoute& route,
                                                          Communicator& comm) {
  std::vector<T> send;
  std::vector<T> local_grad;
  std::vector<T> returned;
  const std::exception_ptr error = local_error([&] {
    check_route_matches(route, comm);
    SPARSECP_CHECK(width > 0, "sequence dispatch row width must be positive, got ", width);
    SPARSECP_CHECK(holds_rows(block_grad.size(), route.block_rows(), width),
                   "sequence dispatch gradient holds ", block_grad.size(), " values, expected ",
                   route.block_rows(), " rows x ", width);
    if (!route.exchange_needed) return;
    allocate(send, route.received_rows(), width, "sequence dispatch gradient send buffer");
    allocate(local_grad, route.local_length, width, "sequence dispatch owner gradient");
    allocate(returned, route.sent_rows(), width, "sequence dispatch gradient receive buffer");
  });
  const auto w = static_cast<size_t>(width);
  if (comm.size() > 1) {
    agree_on_inputs(comm, error, dispatch_inputs<T>(route, width, 1), "Sequence dispatch backward");
  } else if (error) {
    std::rethrow_exception(error);
  }
  if (!route.exchange_needed) {
    return completed(std::vector<T>(block_grad.begin(), block_grad.end()), route.local_length,
                     width);
  }

  // Consumers return the gradient of the rows they received, in the order received.
  const size_t received = static_cast<size_t>(route.received_rows()) * w;
  std::copy(block_grad.begin(), block_grad.begin() + static_cast<ptrdiff_t>(received),
            send.begin());
  // The owner's own contribution comes first (it is the lowest consumer rank).
  std::copy(block_grad.begin() + static_cast<ptrdiff_t>(received), block_grad.end(),
            local_grad.begin());
  Work work =
      all_to_all_rows<T>(comm, send, route.receive_splits, returned, route.send_splits, width);
  return SequenceGatherHandle<T>(
      std::move(work),
      [send = std::move(send), returned = std::move(returned), local_grad = std::move(local_grad),
       begins = route.send_begin, splits = route.send_splits, w]() mutable {
        const T* in = returned.data();
        for (size_t q = 0; q < splits.size(); ++q) {
          T* rows = local_grad.data() + static_cast<size_t>(begins[q]) * w;
          const size_t count = static_cast<size_t>(splits[q]) * w;
          for (size_t i = 0; i < count; ++i) rows[i] += in[i];
          in += count;
        }
        return std::move(local_grad);
      },
      route.local_length, width);
}

template <typename T>
std::vector<T> sequence_dispatch_backward(std::span<const T> block_grad, int64_t width,
                                          const SequenceDispatchRoute& route, Communicator& comm) {
  return launch_sequence_dispatch_backward(block_grad, width, route, comm).wait();
}

// ---------------------------------------------------------------------------
// All-gather and its SUM reduce-scatter backward, on top of the variable-split
// all-to-all (the Communicator has no all-gather): rank r sends its shard to every
// peer, itself included, so the receive buffer is the gathered bank in global order.

std::vector<int64_t> equal_shard_offsets(int64_t local_rows, int64_t size) {
  SPARSECP_CHECK(local_rows >= 0 && size > 0, "equal shard offsets need local rows >= 0 and size ",
                 "> 0, got ", local_rows, " and ", size);
  int64_t total = 0;
  SPARSECP_CHECK(!__builtin_mul_overflow(local_rows, size, &total), "equal shards of ", local_rows,
                 " rows on ", size, " ranks overflow 64 bits");
  std::vector<int64_t> offsets(static_cast<size_t>(size) + 1);
  for (int64_t r = 0; r <= size; ++r) offsets[r] = r * local_rows;
  return offsets;
}

template <typename T>
SequenceGatherHandle<T> launch_all_gather_sequence(std::span<const T> local, int64_t width,
                                                   std::span<const int64_t> shard_offsets,
                                                   Communicator& comm) {
  const int64_t rank = comm.rank();
  std::vector<T> send;
  std::vector<T> bank;
  const std::exception_ptr error = local_error([&] {
    check_shard_offsets(shard_offsets, comm);
    SPARSECP_CHECK(width > 0, "all-gather row width must be positive, got ", width);
    const int64_t rows = shard_offsets[rank + 1] - shard_offsets[rank];
    SPARSECP_CHECK(holds_rows(local.size(), rows, width), "all-gather shard of rank ", rank,
                   " holds ", local.size(), " values, the layout gives it ", rows, " rows x ",
                   width);
    if (comm.size() == 1) return;
    int64_t copies = 0;
    SPARSECP_CHECK(!__builtin_mul_overflow(rows, comm.size(), &copies),
                   "all-gather send buffer of ", rows, " rows x ", comm.size(),
                   " ranks overflows 64 bits");
    allocate(send, copies, width, "all-gather send buffer");
    allocate(bank, shard_offsets.back(), width, "all-gather bank");
  });
  if (comm.size() == 1) {
    if (error) std::rethrow_exception(error);
    return completed(std::vector<T>(local.begin(), local.end()), shard_offsets[1], width);
  }
  agree_on_inputs(comm, error, gather_inputs<T>(shard_offsets, comm, width, 0),
                  "Sequence all-gather");

  const int64_t size = comm.size();
  const auto local_rows = shard_offsets[rank + 1] - shard_offsets[rank];
  for (int64_t p = 0; p < size; ++p) {
    std::copy(local.begin(), local.end(), send.begin() + static_cast<ptrdiff_t>(p * local.size()));
  }
  std::vector<int64_t> send_counts(size, local_rows);
  std::vector<int64_t> receive_counts(size);
  for (int64_t p = 0; p < size; ++p) receive_counts[p] = shard_offsets[p + 1] - shard_offsets[p];
  Work work = all_to_all_rows<T>(comm, send, send_counts, bank, receive_counts, width);
  return SequenceGatherHandle<T>(
      std::move(work),
      [send = std::move(send), bank = std::move(bank)]() mutable { return std::move(bank); },
      shard_offsets[size], width);
}

template <typename T>
std::vector<T> all_gather_sequence(std::span<const T> local, int64_t width,
                                   std::span<const int64_t> shard_offsets, Communicator& comm) {
  return launch_all_gather_sequence(local, width, shard_offsets, comm).wait();
}

template <typename T>
SequenceGatherHandle<T> launch_all_gather_sequence_backward(std::span<const T> bank_grad,
                                                            int64_t width,
                                                            std::span<const int64_t> shard_offsets,
                                                            Communicator& comm) {
  const int64_t rank = comm.rank();
  std::vector<T> send;
  std::vector<T> parts;
  const std::exception_ptr error = local_error([&] {
    check_shard_offsets(shard_offsets, comm);
    SPARSECP_CHECK(width > 0, "all-gather row width must be positive, got ", width);
    SPARSECP_CHECK(holds_rows(bank_grad.size(), shard_offsets.back(), width),
                   "all-gather gradient holds ", bank_grad.size(), " values, expected ",
                   shard_offsets.back(), " rows x ", width);
    if (comm.size() == 1) return;
    const int64_t rows = shard_offsets[rank + 1] - shard_offsets[rank];
    int64_t copies = 0;
    SPARSECP_CHECK(!__builtin_mul_overflow(rows, comm.size(), &copies),
                   "all-gather gradient parts of ", rows, " rows x ", comm.size(),
                   " ranks overflow 64 bits");
    allocate(send, shard_offsets.back(), width, "all-gather gradient send buffer");
    allocate(parts, copies, width, "all-gather gradient parts");
  });
  if (comm.size() == 1) {
    if (error) std::rethrow_exception(error);
    return completed(std::vector<T>(bank_grad.begin(), bank_grad.end()), shard_offsets[1], width);
  }
  agree_on_inputs(comm, error, gather_inputs<T>(shard_offsets, comm, width, 1),
                  "Sequence all-gather backward");

  const int64_t size = comm.size();
  const int64_t local_rows = shard_offsets[rank + 1] - shard_offsets[rank];
  const auto w = static_cast<size_t>(width);
  std::vector<int64_t> send_counts(size);
  for (int64_t p = 0; p < size; ++p) send_counts[p] = shard_offsets[p + 1] - shard_offsets[p];
  std::vector<int64_t> receive_counts(size, local_rows);
  std::copy(bank_grad.begin(), bank_grad.end(), send.begin());  // peer order == global order
  Work work = all_to_all_rows<T>(comm, send, send_counts, parts, receive_counts, width);
  return SequenceGatherHandle<T>(
      std::move(work),
      [send = std::move(send), parts = std::move(parts), size,
       shard = static_cast<size_t>(local_rows) * w]() {
        // SUM in ascending rank order, independent of arrival order.
        std::vector<T> sum(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(shard));
        for (int64_t p = 1; p < size; ++p) {
          const T* part = parts.data() + static_cast<size_t>(p) * shard;
          for (size_t i = 0; i < shard; ++i) sum[i] += part[i];
        }
        return sum;
      },
      local_rows, width);
}

template <typename T>
std::vector<T> all_gather_sequence_backward(std::span<const T> bank_grad, int64_t width,
                                            std::span<const int64_t> shard_offsets,
                                            Communicator& comm) {
  return launch_all_gather_sequence_backward(bank_grad, width, shard_offsets, comm).wait();
}

// ---------------------------------------------------------------------------

namespace {

struct DimSplit {
  size_t outer = 1;   // product of the dimensions before `dim`
  size_t inner = 1;   // product of the dimensions after `dim`
  size_t extent = 0;  // shape[dim]
  size_t total = 1;   // product of all dimensions
};

DimSplit split_at(std::span<const int64_t> shape, int64_t& dim) {
  const auto ndim = static_cast<int64_t>(shape.size());
  SPARSECP_CHECK(-ndim <= dim && dim < ndim,
                 "sequence dispatch dimension is outside the input tensor dimensions");
  if (dim < 0) dim += ndim;
  DimSplit split;
  uint64_t total = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    SPARSECP_CHECK(shape[d] >= 0, "tensor dimension ", d, " is negative: ", shape[d]);
    SPARSECP_CHECK(!__builtin_mul_overflow(total, static_cast<uint64_t>(shape[d]), &total),
                   "tensor shape overflows 64 bits");
    if (d < dim) split.outer *= static_cast<size_t>(shape[d]);
    if (d > dim) split.inner *= static_cast<size_t>(shape[d]);
  }
  split.extent = static_cast<size_t>(shape[dim]);
  split.total = static_cast<size_t>(total);
  return split;
}

}  // namespace

template <typename T>
std::vector<T> move_sequence_dim_to_front(std::span<const T> values, std::span<const int64_t> shape,
                                          int64_t dim) {
  const DimSplit split = split_at(shape, dim);
  SPARSECP_CHECK(values.size() == split.total, "tensor holds ", values.size(),
                 " values, its shape gives ", split.total);
  std::vector<T> rows(values.size());
  for (size_t o = 0; o < split.outer; ++o) {
    for (size_t s = 0; s < split.extent; ++s) {
      const T* from = values.data() + (o * split.extent + s) * split.inner;
      std::copy(from, from + split.inner, rows.data() + (s * split.outer + o) * split.inner);
    }
  }
  return rows;
}

template <typename T>
std::vector<T> move_sequence_dim_from_front(std::span<const T> rows, std::span<const int64_t> shape,
                                            int64_t dim) {
  const DimSplit split = split_at(shape, dim);
  const size_t width = split.outer * split.inner;
  if (width == 0) {
    SPARSECP_CHECK(rows.empty(), "sequence rows of width 0 must be empty, got ", rows.size());
    return {};
  }
  SPARSECP_CHECK(rows.size() % width == 0, "sequence rows hold ", rows.size(),
                 " values, not a multiple of the row width ", width);
  const size_t extent = rows.size() / width;
  std::vector<T> values(rows.size());
  for (size_t o = 0; o < split.outer; ++o) {
    for (size_t s = 0; s < extent; ++s) {
      const T* from = rows.data() + (s * split.outer + o) * split.inner;
      std::copy(from, from + split.inner, values.data() + (o * extent + s) * split.inner);
    }
  }
  return values;
}

// ---------------------------------------------------------------------------
// Explicit instantiations (see the header's list of element types).

#define SPARSECP_FORWARD_TYPES(T)                                                            \
  template class SequenceGatherHandle<T>;                                                    \
  template SequenceGatherHandle<T> launch_sequence_dispatch<T>(                              \
      std::span<const T>, int64_t, const SequenceDispatchRoute&, Communicator&);             \
  template std::vector<T> sequence_dispatch<T>(std::span<const T>, int64_t,                  \
                                               const SequenceDispatchRoute&, Communicator&); \
  template SequenceGatherHandle<T> launch_all_gather_sequence<T>(                            \
      std::span<const T>, int64_t, std::span<const int64_t>, Communicator&);                 \
  template std::vector<T> all_gather_sequence<T>(std::span<const T>, int64_t,                \
                                                 std::span<const int64_t>, Communicator&);   \
  template std::vector<T> move_sequence_dim_to_front<T>(std::span<const T>,                  \
                                                        std::span<const int64_t>, int64_t);  \
  template std::vector<T> move_sequence_dim_from_front<T>(std::span<const T>,                \
                                                          std::span<const int64_t>, int64_t);

#define SPARSECP_BACKWARD_TYPES(T)                                               \
  template SequenceGatherHandle<T> launch_sequence_dispatch_backward<T>(         \
      std::span<const T>, int64_t, const SequenceDispatchRoute&, Communicator&); \
  template std::vector<T> sequence_dispatch_backward<T>(                         \
      std::span<const T>, int64_t, const SequenceDispatchRoute&, Communicator&); \
  template SequenceGatherHandle<T> launch_all_gather_sequence_backward<T>(       \
      std::span<const T>, int64_t, std::span<const int64_t>, Communicator&);     \
  template std::vector<T> all_gather_sequence_backward<T>(                       \
      std::span<const T>, int64_t, std::span<const int64_t>, Communicator&);

SPARSECP_FORWARD_TYPES(float)
SPARSECP_FORWARD_TYPES(double)
SPARSECP_FORWARD_TYPES(uint16_t)
SPARSECP_FORWARD_TYPES(int32_t)
SPARSECP_FORWARD_TYPES(int64_t)
SPARSECP_BACKWARD_TYPES(float)
SPARSECP_BACKWARD_TYPES(double)

#undef SPARSECP_FORWARD_TYPES
#undef SPARSECP_BACKWARD_TYPES

}  // namespace sparsecp
