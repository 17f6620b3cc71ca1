"""Public modules name themselves as the home of what they export."""
from __future__ import annotations

from typing import Any


def publish(module_name: str, namespace: dict[str, Any]) -> None:
    """Sets ``__module__`` of each function and class ``namespace`` exports (``__all__``) that is
    defined in a private module of sparsecp (a ``_``-prefixed part, e.g. ``sparsecp.models._cp``)
    to ``module_name``, so that ``help()``, reprs and tracebacks' type names point where users
    import it from. Only objects whose ``__qualname__`` is their exported name, so that pickling
    by reference (``module_name.qualname``) finds them; the first public module to export an
    object is its home (``sparsecp.models`` before the per-model modules, which import it)."""
    for name in namespace.get("__all__", ()):
        obj = namespace.get(name)
        home = getattr(obj, "__module__", None)
        if not isinstance(home, str) or getattr(obj, "__qualname__", None) != name:
            continue
        parts = home.split(".")
        if parts[0] != "sparsecp" or not any(part.startswith("_") for part in parts[1:]):
            continue
        try:
            obj.__module__ = module_name
        except (AttributeError, TypeError):  # an extension function whose attributes are read-only
            pass
