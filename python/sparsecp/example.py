"""Run sparsecp's examples from an installed package.

    python -m sparsecp.example                      # the examples, one line each, and their folder
    python -m sparsecp.example train_deepseek_v4 --ranks 2 --steps 4
    python -m sparsecp.example train_deepseek_v4 --help

The wheel carries the example scripts (``sparsecp/examples/``); in a source checkout they are
``python/examples/``. An example runs as its own script (``python <folder>/<name>.py ARGS``: the
examples spawn their own gloo ranks), so copy the folder to edit one. The repository's GPU check
of the model path (``gpu_attention_check.py``) needs the source tree's tests and is not shipped.
"""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

__all__ = ["examples_folder", "main"]

_HELPER = "cp_training_driver"  # shared by the two model examples, not run on its own


def examples_folder() -> Path:
    """Where the example scripts are: the installed package's ``examples/``, else the source
    tree's ``python/examples/``."""
    here = Path(__file__).resolve().parent
    for folder in (here / "examples", here.parent / "examples"):
        if (folder / "train_deepseek_v4.py").is_file():
            return folder
    raise FileNotFoundError(f"sparsecp's examples are neither in {here / 'examples'} (an installed wheel) nor in "
                            f"{here.parent / 'examples'} (a source checkout)")


def _summary(script: Path) -> str:
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    return doc.splitlines()[0] if doc else ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = examples_folder()
    names = sorted(p.stem for p in folder.glob("*.py") if p.stem != _HELPER and not p.stem.startswith("_"))
    if not args or args[0] in ("-h", "--help", "--list"):
        print(__doc__.strip().splitlines()[0])
        print(f"\nexamples in {folder}:")
        for name in names:
            print(f"  {name:24} {_summary(folder / f'{name}.py')}")
        print("\nrun one: python -m sparsecp.example NAME [ARGS]; NAME --help explains its options")
        return 0
    name = args[0].removesuffix(".py")
    if name not in names:
        print(f"sparsecp.example: no example {args[0]!r}; the examples: {', '.join(names)}", file=sys.stderr)
        return 2
    script = str(folder / f"{name}.py")
    os.execv(sys.executable, [sys.executable, script, *args[1:]])  # the script's own process: its ranks spawn it


if __name__ == "__main__":
    sys.exit(main())
