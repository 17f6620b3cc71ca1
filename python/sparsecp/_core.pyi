"""
sparsecp's C++ core: planning, routes, agreement fingerprints and CPU kernels. Use the packages `sparsecp` (planning, no torch needed) and `sparsecp.torch`.
"""

from collections.abc import Callable, Sequence
from typing import Annotated, overload

import numpy
from numpy.typing import NDArray


class CostModel:
    """
    Per-row selection cost a + b * vis + c * min(topk, vis) + d * heap(vis), heap(vis) = topk * ln(max(vis, topk) / topk) (include/sparsecp/planning/cost_model.hpp). A value: read-only fields (replace() gives a changed copy), equal and hashed by every field, picklable.
    """

    def __init__(self, *, a: float = 0.0, b: float = 1.0, c: float = 0.0, d: float = 0.0, topk: int = 512, candidates: int = 0, quantum: int = 1, unit: str = 'pairs', note: str = '') -> None: ...

    @staticmethod
    def linear(a: float, b: float, c: float, topk: int) -> CostModel: ...

    @property
    def a(self) -> float: ...

    @property
    def b(self) -> float: ...

    @property
    def c(self) -> float: ...

    @property
    def d(self) -> float: ...

    @property
    def topk(self) -> int: ...

    @property
    def candidates(self) -> int: ...

    @property
    def quantum(self) -> int: ...

    @property
    def unit(self) -> str: ...

    @property
    def note(self) -> str: ...

    @property
    def id(self) -> str:
        """16 hex digits: a hash of the terms, unit and note (what reports print)"""

    def replace(self, *, a: float | None = None, b: float | None = None, c: float | None = None, d: float | None = None, topk: int | None = None, candidates: int | None = None, quantum: int | None = None, unit: str | None = None, note: str | None = None) -> CostModel:
        """A copy with the given fields changed (the model itself never changes)."""

    def row(self, visible: int) -> float: ...

    def heap(self, visible: int) -> float:
        """
        Expected admissions into the full running top-k of a row that sees `visible` keys.
        """

    def __eq__(self, arg: object, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __getstate__(self) -> tuple: ...

    def __setstate__(self, arg: tuple[float, float, float, float, int, int, int, str, str], /) -> None: ...

    def __repr__(self) -> str: ...

def load_cost_model(path: str) -> CostModel:
    """Reads a cost model file (`sparsecp calibrate` writes them)."""

def save_cost_model(path: str, model: CostModel) -> None: ...

def fit_cost_model(rows: Sequence[float], visible: Sequence[float], capped: Sequence[float], seconds: Sequence[float], topk: int = 512, per_call_term: bool = False, candidates: int = 0, quantum: int = 1, max_rms_relative_residual: float = 0.0, heap: Sequence[float] | None = None) -> tuple:
    """
    Non-negative least-squares fit of seconds = k + a*rows + b*visible + c*capped + d*heap (planning/cost_model_fit.hpp): (CostModel in ns, k seconds, rms relative residual, predicted seconds per sample). `visible` sums widths under the model's candidate cap and quantum and `heap` the expected top-k admissions (cost_sample's; heap=None fits no d), which the model carries; a fit whose rms relative residual exceeds max_rms_relative_residual (> 0) raises ValueError.
    """

def calibrate_cost_model(measure: Callable, ratio: int, rows: int = 64, visible: Sequence[int] = [0, 64, 256, 448, 512, 640, 1024, 2048, 4096], topk: int = 512, candidates: int = 0, quantum: int = 1, keys: int = 0, repeats: int = 3, max_residual: float = 0.5, heap_term: bool = False) -> tuple:
    """
    The library's calibration procedure (planning/calibration.hpp) on any selector: measure(target, rows, segments) -> seconds times one call on rows [0, rows) of the caller's inputs and the given worker segments (5-tuples). One warm-up call, then `repeats` interleaved rounds over every point (each visible-key target at rows and rows / 4; targets reaching beyond `keys` > 0 left out), medians, and the non-negative fit with a per-call term (and the top-k admission term d when heap_term: for selectors that keep a running top-k, such as sparsecp's CPU kernel). Returns (CostModel in ns, per-call seconds, rms relative residual, [(target, rows, sum of widths, sum min(topk, vis), median seconds, predicted seconds, sum of top-k admissions)]); a fit over max_residual (> 0) raises ValueError. Exceptions from measure pass through unchanged.
    """

def cost_sample(tasks: Sequence[tuple[int, int, int]], ratio: int, topk: int = 512, candidates: int = 0, quantum: int = 1) -> tuple:
    """
    (rows, sum of widths, sum min(topk, vis), sum of expected top-k admissions) of a task list of (document, start, end); widths are the visible-key counts under the candidate cap (0 = none) and quantum.
    """

class CostModelRefit:
    """
    Refits a cost model from a job's own per-rank selection times over a sliding window of steps (planning/cost_model_refit.hpp): add_step each step's samples, plan the next step with .model.
    """

    def __init__(self, start: CostModel, window: int = 4, max_rms_relative_residual: float = 0.25, heap_term: bool | None = None) -> None:
        """
        heap_term: fit the top-k admission term d (default: when the start model has one)
        """

    def add_step(self, samples: Sequence[Sequence[float]]) -> None:
        """
        One step's samples: (rows, sum of widths, sum min(topk, vis), seconds[, sum of heap admissions]) per rank (cost_sample of its task list, with the model's candidate cap and quantum; step_cost_samples gathers them).
        """

    @property
    def model(self) -> CostModel:
        """
        The model to plan the next step with: a new value after each step that refits
        """

    @property
    def kept_previous(self) -> bool: ...

    @property
    def refused(self) -> bool: ...

    @property
    def refused_residual(self) -> float: ...

    @property
    def rms_relative_residual(self) -> float: ...

    @property
    def steps(self) -> int: ...

    @property
    def samples(self) -> int: ...

class RowBytes:
    """Bytes of one moved row (planning/row_bytes.hpp)."""

    def __init__(self) -> None: ...

    @property
    def qr_rank(self) -> int: ...

    @qr_rank.setter
    def qr_rank(self, arg: int, /) -> None: ...

    @property
    def qr_bytes(self) -> int: ...

    @qr_bytes.setter
    def qr_bytes(self, arg: int, /) -> None: ...

    @property
    def index_heads(self) -> int: ...

    @index_heads.setter
    def index_heads(self, arg: int, /) -> None: ...

    @property
    def weight_bytes(self) -> int: ...

    @weight_bytes.setter
    def weight_bytes(self, arg: int, /) -> None: ...

    @property
    def rope_pairs(self) -> int: ...

    @rope_pairs.setter
    def rope_pairs(self, arg: int, /) -> None: ...

    @property
    def rope_bytes(self) -> int: ...

    @rope_bytes.setter
    def rope_bytes(self, arg: int, /) -> None: ...

    @property
    def topk(self) -> int: ...

    @topk.setter
    def topk(self, arg: int, /) -> None: ...

    @property
    def index_bytes(self) -> int: ...

    @index_bytes.setter
    def index_bytes(self, arg: int, /) -> None: ...

    def input_bytes(self) -> int: ...

    def result_bytes(self) -> int: ...

class StrategyParams:
    """
    Parameters of every strategy (planning/strategy.hpp); each strategy reads only its own.
    """

    def __init__(self) -> None: ...

    @property
    def block_size(self) -> int | None: ...

    @block_size.setter
    def block_size(self, arg: int | None, /) -> None: ...

    @property
    def zigzag_min_length(self) -> int | None: ...

    @zigzag_min_length.setter
    def zigzag_min_length(self, arg: int | None, /) -> None: ...

    @property
    def target_imbalance(self) -> float: ...

    @target_imbalance.setter
    def target_imbalance(self, arg: float, /) -> None: ...

    @property
    def max_received_fragments(self) -> int: ...

    @max_received_fragments.setter
    def max_received_fragments(self, arg: int, /) -> None: ...

    @property
    def ranks_per_node(self) -> int: ...

    @ranks_per_node.setter
    def ranks_per_node(self, arg: int, /) -> None: ...

    @property
    def cost_model(self) -> CostModel | None: ...

    @cost_model.setter
    def cost_model(self, arg: CostModel | None, /) -> None: ...

    @property
    def bandwidth_gbps(self) -> float: ...

    @bandwidth_gbps.setter
    def bandwidth_gbps(self, arg: float, /) -> None: ...

    @property
    def row_bytes(self) -> RowBytes: ...

    @row_bytes.setter
    def row_bytes(self, arg: RowBytes, /) -> None: ...

    @property
    def wlb_split_length(self) -> int | None: ...

    @wlb_split_length.setter
    def wlb_split_length(self, arg: int | None, /) -> None: ...

    @property
    def snake_block(self) -> int: ...

    @snake_block.setter
    def snake_block(self, arg: int, /) -> None: ...

    @property
    def lpt_align(self) -> int: ...

    @lpt_align.setter
    def lpt_align(self, arg: int, /) -> None: ...

    @property
    def lpt_row_cap(self) -> float: ...

    @lpt_row_cap.setter
    def lpt_row_cap(self, arg: float, /) -> None: ...

    @property
    def lpt_search_steps(self) -> int: ...

    @lpt_search_steps.setter
    def lpt_search_steps(self, arg: int, /) -> None: ...

    @property
    def lpt_fragment_cap(self) -> int: ...

    @lpt_fragment_cap.setter
    def lpt_fragment_cap(self, arg: int, /) -> None: ...

    @property
    def lpt_cost(self) -> str: ...

    @lpt_cost.setter
    def lpt_cost(self, arg: str, /) -> None: ...

    @property
    def window(self) -> int: ...

    @window.setter
    def window(self, arg: int, /) -> None: ...

    @property
    def topk(self) -> int: ...

    @topk.setter
    def topk(self, arg: int, /) -> None: ...

    @property
    def owner_load(self) -> list[float]: ...

    @owner_load.setter
    def owner_load(self, arg: Sequence[float], /) -> None: ...

    def validate(self) -> None: ...

def owner_cost(lengths: Sequence[int], cp: int, ratio: int, model: CostModel) -> list[float]:
    """
    Per rank, model.row(visible) summed over its contiguous rows (planning/spill.hpp): with CostModel.linear(a, 0, c, topk), the owner-side KL cost a + c * min(topk, vis) per owned row, for StrategyParams.owner_load.
    """

def strategies() -> list[tuple[str, str, str, str, int]]:
    """
    Every registered strategy as (name, source, summary, unit, listing order).
    """

class Plan:
    """A strategy's plan of one batch (planning/batch_plan.hpp)."""

    @property
    def strategy(self) -> str: ...

    @property
    def cp(self) -> int: ...

    @property
    def ratio(self) -> int: ...

    @property
    def lengths(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    def tasks_array(self, rank: int) -> Annotated[NDArray[numpy.int64], dict(writable=False)]:
        """This rank's tasks as an int64 [tasks, 3] (document, start, end) view."""

    def tasks(self, rank: int) -> list[tuple[int, int, int]]:
        """This rank's tasks as a list of (document, start, end)."""

    @property
    def task_count(self) -> int: ...

    @property
    def rows(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def work(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def cost(self) -> list[float]:
        """
        Per rank: the cost model's load of the rows it selects (causal pairs by default).
        """

    @property
    def total_work(self) -> int: ...

    @property
    def imbalance(self) -> float: ...

    @property
    def rows_moved(self) -> int: ...

    @property
    def imbalance_bound(self) -> float: ...

    @property
    def rows_moved_bound(self) -> int: ...

    @property
    def unit_bound(self) -> float: ...

    @property
    def padding_rows(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def largest_unit_work(self) -> int: ...

    @property
    def note(self) -> str: ...

def plan_strategy(name: str, lengths: Sequence[int], cp: int, ratio: int, params: StrategyParams) -> Plan:
    """
    Strategy `name`'s plan (unset defaults resolved by resolve_seed_options).
    """

@overload
def plan_seed(lengths: Sequence[int], cp: int, ratio: int, mode: str, block_size: int | None, zigzag_min_length: int | None, params: StrategyParams | None = None) -> Plan:
    """
    The seed's indexer_task_plan (plan_tasks, the seed's validation and texts); other registered strategy names plan through the strategy with these two options.
    """

@overload
def plan_seed(batch: PlanningFingerprint, cp: int, ratio: int, mode: str, block_size: int | None, zigzag_min_length: int | None, params: StrategyParams | None = None) -> Plan:
    """
    The same, on the document lengths a PlanningFingerprint already holds (so a call that agreed on its inputs does not pass its lengths into C++ again).
    """

def resolve_block_size(mode: str, block_size: int | None) -> int | None:
    """Seed resolve_indexer_balance_block_size."""

def validate_hybrid_threshold(hybrid: bool, min_length: int | None) -> None:
    """Seed validate_indexer_hybrid_threshold (mode reduced to 'is hybrid')."""

class Route:
    """
    One rank's route (planning/route.hpp); fields are read-only int64 numpy views of the route's own memory.
    """

    @property
    def segments(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def input_splits(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def output_splits(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def send_rows(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def receive_rows(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def local_sources(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def local_targets(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def query_count(self) -> int: ...

    @property
    def owner_rows(self) -> int: ...

    def expected_bytes(self, input_row_bytes: int, topk: int) -> tuple:
        """
        (inputs_sent, inputs_received, results_sent, results_received): the bytes this rank moves to and from other ranks (expected_exchange_bytes).
        """

    def __eq__(self, arg: Route, /) -> bool: ...

@overload
def route_seed(lengths: Sequence[int], cp: int, rank: int, ratio: int, mode: str, block_size: int | None, zigzag_min_length: int | None, params: StrategyParams | None = None) -> Route:
    """
    The seed's indexer_route (seed validation and texts; zigzag's fast path).
    """

@overload
def route_seed(batch: PlanningFingerprint, cp: int, rank: int, ratio: int, mode: str, block_size: int | None, zigzag_min_length: int | None, params: StrategyParams | None = None) -> Route:
    """The same, on the document lengths a PlanningFingerprint already holds."""

def route_strategy(name: str, lengths: Sequence[int], cp: int, rank: int, ratio: int, params: StrategyParams) -> Route:
    """Strategy::route: any strategy's route of one rank."""

def route_from_plan(plan: Plan, rank: int) -> Route:
    """make_route: a rank's route under a plan made beforehand."""

class SequenceDispatchRoute:
    """One rank's KV dispatch route (planning/dispatch.hpp)."""

    @property
    def size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def global_start(self) -> int: ...

    @property
    def global_end(self) -> int: ...

    @property
    def local_start(self) -> int: ...

    @property
    def local_length(self) -> int: ...

    @property
    def send_begin(self) -> list[int]: ...

    @property
    def send_splits(self) -> list[int]: ...

    @property
    def receive_splits(self) -> list[int]: ...

    @property
    def exchange_needed(self) -> bool: ...

    @property
    def kind(self) -> str: ...

    @property
    def boundaries(self) -> list[int]: ...

    @property
    def raw_local_length(self) -> int: ...

    @property
    def window(self) -> int: ...

    @property
    def ratio(self) -> int: ...

    @property
    def block_rows(self) -> int: ...

    @property
    def received_rows(self) -> int: ...

    @property
    def sent_rows(self) -> int: ...

    def __eq__(self, arg: SequenceDispatchRoute, /) -> bool: ...

def sliding_window_route(boundaries: Sequence[int], local_length: int, size: int, rank: int, window: int) -> SequenceDispatchRoute:
    """
    Seed sliding_window_route: the raw-KV halo of sliding-window attention.
    """

def document_prefix_route(boundaries: Sequence[int], local_length: int, size: int, rank: int, ratio: int) -> SequenceDispatchRoute:
    """
    Seed document_prefix_route: compressed-KV document prefixes (ratio 1, 2).
    """

def dispatch_route_from_intervals(interval_starts: Sequence[int], owner_offsets: Sequence[int], rank: int) -> SequenceDispatchRoute:
    """
    The generic route builder: rank q gathers bank rows [interval_starts[q], owner_offsets[q + 1]) (planning/dispatch.hpp).
    """

def compressed_document_offsets(boundaries: Sequence[int], ratio: int) -> list[int]: ...

def compressed_owner_offsets(boundaries: Sequence[int], ratio: int, local_length: int) -> list[int]: ...

def document_boundaries(lengths: Sequence[int]) -> list[int]: ...

def generate_batch(distribution: str = 'lognormal', tokens: int = 1048576, cp: int = 8, seed: int = 1, scale: int = 0) -> list[int]:
    """
    Document lengths of a seeded generated batch (`sparsecp batch`); scale 0 = a quarter of the local shard.
    """

def workload_distributions() -> list[str]:
    """The distributions generate_batch knows."""

class PlanningFingerprint:
    """
    What every CP rank must agree on before data moves (transport/agreement.hpp).
    """

    @staticmethod
    def seed(lengths: Sequence[int], cp: int, ratio: int, mode: str, block_size: int | None, zigzag_min_length: int | None) -> PlanningFingerprint:
        """
        The seed-mode inputs (mode none, zigzag, greedy or hybrid; options as given).
        """

    @staticmethod
    def strategy(lengths: Sequence[int], cp: int, ratio: int, name: str, params: StrategyParams) -> PlanningFingerprint:
        """Any registered strategy and every parameter."""

    def add(self, name: str, value: int) -> PlanningFingerprint: ...

    def add_real(self, name: str, value: float) -> PlanningFingerprint: ...

    @property
    def value(self) -> int: ...

    @property
    def documents(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    def components(self) -> list[int]: ...

    @property
    def setting_names(self) -> list[str]: ...

def dispatch_route_fingerprint(route: SequenceDispatchRoute) -> PlanningFingerprint:
    """
    The defining inputs of a KV dispatch route, to agree on before data moves (transport/agreement.hpp).
    """

def check_agreement(fingerprint: PlanningFingerprint, rank: int, size: int, all_reduce: Callable, context: str = '') -> None:
    """
    Collective: raises ValueError on every rank unless all fingerprints are equal, naming what differs. all_reduce(values: list[int], op: str) -> list[int] reduces over the group.
    """

def interleaved_rope(x: Annotated[NDArray, dict(device='cpu', writable=False)], cos: Annotated[NDArray, dict(device='cpu', writable=False)], sin: Annotated[NDArray, dict(device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], inverse: bool = False, threads: int = 0) -> None:
    """
    DeepSeek-V4's interleaved RoPE of x's trailing 2 * cos.shape[-1] channels into out (x, out: float32 [batch, heads, rows, dim], any strides but the last; cos, sin: [1 or batch, rows, rope_dim / 2]); inverse: the transpose (the gradient). The model's roundings.
    """

def select_topk(q: Annotated[NDArray, dict(device='cpu', writable=False)], weights: Annotated[NDArray, dict(device='cpu', writable=False)], keys: Annotated[NDArray, dict(device='cpu', writable=False)], segments: Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], heads: int, head_dim: int, ratio: int, topk: int, threads: int = 0, isa: str = 'auto') -> None:
    """
    Fused scoring + top-k (kernels/select.hpp select_topk) into `out` [rows, topk] int32. q [rows, heads * head_dim] (any trailing shape), weights [rows, heads], keys [bank, head_dim]; fp32 or bf16; C-contiguous CPU arrays, read in place.
    """

def select_worker_rows(qr: Annotated[NDArray, dict(device='cpu', writable=False)], weights: Annotated[NDArray, dict(device='cpu', writable=False)], cos: Annotated[NDArray, dict(device='cpu', writable=False)], sin: Annotated[NDArray, dict(device='cpu', writable=False)], wq_b: Annotated[NDArray, dict(device='cpu', writable=False)], keys: Annotated[NDArray, dict(device='cpu', writable=False)], segments: Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], heads: int, head_dim: int, rope_dim: int, ratio: int, topk: int, out_in: bool = True, threads: int = 0, isa: str = 'auto') -> None:
    """
    Worker selection (select_worker_rows): Index-Q projection qr @ Wq_b with RoPE, then fused top-k. wq_b is [heads * head_dim, q_rank] (out_in, torch Linear.weight) or [q_rank, heads * head_dim].
    """

def project_index_query(qr: Annotated[NDArray, dict(device='cpu', writable=False)], wq_b: Annotated[NDArray, dict(device='cpu', writable=False)], cos: Annotated[NDArray, dict(device='cpu', writable=False)], sin: Annotated[NDArray, dict(device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], heads: int, head_dim: int, rope_dim: int, out_in: bool = True, threads: int = 0) -> None:
    """
    Index-Q projection with RoPE (project_index_query) into `out` [rows, heads * head_dim] float32; threads 0: OpenMP's default (1 also keeps the BLAS product on this thread).
    """

class TndPlan:
    """Packed layout of the rows that see a key (kernels/tnd_plan.hpp)."""

    @property
    def ratio(self) -> int: ...

    @property
    def packed_rows(self) -> int: ...

    @property
    def sequences(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]:
        """
        [n, 6] int64: row_begin, row_end, packed_begin, first_position, key_begin, key_end.
        """

    def query_offsets(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    def key_offsets(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    def packed_row_ids(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    def covers_queries(self, rows: int) -> bool: ...

def check_select_config(heads: int, head_dim: int, ratio: int, topk: int) -> None:
    """
    The selection kernels' configuration checks (e.g. "Indexer topk ... is too large"), before any output is allocated.
    """

def csa_tnd_plan(segments: Annotated[NDArray[numpy.int64], dict(shape=(None, None), order='C', device='cpu', writable=False)], ratio: int) -> TndPlan | None:
    """Seed csa_tnd_plan: None when no row sees a key."""

def kernel_isa() -> str:
    """
    The ISA the selection and KL kernels run with isa='auto': SPARSECP_ISA if set, else the best this CPU supports.
    """

def select_bf16_products(isa: str = 'auto') -> str:
    """
    What the selection multiplies bf16 keys with under `isa`: 'onednn <version>', 'vdpbf16ps' or 'widened'.
    """

def kernel_isa_supported(name: str) -> bool: ...

def array_address(array: Annotated[NDArray, dict(device='cpu', writable=False)]) -> int:
    """
    The address of the data the binding reads for `array` (tests use it to prove zero copy).
    """

def indexer_kl_loss(index_query: Annotated[NDArray, dict(device='cpu', writable=False)], index_key: Annotated[NDArray, dict(device='cpu', writable=False)], merge_weight: Annotated[NDArray, dict(device='cpu', writable=False)], attention_query: Annotated[NDArray, dict(device='cpu', writable=False)], compressed_key: Annotated[NDArray, dict(device='cpu', writable=False)], topk_indices: Annotated[NDArray, dict(device='cpu', writable=False)], sinks: Annotated[NDArray, dict(device='cpu', writable=False)], grad_index_query: Annotated[NDArray, dict(device='cpu')], grad_index_key: Annotated[NDArray, dict(device='cpu')], grad_merge_weight: Annotated[NDArray, dict(device='cpu')], attention_scale: float, loss_coeff: float, main_key_offset: int = 0, threads: int = 0, isa: str = 'auto', reference: bool = False, any_topk: bool = False) -> float:
    """
    Fused indexer KL loss + gradients (kernels/indexer_kl.hpp indexer_kl_loss; seed shared_compressed_indexer_kl_loss): returns the loss and writes the three float32 gradients. index_query [B, S, H, D], index_key [B, Ki, D], merge_weight [B, S, H], attention_query [B, Hm, S, Dm], compressed_key [B, K, Dm], topk_indices [B, S, T] int32/int64 (-1 padded), sinks [Hm]; float inputs fp32 or bf16; C-contiguous CPU arrays, read in place. reference=True runs the double-precision reference instead. any_topk=True waives the seed's TopK512 rule (1 <= TopK <= 512: a model's own index_topk).
    """

def indexer_kl_scratch_bytes(index_query: Annotated[NDArray, dict(device='cpu', writable=False)], index_key: Annotated[NDArray, dict(device='cpu', writable=False)], merge_weight: Annotated[NDArray, dict(device='cpu', writable=False)], attention_query: Annotated[NDArray, dict(device='cpu', writable=False)], compressed_key: Annotated[NDArray, dict(device='cpu', writable=False)], topk_indices: Annotated[NDArray, dict(device='cpu', writable=False)], sinks: Annotated[NDArray, dict(device='cpu', writable=False)], main_key_offset: int = 0, threads: int = 0, isa: str = 'auto', any_topk: bool = False) -> int:
    """
    Upper bound of indexer_kl_loss's scratch bytes for these shapes, dtypes and threads (0: OpenMP's default); independent of B and S (indexer_kl_scratch_bytes). any_topk as in indexer_kl_loss.
    """

def sparse_attention_forward(q: Annotated[NDArray, dict(device='cpu', writable=False)], kv: Annotated[NDArray, dict(device='cpu', writable=False)], indices: Annotated[NDArray, dict(device='cpu', writable=False)], sinks: Annotated[NDArray, dict(device='cpu', writable=False)] | None, out: Annotated[NDArray, dict(device='cpu')], lse: Annotated[NDArray, dict(device='cpu')], scale: float, value_dim: int, threads: int = 0, isa: str = 'auto', gemm: str = 'auto', scratch_bytes: int = 0) -> None:
    """
    Sparse attention forward (kernels/sparse_attention.hpp): q [rows, heads, qk_dim], kv [keys, qk_dim] (float32, bfloat16 or float64), indices [rows, columns] int32 (-1: none), sinks [heads] or None (float32; float64 for float64 calls); writes out [rows, heads, value_dim] and lse [rows, heads]. scratch_bytes: per-thread budget that sets the rows of a block (0: the default, 1 MiB).
    """

def sparse_attention_backward(q: Annotated[NDArray, dict(device='cpu', writable=False)], kv: Annotated[NDArray, dict(device='cpu', writable=False)], indices: Annotated[NDArray, dict(device='cpu', writable=False)], sinks: Annotated[NDArray, dict(device='cpu', writable=False)] | None, out: Annotated[NDArray, dict(device='cpu', writable=False)], lse: Annotated[NDArray, dict(device='cpu', writable=False)], grad_out: Annotated[NDArray, dict(device='cpu', writable=False)], grad_q: Annotated[NDArray, dict(device='cpu')], grad_kv: Annotated[NDArray, dict(device='cpu')], grad_sinks: Annotated[NDArray, dict(device='cpu')] | None, scale: float, value_dim: int, threads: int = 0, isa: str = 'auto', gemm: str = 'auto', scratch_bytes: int = 0) -> None:
    """
    Sparse attention backward: from the forward's out and lse and grad_out, writes grad_q (the call's dtype), grad_kv [keys, qk_dim] and grad_sinks [heads] (float32; float64 for float64 calls). grad_kv is summed in row order whatever the thread count.
    """

def sparse_attention_gemm(dtype: str = 'bfloat16', gemm: str = 'auto', heads: int = 0) -> str:
    """
    What multiplies a sparse attention call of this dtype and head count (0: more than 8): 'onednn <version>', 'blas' or 'direct' (float32 with 1, 2, 4 or 8 heads: the kernel's own loops, reading each row's kv rows in place).
    """

def blas_core() -> str:
    """
    The OpenBLAS kernel family sparsecp's BLAS calls run ('SkylakeX', 'Haswell', ...).
    """
