"""pytest configuration: shared gloo rank pools (multirank.py), closed at the end."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Calibrations cached on disk (sparsecp.models) go to a folder of this run's, inherited by every
# rank the tests spawn: no test reuses a fit from an earlier run, none is left in the home folder.
_CACHE_FOLDER = tempfile.mkdtemp(prefix="sparsecp-test-cache-")
os.environ["SPARSECP_CACHE_DIR"] = _CACHE_FOLDER


@pytest.fixture(scope="session", autouse=True)
def _close_rank_pools():
    yield
    if "multirank" in sys.modules:
        sys.modules["multirank"].close_pools()
    shutil.rmtree(_CACHE_FOLDER, ignore_errors=True)


def pytest_report_header(config):
    try:
        import sparsecp

        return (f"sparsecp {sparsecp.__version__} from {os.path.dirname(sparsecp.__file__)}, "
                f"kernel {sparsecp.kernel_isa()}")
    except Exception as error:  # pragma: no cover
        return f"sparsecp not importable: {error}"
