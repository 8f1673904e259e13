"""The package's shape: folders that read as the data flow, no import cycle, no library module
importing the command line, no module using another package's private names, light worker
modules. Size is guarded by ruff's complexity rules (pyproject.toml), not by a line count."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fgscale

PACKAGE = Path(fgscale.__file__).parent


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
                                    "fgscale._dask.client", "fgscale._dask.worker_signals",
                                    "fgscale._utils.checks", "fgscale.estimators._params",
                                    "fgscale.runs._listing", "fgscale.runs._bids_inputs"])
def test_worker_modules_import_no_torch_nor_sklearn(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('torch', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imports {out.stdout.strip()}"


# beside __init__ and __main__, the top level holds subpackages and at most these modules
TOP_LEVEL_MODULES = {"demo"}


def test_the_top_level_holds_subpackages():
    loose = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert loose <= TOP_LEVEL_MODULES and len(TOP_LEVEL_MODULES) <= 2, loose


def test_no_library_module_imports_the_command_line():
    modules = _modules()
    # __main__ is `python -m fgscale`: the command line's entry point, as fgscale.cli is
    importers = {name for name in modules if not name.startswith("fgscale.cli")
                 and name != "fgscale.__main__"
                 and any(t == "fgscale.cli" or t.startswith("fgscale.cli.")
                         for t in _imports(name, modules))}
    assert importers == set()


# private names of the standard library that are documented, or without a public way: argparse
# lists a parser's actions only in its private _actions
STDLIB_PRIVATE = {"_exit", "_getframe", "_actions", "_SubParsersAction"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _owner(module: str) -> str:
    """The package whose private names a module may use: its own subpackage (fgscale.store for
    fgscale.store._reader); fgscale's private packages (_dask, _utils) are shared by all."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and not _private(parts[1]) else "fgscale"


def _defined_names(path: Path) -> set[str]:
    """The names a module defines: functions, classes, their methods, attributes it assigns."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _private_uses(path: Path, module: str, owned: set[str]) -> list[str]:
    """Another package's private names that ``path`` imports or calls: ``from pkg import _x``
    or ``import pkg._x.y`` with pkg not its own (third-party packages included), and
    ``obj._x`` where no module of its own package defines ``_x``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            own = node.module.startswith("fgscale") and _owner(node.module) in (_owner(module),
                                                                               "fgscale")
            private_path = any(_private(part) for part in node.module.split(".")[1:])
            if node.module.startswith("fgscale"):
                private_path = private_path and not own and _owner(node.module) != "fgscale"
            if not own and any(_private(alias.name) for alias in node.names):
                found.append(f"from {node.module} import "
                             + ", ".join(a.name for a in node.names if _private(a.name)))
            elif private_path and not node.module.startswith("fgscale"):
                found.append(f"from {node.module} import ...")
        elif (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in owned
              and node.attr not in STDLIB_PRIVATE):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_no_module_uses_another_packages_private_names():
    modules = _modules()
    owned: dict[str, set[str]] = {}
    for name, path in modules.items():
        owned.setdefault(_owner(name), set()).update(_defined_names(path))
    uses = {name: found for name, path in modules.items()
            if (found := _private_uses(path, name, owned[_owner(name)] | owned["fgscale"]))}
    assert uses == {}


def test_the_private_names_check_finds_them(tmp_path):
    code = tmp_path / "m.py"
    code.write_text("from sklearn.utils.validation import _num_samples\n"
                    "from fgscale.training._loop import _snapshot\n"
                    "from fgscale.store import open_store\n"
                    "clf._check_params()\n")
    found = _private_uses(code, "fgscale.runs._train", {"_own"})
    assert found == ["from sklearn.utils.validation import _num_samples",
                     "from fgscale.training._loop import _snapshot", "line 4: ._check_params"]
    assert _private_uses(code, "fgscale.training._other", {"_check_params"}) == [
        "from sklearn.utils.validation import _num_samples"]


def test_every_subpackage_declares_its_public_names():
    for name, path in _modules().items():
        # fgscale._dask and fgscale._utils are private: their modules are imported by name
        if path.name == "__init__.py" and name != "fgscale" and not _private(name.split(".")[1]):
            module = __import__(name, fromlist=["__all__"])
            assert module.__all__, name
            for public in module.__all__:
                assert getattr(module, public) is not None, f"{name}.{public}"


def test_version_comes_from_the_installed_metadata():
    from importlib.metadata import version

    assert fgscale.__version__ == version("fgscale")
