"""The package's shape: no import cycle, light worker modules, modules of a readable size."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fgscale

PACKAGE = Path(fgscale.__file__).parent
MAX_LINES = 420


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _package_of(name: str, modules) -> str:
    """The package a module belongs to (a package's own __init__ belongs to itself)."""
    path = modules[name]
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, modules) -> set[str]:
    """fgscale modules that importing ``name`` runs, from any import statement in it (function
    bodies too): a module imported from outside its package also runs the package's __init__."""
    found = set()
    for node in ast.walk(ast.parse(modules[name].read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for target in targets:
            if target not in modules:
                continue
            found.add(target)
            package = _package_of(target, modules)
            if package != _package_of(name, modules):
                while package != "fgscale":
                    found.add(package)
                    package = package.rpartition(".")[0]
    found.discard(name)
    found.discard("fgscale")  # the top level imports nothing eagerly
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, modules) for name in modules}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("module", ["fgscale.images", "fgscale.store", "fgscale.grouping",
                                    "fgscale.grouping._dask_bank", "fgscale.store._convert",
                                    "fgscale._dask.client", "fgscale.estimators._params", "fgscale._dask.worker_signals"])
def test_worker_modules_import_no_torch_nor_sklearn(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('torch', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


def test_modules_are_short():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_subpackage_declares_its_public_names():
    for name, path in _modules().items():
        if path.name == "__init__.py" and name != "fgscale":
            module = __import__(name, fromlist=["__all__"])
            assert module.__all__, name
            for public in module.__all__:
                assert getattr(module, public) is not None, f"{name}.{public}"


def test_version_comes_from_the_installed_metadata():
    from importlib.metadata import version

    assert fgscale.__version__ == version("fgscale")
