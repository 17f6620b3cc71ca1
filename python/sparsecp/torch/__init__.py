"""sparsecp.torch: the seed's ``indexer_balance`` module for PyTorch, drop-in, and more.

``import sparsecp.torch as indexer_balance`` gives the names, signatures and error texts
of Huawei hyper_parallel's ``indexer_balance`` (``resolve_indexer_balance_block_size``,
``validate_indexer_hybrid_threshold``, ``IndexerTask``, ``indexer_task_plan``,
``IndexerRoute``, ``indexer_route``, ``balanced_indexer_select``,
``launch_indexer_inputs`` with ``IndexerInputExchange`` / ``_PendingRows``), backed by
sparsecp's C++ planners; ``mode`` also takes sparsecp's strategies (``spill``, ``auto``,
...). Data moves with ``torch.distributed`` on the caller's process group (gloo for CPU
tensors, NCCL for CUDA tensors).

Also here: sparse attention on the contract every DSA kernel shares (``sparse_attention``: the
C++ kernel on CPU, Triton on a GPU, a chunked torch path anywhere), the selection op
(``select_indices``, ``csa_tnd_plan``,
``packed_indexer_select``, ``project_index_query``, ``IndexerSelector``) and the KV routes
with autograd (``sliding_window_route``, ``document_prefix_route``,
``sequence_dispatch``, ``sequence_gather``, ``SequenceGatherHandle``,
``DeferredBankLaunch``), and the indexer's KL training loss with autograd
(``shared_compressed_indexer_kl_loss``, ``indexer_kl_scratch_bytes``).

For activation recompute and RL: ``selection_replay_contexts`` (the ``context_fn`` of
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``) and ``SelectionReplay``
(``record()`` / ``replay()``): every selection entry point records its int32 result in the
first forward and returns it in the recompute with no planning, no data movement and no
selection work and no collective; ``verify_replays(group)``, once per step, agrees on every
call replayed since the last agreement (one small all-reduce), so a mismatch on one rank
raises on every rank (``4 * topk`` bytes per owned row and call retained).

Layout, in layers (no module imports one above it; ``_route.py`` lists them):
``indexer_balance.py`` (the seed's module: its names only) on top; below it
``_overlapped.py`` (the overlapped handle, ``IndexerInputExchange``), ``_prebuilt.py``
(routes planned at data time, ``prebuild``; the fixed-capacity exchange and its staging
buffers), ``_replay.py`` (selection record and replay), ``ops.py`` (the selection as
``torch.library`` custom ops), ``kl.py`` (the KL loss and its custom op; ``_kl_torch.py`` its
torch path), ``_compiled.py`` (the fixed exchange on functional collectives, for
torch.compile), ``sequence.py`` (KV routes and gathers); at the bottom ``_route.py``
(``IndexerRoute``), ``_plans.py`` (the plan and route cache, option shims, ``RowTuple``),
``_exchange.py`` (the row exchange, byte counters), ``_checks.py`` and ``_agreement.py``
(input checks, cross-rank agreement), ``select.py`` (selection), ``calibrate.py`` (the cost
model fitted to a selector's own times).
"""
from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "sparsecp.torch needs PyTorch, which is not installed: pip install torch "
        "(`import sparsecp` plans without it)"
    ) from error

# With the seed's private helpers (`X as X`): code written against the seed may reach them.
from .._publish import publish as _publish  # noqa: E402
from . import ops  # noqa: E402  (registers torch.ops.sparsecp.*)
from ._compiled import (  # noqa: E402
    FixedIndexTensors,
    fixed_inputs_to_workers,
    fixed_results_to_owners,
    fixed_step_indices,
)
from ._exchange import (  # noqa: E402
    ExchangeBytes,
    exchange_stats,
    expected_exchange_bytes,
    reset_exchange_stats,
)
from ._exchange import _device_rows as _device_rows  # noqa: E402
from ._exchange import _exchange_inputs as _exchange_inputs  # noqa: E402
from ._exchange import _exchange_rows as _exchange_rows  # noqa: E402
from ._exchange import _PendingRows as _PendingRows  # noqa: E402
from ._plans import RowTuple  # noqa: E402
from ._prebuilt import (  # noqa: E402
    FixedIndices,
    PrebuiltRoutes,
    StagingBuffers,
    fixed_capacity,
    padding_bytes,
    prebuild,
)
from ._replay import SelectionReplay, selection_replay_contexts, verify_replays  # noqa: E402
from ._worker_time import step_cost_samples  # noqa: E402
from .attention import (  # noqa: E402
    sparse_attention,
    sparse_attention_backend,
    sparse_attention_backends,
    sparse_attention_gemm,
)
from .calibrate import Calibration, CalibrationPoint, calibrate  # noqa: E402
from .indexer_balance import (  # noqa: E402
    IndexerInputExchange,
    IndexerRoute,
    IndexerTask,
    balanced_indexer_select,
    indexer_route,
    indexer_task_plan,
    launch_indexer_inputs,
    resolve_indexer_balance_block_size,
    validate_indexer_hybrid_threshold,
)
from .kl import indexer_kl_scratch_bytes, shared_compressed_indexer_kl_loss  # noqa: E402
from .select import (  # noqa: E402
    IndexerSelector,
    TndPlan,
    csa_tnd_plan,
    packed_indexer_select,
    project_index_query,
    select_indices,
)
from .sequence import (  # noqa: E402
    DeferredBankLaunch,
    SequenceDispatchRoute,
    SequenceGatherHandle,
    compressed_document_offsets,
    compressed_owner_offsets,
    document_prefix_route,
    launch_sequence_dispatch,
    launch_sequence_gather,
    sequence_dispatch,
    sequence_gather,
    sliding_window_route,
)
from .sequence import _DeferredBankLaunch as _DeferredBankLaunch  # noqa: E402

__all__ = [
    "Calibration",
    "CalibrationPoint",
    "DeferredBankLaunch",
    "ExchangeBytes",
    "FixedIndexTensors",
    "FixedIndices",
    "IndexerInputExchange",
    "IndexerRoute",
    "IndexerSelector",
    "IndexerTask",
    "PrebuiltRoutes",
    "RowTuple",
    "SequenceDispatchRoute",
    "SelectionReplay",
    "SequenceGatherHandle",
    "StagingBuffers",
    "TndPlan",
    "balanced_indexer_select",
    "calibrate",
    "compressed_document_offsets",
    "compressed_owner_offsets",
    "csa_tnd_plan",
    "document_prefix_route",
    "exchange_stats",
    "expected_exchange_bytes",
    "fixed_capacity",
    "fixed_inputs_to_workers",
    "fixed_results_to_owners",
    "fixed_step_indices",
    "indexer_kl_scratch_bytes",
    "indexer_route",
    "indexer_task_plan",
    "launch_indexer_inputs",
    "launch_sequence_dispatch",
    "launch_sequence_gather",
    "ops",
    "packed_indexer_select",
    "padding_bytes",
    "prebuild",
    "project_index_query",
    "reset_exchange_stats",
    "resolve_indexer_balance_block_size",
    "select_indices",
    "selection_replay_contexts",
    "sequence_dispatch",
    "sequence_gather",
    "shared_compressed_indexer_kl_loss",
    "sliding_window_route",
    "sparse_attention",
    "sparse_attention_backend",
    "sparse_attention_backends",
    "sparse_attention_gemm",
    "step_cost_samples",
    "validate_indexer_hybrid_threshold",
    "verify_replays",
]

_publish(__name__, globals())  # help() names this module, not the private one defining it
