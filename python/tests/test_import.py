"""Imports in fresh interpreters: `import sparsecp` needs no torch; `import sparsecp.torch`
without torch says what to install; torch and the extension load together in either order
(both link an OpenMP runtime) and their threaded kernels run side by side."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=environment)


BLOCK_TORCH = "import sys\nsys.modules['torch'] = None  # `import torch` raises ImportError\n"


def test_planning_needs_no_torch():
    done = run_python(BLOCK_TORCH + textwrap.dedent("""
        import sparsecp
        plan = sparsecp.plan([5000, 300, 2699, 1], 4, 4, "spill")
        route = sparsecp.route(plan, [5000, 300, 2699, 1], 4, 0, 4)
        assert route.send_rows.dtype.name == "int64"
        assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None and m.startswith("torch")]
        print("planned", plan.imbalance)
    """))
    assert done.returncode == 0, done.stderr
    assert "planned" in done.stdout


def test_torch_subpackage_says_torch_is_missing():
    done = run_python(BLOCK_TORCH + "import sparsecp.torch\n")
    assert done.returncode != 0
    assert "ImportError: sparsecp.torch needs PyTorch, which is not installed: pip install torch" in done.stderr


SIDE_BY_SIDE = """
    import sys, threading
    first, second = sys.argv_order
    for name in (first, second):
        __import__(name)
    import torch, sparsecp.torch as sct
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(1)
    query = torch.randint(-3, 4, (500, 4, 16), generator=generator).float()
    key = torch.randint(-3, 4, (400, 16), generator=generator).float()
    weights = torch.randint(-2, 3, (500, 4), generator=generator).float()
    segments = [(0, 500, 0, 250, 0)]  # a 500-token document at ratio 2: 250 keys
    one = sct.select_indices(query, key, weights, segments, 2, 32, threads=1)
    results = []
    def kernel():
        results.append(sct.select_indices(query, key, weights, segments, 2, 32, threads=2))
    workers = [threading.Thread(target=kernel) for _ in range(2)]
    for worker in workers:
        worker.start()
    product = (torch.randn(300, 300) @ torch.randn(300, 300)).sum()  # torch's own threads meanwhile
    for worker in workers:
        worker.join()
    assert all(torch.equal(r, one) for r in results) and torch.isfinite(product)
    print("ok", torch.get_num_threads())
"""


@pytest.mark.parametrize("order", [("torch", "sparsecp._core"), ("sparsecp._core", "torch")], ids=["torch-first",
                                                                                                  "sparsecp-first"])
def test_torch_and_extension_load_together(order):
    code = textwrap.dedent(SIDE_BY_SIDE).replace("sys.argv_order", repr(order))
    done = run_python(code, OMP_NUM_THREADS="2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")


def test_type_stubs_match_the_extension(tmp_path):
    """sparsecp/_core.pyi is what nanobind.stubgen writes for the built module (regenerate it
    with `python -m nanobind.stubgen -m sparsecp._core -o python/sparsecp/_core.pyi`)."""
    pytest.importorskip("nanobind")
    import sparsecp

    installed = os.path.join(os.path.dirname(sparsecp.__file__), "_core.pyi")
    assert os.path.exists(os.path.join(os.path.dirname(sparsecp.__file__), "py.typed"))
    done = subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "sparsecp._core", "-o",
                           str(tmp_path / "_core.pyi")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "_core.pyi").read_text() == open(installed).read()


def _import_graph(root: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in it: functions and TYPE_CHECKING
    blocks too), from the source, as ../shared/tools/import_circles.py (relative to the checkout) reads it: a
    package's own __init__ only hands names on to its children, so it is no edge."""
    import ast
    import pathlib

    base = pathlib.Path(root).parent
    found = {}
    for path in pathlib.Path(root).rglob("*.py"):
        name = ".".join(path.relative_to(base).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {module: set() for module in found}
    for module, path in found.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str | None] = []
            if isinstance(node, ast.ImportFrom):
                stem = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    stem = ".".join(parts + ([stem] if stem else []))
                targets = [next((c for c in (stem + "." + a.name, stem) if c in found), None) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if target in found and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def test_sparsecp_and_its_torch_package_import_in_layers():
    """Issue 31 item 5: no import circle (sparsecp.torch had six: _exchange, indexer_balance,
    _prebuilt and _replay among themselves, kl and ops): the route and exchange types at the
    bottom, the exchange, replay and prebuilt paths above, the seed's names on top.
    (sparsecp.models, issue 29's package, is left to its own test.)"""
    import pathlib

    import sparsecp

    graph = _import_graph(str(pathlib.Path(sparsecp.__file__).parent))
    graph = {m: {t for t in targets if not t.startswith("sparsecp.models")}
             for m, targets in graph.items() if not m.startswith("sparsecp.models")}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(stack[stack.index(target):] + [module, target])
            elif target not in state:
                visit(target, stack + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert circles == []
    below_the_seed = [m for m in graph if m.startswith("sparsecp.torch.") and m != "sparsecp.torch.indexer_balance"]
    assert not [m for m in below_the_seed if "sparsecp.torch.indexer_balance" in graph[m]]
