// sparsecp._core transport: the cross-rank agreement fingerprint and its check over a
// Python-supplied all-reduce (the caller's torch.distributed group).
//
// check_agreement (transport/agreement.hpp) needs only Communicator::all_reduce; the
// Communicator here forwards it to a Python callable, so the C++ protocol and its
// mismatch message are used unchanged while the data travels on the caller's group
// (gloo: a CPU tensor; NCCL: a tensor on the current CUDA device).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "sparsecp/balanced_select.hpp"
#include "sparsecp/error.hpp"
#include "sparsecp/planning/plan.hpp"
#include "sparsecp/planning/strategy.hpp"
#include "sparsecp/transport/agreement.hpp"
#include "sparsecp/transport/comm.hpp"

namespace sparsecp::python {
namespace {

const char* reduce_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kSum:
      return "sum";
  }
  return "sum";
}

// A Communicator whose only operation, all_reduce, calls
// `all_reduce(values: list[int], op: "min" | "max" | "sum") -> list[int]` in Python.
class CallbackCommunicator final : public Communicator {
 public:
  CallbackCommunicator(int64_t rank, int64_t size, nb::callable all_reduce)
      : rank_(rank), size_(size), all_reduce_(std::move(all_reduce)) {}

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }

  Work all_to_all_rows(std::span<const std::byte>, std::span<const int64_t>, std::span<std::byte>,
                       std::span<const int64_t>, int64_t) override {
    SPARSECP_FAIL_AS(ErrorKind::kMisuse, "the agreement communicator only reduces");
  }
  std::vector<int64_t> all_to_all_counts(std::span<const int64_t>) override {
    SPARSECP_FAIL_AS(ErrorKind::kMisuse, "the agreement communicator only reduces");
  }
  void all_reduce(std::span<int64_t> values, ReduceOp op) override {
    const std::vector<int64_t> sent(values.begin(), values.end());
    const auto reduced = nb::cast<std::vector<int64_t>>(all_reduce_(sent, reduce_name(op)));
    SPARSECP_CHECK_AS(ErrorKind::kTransport, reduced.size() == values.size(),
                      "agreement all_reduce returned ", reduced.size(), " values for ",
                      values.size());
    std::copy(reduced.begin(), reduced.end(), values.begin());
  }

 private:
  int64_t rank_;
  int64_t size_;
  nb::callable all_reduce_;
};

}  // namespace

void bind_transport(nb::module_& m) {
  nb::class_<PlanningFingerprint>(
      m, "PlanningFingerprint",
      "What every CP rank must agree on before data moves (transport/agreement.hpp).")
      .def_static(
          "seed",
          [](const std::vector<int64_t>& lengths, int64_t cp, int64_t ratio, std::string_view mode,
             std::optional<int64_t> block_size, std::optional<int64_t> zigzag_min_length) {
            return planning_fingerprint(lengths, cp, ratio,
                                        PlanOptions{.mode = parse_mode(mode),
                                                    .block_size = block_size,
                                                    .zigzag_min_length = zigzag_min_length});
          },
          nb::arg("lengths"), nb::arg("cp"), nb::arg("ratio"), nb::arg("mode"),
          nb::arg("block_size").none(), nb::arg("zigzag_min_length").none(),
          "The seed-mode inputs (mode none, zigzag, greedy or hybrid; options as given).")
      .def_static(
          "strategy",
          [](const std::vector<int64_t>& lengths, int64_t cp, int64_t ratio, std::string_view name,
             const StrategyParams& params) {
            return planning_fingerprint(lengths, cp, ratio, find_strategy(name), params);
          },
          nb::arg("lengths"), nb::arg("cp"), nb::arg("ratio"), nb::arg("name"), nb::arg("params"),
          "Any registered strategy and every parameter.")
      .def(
          "add",
          [](PlanningFingerprint& f, std::string_view name, int64_t value) -> PlanningFingerprint& {
            return f.add(name, value);
          },
          nb::arg("name"), nb::arg("value"), nb::rv_policy::reference_internal)
      .def(
          "add_real",
          [](PlanningFingerprint& f, std::string_view name, double value) -> PlanningFingerprint& {
            return f.add_real(name, value);
          },
          nb::arg("name"), nb::arg("value"), nb::rv_policy::reference_internal)
      .def_prop_ro("value", &PlanningFingerprint::value)
      .def_prop_ro("documents", &PlanningFingerprint::documents)
      .def_prop_ro("tokens", &PlanningFingerprint::tokens)
      .def("components", &PlanningFingerprint::components)
      .def_prop_ro("setting_names", &PlanningFingerprint::setting_names);

  m.def("dispatch_route_fingerprint", &dispatch_route_fingerprint, nb::arg("route"),
        "The defining inputs of a KV dispatch route, to agree on before data moves "
        "(transport/agreement.hpp).");
  m.def(
      "check_agreement",
      [](const PlanningFingerprint& fingerprint, int64_t rank, int64_t size,
         nb::callable all_reduce, std::string_view context) {
        CallbackCommunicator comm(rank, size, std::move(all_reduce));
        check_agreement(comm, fingerprint, context);
      },
      nb::arg("fingerprint"), nb::arg("rank"), nb::arg("size"), nb::arg("all_reduce"),
      nb::arg("context") = "",
      "Collective: raises ValueError on every rank unless all fingerprints are equal, naming "
      "what differs. all_reduce(values: list[int], op: str) -> list[int] reduces over the "
      "group.");
}

}  // namespace sparsecp::python
