// sparsecp: moving selection inputs to workers and top-k results back to owners.
//
// Given a rank's IndexerRoute (route.hpp), the owner of a query row sends the row's
// selection inputs — low-rank query residual `qr`, merge weights and the original
// RoPE `cos`/`sin` — to the worker that selects it, and the worker sends back only
// the integer key ids. Main attention, its teacher and the KL loss never move.
//
// How rows travel (seed `_exchange_rows`, `_exchange_inputs`):
//   * Fields of equal dtype are packed side by side into one buffer per dtype group
//     (first-appearance order of the dtypes), so fp32 RoPE is never rounded to the
//     dtype of qr, and each group costs one variable-split all-to-all.
//   * The owner sends local rows `route.send_rows` split by `route.input_splits`;
//     the worker scatters received rows to `route.receive_rows`.
//   * Rows a rank selects itself are copied directly from `local_sources` to
//     `local_targets` (local bypass) and never sent to itself; the splits to self
//     are zero.
//   * Results take the reverse route: the worker sends rows `receive_rows` split by
//     `output_splits`; the owner scatters them to `send_rows`.
//   The bytes a rank moves are therefore exactly `expected_exchange_bytes(route,..)`.
//
// Every entry point that communicates first makes all ranks agree that their
// inputs are valid and consistent (a small allreduce and an all-to-all of the row
// counts; the rules of comm.hpp): an invalid input on one rank — wrong shapes,
// different lengths/options/field widths between ranks, routes whose row counts do
// not match — throws sparsecp::Error on *every* rank (the rank at fault gets the
// specific message, the others name that rank) instead of leaving peers hanging in a
// collective. Transfer buffers are sized (checked against 64 bits) and allocated
// before that agreement, so a rank that runs out of memory raises ResourceError and
// its peers a ResourceError naming it. No data moves unless every rank passed.
//
// Synchronous path: `balanced_select` (seed `balanced_indexer_select`).
// Overlapped path (seed `launch_indexer_inputs` -> `IndexerInputExchange.wait()` ->
// `launch_result(selected)` -> `_PendingRows.wait()`):
//
//     auto exchange = launch_indexer_inputs(inputs, route, comm);  // or balanced_select.hpp
//     ... owner work (e.g. project the compressed Index K bank) ...
//     WorkerInputs worker = exchange.wait();          // single use
//     SelectedKeys mine = select(worker, exchange.route().segments);
//     PendingRows result = exchange.launch_result(mine);
//     ... owner work (e.g. differentiable Q projection for the KL loss) ...
//     SelectedKeys owner_topk = result.wait();        // single use
//
// Handles are move-only and single-use: a second wait() throws the seed's
// "Indexer input exchange cannot be consumed twice" / "Indexer communication
// handle cannot be consumed twice", and a second launch_result() "Indexer result
// exchange cannot be consumed twice" (MisuseError, raised locally before any
// collective). Transfer buffers are released when wait() returns. A handle dropped
// without wait() completes its transfers in its destructor (blocking), so buffers are
// never freed under an in-flight transfer; if a transfer failed (wait() threw
// TransportError), its buffers are kept until the process exits (comm.hpp, rule 3).
// Handles keep a pointer to the Communicator, which must outlive them.
//
// Transport consumes routes; it never plans. The entry points that take document
// lengths and a strategy (hyper_parallel's signatures) are in balanced_select.hpp, one
// level above: they hand this layer a RouteRequest.
//
// Host memory only (MPI backend): `device` checks of the seed have no analogue.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "sparsecp/planning/route.hpp"
#include "sparsecp/segment.hpp"
#include "sparsecp/tensor.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/comm.hpp"

namespace sparsecp {

// An owning dense row-major [rows, cols] matrix of fp32 or bf16 elements, as the
// worker receives each field. The constructor checks the extents (non-negative, byte
// size within 64 bits: InvalidInputError) and turns a failed allocation into a
// ResourceError naming the size.
struct RowMatrix {
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<std::byte> bytes;  // rows * cols * dtype_bytes(dtype)

  RowMatrix() = default;
  RowMatrix(DType type, int64_t row_count, int64_t col_count);
  MatrixView view() const { return {bytes.data(), dtype, rows, cols}; }
  int64_t row_bytes() const { return cols * dtype_bytes(dtype); }
};

// Selected key ids [rows, topk] int32, -1 padded (the selector's output, and what
// an owner gets back for its rows).
struct SelectedKeys {
  int64_t rows = 0;
  int64_t topk = 0;
  std::vector<int32_t> ids;  // rows * topk

  std::span<const int32_t> row(int64_t r) const {
    return std::span<const int32_t>(ids).subspan(static_cast<size_t>(r * topk),
                                                 static_cast<size_t>(topk));
  }
  friend bool operator==(const SelectedKeys&, const SelectedKeys&) = default;
};

// An owner's selection inputs, each [1, local tokens, width] (seed: `query_residual`
// [1, local, q_lora_rank], `weights` [1, local, heads], `position_embeddings`
// (cos, sin) each [1, local, rope_dim / 2]). Any field may be fp32 or bf16.
struct IndexerInputs {
  TensorView query_residual;
  TensorView weights;
  TensorView cos;
  TensorView sin;
};

// A worker's inputs in its worker order, each [route.query_count, width] with the
// owner's dtype.
struct WorkerInputs {
  RowMatrix query_residual;
  RowMatrix weights;
  RowMatrix cos;
  RowMatrix sin;
};

// The worker-side selection (seed `selector(qr, weights, (cos, sin), segments)`):
// projects Index Q with the layer's own weights and selects against the full Index K
// bank. Must return [worker rows, topk] with the same topk on every rank.
using Selector = std::function<SelectedKeys(const WorkerInputs&, std::span<const Segment>)>;

// ExchangeBytes and expected_exchange_bytes (route.hpp): what a route moves; CommStats
// (comm.hpp) measures what actually moved.

// Packed row size of the inputs: sum of width * dtype bytes over all fields.
int64_t input_row_bytes(const IndexerInputs& inputs);

// ---------------------------------------------------------------------------------
// Generic row exchange (seed `_exchange_inputs` over `_exchange_rows`).
//
// `fields` are an owner's [local rows, width] matrices (local rows = the route's
// owner row count, send_rows.size() + local_sources.size()). Returns each field in
// worker order, [route.query_count, width], same dtype. Collective; synchronous.
std::vector<RowMatrix> exchange_rows(std::span<const MatrixView> fields, const IndexerRoute& route,
                                     Communicator& comm);

// The reverse move: a worker's `selected` [route.query_count, topk] rows go back to
// their owners. Returns [owner rows, topk]. Collective; synchronous.
SelectedKeys return_rows(const SelectedKeys& selected, const IndexerRoute& route,
                         Communicator& comm);

// ---------------------------------------------------------------------------------
// Single-use handles of the overlapped path.

// Seed `_PendingRows` for results: the owner's top-k rows in flight.
class PendingRows {
 public:
  PendingRows();
  PendingRows(PendingRows&&) noexcept;
  PendingRows& operator=(PendingRows&&) noexcept;
  ~PendingRows();

  // Waits once, restores received rows into owner order and releases transfer
  // storage. Returns [owner rows, topk]. Throws "Indexer communication handle
  // cannot be consumed twice" on a second call (or on a moved-from handle).
  SelectedKeys wait();
  // Drives progress without blocking; true once the transfer completed.
  bool test();

 private:
  friend struct ExchangeAccess;
  struct State;
  explicit PendingRows(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Seed `IndexerInputExchange`: one balanced input dispatch in flight.
class IndexerInputExchange {
 public:
  IndexerInputExchange();
  IndexerInputExchange(IndexerInputExchange&&) noexcept;
  IndexerInputExchange& operator=(IndexerInputExchange&&) noexcept;
  ~IndexerInputExchange();

  // Waits for all dtype groups once and returns the worker's qr, weights, cos and
  // sin in worker order, releasing transfer storage. Throws "Indexer input exchange
  // cannot be consumed twice" on a second call (or on a moved-from handle).
  WorkerInputs wait();
  // Drives progress of all input transfers without blocking; true once complete.
  bool test();

  // Launches the return of this worker's results, `selected` [query_count, topk]
  // (seed `launch_result`). Collective: every rank calls it with the same topk.
  // Local rows are copied at once; the returned handle completes the rest. May be
  // called before or after wait(), once: a second call throws MisuseError "Indexer
  // result exchange cannot be consumed twice" (the seed launches again; here the
  // handle is single-use like the others). A call that the result agreement rejected
  // on every rank (bad `selected` somewhere) launched nothing and may be repeated.
  // Not on a moved-from handle.
  PendingRows launch_result(const SelectedKeys& selected);

  // The route this exchange follows (its `segments` feed the selector).
  const IndexerRoute& route() const;
  // Rows this rank owns (seed `owner_queries`).
  int64_t owner_queries() const;

 private:
  friend struct ExchangeAccess;
  struct State;
  explicit IndexerInputExchange(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A route built inside the launch, from document lengths, so that a rank whose
// planning fails (bad lengths, a strategy's Error) raises on every rank through the
// launch's agreement instead of leaving its peers in a collective. balanced_select.hpp
// builds these from hyper_parallel's arguments or any strategy.
struct RouteRequest {
  // Document lengths of the packed batch: the launch checks the seed's equal
  // contiguous shards (local tokens * cp == sum(lengths)) before calling `build`.
  std::span<const int64_t> lengths;
  // This rank's route; may throw sparsecp::Error. Called once, inside the launch.
  std::function<IndexerRoute()> build;
  // What every rank must have planned from (folded into the launch's agreement).
  PlanningFingerprint planning{{}, 0, 0};
  // Input errors in the wording of the synchronous path (seed `balanced_indexer_select`:
  // "... must have matching batch/token axes and device") instead of the launch's.
  bool synchronous = false;
};

// Seed `launch_indexer_inputs`: checks the inputs (seed texts: "Indexer balance
// requires batch one and equal contiguous source query shards", "Indexer qr, weights
// and rotary embeddings must share token axes and device"), builds this rank's route
// with request.build(), agrees with all ranks, and launches one all-to-all per dtype
// group without waiting. Collective.
IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs, const RouteRequest& request,
                                           Communicator& comm);

// Plan-then-run variant: follows a route built beforehand (e.g. make_route of a
// custom TaskPlan, or Plan::route). The owner row count must equal the route's; ranks
// check that their row counts match each other's before anything moves. Collective.
IndexerInputExchange launch_indexer_inputs(const IndexerInputs& inputs,
                                           std::shared_ptr<const IndexerRoute> route,
                                           Communicator& comm);

// The rest of seed `balanced_indexer_select` after a launch: waits for the inputs,
// runs `selector` on this rank's worker rows with the route's segments, returns the
// results to their owners and waits: the top-k of this rank's own rows, [local
// tokens, topk] (the seed returns [1, local, topk]). A selector that throws on one
// rank raises on every rank (the failing rank rethrows its own exception).
// Collective.
SelectedKeys select_and_return(IndexerInputExchange exchange, const Selector& selector,
                               Communicator& comm);

}  // namespace sparsecp
