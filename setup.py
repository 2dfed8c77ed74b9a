"""Build script: the Cython hot paths under ray_lite/_fast (and the compiled
micro-benchmark) are optional extensions.

RAY_LITE_NO_EXTENSIONS=1 at build time skips them and gives a pure-Python
install; every module then falls back to its ``_x_py.py`` twin.
"""
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
NO_EXTENSIONS = os.environ.get("RAY_LITE_NO_EXTENSIONS", "") not in ("", "0")


def extensions():
    if NO_EXTENSIONS or sys.implementation.name != "cpython":
        return []
    from Cython.Build import cythonize
    from setuptools import Extension

    pyx_files = sorted(HERE.glob("ray_lite/_fast/*.pyx")) + sorted(HERE.glob("ray_lite/bench/*.pyx"))
    exts = [
        Extension(
            ".".join(p.relative_to(HERE).with_suffix("").parts),
            [str(p.relative_to(HERE))],
            extra_compile_args=["-O3"],
        )
        for p in pyx_files
    ]
    return cythonize(
        exts,
        # Translating .pyx to C and compiling C are both per module: one job
        # per core halves a build on two (CI builds a wheel per Python).
        nthreads=os.cpu_count() or 1,
        compiler_directives={"language_level": "3"},
        # Annotated HTML is a developer aid; generate it with `cython -a` by hand.
        annotate=False,
    )


class ParallelBuildExt(build_ext):
    """``build_ext`` compiling the extensions in parallel unless told
    otherwise (``--parallel N``)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


setup(ext_modules=extensions(), cmdclass={"build_ext": ParallelBuildExt})
