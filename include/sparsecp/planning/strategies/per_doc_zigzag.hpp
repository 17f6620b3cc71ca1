// sparsecp strategies: per-document zigzag with padding (Megatron / TransformerEngine).
//
// Source: NVIDIA TransformerEngine's THD context parallelism
// (`transformer_engine.pytorch.attention` `get_batch_on_this_cp_rank` / the
// `thd_get_partitioned_indices` kernel, with `cu_seqlens_q_padded`) as used by
// Megatron-LM: every document is padded to a multiple of 2 * cp, cut into 2 * cp equal
// chunks, and rank r takes chunks r and 2 * cp - 1 - r of every document.
//
// Here the plan covers the real rows only: rank r selects document rows
// [r * c, (r + 1) * c) and [(2cp - 1 - r) * c, (2cp - r) * c), clipped to the document,
// with c = ceil(length / (2 * cp)). The rows beyond a document's end are the padding
// those frameworks compute for nothing; they are reported per rank as wasted rows
// (Plan::padding_rows) and are not counted as work. Unit: one row.
#pragma once

#include <memory>
#include <vector>

#include "sparsecp/planning/strategy.hpp"

namespace sparsecp {

// The strategy "per-doc-zigzag".
std::vector<std::unique_ptr<const Strategy>> make_per_doc_zigzag_strategies();

}  // namespace sparsecp
