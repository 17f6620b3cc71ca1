// `sparsecp run`: the main job. Under `mpirun -np N`, every rank owns one contiguous
// shard of a packed batch, selects top-k once with mode 'none' (every rank selects
// its own rows) and once balanced (default hybrid), checks the two results are
// identical, and rank 0 reports per-rank rows, causal work, selection CPU time and
// bytes moved, the imbalance of both runs and the slowest rank's speedup.
//
// Model tensors are seeded and small-integer valued (qr, Wq_b and keys in a few
// integers, RoPE rotations by multiples of 90 degrees), so every score is exact and
// a row's top-k cannot depend on where it was computed; select.hpp guarantees the
// same for real values, the integers only make a mismatch impossible to excuse.
#include <cblas.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/kernels/bf16.hpp"
#include "sparsecp/kernels/select.hpp"
#include "sparsecp/planning/cost.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/route.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/planning/workload.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/exchange.hpp"
#include "sparsecp/transport/mpi_communicator.hpp"

namespace sparsecp::cli {
namespace {

struct RunFlags {
  BatchOptions batch;
  int64_t ratio = 4;
  std::string mode = "hybrid";
  std::optional<int64_t> block_size;
  std::optional<int64_t> zigzag_min_length;
  int64_t heads = 16;
  int64_t head_dim = 128;
  int64_t rope_dim = 64;
  int64_t q_rank = 256;
  int64_t topk = 512;
  uint64_t model_seed = 7;
  int threads = 1;
  int repeats = 3;
  bool overlap = true;
  bool json = false;
  bool check_agreement = true;
};

// Initialises MPI when the tool is the MPI program (it is, under mpirun) and
// finalises it when the command ends, after every communicator is gone.
class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      owned_ = true;
    }
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Finalize();
  }

  // Called on the error path before the error propagates. MPI_Finalize waits for every
  // rank, so a rank that failed alone (a transport error, out of memory, a bug) and
  // then finalised would leave the others blocked in a collective, and itself in
  // MPI_Finalize, forever. Errors that every rank raised together (input checks, the
  // agreement checks of agreement.hpp and exchange.hpp) reach this point on every rank
  // within moments; anything else aborts the job, naming this rank and the error.
  void leave_on_error(const char* what) const {
    if (!owned_) return;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Ibarrier(MPI_COMM_WORLD, &request);
    const timespec pause{0, 1000000};  // 1 ms
    for (int waited = 0; waited < kLeaveTimeoutMs; ++waited) {
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) return;  // every rank is leaving on an error: finalise normally
      nanosleep(&pause, nullptr);
    }
    std::fprintf(stderr,
                 "error: %s\nerror: rank %d failed while other ranks were still running; "
                 "aborting the job\n",
                 what, rank);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  static constexpr int kLeaveTimeoutMs = 10000;
  bool owned_ = false;
};

double now_seconds(clockid_t clock) {
  timespec time{};
  clock_gettime(clock, &time);
  return static_cast<double>(time.tv_sec) + 1e-9 * static_cast<double>(time.tv_nsec);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n == 0 ? 0.0 : (n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]));
}

// Small integers from (seed, stream, row, column): identical on every rank.
int64_t small_int(uint64_t seed, uint64_t stream, int64_t row, int64_t column, int64_t span) {
  SplitMix64 random(seed * 0x9E3779B97F4A7C15ULL + stream * 0x632BE59BD9B4E019ULL +
                    static_cast<uint64_t>(row) * 0x85EBCA77C2B2AE63ULL +
                    static_cast<uint64_t>(column));
  return static_cast<int64_t>(random.next() % static_cast<uint64_t>(span));
}

// This rank's owner inputs and the tensors every rank holds.
struct Model {
  SelectConfig config;
  int64_t q_rank = 0;
  std::vector<uint16_t> qr;              // [local, q_rank] bf16
  std::vector<float> weights, cos, sin;  // [local, heads], [local, rope_dim / 2] x 2
  std::vector<uint16_t> wq_b;            // [q_rank, heads * head_dim] bf16
  std::vector<uint16_t> keys;            // [bank, head_dim] bf16
  int64_t local = 0;
  int64_t bank = 0;

  IndexerInputs inputs() const {
    const int64_t half = config.rope_dim / 2;
    return {TensorView::tokens(MatrixView::bf16(qr.data(), local, q_rank)),
            TensorView::tokens(MatrixView::f32(weights.data(), local, config.heads)),
            TensorView::tokens(MatrixView::f32(cos.data(), local, half)),
            TensorView::tokens(MatrixView::f32(sin.data(), local, half))};
  }
};

Model make_model(const RunFlags& flags, std::span<const int64_t> lengths, int64_t rank,
                 int64_t local) {
  Model model;
  model.config.heads = flags.heads;
  model.config.head_dim = flags.head_dim;
  model.config.rope_dim = flags.rope_dim;
  model.config.topk = flags.topk;
  model.config.ratio = flags.ratio;
  model.config.threads = flags.threads;
  validate_select_config(model.config);
  SPARSECP_CHECK(flags.q_rank >= 1, "--q-rank must be positive, got ", flags.q_rank);
  model.q_rank = flags.q_rank;
  model.local = local;
  for (const int64_t length : lengths) model.bank += length / flags.ratio;
  const uint64_t seed = flags.model_seed;
  const int64_t half = flags.rope_dim / 2;
  const int64_t width = flags.heads * flags.head_dim;
  model.qr.resize(static_cast<size_t>(local * flags.q_rank));
  model.weights.resize(static_cast<size_t>(local * flags.heads));
  model.cos.resize(static_cast<size_t>(local * half));
  model.sin.resize(static_cast<size_t>(local * half));
  for (int64_t row = 0; row < local; ++row) {
    const int64_t global = rank * local + row;  // inputs are a function of the global row
    for (int64_t c = 0; c < flags.q_rank; ++c) {
      model.qr[row * flags.q_rank + c] =
          float_to_bf16(static_cast<float>(small_int(seed, 1, global, c, 5) - 2));
    }
    for (int64_t h = 0; h < flags.heads; ++h) {
      model.weights[row * flags.heads + h] =
          static_cast<float>(1 + small_int(seed, 2, global, h, 4));
    }
    for (int64_t i = 0; i < half; ++i) {
      static constexpr float kCos[] = {1, 0, -1, 0};
      static constexpr float kSin[] = {0, 1, 0, -1};
      const int64_t quarter = small_int(seed, 3, global, i, 4);
      model.cos[row * half + i] = kCos[quarter];
      model.sin[row * half + i] = kSin[quarter];
    }
  }
  model.wq_b.resize(static_cast<size_t>(flags.q_rank * width));
  for (int64_t r = 0; r < flags.q_rank; ++r) {
    for (int64_t c = 0; c < width; ++c) {
      model.wq_b[r * width + c] =
          float_to_bf16(static_cast<float>(small_int(seed, 4, r, c, 3) - 1));
    }
  }
  model.keys.resize(static_cast<size_t>(model.bank * flags.head_dim));
  for (int64_t key = 0; key < model.bank; ++key) {
    for (int64_t c = 0; c < flags.head_dim; ++c) {
      model.keys[key * flags.head_dim + c] =
          float_to_bf16(static_cast<float>(small_int(seed, 5, key, c, 5) - 2));
    }
  }
  return model;
}

// Causal (query, key) pairs of a worker's segments (cost.hpp).
int64_t segment_work(std::span<const Segment> segments, int64_t ratio) {
  int64_t work = 0;
  for (const Segment& s : segments) {
    const int64_t end = (s.key_end - s.key_begin) * ratio + s.residual;
    work += range_work(end - (s.q_end - s.q_begin), end, ratio);
  }
  return work;
}

// What one rank measured for one mode.
struct RankFigures {
  int64_t rows = 0;
  int64_t work = 0;
  double select_cpu = 0;  // median seconds
  double select_wall = 0;
  double input_wait = 0;   // median seconds in IndexerInputExchange::wait()
  double result_wait = 0;  // median seconds in PendingRows::wait()
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t predicted_sent = 0;
  int64_t predicted_received = 0;
};
constexpr int kFigureCount = 10;

std::vector<int64_t> encode(const RankFigures& f) {
  const auto ns = [](double s) { return static_cast<int64_t>(s * 1e9); };
  return {f.rows,           f.work,
          ns(f.select_cpu), ns(f.select_wall),
          ns(f.input_wait), ns(f.result_wait),
          f.bytes_sent,     f.bytes_received,
          f.predicted_sent, f.predicted_received};
}

RankFigures decode(std::span<const int64_t> v) {
  const auto s = [](int64_t ns) { return static_cast<double>(ns) * 1e-9; };
  return {v[0], v[1], s(v[2]), s(v[3]), s(v[4]), s(v[5]), v[6], v[7], v[8], v[9]};
}

// Every rank's figures on every rank (sum of one-hot slots).
std::vector<RankFigures> gather(Communicator& comm, const RankFigures& mine) {
  std::vector<int64_t> all(static_cast<size_t>(comm.size() * kFigureCount), 0);
  const std::vector<int64_t> encoded = encode(mine);
  std::copy(encoded.begin(), encoded.end(), all.begin() + comm.rank() * kFigureCount);
  comm.all_reduce(all, ReduceOp::kSum);
  std::vector<RankFigures> result;
  for (int64_t r = 0; r < comm.size(); ++r) {
    result.push_back(decode(std::span<const int64_t>(all).subspan(r * kFigureCount, kFigureCount)));
  }
  return result;
}

// A barrier that sleeps while it waits. Ranks usually outnumber cores here (4 ranks
// on 2 cores), and a rank spinning in MPI while it waits for a slower one steals
// the core that rank needs; the library's waits spin (as MPI and NCCL do), so the
// tool parks ranks here before every collective that follows uneven work.
void barrier(const MpiCommunicator& comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm.handle(), &request);
  int done = 0;
  while (true) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const timespec pause{0, 200000};  // 0.2 ms
    nanosleep(&pause, nullptr);
  }
}

// Launches one balanced input exchange: from a route planned beforehand by a registered
// strategy (spill, auto, ...) when `planned` is set, else from the seed mode `options`.
IndexerInputExchange launch(const IndexerInputs& inputs, std::span<const int64_t> lengths,
                            int64_t ratio, const PlanOptions& options,
                            const std::shared_ptr<const IndexerRoute>& planned,
                            MpiCommunicator& comm) {
  return planned ? launch_indexer_inputs(inputs, planned, comm)
                 : launch_indexer_inputs(inputs, lengths, ratio, options, comm);
}

struct ModeRun {
  RankFigures figures;
  SelectedKeys result;  // this rank's own rows, [local, topk]
  int64_t unstable_repeats = 0;
};

// One mode, `repeats` times, through the overlapped path. CPU time of the selection
// is the calling thread's (one selection thread) or the process's (several).
ModeRun run_mode(const Model& model, std::span<const int64_t> lengths, const PlanOptions& options,
                 const std::shared_ptr<const IndexerRoute>& planned, int repeats,
                 MpiCommunicator& comm) {
  const clockid_t cpu_clock =
      model.config.threads == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID;
  const MatrixView wq_b =
      MatrixView::bf16(model.wq_b.data(), model.q_rank, model.config.heads * model.config.head_dim);
  const MatrixView keys = MatrixView::bf16(model.keys.data(), model.bank, model.config.head_dim);
  ModeRun run;
  std::vector<double> cpu, wall, input_wait, result_wait;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    barrier(comm);
    comm.reset_stats();
    IndexerInputExchange exchange =
        launch(model.inputs(), lengths, model.config.ratio, options, planned, comm);
    // Test hook (tests of failure handling): this rank fails alone, mid-exchange.
    if (const char* fail_rank = std::getenv("SPARSECP_RUN_FAIL_RANK")) {
      SPARSECP_CHECK(std::to_string(comm.rank()) != fail_rank, "injected failure on rank ",
                     comm.rank(), " in the middle of an input exchange (SPARSECP_RUN_FAIL_RANK)");
    }
    double start = now_seconds(CLOCK_MONOTONIC);
    const WorkerInputs worker = exchange.wait();
    input_wait.push_back(now_seconds(CLOCK_MONOTONIC) - start);

    const IndexerRoute& route = exchange.route();
    SelectedKeys selected{
        route.query_count, model.config.topk,
        std::vector<int32_t>(static_cast<size_t>(route.query_count * model.config.topk))};
    const double cpu_start = now_seconds(cpu_clock);
    start = now_seconds(CLOCK_MONOTONIC);
    select_worker_rows(worker.query_residual.view(), worker.weights.view(), worker.cos.view(),
                       worker.sin.view(), wq_b, keys, route.segments, model.config, selected.ids);
    wall.push_back(now_seconds(CLOCK_MONOTONIC) - start);
    cpu.push_back(now_seconds(cpu_clock) - cpu_start);

    barrier(comm);  // ranks finish selecting at different times; wait asleep
    PendingRows pending = exchange.launch_result(selected);
    start = now_seconds(CLOCK_MONOTONIC);
    SelectedKeys owner = pending.wait();
    result_wait.push_back(now_seconds(CLOCK_MONOTONIC) - start);

    if (repeat == 0) {
      run.figures.rows = route.query_count;
      run.figures.work = segment_work(route.segments, model.config.ratio);
      run.figures.bytes_sent = comm.stats().bytes_sent;
      run.figures.bytes_received = comm.stats().bytes_received;
      const ExchangeBytes predicted =
          expected_exchange_bytes(route, input_row_bytes(model.inputs()), model.config.topk);
      run.figures.predicted_sent = predicted.sent();
      run.figures.predicted_received = predicted.received();
      run.result = std::move(owner);
    } else if (!(owner == run.result)) {
      ++run.unstable_repeats;
    }
  }
  run.figures.select_cpu = median(cpu);
  run.figures.select_wall = median(wall);
  run.figures.input_wait = median(input_wait);
  run.figures.result_wait = median(result_wait);
  return run;
}

// How much of the input exchange the owner's own work hides: the exchange alone
// (launch then wait at once) against launch, the owner's Index-Q projection of its
// own rows (the seed overlaps exactly this), then wait. With `poll`, the owner
// calls test() between row blocks so that MPI can progress the transfer.
struct OverlapFigures {
  double alone = 0;        // launch + wait, nothing in between
  double work = 0;         // the owner's projection
  double wait_after = 0;   // wait() after the projection, no polling
  double wait_polled = 0;  // wait() after the projection, test() between blocks
};

OverlapFigures measure_overlap(const Model& model, std::span<const int64_t> lengths,
                               const PlanOptions& options,
                               const std::shared_ptr<const IndexerRoute>& planned, int repeats,
                               MpiCommunicator& comm) {
  const MatrixView wq_b =
      MatrixView::bf16(model.wq_b.data(), model.q_rank, model.config.heads * model.config.head_dim);
  const int64_t width = model.config.heads * model.config.head_dim;
  const int64_t half = model.config.rope_dim / 2;
  constexpr int64_t kBlock = 512;
  std::vector<float> q(static_cast<size_t>(std::min(kBlock, model.local) * width));
  const auto owner_projection = [&](IndexerInputExchange* poll) {
    for (int64_t begin = 0; begin < model.local; begin += kBlock) {
      const int64_t rows = std::min(kBlock, model.local - begin);
      project_index_query(
          MatrixView::bf16(model.qr.data() + begin * model.q_rank, rows, model.q_rank), wq_b,
          MatrixView::f32(model.cos.data() + begin * half, rows, half),
          MatrixView::f32(model.sin.data() + begin * half, rows, half), model.config,
          std::span<float>(q).first(static_cast<size_t>(rows * width)));
      if (poll != nullptr) poll->test();
    }
  };
  std::vector<double> alone, work, after, polled;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    barrier(comm);
    double start = now_seconds(CLOCK_MONOTONIC);
    launch(model.inputs(), lengths, model.config.ratio, options, planned, comm).wait();
    alone.push_back(now_seconds(CLOCK_MONOTONIC) - start);
    for (const bool poll : {false, true}) {
      barrier(comm);
      IndexerInputExchange exchange =
          launch(model.inputs(), lengths, model.config.ratio, options, planned, comm);
      start = now_seconds(CLOCK_MONOTONIC);
      owner_projection(poll ? &exchange : nullptr);
      if (!poll) work.push_back(now_seconds(CLOCK_MONOTONIC) - start);
      start = now_seconds(CLOCK_MONOTONIC);
      exchange.wait();
      (poll ? polled : after).push_back(now_seconds(CLOCK_MONOTONIC) - start);
    }
  }
  return {median(alone), median(work), median(after), median(polled)};
}

double imbalance_of(const std::vector<RankFigures>& ranks, double RankFigures::*field) {
  double total = 0;
  double most = 0;
  for (const RankFigures& f : ranks) {
    total += f.*field;
    most = std::max(most, f.*field);
  }
  return total > 0 ? most / (total / static_cast<double>(ranks.size())) : 1.0;
}

double work_imbalance(const std::vector<RankFigures>& ranks) {
  int64_t total = 0;
  int64_t most = 0;
  for (const RankFigures& f : ranks) {
    total += f.work;
    most = std::max(most, f.work);
  }
  return total > 0 ? static_cast<double>(most) * static_cast<double>(ranks.size()) /
                         static_cast<double>(total)
                   : 1.0;
}

double slowest(const std::vector<RankFigures>& ranks) {
  double most = 0;
  for (const RankFigures& f : ranks) most = std::max(most, f.select_cpu);
  return most;
}

nlohmann::json mode_json(const std::vector<RankFigures>& ranks) {
  nlohmann::json out;
  out["ranks"] = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankFigures& f = ranks[r];
    out["ranks"].push_back({{"rank", r},
                            {"rows", f.rows},
                            {"work", f.work},
                            {"select_cpu_s", f.select_cpu},
                            {"select_wall_s", f.select_wall},
                            {"input_wait_s", f.input_wait},
                            {"result_wait_s", f.result_wait},
                            {"bytes_sent", f.bytes_sent},
                            {"bytes_received", f.bytes_received},
                            {"predicted_bytes_sent", f.predicted_sent},
                            {"predicted_bytes_received", f.predicted_received}});
  }
  out["work_imbalance"] = work_imbalance(ranks);
  out["time_imbalance"] = imbalance_of(ranks, &RankFigures::select_cpu);
  out["slowest_select_cpu_s"] = slowest(ranks);
  return out;
}

void print_table(const char* name, const std::vector<RankFigures>& ranks) {
  std::printf("\nmode %s\n", name);
  std::printf("  %4s %9s %14s %12s %12s %14s %14s %10s\n", "rank", "rows", "causal work",
              "select CPU", "select wall", "bytes sent", "bytes recv", "= route");
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankFigures& f = ranks[r];
    const bool match = f.bytes_sent == f.predicted_sent && f.bytes_received == f.predicted_received;
    std::printf("  %4zu %9lld %14lld %10.1f ms %10.1f ms %14lld %14lld %10s\n", r,
                static_cast<long long>(f.rows), static_cast<long long>(f.work), f.select_cpu * 1e3,
                f.select_wall * 1e3, static_cast<long long>(f.bytes_sent),
                static_cast<long long>(f.bytes_received), match ? "yes" : "NO");
  }
  std::printf(
      "  work imbalance (max/mean) %.3f   CPU time imbalance (max/mean) %.3f   slowest "
      "rank %.1f ms\n",
      work_imbalance(ranks), imbalance_of(ranks, &RankFigures::select_cpu), slowest(ranks) * 1e3);
}

void run_ranks(const RunFlags& flags) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t cp = comm.size();
  const int64_t rank = comm.rank();
  openblas_set_num_threads(std::max(flags.threads, 1));

  // Inputs are the same on every rank; still, agree before anything collective so
  // that a rank that cannot read them does not leave the others waiting.
  std::vector<int64_t> lengths;
  PlanOptions options;
  std::shared_ptr<const IndexerRoute> planned;  // set for strategies beyond the seed modes
  Model model;
  std::string error;
  try {
    SPARSECP_CHECK(flags.repeats >= 1, "--repeats must be at least 1, got ", flags.repeats);
    lengths = flags.batch.load(cp);
    const bool seed_mode = flags.mode == "none" || flags.mode == "zigzag" ||
                           flags.mode == "greedy" || flags.mode == "hybrid";
    // Any other registered strategy (spill, auto, ...) plans here and runs its route;
    // the seed modes plan inside the exchange, as the seed does.
    const Strategy* strategy = seed_mode ? nullptr : &find_strategy(flags.mode);
    options.mode = seed_mode ? parse_mode(flags.mode) : Mode::kZigzag;
    SPARSECP_CHECK(!seed_mode || options.mode != Mode::kNone,
                   "--mode none is the baseline every run already includes; choose zigzag, greedy "
                   "or hybrid");
    int64_t total = 0;
    for (const int64_t length : lengths) {
      SPARSECP_CHECK(!__builtin_add_overflow(total, length, &total),
                     "Indexer balance document lengths sum beyond 64 bits (document of ", length,
                     " tokens)");
    }
    options.block_size = flags.block_size;
    if (!options.block_size && options.mode != Mode::kZigzag) {
      // The seed's default of 2048 rows may exceed a small shard; cap it there.
      options.block_size = std::clamp<int64_t>(total / cp, 1, kDefaultBlockSize);
    }
    if (options.mode == Mode::kHybrid) {
      options.zigzag_min_length =
          flags.zigzag_min_length.value_or(std::max<int64_t>(total / cp, 1));
    } else {
      options.zigzag_min_length = flags.zigzag_min_length;
    }
    if (strategy) {
      validate_plan_inputs(lengths, cp, flags.ratio, Mode::kNone, std::nullopt);
      StrategyParams params;
      params.block_size = flags.block_size;
      params.zigzag_min_length = flags.zigzag_min_length;
      const StrategyPlan plan = strategy->plan(lengths, cp, flags.ratio, params);
      planned =
          std::make_shared<const IndexerRoute>(make_route(plan.plan, lengths, rank, flags.ratio));
      options = PlanOptions{};  // the fingerprint below then names the strategy instead
    } else {
      validate_plan_inputs(lengths, cp, flags.ratio, options.mode, options.block_size);
      validate_hybrid_threshold(options.mode, options.zigzag_min_length);
    }
    model = make_model(flags, lengths, rank, total / cp);
  } catch (const std::exception& e) {
    error = e.what();
  }
  barrier(comm);  // generating the model takes uneven time
  std::vector<int64_t> failed = {error.empty() ? 0 : 1};
  comm.all_reduce(failed, ReduceOp::kSum);
  if (!error.empty()) throw Error(error);
  SPARSECP_CHECK(failed[0] == 0, "another rank rejected the inputs");
  if (flags.check_agreement) {
    // Ranks handed different inputs (an MPMD launch, a per-rank lengths file) would
    // plan different routes, or run different numbers of collectives and hang: every
    // setting that shapes the collectives below must agree (agreement.hpp).
    PlanningFingerprint fingerprint(lengths, cp, flags.ratio, options);
    fingerprint.add("heads", flags.heads)
        .add("head_dim", flags.head_dim)
        .add("rope_dim", flags.rope_dim)
        .add("q_rank", flags.q_rank)
        .add("topk", flags.topk)
        .add("model_seed", static_cast<int64_t>(flags.model_seed))
        .add("repeats", flags.repeats)
        .add("overlap", flags.overlap ? 1 : 0);
    // FNV-1a of the strategy name: "spill" and "auto" share the seed options above.
    uint64_t name_hash = 1469598103934665603ULL;
    for (const char c : flags.mode)
      name_hash = (name_hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
    fingerprint.add("strategy", static_cast<int64_t>(name_hash));
    check_agreement(comm, fingerprint);
  }

  const PlanOptions baseline{Mode::kNone, std::nullopt, std::nullopt};
  const ModeRun none = run_mode(model, lengths, baseline, nullptr, flags.repeats, comm);
  const ModeRun balanced = run_mode(model, lengths, options, planned, flags.repeats, comm);
  const OverlapFigures overlap =
      flags.overlap ? measure_overlap(model, lengths, options, planned, flags.repeats, comm)
                    : OverlapFigures{};

  barrier(comm);
  // Bit-identical top-k on every rank: compare row by row, count mismatches.
  int64_t mismatched_rows = 0;
  for (int64_t row = 0; row < model.local; ++row) {
    const auto a = none.result.row(row);
    const auto b = balanced.result.row(row);
    mismatched_rows += std::equal(a.begin(), a.end(), b.begin(), b.end()) ? 0 : 1;
  }
  if (none.result.rows != model.local || balanced.result.rows != model.local) {
    mismatched_rows = model.local;
  }
  std::vector<int64_t> totals = {mismatched_rows, none.unstable_repeats + balanced.unstable_repeats,
                                 overlap.alone > 0 ? 1 : 0};
  comm.all_reduce(totals, ReduceOp::kSum);
  const std::vector<RankFigures> none_ranks = gather(comm, none.figures);
  const std::vector<RankFigures> balanced_ranks = gather(comm, balanced.figures);
  // Overlap figures: the slowest rank's (max over ranks).
  std::vector<int64_t> overlap_ns = {static_cast<int64_t>(overlap.alone * 1e9),
                                     static_cast<int64_t>(overlap.work * 1e9),
                                     static_cast<int64_t>(overlap.wait_after * 1e9),
                                     static_cast<int64_t>(overlap.wait_polled * 1e9)};
  comm.all_reduce(overlap_ns, ReduceOp::kMax);
  const bool verified = totals[0] == 0 && totals[1] == 0;
  bool bytes_match = true;
  for (const auto* ranks : {&none_ranks, &balanced_ranks}) {
    for (const RankFigures& f : *ranks) {
      bytes_match = bytes_match && f.bytes_sent == f.predicted_sent &&
                    f.bytes_received == f.predicted_received;
    }
  }
  const double speedup =
      slowest(balanced_ranks) > 0 ? slowest(none_ranks) / slowest(balanced_ranks) : 0.0;
  const std::string mode = planned ? flags.mode : std::string(mode_name(options.mode));
  const auto hidden = [&](int64_t wait_ns) {
    return overlap_ns[0] > 0
               ? std::clamp(1.0 - static_cast<double>(wait_ns) / static_cast<double>(overlap_ns[0]),
                            0.0, 1.0)
               : 0.0;
  };

  if (rank == 0) {
    if (flags.json) {
      nlohmann::json out;
      out["verified"] = verified;
      out["cp"] = cp;
      out["batch"] = flags.batch.describe();
      out["documents"] = lengths.size();
      out["tokens"] = model.local * cp;
      out["ratio"] = flags.ratio;
      out["mode"] = mode;
      out["block_size"] = resolve_block_size(options.mode, options.block_size).value_or(0);
      if (options.zigzag_min_length) out["zigzag_min_length"] = *options.zigzag_min_length;
      out["model"] = {{"heads", flags.heads},       {"head_dim", flags.head_dim},
                      {"rope_dim", flags.rope_dim}, {"q_rank", flags.q_rank},
                      {"topk", flags.topk},         {"seed", flags.model_seed},
                      {"threads", flags.threads},   {"repeats", flags.repeats}};
      out["mismatched_rows"] = totals[0];
      out["unstable_repeats"] = totals[1];
      out["bytes_match_route"] = bytes_match;
      out["none"] = mode_json(none_ranks);
      out["balanced"] = mode_json(balanced_ranks);
      out["speedup_slowest_rank"] = speedup;
      if (flags.overlap) {
        out["overlap"] = {{"exchange_alone_s", overlap_ns[0] * 1e-9},
                          {"owner_work_s", overlap_ns[1] * 1e-9},
                          {"wait_after_work_s", overlap_ns[2] * 1e-9},
                          {"wait_after_polled_work_s", overlap_ns[3] * 1e-9},
                          {"hidden_fraction", hidden(overlap_ns[2])},
                          {"hidden_fraction_polled", hidden(overlap_ns[3])}};
      }
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf(
          "sparsecp run: %lld ranks, %s: %zu documents, %lld tokens (%lld per rank), "
          "ratio %lld\n",
          static_cast<long long>(cp), flags.batch.describe().c_str(), lengths.size(),
          static_cast<long long>(model.local * cp), static_cast<long long>(model.local),
          static_cast<long long>(flags.ratio));
      std::printf(
          "model: %lld index heads x head_dim %lld (rope %lld), q_rank %lld, top-k %lld, "
          "bank %lld keys; bf16 qr/Wq_b/keys, fp32 weights/RoPE; seed %llu\n",
          static_cast<long long>(flags.heads), static_cast<long long>(flags.head_dim),
          static_cast<long long>(flags.rope_dim), static_cast<long long>(flags.q_rank),
          static_cast<long long>(flags.topk), static_cast<long long>(model.bank),
          static_cast<unsigned long long>(flags.model_seed));
      std::printf(
          "balanced mode: %s, block %lld", mode.c_str(),
          static_cast<long long>(resolve_block_size(options.mode, options.block_size).value_or(0)));
      if (options.zigzag_min_length) {
        std::printf(", zigzag_min_length %lld%s",
                    static_cast<long long>(*options.zigzag_min_length),
                    flags.zigzag_min_length ? "" : " (default: the local shard, tokens / ranks)");
      }
      std::printf(
          "\n%d selection thread(s) per rank; figures are medians of %d repeat(s); CPU "
          "time is per rank (ranks may share cores)\n",
          flags.threads, flags.repeats);
      print_table("none (every rank selects its own rows)", none_ranks);
      print_table(mode.c_str(), balanced_ranks);
      std::printf(
          "\nslowest rank's selection CPU time: none %.1f ms, %s %.1f ms -> speedup %.2fx "
          "(work imbalance of none / %s: %.2fx)\n",
          slowest(none_ranks) * 1e3, mode.c_str(), slowest(balanced_ranks) * 1e3, speedup,
          mode.c_str(), work_imbalance(none_ranks) / work_imbalance(balanced_ranks));
      std::printf("bytes moved equal the route's prediction on every rank: %s\n",
                  bytes_match ? "yes" : "NO");
      if (flags.overlap) {
        std::printf(
            "overlap (slowest rank): input exchange alone %.2f ms; owner Q projection "
            "%.2f ms; wait after it %.2f ms (%.0f%% hidden), with test() between blocks "
            "%.2f ms (%.0f%% hidden)\n",
            overlap_ns[0] * 1e-6, overlap_ns[1] * 1e-6, overlap_ns[2] * 1e-6,
            100 * hidden(overlap_ns[2]), overlap_ns[3] * 1e-6, 100 * hidden(overlap_ns[3]));
      }
      if (verified) {
        std::printf(
            "verified: the %s top-k equals mode none bit for bit on every rank (%lld "
            "rows)\n",
            mode.c_str(), static_cast<long long>(model.local * cp));
      } else {
        std::printf(
            "NOT VERIFIED: %lld rows differ between none and %s; %lld repeats were not "
            "reproducible\n",
            static_cast<long long>(totals[0]), mode.c_str(), static_cast<long long>(totals[1]));
      }
    }
    std::fflush(stdout);
  }
  if (!verified) throw ExitStatus{1};
}

void run_job(const RunFlags& flags) {
  const MpiSession session;
  try {
    run_ranks(flags);
  } catch (const std::exception& error) {
    session.leave_on_error(error.what());
    throw;
  }
}

const Registration registration("run", [](CLI::App& app) {
  auto flags = std::make_shared<RunFlags>();
  flags->batch.tokens = 1 << 16;
  CLI::App* sub = app.add_subcommand(
      "run",
      "The main job, under mpirun: every rank owns one contiguous shard of a packed batch and\n"
      "runs the Lightning Indexer top-k selection twice: with mode 'none' (every rank selects\n"
      "its own rows) and balanced (--mode, default hybrid), moving qr, merge weights and RoPE\n"
      "to workers and the int32 key ids back over MPI. Checks that both give bit-identical\n"
      "top-k on every rank and reports, per rank: rows selected, causal work, selection CPU\n"
      "time, bytes sent and received (checked against the route's prediction); then the work\n"
      "and CPU-time imbalance of both runs, the slowest rank's speedup, and how much of the\n"
      "input exchange the owner's own Q projection hides. Exit status 1 when results differ.\n"
      "Model tensors are seeded small integers (exact scores); the Index K bank is the same\n"
      "on every rank.");
  flags->batch.add_to(*sub);
  sub->add_option("--ratio", flags->ratio, "Key compression ratio of the indexer layer")
      ->capture_default_str();
  sub->add_option("--mode", flags->mode,
                  "Balanced mode to compare with none: a seed mode (zigzag, greedy, hybrid) or any "
                  "other strategy of 'sparsecp simulate --list' (e.g. spill, auto, snake)")
      ->capture_default_str();
  sub->add_option("--block", flags->block_size,
                  "Greedy/hybrid: rows per pooled block (default 2048, or the rows per rank when "
                  "fewer; printed)");
  sub->add_option("--zigzag-min-length", flags->zigzag_min_length,
                  "Hybrid: documents of at least this many tokens keep their zigzag chunks "
                  "(default: the rows per rank, tokens / ranks; printed)");
  sub->add_option("--heads", flags->heads, "Index heads")->capture_default_str();
  sub->add_option("--head-dim", flags->head_dim, "Index head dimension")->capture_default_str();
  sub->add_option("--rope-dim", flags->rope_dim, "Rotated trailing channels per head (even)")
      ->capture_default_str();
  sub->add_option("--q-rank", flags->q_rank, "Low-rank query residual width (q_lora_rank)")
      ->capture_default_str();
  sub->add_option("--topk", flags->topk, "Selected keys per query row")->capture_default_str();
  sub->add_option("--model-seed", flags->model_seed, "Seed of the model tensors")
      ->capture_default_str();
  sub->add_option("--threads", flags->threads,
                  "Selection threads per rank (OpenMP and OpenBLAS); CPU time is the thread's "
                  "when 1, the process's otherwise")
      ->capture_default_str();
  sub->add_option("--repeats", flags->repeats,
                  "Repeats of each run; figures are per-rank medians, results must repeat exactly")
      ->capture_default_str();
  sub->add_flag("!--no-overlap", flags->overlap,
                "Skip the overlap measurement (input exchange alone vs hidden behind the owner's "
                "Q projection)");
  sub->add_flag("!--no-agreement-check", flags->check_agreement,
                "Skip the check (on by default) that every rank was given the same document "
                "lengths, mode, block, threshold, model sizes, repeats and overlap setting; "
                "without it, ranks given different inputs can hang or mix up rows");
  sub->add_flag("--json", flags->json,
                "Print JSON (rank 0): {verified, cp, mode, zigzag_min_length, model, none: "
                "{ranks: [{rank, rows, work, select_cpu_s, bytes_sent, bytes_received, "
                "predicted_bytes_sent, ...}], work_imbalance, time_imbalance, "
                "slowest_select_cpu_s}, balanced: {...}, speedup_slowest_rank, overlap: {...}}");
  sub->footer(
      "Examples:\n"
      "  mpirun --allow-run-as-root --oversubscribe -np 4 sparsecp run\n"
      "  mpirun -np 4 sparsecp run --mode greedy --dist pareto --tokens 131072 --seed 3\n"
      "  mpirun -np 8 sparsecp run --lengths-file batch.txt --mode hybrid "
      "--zigzag-min-length 8192 --json");
  sub->callback([flags] { run_job(*flags); });
});

}  // namespace
}  // namespace sparsecp::cli
