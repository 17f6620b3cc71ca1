"""Nothing of the C++ extension outlives the interpreter (issue 43, item 11): a script that keeps
its last ``logits`` and ``loss`` in globals, as one written from the README does, ends without
nanobind's "leaked instances" report on any rank.

torch does not free the Python objects an autograd graph still holds when the interpreter
exits; nanobind then reports every extension object among them (a spill route held by a layer's
per-batch tables: about 24 lines per rank). The tables a graph can reach hold no extension
object (``IndexerRoute.detached``). Each case runs ``exit_leak_job.py`` as two gloo ranks in
fresh interpreters and reads their stderr."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exit_leak_job.py")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("case", ["v4", "v4-checkpointing", "v32", "low-level"])
def test_a_spill_job_ends_without_leaked_extension_objects(case: str) -> None:
    if case != "low-level":
        pytest.importorskip(f"transformers.models.{'deepseek_v4' if case.startswith('v4') else 'deepseek_v32'}",
                            reason="transformers with DeepSeek-V4 and V3.2 not installed")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    port, size = str(_free_port()), 2
    ranks = [subprocess.Popen([sys.executable, JOB, str(rank), str(size), port, case], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(size)]
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=300))
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()
    for rank, (process, (out, err)) in enumerate(zip(ranks, outputs)):
        assert process.returncode == 0 and "done" in out, f"{case}: rank {rank} exited {process.returncode}:\n{err}"
        assert "nanobind: leaked" not in err, f"{case}: rank {rank} at exit:\n{err}"


def test_a_detached_route_equals_its_source_and_holds_no_extension_object() -> None:
    import numpy as np

    import sparsecp.torch as sct
    from sparsecp.torch._exchange import _device_rows

    route = sct.indexer_route((5000, 300, 2699, 1), 4, 1, 4, "spill")
    assert route.core is not None
    detached = route.detached()
    assert detached.core is None and detached.detached() is detached
    assert detached == route and hash(detached) == hash(route) and repr(detached) == repr(route)
    for name in ("segments", "input_splits", "output_splits", "send_rows", "receive_rows", "local_sources",
                 "local_targets"):
        array = getattr(detached, name).array
        while isinstance(array, np.ndarray) and array.base is not None:
            array = array.base
        assert isinstance(array, np.ndarray), f"{name} still views {type(array).__name__}"
    # the row lists on the device are tensors of their own, on the CPU too (not views of the route)
    rows = _device_rows(route, torch.device("cpu"))
    assert all(t.data_ptr() != getattr(route, name).array.ctypes.data for name, t in zip(rows._fields, rows))
