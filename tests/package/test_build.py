"""The package is built the way it should be."""
import importlib
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

import ray_lite._fast as fast
from ray_lite._fast import NO_EXTENSIONS

HOT_PATHS = ["broadcast", "codec", "http_conn", "link", "pool_book", "ring", "stream_table",
             "task_runner"]


def test_compiled_twins_loaded_unless_disabled():
    # A wheel built with a compiler must run the compiled hot paths: a silent
    # fallback to Python would cost an order of magnitude unnoticed.
    if NO_EXTENSIONS:
        assert not fast.USING_EXTENSIONS
    else:
        assert fast.USING_EXTENSIONS, {
            name: importlib.import_module(f"ray_lite._fast.{name}").COMPILED for name in HOT_PATHS
        }


def test_twins_export_the_same_names():
    for name in HOT_PATHS:
        py = importlib.import_module(f"ray_lite._fast._{name}_py")
        public = {n for n in getattr(py, "__all__", []) }
        assert public, f"_{name}_py must declare __all__"
        if not NO_EXTENSIONS:
            c = importlib.import_module(f"ray_lite._fast._{name}_c")
            missing = {n for n in public if not hasattr(c, n)}
            assert not missing, f"_{name}_c lacks {sorted(missing)}"


# The Pythons ray_lite supports: 3.9 is past its end of life and lacks
# os.eventfd, which the runtime needs.
SUPPORTED = ["3.10", "3.11", "3.12", "3.13"]
CHECKOUT = Path(__file__).resolve().parents[2]
README = CHECKOUT / "README.md"
PYPROJECT = CHECKOUT / "pyproject.toml"


def python_metadata():
    """(Requires-Python, [x.y of each classifier]) from the checkout's
    pyproject.toml, or from the installed package's metadata when the tests
    run without the checkout.  (No tomllib: it is new in 3.11.)"""
    if PYPROJECT.is_file():
        text = PYPROJECT.read_text(encoding="utf-8")
        requires = re.search(r'^requires-python\s*=\s*"([^"]*)"', text, re.M).group(1)
        classifiers = re.findall(r'"(Programming Language :: Python :: [^"]*)"', text)
    else:
        meta = importlib.metadata.metadata("ray_lite")
        requires, classifiers = meta["Requires-Python"], meta.get_all("Classifier")
    versions = [c.rsplit(" :: ", 1)[1] for c in classifiers
                if c.startswith("Programming Language :: Python :: 3.")]
    return requires, versions


def test_metadata_refuses_pythons_older_than_the_oldest_supported():
    # pip reads Requires-Python and refuses an install on an older Python
    # with its own message, instead of a failure at run time.
    requires, versions = python_metadata()
    assert requires == f">={SUPPORTED[0]}"
    assert versions == SUPPORTED
    assert sys.version_info >= tuple(int(p) for p in SUPPORTED[0].split("."))


def test_readme_states_the_supported_pythons():
    if not README.is_file():
        pytest.skip("run from an installed package without its checkout")
    text = README.read_text(encoding="utf-8")
    assert f"Python {SUPPORTED[0]}–{SUPPORTED[-1]}" in " ".join(text.split())
