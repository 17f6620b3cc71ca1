"""Public modules name themselves as the home of what they export."""
from __future__ import annotations

import sys
import typing
from typing import Any


def publish(module_name: str, namespace: dict[str, Any]) -> None:
    """Sets ``__module__`` of each function and class ``namespace`` exports (``__all__``) that is
    defined in a private Python module of sparsecp (a ``_``-prefixed part, e.g.
    ``sparsecp.models._cp``; not the extension ``sparsecp._core``) to ``module_name``, so that
    ``help()``, reprs and tracebacks' type names point where users import it from. Only objects
    whose ``__qualname__`` is their exported name, so that pickling by reference
    (``module_name.qualname``) finds them; the first public module to export an object is its
    home (``sparsecp.models`` before the per-model modules, which import it). A class whose
    annotations name types the public module does not define keeps its module, so that
    ``typing.get_type_hints`` still resolves them."""
    for name in namespace.get("__all__", ()):
        obj = namespace.get(name)
        home = getattr(obj, "__module__", None)
        if not isinstance(home, str) or getattr(obj, "__qualname__", None) != name:
            continue
        parts = home.split(".")
        if parts[0] != "sparsecp" or not any(part.startswith("_") for part in parts[1:]):
            continue
        if not str(getattr(sys.modules.get(home), "__file__", "")).endswith(".py"):
            continue  # the extension's own (nanobind's stubs and pickles name them by their module)
        cls = obj if isinstance(obj, type) else None
        resolvable = cls is not None and _hints_resolve(cls)
        try:
            obj.__module__ = module_name
        except (AttributeError, TypeError):  # an extension function whose attributes are read-only
            continue
        if cls is not None and resolvable and not _hints_resolve(cls):
            # typing.get_type_hints resolves a class's string annotations in the namespace of
            # its __module__: one that names private types keeps its defining module.
            obj.__module__ = home


def _hints_resolve(cls: type) -> bool:
    try:
        typing.get_type_hints(cls)
    except Exception:  # NameError for a name the module does not define, or anything the hints raise
        return False
    return True
