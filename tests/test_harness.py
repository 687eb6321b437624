"""The engine harness is a package of its own (harness/kvc_harness) that tests and benchmarks
import by name: no module of the tree edits sys.path, kvcache_ext never imports the harness, and
the benchmarks use only kvcache_ext's public names (no underscore name of it)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for d in ("kvcache_ext", "tests", "benchmarks", "harness", "scripts")
           for p in sorted((ROOT / d).rglob("*.py"))]


def test_no_module_edits_sys_path():
    bad = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("insert", "append", "extend")
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "path"
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, bad


def test_the_harness_is_a_package_that_the_library_never_imports():
    assert (ROOT / "harness" / "kvc_harness" / "__init__.py").exists()
    assert not (ROOT / "benchmarks" / "engines.py").exists()
    for path in sorted((ROOT / "kvcache_ext").rglob("*.py")):
        assert "kvc_harness" not in path.read_text(), path


def underscore_uses(tree: ast.Module) -> list[str]:
    """Underscore names of kvcache_ext a module uses: imported by name, or read as an attribute
    of a name bound to one of kvcache_ext's modules."""
    aliases: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "kvcache_ext":
                    aliases.add((a.asname or a.name).split(".")[0])
                    found += [f"import {a.name}" for part in a.name.split(".") if part.startswith("_")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kvcache_ext":
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") or any(p.startswith("_") for p in node.module.split("."))]
            aliases.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            found.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    return found


def test_benchmarks_use_no_underscore_name_of_kvcache_ext():
    bad = {str(p.relative_to(ROOT)): u for p in sorted((ROOT / "benchmarks").rglob("*.py"))
           if (u := underscore_uses(ast.parse(p.read_text())))}
    assert not bad, bad


def test_the_check_sees_an_underscore_name():
    code = ("import kvcache_ext as kvc\nfrom kvcache_ext.vllm.side_channel import _HEADER\n"
            "import kvcache_ext.nixl as kn\nx = kn._agent\ny = kvc.plan_cache\n")
    assert underscore_uses(ast.parse(code)) == [
        "from kvcache_ext.vllm.side_channel import _HEADER", "kn._agent (line 4)"]
