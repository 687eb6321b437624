"""The package is built in layers (kvcache_ext/__init__.py): every import of every module -- those
inside functions included -- goes to the same layer or one below it, and no chain of imports
comes back to where it started. Read from the source (ast), so a lazy import inside a function
counts as much as one at the top of a file."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kvcache_ext"
NAME = "kvcache_ext"

# Layers, bottom up: a module may import from its own layer and the ones below.
LAYERS = {
    "_C": 0,
    "plan": 1,
    "cache": 2,
    "reference": 3, "reference_v4": 3,
    "ops": 4, "ops_v4": 4,
    "transfer": 5,
    "nixl": 6, "hf": 6, "models": 6, "vllm": 6,
    "viz": 7,
    "cli": 8, "__main__": 8,
}
FACADE = 9  # kvcache_ext/__init__.py: the public names, above everything


def modules(pkg: Path = PKG) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__.py)."""
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return FACADE
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module} is in no layer: add kvcache_ext/{parts[1]} to LAYERS "
                             f"(and to kvcache_ext/__init__.py's list)")
    return LAYERS[parts[1]]


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `module` imports, anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # `from X import y` imports the module X.y when there is one, else (a name of) X
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import a.b.c` imports a.b.c; names inside resolve up
                t = t.rpartition(".")[0]
            if t and t != module and t.split(".")[0] == NAME:
                found.add(t)
    return found


def graph(pkg: Path = PKG) -> dict[str, set[str]]:
    known = modules(pkg)
    sources = dict(known)
    known[f"{NAME}._C"] = None  # the compiled library: the bottom layer, no Python source
    return {m: imports(m, p, known) for m, p in sources.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, targets in g.items():
        for t in targets:
            if t == NAME and m != NAME:
                bad.append(f"{m} imports the package facade kvcache_ext (import from the layer "
                           f"module instead)")
            elif layer_of(t) > layer_of(m):
                bad.append(f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})")
    return sorted(bad)


def test_no_import_goes_up_a_layer():
    assert violations(graph()) == []


def test_no_import_circle():
    assert cycles(graph()) == []


def test_every_module_is_in_a_layer():
    for m in modules():
        layer_of(m)


def test_the_checker_sees_circles_and_upward_imports(tmp_path):
    """The walk itself: a package with a circle through a function-level import, and an import
    from a lower layer to a higher one, is caught on both counts."""
    pkg = tmp_path / NAME
    for sub in ("plan", "ops", "cli"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from . import plan\n")
    (pkg / "plan" / "layout.py").write_text("def f():\n    from .groups import g\n")
    (pkg / "plan" / "groups.py").write_text("from .layout import f\n")
    (pkg / "ops" / "wrap.py").write_text("from ..cli import main\n")
    g = graph(pkg)
    assert cycles(g) == [["kvcache_ext.plan.groups", "kvcache_ext.plan.layout"]]
    assert violations(g) == ["kvcache_ext.ops.wrap (layer 4) imports kvcache_ext.cli (layer 8)"]


@pytest.mark.parametrize("flat", ["layout.py", "groups.py"])
def test_a_flat_module_is_in_no_layer(tmp_path, flat):
    """The flat package of old (layout.py beside groups.py at the top) is refused."""
    pkg = tmp_path / NAME
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / flat).write_text("")
    with pytest.raises(AssertionError, match="is in no layer"):
        for m in modules(pkg):
            layer_of(m)


SOURCE_ROOT = PKG.parent
MAX_LINES = 400


def long_sources(root: Path) -> list[str]:
    """Source files of the package, the C++/CUDA code and the benchmarks over MAX_LINES lines."""
    found = []
    for folder in ("kvcache_ext", "csrc", "benchmarks"):
        for f in sorted((root / folder).rglob("*")):
            if f.suffix in {".py", ".cpp", ".h", ".cu", ".cuh", ".sh"} and "__pycache__" not in f.parts:
                n = len(f.read_text().splitlines())
                if n > MAX_LINES:
                    found.append(f"{f.relative_to(root)}: {n} lines")
    return found


def test_no_source_file_holds_two_concerns_by_size():
    """A file past MAX_LINES probably holds two concerns (tests may be longer)."""
    assert long_sources(SOURCE_ROOT) == []


def test_the_size_check_sees_a_long_file(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "big.cpp").write_text("int x;\n" * (MAX_LINES + 1))
    assert long_sources(tmp_path) == [f"csrc/big.cpp: {MAX_LINES + 1} lines"]


def test_import_kvcache_ext_loads_no_module_that_imports_numpy():
    """torch is the one dependency (setup.py): every module `import kvcache_ext` loads -- and the
    transfer planner's runs-table pool a first token_runs loads -- imports neither numpy nor any
    other package outside torch and the standard library (numpy-based modules, e.g.
    transfer.pack, the nixl integration, load only when asked for)."""
    import subprocess
    code = ("import sys, torch, kvcache_ext as kvc\n"
            "s = kvc.CacheSpec('kv', 64, 1, 1)\n"
            "kvc.TransferPlan(kvc.plan_cache([s], 8, 4), kvc.plan_cache([s], 8, 8)).token_runs("
            "torch.arange(8), torch.arange(4), 30)\n"
            "print('\\n'.join(m.__file__ for n, m in sys.modules.items()\n"
            "                 if n.startswith('kvcache_ext') and getattr(m, '__file__', None)\n"
            "                 and m.__file__.endswith('.py')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    files = out.stdout.split()
    assert any(f.endswith("transfer/scratch.py") for f in files), files
    allowed = set(sys.stdlib_module_names) | {"torch", "kvcache_ext", "__future__"}
    bad = []
    for f in files:
        for node in ast.walk(ast.parse(Path(f).read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [])
            bad += [f"{f}: {n}" for n in names if n and n.split(".")[0] not in allowed]
    assert bad == []
