"""What a wheel carries besides the code: its licence, metadata, type marker,
the cibuildwheel configuration, and the files a user reads next to it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ray_lite

CHECKOUT = Path(__file__).resolve().parents[2]
PYPROJECT = CHECKOUT / "pyproject.toml"


def pyproject():
    """The checkout's pyproject.toml, parsed (tomllib: Python 3.11+)."""
    if not PYPROJECT.is_file():
        pytest.skip("run from an installed package without its checkout")
    tomllib = pytest.importorskip("tomllib")
    with open(PYPROJECT, "rb") as f:
        return tomllib.load(f)


def supported_pythons(project):
    return [c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
            if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]


def test_the_installed_package_is_marked_typed():
    # PEP 561: without the marker, type checkers ignore the package's annotations.
    assert (Path(ray_lite.__file__).parent / "py.typed").is_file()


def test_the_licence_is_the_apache_licence_that_pyproject_declares():
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (CHECKOUT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("Copyright 2026 The ray_lite Authors\n")
    body = " ".join(text.split())
    assert "Apache License Version 2.0, January 2004" in body
    # The whole text, not an excerpt: its sections up to the end of the terms.
    for section in range(1, 10):
        assert f" {section}. " in body
    assert "END OF TERMS AND CONDITIONS" in body


def test_metadata_classifies_the_package():
    project = pyproject()["project"]
    classifiers = project["classifiers"]
    # PEP 639: a licence expression and a licence classifier together fail the build.
    assert not [c for c in classifiers if c.startswith("License ::")]
    for prefix in ("Development Status :: ", "Intended Audience :: ", "Topic :: ",
                   "Typing :: Typed", "Operating System :: POSIX :: Linux"):
        assert any(c.startswith(prefix) for c in classifiers), prefix
    assert project["authors"] and project["keywords"]
    # Placeholder addresses are worse than none.
    for url in project.get("urls", {}).values():
        assert url.startswith("https://") and "example" not in url


def test_py_typed_is_package_data_and_in_the_sdist():
    data = pyproject()
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["ray_lite"]
    manifest = (CHECKOUT / "MANIFEST.in").read_text(encoding="utf-8")
    assert re.search(r"^recursive-include ray_lite .*\bpy\.typed\b", manifest, re.M)
    assert re.search(r"^include .*\bLICENSE\b.*\bCHANGELOG\.md\b", manifest, re.M)


def test_the_docs_extra_installs_what_mkdocs_yml_uses():
    extra = pyproject()["project"]["optional-dependencies"]["docs"]
    names = {re.split(r"[<>=\[]", req, maxsplit=1)[0] for req in extra}
    assert names == {"mkdocs", "mkdocs-material", "mkdocstrings"}
    assert "mkdocstrings[python]>=0.26" in extra
    mkdocs_yml = (CHECKOUT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "name: material" in mkdocs_yml and "mkdocstrings" in mkdocs_yml


def test_cibuildwheel_builds_every_supported_python_for_both_architectures():
    data = pyproject()
    cibw = data["tool"]["cibuildwheel"]
    versions = supported_pythons(data["project"])
    assert versions, "no Python version classifiers"
    assert set(cibw["build"].split()) == {f"cp{v.replace('.', '')}-*" for v in versions}
    assert "*-musllinux_*" in cibw["skip"].split()
    assert set(data["tool"]["cibuildwheel"]["linux"]["archs"]) == {"x86_64", "aarch64"}

def test_the_build_needs_a_setuptools_that_reads_spdx_licences():
    requires = pyproject()["build-system"]["requires"]
    floor = [re.fullmatch(r"setuptools>=(\d+)(\.\d+)*", r) for r in requires]
    assert any(m and int(m.group(1)) >= 77 for m in floor), requires


def run_cibuildwheel_test_command(cwd, env):
    command = pyproject()["tool"]["cibuildwheel"]["test-command"]
    assert command.startswith("python -c ")
    # cibuildwheel runs it with the wheel's Python first on PATH, outside the checkout.
    env = dict(os.environ, **env)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run(["sh", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_cibuildwheel_test_command_passes_only_with_compiled_twins(twin, tmp_path):
    twin.check()
    env = {"RAY_LITE_NO_EXTENSIONS": "0" if twin.compiled else "1"}
    result = run_cibuildwheel_test_command(tmp_path, env)
    if twin.compiled:
        assert result.returncode == 0, result.stderr
        assert "compiled hot paths loaded from" in result.stdout
    else:
        assert result.returncode != 0
        assert "compiled hot paths did not load" in result.stderr


def test_the_changelog_keeps_a_changelog():
    path = CHECKOUT / "CHANGELOG.md"
    if not path.is_file():
        pytest.skip("run from an installed package without its checkout")
    text = path.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "[Unreleased]"
    for heading in headings[1:]:
        assert re.fullmatch(r"\[[0-9][0-9a-z.]*\] - \d{4}-\d{2}-\d{2}", heading), heading
    assert f"## [{pyproject()['project']['version']}] - " in text
    for section in re.findall(r"^### (.+)$", text, re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_contributing_says_how_to_build_test_and_run_ci():
    path = CHECKOUT / "CONTRIBUTING.md"
    if not path.is_file():
        pytest.skip("run from an installed package without its checkout")
    text = path.read_text(encoding="utf-8")
    for needed in ("pip install -e", "RAY_LITE_NO_EXTENSIONS=1", "USING_EXTENSIONS",
                   "mkdocs build --strict", "tests/package/test_docs.py", "ray-lite bench",
                   "bash .ci/run", "twine check", "auditwheel show"):
        assert needed in text, needed
