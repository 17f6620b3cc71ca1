"""pytest configuration: shared gloo rank pools (multirank.py), closed at the end."""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session", autouse=True)
def _close_rank_pools():
    yield
    if "multirank" in sys.modules:
        sys.modules["multirank"].close_pools()


def pytest_report_header(config):
    try:
        import sparsecp

        return (f"sparsecp {sparsecp.__version__} from {os.path.dirname(sparsecp.__file__)}, "
                f"kernel {sparsecp.kernel_isa()}")
    except Exception as error:  # pragma: no cover
        return f"sparsecp not importable: {error}"
