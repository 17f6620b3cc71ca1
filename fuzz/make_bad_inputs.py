#!/usr/bin/env python3
"""Writes the small bad (and a few good) input files that cli_limits.cases names.

Usage: make_bad_inputs.py DIR. Pure Python (no numpy): .npy images are built by hand.
"""
import json
import os
import struct
import sys


def header(text, version=1):
    body = text.encode()
    size_bytes = 2 if version == 1 else 4
    pad = (64 - (8 + size_bytes + len(body) + 1) % 64) % 64
    body = body + b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack("<H" if version == 1 else "<I", len(body)) + body


def npy(descr, shape, fortran=False):
    dims = "".join(f"{s:d}, " for s in shape)
    return header(f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': ({dims}), }}")


def main(out):
    os.makedirs(out, exist_ok=True)

    def write(name, data):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())

    def ones(n):
        return struct.pack(f"<{n:d}f", *([1.0] * n))

    # A valid selection problem: 6 rows of one document, ratio 4 -> 1 key; bank of 8 keys.
    write("k.npy", npy("<f4", (8, 16)) + ones(128))
    write("w.npy", npy("<f4", (6, 2)) + ones(12))
    write("q.npy", npy("<f4", (6, 2, 16)) + ones(192))
    write("seg.json", json.dumps([[0, 6, 0, 1, 2]]))
    # Bad .npy images.
    write("empty.npy", b"")
    write("garbage.npy", b"hello world this is not numpy\n" * 4)
    write("trunc.npy", b"\x93NUMPY\x01\x00\x40\x00{'descr'")
    write("hlen.npy", b"\x93NUMPY\x02\x00\xff\xff\xff\x7f{")
    write("f8.npy", npy("<f8", (2, 2)) + b"\0" * 32)
    write("fortran.npy", npy("<f4", (2, 2), True) + b"\0" * 16)
    write("bigend.npy", npy(">f4", (2, 2)) + b"\0" * 16)
    write("negshape.npy", npy("<f4", (-1, 2)) + b"\0" * 16)
    write("hugeshape.npy", npy("<f4", (1 << 32, 1 << 32, 16)) + b"\0" * 16)
    write("ovfshape.npy", npy("<f4", (10**23, 2)) + b"\0" * 16)
    write("bigdata.npy", npy("<f4", (10**9, 16)) + b"\0" * 16)
    write("nodescr.npy", header("{'fortran_order': False, 'shape': (2, 2), }") + b"\0" * 16)
    write("badver.npy", b"\x93NUMPY\x09\x00" + npy("<f4", (2, 2))[8:] + b"\0" * 16)
    write("notdict.npy", header("[1, 2, 3]") + b"\0" * 16)
    # Bad segments JSON.
    write("seg_garbage.json", "{{{ not json")
    write("seg_empty.json", "")
    write("seg_obj.json", '{"a": 1}')
    write("seg_four.json", "[[0,6,0,1]]")
    write("seg_str.json", '[[0,"6",0,1,2]]')
    write("seg_float.json", "[[0,6.5,0,1,2]]")
    write("seg_huge.json", "[[0,6,0,99999999999999999999,2]]")
    write("seg_u64.json", "[[0,6,0,18446744073709551615,2]]")
    write("seg_neg.json", "[[0,-6,0,1,2]]")
    write("seg_range.json", "[[0,600,0,150,0]]")
    write("seg_keys.json", "[[0,6,0,200,0]]")
    write("seg_resid.json", "[[0,6,0,1,-7]]")
    write("seg_overlap.json", "[[0,6,0,1,2],[3,6,0,1,2]]")
    write("seg_deep.json", "[" * 100000 + "]" * 100000)
    # Bad lengths files.
    write("empty.txt", "")
    write("spaces.txt", "  \n\t ,, \n")
    write("garbage.txt", "hello, world\n")
    write("binary.txt", bytes(range(256)) * 2)
    write("mixed.txt", "100, 200\n300 x\n")
    write("floats.txt", "100.5 200\n")
    write("negative.txt", "100 -4 8\n")
    write("huge.txt", "99999999999999999999999\n")
    write("sum64.txt", "4611686018427387904 4611686018427387904\n")
    # Cost models whose coefficients would make a plan's cost inf or nan (issue 30).
    write("huge_b.model", "# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis)\n"
                          "a 0\nb 1e308\nc 0\ntopk 512\nunit pairs\n")
    write("huge_d.model", "# sparsecp cost model: per-row cost a + b * vis + c * min(topk, vis)\n"
                          "a 1\nb 1\nc 0\nd 1.7976931348623157e308\ntopk 512\nunit pairs\n")


if __name__ == "__main__":
    main(sys.argv[1])
