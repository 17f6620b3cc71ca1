// `sparsecp dispatch`: the KV dispatch routes of main attention (SWA halo, compressed
// document prefixes) — per-rank intervals and rows moved versus a full all-gather — and a
// sweep over CP sizes and seeded batches for reports.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "batch_input.hpp"
#include "command.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/dispatch.hpp"

namespace sparsecp::cli {
namespace {

struct DispatchCommand {
  BatchOptions batch;
  std::string kind;
  // --cp: one CP size (per-rank intervals) or several (a sweep); the old --sweep always sweeps.
  std::vector<int64_t> cps = {8};
  int64_t cp = 8;  // cps[0] when not sweeping
  std::optional<int64_t> rank;
  int64_t window = 128;
  int64_t ratio = 1;
  int64_t batches = 1;
  bool json = false;
  CLI::Option* window_option = nullptr;
  CLI::Option* ratio_option = nullptr;
  CLI::Option* cp_option = nullptr;
  CLI::Option* sweep_option = nullptr;
  bool sweeping() const { return cps.size() > 1 || sweep_option->count() > 0; }
};

// Every rank's route for one batch, plus the bank size an all-gather would move.
struct Routes {
  std::vector<SequenceDispatchRoute> ranks;
  int64_t local_raw = 0;  // raw tokens per rank
  int64_t bank_rows = 0;  // rows of the whole bank (raw tokens, or compressed blocks)
};

Routes build_routes(const DispatchCommand& command, std::span<const int64_t> lengths, int64_t cp) {
  SPARSECP_CHECK(cp >= 1, "--cp must be at least 1, got ", cp);
  const std::vector<int64_t> boundaries = document_boundaries(lengths);
  const int64_t total = boundaries.back();
  SPARSECP_CHECK(total % cp == 0, "the batch holds ", total,
                 " tokens, not a multiple of the CP size ", cp);
  Routes routes;
  routes.local_raw = total / cp;
  for (int64_t rank = 0; rank < cp; ++rank) {
    routes.ranks.push_back(
        command.kind == "swa"
            ? sliding_window_route(boundaries, routes.local_raw, cp, rank, command.window)
            : document_prefix_route(boundaries, routes.local_raw, cp, rank, command.ratio));
  }
  routes.bank_rows = routes.ranks.back().global_end;
  return routes;
}

// Rows a full all-gather delivers to `route`'s rank from other ranks.
int64_t all_gather_rows(const Routes& routes, const SequenceDispatchRoute& route) {
  return routes.bank_rows - route.local_length;
}

std::string parameter_text(const DispatchCommand& command) {
  return command.kind == "swa" ? "window " + std::to_string(command.window)
                               : "ratio " + std::to_string(command.ratio);
}

nlohmann::ordered_json rank_json(const Routes& routes, const SequenceDispatchRoute& route) {
  nlohmann::ordered_json out;
  out["rank"] = route.rank;
  out["global_start"] = route.global_start;
  out["global_end"] = route.global_end;
  out["local_start"] = route.local_start;
  out["local_length"] = route.local_length;
  out["received_rows"] = route.received_rows();
  out["sent_rows"] = route.sent_rows();
  out["all_gather_rows"] = all_gather_rows(routes, route);
  out["send_begin"] = route.send_begin;
  out["send_splits"] = route.send_splits;
  out["receive_splits"] = route.receive_splits;
  return out;
}

void run_single(const DispatchCommand& command) {
  SPARSECP_CHECK(command.cp >= 1, "--cp must be at least 1, got ", command.cp);
  SPARSECP_CHECK(command.batches == 1, "--batches requires several CP sizes (--cp 4,8,...)");
  const std::vector<int64_t> lengths = command.batch.load(command.cp);
  const Routes routes = build_routes(command, lengths, command.cp);
  if (command.rank) {
    SPARSECP_CHECK(0 <= *command.rank && *command.rank < command.cp, "--rank ", *command.rank,
                   " is outside [0, ", command.cp, ")");
  }
  int64_t received = 0, gathered = 0, most = 0;
  for (const SequenceDispatchRoute& route : routes.ranks) {
    received += route.received_rows();
    gathered += all_gather_rows(routes, route);
    most = std::max(most, route.received_rows());
  }
  const bool exchange = routes.ranks.front().exchange_needed;
  if (command.json) {
    nlohmann::ordered_json out;
    out["kind"] = command.kind;
    if (command.kind == "swa") {
      out["window"] = command.window;
    } else {
      out["ratio"] = command.ratio;
    }
    out["cp"] = command.cp;
    out["documents"] = lengths.size();
    out["local_raw_rows"] = routes.local_raw;
    out["bank_rows"] = routes.bank_rows;
    out["exchange_needed"] = exchange;
    out["received_rows_total"] = received;
    out["received_rows_max"] = most;
    out["all_gather_rows_total"] = gathered;
    out["ranks"] = nlohmann::ordered_json::array();
    for (const SequenceDispatchRoute& route : routes.ranks) {
      if (!command.rank || route.rank == *command.rank) {
        out["ranks"].push_back(rank_json(routes, route));
      }
    }
    std::cout << out.dump() << "\n";
    return;
  }
  std::printf("%s route, %s: %lld ranks of %lld raw tokens, %zu documents (%s)\n",
              command.kind == "swa" ? "SWA halo" : "compressed prefix",
              parameter_text(command).c_str(), static_cast<long long>(command.cp),
              static_cast<long long>(routes.local_raw), lengths.size(),
              command.batch.describe().c_str());
  std::printf("bank: %lld %s rows; exchange needed: %s\n", static_cast<long long>(routes.bank_rows),
              command.kind == "swa" ? "raw KV" : "compressed KV", exchange ? "yes" : "no");
  std::printf("%6s %25s %10s %10s %10s %12s\n", "rank", "interval", "own", "received", "sent",
              "all-gather");
  for (const SequenceDispatchRoute& route : routes.ranks) {
    if (command.rank && route.rank != *command.rank) continue;
    const std::string interval =
        "[" + std::to_string(route.global_start) + ", " + std::to_string(route.global_end) + ")";
    std::printf("%6lld %25s %10lld %10lld %10lld %12lld\n", static_cast<long long>(route.rank),
                interval.c_str(), static_cast<long long>(route.local_length),
                static_cast<long long>(route.received_rows()),
                static_cast<long long>(route.sent_rows()),
                static_cast<long long>(all_gather_rows(routes, route)));
  }
  if (command.rank) {
    const SequenceDispatchRoute& route = routes.ranks[static_cast<size_t>(*command.rank)];
    std::printf("rank %lld per peer (local rows sent as [begin, begin + count)):\n",
                static_cast<long long>(*command.rank));
    std::printf("%6s %12s %12s %12s\n", "peer", "send begin", "sends", "receives");
    for (int64_t peer = 0; peer < route.size; ++peer) {
      if (route.send_splits[peer] == 0 && route.receive_splits[peer] == 0) continue;
      std::printf("%6lld %12lld %12lld %12lld\n", static_cast<long long>(peer),
                  static_cast<long long>(route.send_begin[peer]),
                  static_cast<long long>(route.send_splits[peer]),
                  static_cast<long long>(route.receive_splits[peer]));
    }
    return;
  }
  std::printf(
      "received: %lld rows in total, %.1f mean and %lld max per rank; a full all-gather "
      "moves %lld (routed = %.3f%% of it)\n",
      static_cast<long long>(received),
      static_cast<double>(received) / static_cast<double>(command.cp), static_cast<long long>(most),
      static_cast<long long>(gathered),
      gathered ? 100.0 * static_cast<double>(received) / static_cast<double>(gathered) : 0.0);
}

void run_sweep(const DispatchCommand& command) {
  SPARSECP_CHECK(!command.rank, "--rank does not apply to a sweep of several CP sizes");
  SPARSECP_CHECK(command.batches >= 1 && command.batches <= kMaxSweepBatches,
                 "--batches must be within [1, ", kMaxSweepBatches, "], got ", command.batches);
  SPARSECP_CHECK(!command.cps.empty(), "--cp needs at least one CP size");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  if (!command.json) {
    std::printf(
        "%s route, %s, %s, %lld batch(es) per CP size, seeds from %llu; rows received per rank "
        "(mean over ranks and seeds; max over both)\n",
        command.kind == "swa" ? "SWA halo" : "compressed prefix", parameter_text(command).c_str(),
        command.batch.describe().c_str(), static_cast<long long>(command.batches),
        static_cast<unsigned long long>(command.batch.seed));
    std::printf("%6s %10s %10s %12s %12s %14s %12s %10s\n", "cp", "local", "documents",
                "mean routed", "max routed", "all-gather", "routed/AG", "exchange");
  }
  for (const int64_t cp : command.cps) {
    int64_t received = 0, most = 0, gathered = 0, documents = 0, exchanges = 0, local = 0;
    for (int64_t i = 0; i < command.batches; ++i) {
      BatchOptions batch = command.batch;
      batch.seed = command.batch.seed + static_cast<uint64_t>(i);
      const std::vector<int64_t> lengths = batch.load(cp);
      const Routes routes = build_routes(command, lengths, cp);
      local = routes.local_raw;
      documents += static_cast<int64_t>(lengths.size());
      exchanges += routes.ranks.front().exchange_needed ? 1 : 0;
      for (const SequenceDispatchRoute& route : routes.ranks) {
        received += route.received_rows();
        most = std::max(most, route.received_rows());
        gathered += all_gather_rows(routes, route);
      }
    }
    const double samples = static_cast<double>(cp * command.batches);
    const double mean = static_cast<double>(received) / samples;
    const double gather_mean = static_cast<double>(gathered) / samples;
    const double fraction =
        gathered ? static_cast<double>(received) / static_cast<double>(gathered) : 0.0;
    if (command.json) {
      nlohmann::ordered_json row;
      row["cp"] = cp;
      row["local_raw_rows"] = local;
      row["documents_mean"] = static_cast<double>(documents) / static_cast<double>(command.batches);
      row["received_rows_mean"] = mean;
      row["received_rows_max"] = most;
      row["all_gather_rows_mean"] = gather_mean;
      row["routed_over_all_gather"] = fraction;
      row["batches_with_exchange"] = exchanges;
      rows.push_back(row);
    } else {
      std::printf("%6lld %10lld %10.1f %12.1f %12lld %14.1f %11.4f%% %6lld/%lld\n",
                  static_cast<long long>(cp), static_cast<long long>(local),
                  static_cast<double>(documents) / static_cast<double>(command.batches), mean,
                  static_cast<long long>(most), gather_mean, 100.0 * fraction,
                  static_cast<long long>(exchanges), static_cast<long long>(command.batches));
    }
  }
  if (command.json) {
    nlohmann::ordered_json out;
    out["kind"] = command.kind;
    if (command.kind == "swa") {
      out["window"] = command.window;
    } else {
      out["ratio"] = command.ratio;
    }
    out["batch"] = command.batch.describe();
    out["batches"] = command.batches;
    out["sweep"] = rows;
    std::cout << out.dump() << "\n";
  }
}

void run_dispatch(const DispatchCommand& command) {
  SPARSECP_CHECK(command.kind == "swa" || command.kind == "prefix",
                 "--kind must be 'swa' or 'prefix', got '", command.kind, "'");
  SPARSECP_CHECK(command.kind == "swa" || command.window_option->count() == 0,
                 "--window applies to --kind swa only");
  SPARSECP_CHECK(command.kind == "prefix" || command.ratio_option->count() == 0,
                 "--ratio applies to --kind prefix only");
  SPARSECP_CHECK(command.sweep_option->count() == 0 || command.cp_option->count() == 0,
                 "--sweep (the old spelling of --cp with several CP sizes) replaces --cp; give "
                 "one of them");
  if (command.sweeping()) {
    run_sweep(command);
  } else {
    DispatchCommand single = command;
    single.cp = command.cps.front();
    run_single(single);
  }
}

const Registration registration("dispatch", [](CLI::App& app) {
  auto command = std::make_shared<DispatchCommand>();
  CLI::App* sub = app.add_subcommand(
      "dispatch",
      "Show the KV dispatch routes of main attention: which key rows each CP rank receives from\n"
      "lower ranks, as one contiguous interval [global_start, global_end) of the bank, versus the\n"
      "rows a full all-gather would move. --kind swa: the raw-KV sliding-window halo (never\n"
      "crossing a document start). --kind prefix: compressed KV from the start of each document a\n"
      "rank touches (blocks owned by the rank holding their last token).");
  sub->add_option("--kind", command->kind,
                  "Route: swa (raw-KV sliding-window halo) or prefix "
                  "(compressed-KV document prefixes)")
      ->required();
  command->batch.add_to(*sub);
  command->cp_option =
      sub->add_option("--cp", command->cps,
                      "CP size (ranks; the batch total must divide evenly), or several "
                      "comma-separated, e.g. 4,8,16,64: a sweep printing the mean and max rows "
                      "received per rank against a full all-gather")
          ->delimiter(',')
          ->capture_default_str();
  sub->add_option("--rank", command->rank,
                  "Show only this rank (0 <= R < --cp), with its per-peer splits");
  command->window_option =
      sub->add_option("--window", command->window,
                      "--kind swa: sliding window in raw tokens (a query at p sees keys "
                      "[p - W + 1, p]); DeepSeek-V4 uses 128")
          ->capture_default_str();
  command->ratio_option =
      sub->add_option("--ratio", command->ratio,
                      "--kind prefix: compression ratio, raw tokens per compressed block (1 or 2)")
          ->capture_default_str();
  // The old spelling of a sweep: always sweeps, even over one CP size.
  command->sweep_option = sub->add_option("--sweep", command->cps)->delimiter(',')->group("");
  sub->add_option(names("--batches", {"--seeds"}), command->batches,
                  "A sweep of a generated batch: batches per CP size, seeds --seed, --seed + 1, "
                  "... (at most 100000)")
      ->capture_default_str();
  sub->add_flag("--json", command->json,
                "Print JSON: per-rank global_start, global_end, local_start, local_length, "
                "received_rows, sent_rows, all_gather_rows and splits (or the sweep rows)");
  sub->footer(
      "Rows are bank rows: raw tokens for swa, compressed blocks for prefix. 'all-gather' is what "
      "a rank would receive from the others if the whole bank were all-gathered.\n"
      "Examples:\n"
      "  sparsecp dispatch --kind swa --lengths 5000,300,2699,1 --cp 4 --window 128\n"
      "  sparsecp dispatch --kind prefix --lengths 5000,300,2699,1 --cp 4 --ratio 2 --rank 3\n"
      "  sparsecp dispatch --kind swa --dist lognormal --tokens 1048576 --cp 4,8,16,64 "
      "--batches 5");
  sub->callback([command] { run_dispatch(*command); });
});

}  // namespace
}  // namespace sparsecp::cli
