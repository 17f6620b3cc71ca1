"""The OpenBLAS kernel family sparsecp runs on (``sparsecp.blas_core``): never OpenBLAS's SSE3
fallback on a CPU with AVX2 or AVX-512 unless the user asks for OpenBLAS's own choice."""
from __future__ import annotations

import os
import subprocess
import sys

import sparsecp

GENERIC = {"Prescott", "prescott", "Core2", "core2", "Penryn", "Nehalem", "nehalem", "Dunnington", "Atom",
           "Unknown", "unknown"}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _core_in_subprocess(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "SPARSECP_BLAS_AS_IS")}
    environment.update(env)
    result = subprocess.run([sys.executable, "-c", "import sparsecp; print(sparsecp.blas_core())"], env=environment,
                            capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.strip()


def test_the_cpus_own_family_unless_told_otherwise() -> None:
    flags = _cpu_flags()
    core = _core_in_subprocess()
    as_is = _core_in_subprocess(SPARSECP_BLAS_AS_IS="1")  # OpenBLAS's own choice, untouched
    print(f"blas_core {core}, OpenBLAS's own choice {as_is}")
    if as_is in GENERIC and "avx2" in flags:  # the fallback this module replaces
        assert core == ("SkylakeX" if "avx512f" in flags else "Haswell")
    else:  # a family OpenBLAS knows for this CPU stays
        assert core == as_is
    assert _core_in_subprocess(OPENBLAS_CORETYPE="Haswell") == "Haswell"  # the user's choice stands
    assert sparsecp.blas_core() in (core, os.environ.get("OPENBLAS_CORETYPE"))
