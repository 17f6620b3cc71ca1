"""Load the re-indented seed module (see reindent.py) from an explicit path."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType


def load_seed(path: str | pathlib.Path) -> ModuleType:
    """Import `indexer_balance_seed.py` written by reindent.py, wherever it lies."""
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise SystemExit(f"{path}: no seed module; run tools/golden/reindent.py SEED_FILE /tmp/seedref first")
    spec = importlib.util.spec_from_file_location("indexer_balance_seed", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
