"""The kvcache_ext these tests import is .venv-vllm's own build of this very tree: a stale copy
(installed before the tree changed) would test other code than the tree's."""
from __future__ import annotations

from pathlib import Path

import kvcache_ext


def test_installed_package_is_the_trees(tree: Path) -> None:
    installed = Path(kvcache_ext.__file__).resolve().parent
    source = tree / "kvcache_ext"
    assert installed != source.resolve(), "the tree's own package was imported, not the build"
    def same(p: Path) -> bool:
        copy = installed / p.relative_to(source)
        return copy.is_file() and copy.read_bytes() == p.read_bytes()
    stale = [str(p.relative_to(source)) for p in sorted(source.rglob("*.py")) if not same(p)]
    assert not stale, (f"{installed} differs from the tree in {stale}: reinstall it "
                       f"(scripts/setup.sh, or KVC_BUILD_DIR=build/vllm-env KVC_WITH_CUDA=OFF "
                       f".venv-vllm/bin/python -m pip install --no-build-isolation --no-deps "
                       f"--force-reinstall .)")
