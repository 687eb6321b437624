"""Build kvcache_ext: setup.py drives CMakeLists.txt, the one place the build is described.

    pip install --no-build-isolation -e .      # or: python setup.py build_ext --inplace

Environment: MAX_JOBS (parallel compile jobs), TORCH_CUDA_ARCH_LIST (default "9.0"),
KVC_WITH_CUDA (ON / OFF / AUTO, default AUTO: CUDA kernels when torch is a CUDA build and nvcc
is found), CUDA_HOME (where nvcc lives), KVC_BUILD_DIR (CMake's build folder; default
build/temp.*/cmake: a second environment building from this tree, e.g. .venv-vllm against
another torch, gives its own so the two never share objects).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


def cmake_executable() -> str:
    """The cmake of the `cmake` Python package when installed (recent), else the one on PATH."""
    try:
        import cmake
        return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    except (ImportError, AttributeError):
        return "cmake"


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("KVC_BUILD_DIR") or Path(self.build_temp) / "cmake").resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            cmake_executable(), "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DKVC_WITH_CUDA={os.environ.get('KVC_WITH_CUDA', 'AUTO')}",
        ]
        env = dict(os.environ)
        # torch looks for nvcc on PATH, where it may be a wrapper script: prefer the toolkit.
        if not env.get("CUDA_HOME") and Path("/usr/local/cuda/bin/nvcc").exists():
            env["CUDA_HOME"] = "/usr/local/cuda"
        subprocess.check_call(args, env=env)
        jobs = env.get("MAX_JOBS") or str(os.cpu_count() or 1)
        subprocess.check_call([cmake_executable(), "--build", str(build_dir), "-j", jobs], env=env)


setup(
    name="kvcache_ext",
    version="0.1.0",
    description="Paged KV cache in one flat buffer: layouts, views and fused write/read kernels",
    packages=find_packages(include=["kvcache_ext", "kvcache_ext.*"]),
    ext_modules=[CMakeExtension("kvcache_ext._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch>=2.11"],
)
