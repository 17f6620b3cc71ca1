"""One validation rule for the integer arguments of every public entry point.

An integer argument is a Python ``int`` or a numpy integer: never a ``bool`` (``True``
would run as 1), never a float (``10.0`` or ``0.9`` would be truncated), never a string
(``"8"`` would be parsed). Each error names the parameter and the value, e.g.
``ratio=True: expected an integer (int or numpy integer), got bool`` or
``head_dim=0: must be at least 1``. The error is an ``IntegerArgumentError``, both a
``ValueError`` (what the seed raises for its own bad options) and a ``TypeError`` (what
Python raises for a wrong type), so either ``except`` clause catches it.

Entry points whose option has a text in hyper_parallel's ``indexer_balance`` (block size,
hybrid threshold) keep the seed's text; everything else uses these.
"""
from __future__ import annotations

from typing import Any

import numpy as np

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

__all__ = ["IntegerArgumentError", "integer", "integer_list", "integer_table", "optional_integer", "real"]


class IntegerArgumentError(ValueError, TypeError):
    """An integer argument that is not an integer, or is out of range."""


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any, minimum: int | None = None, maximum: int = _INT64_MAX) -> int:
    """``value`` as a Python int, or IntegerArgumentError naming ``name`` and the value.

    Args:
        name: The parameter's name, as the caller wrote it (``"ratio"``).
        value: What was passed.
        minimum: The smallest accepted value (None: any that fits int64).
        maximum: The largest accepted value (default: the int64 maximum).
    """
    if not _is_integer(value):
        raise IntegerArgumentError(f"{name}={value!r}: expected an integer (int or numpy integer), "
                                   f"got {type(value).__name__}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise IntegerArgumentError(f"{name}={number}: must be at least {minimum}")
    if number > maximum or number < _INT64_MIN:
        limit = "a 64-bit integer" if maximum == _INT64_MAX else f"at most {maximum}"
        raise IntegerArgumentError(f"{name}={number}: must be {limit}")
    return number


def optional_integer(name: str, value: Any, minimum: int | None = None) -> int | None:
    """None stays None (an omitted option); anything else as ``integer``."""
    return None if value is None else integer(name, value, minimum)


def real(name: str, value: Any) -> float:
    """A real-valued argument: int, float or numpy number, never a bool or a string."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise IntegerArgumentError(f"{name}={value!r}: expected a number, got {type(value).__name__}")
    return float(value)


def integer_list(name: str, values: Any, minimum: int | None = None) -> tuple[int, ...]:
    """A sequence of integers (document lengths, boundaries) as a tuple of Python ints;
    the error names the entry: ``lengths[2]=32.7: expected an integer ...``."""
    if isinstance(values, (str, bytes)):
        raise IntegerArgumentError(f"{name}={values!r}: expected a sequence of integers, got {type(values).__name__}")
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu" and values.ndim == 1:
        array = values.astype(np.int64, copy=False)
        if minimum is not None and len(array) and array.min() < minimum:
            index = int(np.flatnonzero(array < minimum)[0])
            raise IntegerArgumentError(f"{name}[{index}]={int(array[index])}: must be at least {minimum}")
        return tuple(array.tolist())
    try:
        items = list(values)
    except TypeError:
        raise IntegerArgumentError(f"{name}={values!r}: expected a sequence of integers, "
                                   f"got {type(values).__name__}") from None
    return tuple(integer(f"{name}[{index}]", item, minimum) for index, item in enumerate(items))


def integer_table(name: str, values: Any, columns: int) -> np.ndarray:
    """A [n, columns] table of integers (e.g. segments) as a C-contiguous int64 array.

    Integer numpy arrays and torch tensors pass as they are; lists of tuples are checked
    entry by entry (``segments[0][1]=32.7: expected an integer ...``).
    """
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise IntegerArgumentError(f"{name}: expected an integer array, got dtype {values.dtype}")
        return np.ascontiguousarray(values, dtype=np.int64)
    if hasattr(values, "dtype") and hasattr(values, "numpy"):  # a torch tensor, without importing torch
        if values.is_floating_point() or values.is_complex() or str(values.dtype) == "torch.bool":
            raise IntegerArgumentError(f"{name}: expected an integer tensor, got dtype {values.dtype}")
        return np.ascontiguousarray(values.detach().cpu().numpy(), dtype=np.int64)
    rows = []
    for index, row in enumerate(values):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__iter__"):
            raise IntegerArgumentError(f"{name}[{index}]={row!r}: expected {columns} integers")
        rows.append([integer(f"{name}[{index}][{column}]", item) for column, item in enumerate(row)])
    if any(len(row) != columns for row in rows):
        return np.zeros((len(rows), 0), dtype=np.int64)  # the caller reports the shape
    return np.array(rows, dtype=np.int64).reshape(len(rows), columns)
