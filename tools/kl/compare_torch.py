#!/usr/bin/env python3
"""Compare `sparsecp kl` with the chunked pure-torch implementation on random inputs.

Writes random .npy inputs (float32 or bfloat16, int32 or int64 ids with -1 padding,
duplicate ids and empty rows, an optional compact-bank offset), runs the tool, runs
``python/sparsecp/torch/_kl_torch.py``'s ``kl_loss_and_grads_torch`` on the same values
and prints the relative differences (loss: |a - b| / |b|; gradients: ||a - b||_2 / ||b||_2).
With ``--time`` it also times both on the same inputs (the tool's own time is its
wall-clock run including .npy I/O, so this is an upper bound for the kernel).

Needs torch and numpy only. Exit status 1 if a difference exceeds --tolerance.

  python3 tools/kl/compare_torch.py --sparsecp build/release/sparsecp
  python3 tools/kl/compare_torch.py --sparsecp build/release/sparsecp --dtype bf16 --offset 7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "sparsecp", "torch"))
from _kl_torch import kl_loss_and_grads_torch  # noqa: E402


def save(path: str, tensor: torch.Tensor) -> None:
    """np.save; bfloat16 as 2-byte void ('|V2'), which sparsecp reads as bfloat16."""
    if tensor.dtype == torch.bfloat16:
        np.save(path, tensor.view(torch.int16).numpy().view(np.dtype("V2")))
    else:
        np.save(path, tensor.numpy())


def random_inputs(args, generator):
    b, s, h, d, hm, dm, k, t = args.batch, args.rows, args.heads, args.head_dim, args.att_heads, \
        args.att_dim, args.keys, args.topk
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32

    def rand(*shape, scale=1.0):
        return ((torch.rand(*shape, generator=generator) * 2 - 1) * scale).to(dtype)

    index_keys = args.offset + k + 3
    inputs = dict(
        index_query=rand(b, s, h, d),
        index_key=rand(b, index_keys, d),
        merge_weight=rand(b, s, h, scale=4.0 / (h * d) ** 0.5),
        attention_query=rand(b, hm, s, dm),
        compressed_key=rand(b, k, dm),
        sinks=rand(hm, scale=2.0),
    )
    ids = torch.randint(0, k, (b, s, t), generator=generator) + args.offset
    ids[torch.rand(b, s, t, generator=generator) < 0.2] = -1  # padding
    duplicate = torch.rand(b, s, t, generator=generator) < 0.1
    ids[..., 1:][duplicate[..., 1:]] = ids[..., :-1][duplicate[..., 1:]]
    ids[torch.rand(b, s, generator=generator) < 0.1] = -1  # empty rows
    inputs["topk_indices"] = ids.to(torch.int32 if args.ids == "int32" else torch.int64)
    return inputs


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    norm = float(b.double().norm())
    diff = float((a.double() - b.double()).norm())
    return diff / norm if norm else diff


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sparsecp", default="build/release/sparsecp", help="the built tool")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rows", type=int, default=67)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--att-heads", type=int, default=8)
    parser.add_argument("--att-dim", type=int, default=96)
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--topk", type=int, default=300)
    parser.add_argument("--offset", type=int, default=0, help="main_key_offset")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--ids", choices=["int32", "int64"], default="int64")
    parser.add_argument("--loss-coeff", type=float, default=1.0)
    parser.add_argument("--chunk", type=int, default=256, help="query_chunk_size of the torch code")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--time", action="store_true", help="also time both")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(args.seed)
    inputs = random_inputs(args, generator)
    scale = args.att_dim ** -0.5
    with tempfile.TemporaryDirectory() as work:
        names = dict(index_query="q", index_key="k", merge_weight="w", attention_query="qa",
                     compressed_key="ka", topk_indices="idx", sinks="sinks")
        for key, name in names.items():
            save(os.path.join(work, name + ".npy"), inputs[key])
        command = [args.sparsecp, "kl", "--index-query", f"{work}/q.npy", "--index-key", f"{work}/k.npy",
                   "--weights", f"{work}/w.npy", "--attention-query", f"{work}/qa.npy",
                   "--attention-key", f"{work}/ka.npy", "--indices", f"{work}/idx.npy",
                   "--sinks", f"{work}/sinks.npy", "--attention-scale", repr(scale),
                   "--loss-coeff", repr(args.loss_coeff), "--main-key-offset", str(args.offset),
                   "--out-dir", f"{work}/out", "--json"]
        start = time.perf_counter()
        run = subprocess.run(command, capture_output=True, text=True)
        tool_seconds = time.perf_counter() - start
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        tool_loss = json.loads(run.stdout)["loss"]
        out = {name: torch.from_numpy(np.load(f"{work}/out/{name}.npy"))
               for name in ("loss", "grad_index_query", "grad_index_key", "grad_weights")}

    start = time.perf_counter()
    loss, grad_q, grad_k, grad_w = kl_loss_and_grads_torch(
        inputs["index_query"], inputs["index_key"], inputs["merge_weight"], inputs["attention_query"],
        inputs["compressed_key"], inputs["topk_indices"], inputs["sinks"], scale, args.loss_coeff,
        main_key_offset=args.offset, query_chunk_size=args.chunk)
    torch_seconds = time.perf_counter() - start
    result = {
        "shape": {k: list(v.shape) for k, v in inputs.items()},
        "dtype": args.dtype,
        "ids": args.ids,
        "offset": args.offset,
        "loss_sparsecp": tool_loss,
        "loss_torch": float(loss),
        "loss_relative": abs(tool_loss - float(loss)) / max(abs(float(loss)), 1e-30),
        "loss_npy_matches_json": float(out["loss"]) == tool_loss,
        "grad_index_query_relative": relative(out["grad_index_query"], grad_q),
        "grad_index_key_relative": relative(out["grad_index_key"], grad_k),
        "grad_weights_relative": relative(out["grad_weights"], grad_w),
    }
    if args.time:
        result["sparsecp_process_seconds"] = tool_seconds
        result["torch_seconds"] = torch_seconds
        result["torch_threads"] = torch.get_num_threads()
    worst = max(result["loss_relative"], result["grad_index_query_relative"],
                result["grad_index_key_relative"], result["grad_weights_relative"])
    result["ok"] = worst <= args.tolerance and result["loss_npy_matches_json"]
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
