#!/usr/bin/env python3
"""A prepared check for a machine with one CUDA GPU (CI never runs it; under 5 minutes).

Runs sparsecp.torch on CUDA tensors with an NCCL process group of one rank and prints a
pass/fail line per check and a summary (exit status 0 only when every check passed):

1. ``cuda-select``: ``balanced_indexer_select`` on CUDA tensors (the torch selection path,
   NCCL exchange) for several strategies, equal to the CPU C++ kernel's ids.
2. ``cuda-graph``: the fixed-capacity exchange and the selection captured once in a CUDA
   graph (``StagingBuffers`` + ``torch.ops.sparsecp.select_rows``), then replayed on
   different batches (each batch only copies its inputs and padded indices into the fixed
   buffers): every replay equal to the eager ids; the collective buffers' addresses never
   change.
3. ``cuda-kl``: ``shared_compressed_indexer_kl_loss`` on CUDA (loss and the three
   gradients) against the CPU fused kernel.
4. ``cuda-compile``: ``torch.compile(fullgraph=True)`` of exchange -> select -> result ->
   KL on CUDA with the functional collectives, equal to eager (skipped with
   ``--no-compile``).

Without CUDA it says so and exits with status 2; ``--cpu`` runs the same code on CPU
tensors over a gloo group of one (no capture: the graph's step runs eagerly per batch), a
dry run of the script itself.

Usage::

    python python/examples/gpu_check.py [--no-compile] [--tokens 4096] [--cpu]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

HEADS, HEAD_DIM, ROPE_DIM, Q_RANK, RATIO, TOPK = 8, 32, 16, 64, 4, 64


def _batch(seed: int, tokens: int) -> tuple[int, ...]:
    import random

    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(min(rng.choice([rng.randint(1, 64), rng.randint(64, tokens // 2)]), tokens - sum(lengths)))
    return tuple(lengths)


class Payload:
    """One batch's owner inputs and the layer's weights (small integers: exact scores, so
    CPU and CUDA ids are identical, ties included)."""

    def __init__(self, torch: Any, lengths: tuple[int, ...], seed: int, device: Any) -> None:
        tokens = sum(lengths)
        generator = torch.Generator().manual_seed(seed)

        def integers(low: int, high: int, *shape: int) -> Any:
            return torch.randint(low, high + 1, shape, generator=generator).float()

        self.lengths = lengths
        self.qr = integers(-2, 2, 1, tokens, Q_RANK).to(torch.bfloat16).to(device)
        self.weights = integers(-2, 2, 1, tokens, HEADS).to(device)
        self.cos = integers(-1, 1, 1, tokens, ROPE_DIM // 2).to(device)
        self.sin = integers(-1, 1, 1, tokens, ROPE_DIM // 2).to(device)
        self.wq_b = integers(-1, 1, HEADS * HEAD_DIM, Q_RANK).to(torch.bfloat16).to(device)
        self.keys = integers(-2, 2, sum(n // RATIO for n in lengths), HEAD_DIM).to(torch.bfloat16).to(device)

    def inputs(self) -> tuple[Any, ...]:
        return self.qr, self.weights, self.cos, self.sin


@contextlib.contextmanager
def cxx_kernels() -> Iterator[None]:
    """CPU tensors through the C++ kernels while inside (also in the --cpu dry run)."""
    saved = os.environ.pop("SPARSECP_TORCH_PATH", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["SPARSECP_TORCH_PATH"] = saved


@cxx_kernels()
def cpu_reference(torch: Any, payload: Payload) -> Any:
    """The C++ kernel's ids of every row, selected where it is (no exchange)."""
    import sparsecp.torch as sct

    route = sct.indexer_route(payload.lengths, 1, 0, RATIO, "none")
    cpu = [t.cpu() for t in payload.inputs()]
    selector = sct.IndexerSelector(payload.wq_b.cpu(), payload.keys.cpu(), RATIO, TOPK, head_dim=HEAD_DIM,
                                   rope_dim=ROPE_DIM)
    return selector(cpu[0], cpu[1], (cpu[2], cpu[3]), route.segments)[0]


def check_select(torch: Any, group: Any, tokens: int, device: Any) -> str:
    import sparsecp.torch as sct

    for seed, mode, options in ((1, "spill", {}), (2, "greedy", {"block_size": 256}), (3, "zigzag", {})):
        payload = Payload(torch, _batch(seed, tokens), seed, device)
        selector = sct.IndexerSelector(payload.wq_b, payload.keys, RATIO, TOPK, head_dim=HEAD_DIM, rope_dim=ROPE_DIM)
        ids = sct.balanced_indexer_select(payload.qr, payload.weights, (payload.cos, payload.sin), selector,
                                          payload.lengths, RATIO, mode, group, **options)
        if ids.device != payload.qr.device:
            raise AssertionError(f"{mode}: ids on {ids.device}")
        if not torch.equal(ids[0].cpu(), cpu_reference(torch, payload)):
            raise AssertionError(f"{mode}: CUDA ids differ from the CPU kernel's")
    return "3 strategies, ids equal to the CPU kernel"


def check_graph(torch: Any, group: Any, tokens: int, device: Any) -> str:
    import sparsecp.torch as sct
    from sparsecp.torch._prebuilt import staging_buffers
    from sparsecp.torch.select import _project_torch

    batches = [_batch(10 + step, tokens) for step in range(6)]
    capacity = sct.fixed_capacity(batches, 1, [RATIO], "spill")
    first = Payload(torch, batches[0], 10, device)
    # Static inputs and a key bank of the largest size: each batch copies into them.
    static = [t.clone() for t in first.inputs()]
    bank = torch.zeros((tokens // RATIO, HEAD_DIM), dtype=torch.bfloat16, device=device)
    wq_b = first.wq_b
    fields = tuple((int(t.shape[-1]), t.dtype) for t in static)
    staging = staging_buffers(group, device, 1, capacity, tokens, fields)

    def step() -> Any:
        works = staging.send_inputs(static, group, async_op=False)
        qr, weights, cos, sin = staging.finish_inputs(works)
        query = _project_torch(qr[0], wq_b, cos[0], sin[0], HEAD_DIM, ROPE_DIM)
        ids = torch.ops.sparsecp.select_rows(query, bank, weights[0], staging.key_begin, staging.visible, TOPK)
        work = staging.send_results(ids, group, async_op=False)
        return staging.finish_results(work, TOPK, torch.int32)

    def load(seed: int, lengths: tuple[int, ...]) -> Payload:
        payload = Payload(torch, lengths, seed, device)
        payload.wq_b = wq_b  # the layer's weight stays
        for target, source in zip(static, payload.inputs()):
            target.copy_(source)
        bank.zero_()
        bank[:payload.keys.shape[0]].copy_(payload.keys)
        payload.keys = bank
        routes = sct.prebuild(lengths, 1, 0, [RATIO], "spill", capacity=capacity)
        assert routes.layer(RATIO).indices is not None
        staging.load(routes.layer(RATIO).indices)
        return payload

    load(10, batches[0])
    capture = device.type == "cuda"
    if capture:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (allocations, NCCL communicator) before capture
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
    else:  # --cpu: the same buffers and ops, run eagerly every batch
        out = step()
    addresses = [t.data_ptr() for t in staging.collective_tensors()]
    for index, lengths in enumerate(batches):
        payload = load(10 + index, lengths)
        if capture:
            graph.replay()
            torch.cuda.synchronize()
        elif step().data_ptr() != out.data_ptr():
            raise AssertionError("the result buffer moved")
        expected = cpu_reference(torch, payload)
        if not torch.equal(out.cpu(), expected):
            raise AssertionError(f"replay {index}: ids differ from the CPU kernel's")
        if [t.data_ptr() for t in staging.collective_tensors()] != addresses:
            raise AssertionError("collective buffers moved")
    how = "captured once, replayed" if capture else "run eagerly (no capture on CPU)"
    return f"{how} on {len(batches)} batches, ids equal, buffers fixed (capacity {capacity})"


def check_kl(torch: Any, tokens: int, device: Any) -> str:
    import sparsecp.torch as sct

    generator = torch.Generator().manual_seed(7)
    rows, keys, topk, heads_main, dim_main = min(tokens, 1024), 512, 512, 4, 64

    def normal(*shape: int) -> Any:
        return torch.randn(shape, generator=generator)

    ids = torch.stack([torch.randperm(keys, generator=generator)[:topk] for _ in range(rows)])[None].int()
    ids[0, :, topk - 8:] = -1
    base = (normal(1, rows, HEADS, HEAD_DIM), normal(1, keys, HEAD_DIM), normal(1, rows, HEADS) * 0.1,
            normal(1, heads_main, rows, dim_main), normal(1, keys, dim_main), ids, normal(heads_main))
    results = []
    for where in ("cpu", device):
        tensors = [t.to(where) for t in base]
        for t in tensors[:3]:
            t.requires_grad_()
        with cxx_kernels() if where == "cpu" else contextlib.nullcontext():
            loss = sct.shared_compressed_indexer_kl_loss(*tensors, attention_scale=dim_main ** -0.5, loss_coeff=1.0)
            loss.backward()
        results.append([loss.detach().cpu(), *(t.grad.cpu() for t in tensors[:3])])
    for name, cpu, cuda in zip(("loss", "grad q", "grad k", "grad w"), *results):
        if not torch.allclose(cpu.float(), cuda.float(), rtol=1e-4, atol=1e-6):
            raise AssertionError(f"{name}: CUDA differs from the CPU kernel (max diff "
                                 f"{(cpu.float() - cuda.float()).abs().max().item():.3g})")
    return f"loss {float(results[0][0]):.6f}, gradients within 1e-4 of the CPU kernel"


def check_compile(torch: Any, group: Any, tokens: int, device: Any) -> str:
    import sparsecp.torch as sct
    from sparsecp.torch.select import _project_torch

    lengths = _batch(21, tokens)
    payload = Payload(torch, lengths, 21, device)
    routes = sct.prebuild(lengths, 1, 0, [RATIO], "spill", capacity=8)
    index = sct.fixed_step_indices(payload.qr, payload.weights, (payload.cos, payload.sin), lengths, RATIO, "spill",
                                   group, routes=routes)
    layer = routes.layer(RATIO)
    assert layer.indices is not None
    worker_rows, owner_rows, keys = layer.indices.worker_rows, layer.indices.owner_rows, payload.keys.shape[0]
    kl_topk = max(TOPK, min(512, keys))
    generator = torch.Generator().manual_seed(3)
    teacher = (torch.randn((1, 2, owner_rows, 16), generator=generator).to(device),
               torch.randn((1, keys, 16), generator=generator).to(device),
               torch.randn((2,), generator=generator).to(device))

    def step(qr: Any, weights: Any, cos: Any, sin: Any, index: Any, leaves: Any) -> Any:
        wqr, ww, wcos, wsin = sct.fixed_inputs_to_workers([qr, weights, cos, sin], index, worker_rows, group)
        query = _project_torch(wqr, payload.wq_b, wcos, wsin, HEAD_DIM, ROPE_DIM)
        ids = torch.ops.sparsecp.select_rows(query, payload.keys, ww, index.key_begin, index.visible, kl_topk)
        owner_ids = sct.fixed_results_to_owners(ids, index, owner_rows, group)
        loss = sct.shared_compressed_indexer_kl_loss(leaves[0], leaves[1], leaves[2], teacher[0], teacher[1],
                                                     owner_ids[None], teacher[2], attention_scale=0.25,
                                                     loss_coeff=1.0)
        return loss, owner_ids

    def run(function: Callable) -> list[Any]:
        g = torch.Generator().manual_seed(4)
        leaves = [torch.randn(shape, generator=g).to(device).requires_grad_()
                  for shape in ((1, owner_rows, HEADS, HEAD_DIM), (1, keys, HEAD_DIM), (1, owner_rows, HEADS))]
        loss, ids = function(payload.qr, payload.weights, payload.cos, payload.sin, index, leaves)
        loss.backward()
        return [loss.detach(), ids, *(t.grad for t in leaves)]

    eager = run(step)
    compiled = run(torch.compile(step, fullgraph=True))
    for name, a, b in zip(("loss", "ids", "grad q", "grad k", "grad w"), eager, compiled):
        same = torch.equal(a, b) if name == "ids" else torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        if not same:
            raise AssertionError(f"compiled {name} differs from eager")
    return "fullgraph compile (inductor) equal to eager"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per batch (one rank)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile check")
    parser.add_argument("--cpu", action="store_true",
                        help="a dry run of the same checks on CPU tensors over gloo (no capture, torch selection path)")
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        print(f"gpu_check: FAIL: PyTorch is not importable ({error})")
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: FAIL: no CUDA device (torch.cuda.is_available() is False): this check needs a GPU "
              "(--cpu: a dry run of the same code on CPU; the CPU tests are python/tests)")
        return 2
    import sparsecp.torch  # noqa: F401  (fails here, not inside a check, when the package is broken)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if args.cpu:
        os.environ["SPARSECP_TORCH_PATH"] = "1"  # the device path (torch selection, KL) on CPU tensors
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        where = "CPU dry run, gloo group of 1"
    else:
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=120), device_id=device)
        where = f"{torch.cuda.get_device_name(0)}, NCCL group of 1"
    group = dist.group.WORLD
    print(f"gpu_check: {where}, torch {torch.__version__}, {args.tokens} tokens", flush=True)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("cuda-select", lambda: check_select(torch, group, args.tokens, device)),
        ("cuda-graph", lambda: check_graph(torch, group, args.tokens, device)),
        ("cuda-kl", lambda: check_kl(torch, args.tokens, device)),
    ]
    if not args.no_compile:
        checks.append(("cuda-compile", lambda: check_compile(torch, group, args.tokens, device)))
    failed = 0
    for name, check in checks:
        start = time.perf_counter()
        try:
            detail = check()
            if device.type == "cuda":
                torch.cuda.synchronize()
            print(f"PASS {name} ({time.perf_counter() - start:.1f} s): {detail}", flush=True)
        except Exception as error:  # report every check
            failed += 1
            print(f"FAIL {name} ({time.perf_counter() - start:.1f} s): {type(error).__name__}: {error}", flush=True)
            traceback.print_exc()
    print(f"gpu_check: {len(checks) - failed} passed, {failed} failed")
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
