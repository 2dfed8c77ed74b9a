"""The documentation's code runs, and the manual's pages and nav agree.

Every ```python block of README.md and docs/**/*.md runs as its own script in
a fresh process (the installed ray_lite, a fresh temporary directory as the
working directory), unless the line right before its fence is
``<!-- skip: reason -->``.  Every ``8000`` in a block becomes a free loopback
port first, so Serve examples may say port 8000 and still run beside another
test session.  A block must exit 0 and leave no process behind.

From an installed package without the checkout (no README.md or docs/), the
tests skip.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK_TIMEOUT_S = 120

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)```python\s*$")
_SKIP = re.compile(r"^\s*<!--\s*skip:\s*(?P<reason>.+?)\s*-->\s*$")


def _markdown_files():
    files = []
    if (ROOT / "README.md").is_file():
        files.append(ROOT / "README.md")
    if DOCS.is_dir():
        files.extend(sorted(DOCS.rglob("*.md")))
    return files


def code_blocks(path):
    """``(line, code, skip_reason)`` for each ```python block of ``path``;
    ``line`` is the fence's line number (1-based)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        indent = opened.group("indent")
        start = i
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        if i >= len(lines):
            raise AssertionError(f"{path}:{start + 1}: a ```python block is never closed")
        skip = _SKIP.match(lines[start - 1]) if start > 0 else None
        blocks.append((start + 1, "\n".join(body) + "\n", skip.group("reason") if skip else None))
        i += 1
    return blocks


def _block_params():
    params = []
    for path in _markdown_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, code, skip in code_blocks(path):
            marks = [pytest.mark.skip(reason=skip)] if skip else []
            params.append(pytest.param(code, id=f"{rel}:{line}", marks=marks))
    return params


_BLOCKS = _block_params()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_members(sid):
    """PIDs of live processes in session ``sid`` (zombies excluded)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        # fields: state, ppid, pgrp, session, ...
        if fields[0] != b"Z" and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def _left_running(sid, grace_s=10.0):
    """What of session ``sid`` still runs ``grace_s`` after its leader ended:
    a helper that ends by itself once its parent is gone (multiprocessing's
    resource tracker) may take a moment to notice."""
    deadline = time.monotonic() + grace_s
    while True:
        left = _session_members(sid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _kill_session(sid):
    for pid in _session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not _BLOCKS, reason="README.md and docs/ are not here (an installed run)")
@pytest.mark.parametrize("code", _BLOCKS or [None])
def test_code_block_runs(code, tmp_path):
    code = re.sub(r"\b8000\b", str(_free_port()), code)
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    work = tmp_path / "cwd"
    work.mkdir()
    # The block imports what this test session imports (the installed ray_lite).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("RAY_LITE_BACKEND", None)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the block ran over {BLOCK_TIMEOUT_S} s\n--- stdout\n{out}\n--- stderr\n{err}",
                    pytrace=False)
    left = _left_running(proc.pid)
    _kill_session(proc.pid)
    assert proc.returncode == 0, (
        f"the block exited {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")
    assert not left, f"the block left processes running: {left}\n--- stderr\n{err}"


def _nav_pages(mkdocs_yml):
    """The .md files mkdocs.yml's nav names, in order."""
    pages = []
    in_nav = False
    for line in mkdocs_yml.read_text(encoding="utf-8").splitlines():
        if re.match(r"^nav:\s*$", line):
            in_nav = True
            continue
        if in_nav:
            if line and not line[0].isspace():
                break
            found = re.search(r"(?:^\s*-\s+|:\s+)([\w./-]+\.md)\s*$", line)
            if found:
                pages.append(found.group(1))
    return pages


@pytest.mark.skipif(not (ROOT / "mkdocs.yml").is_file() or not DOCS.is_dir(),
                    reason="mkdocs.yml and docs/ are not here (an installed run)")
def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = _nav_pages(ROOT / "mkdocs.yml")
    assert nav, "mkdocs.yml has no nav"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(set(nav) - pages) == [], "nav entries without a page"
    assert sorted(pages - set(nav)) == [], "pages missing from the nav"
    assert len(nav) == len(set(nav)), "a page appears twice in the nav"


def test_code_blocks_are_found(tmp_path):
    # The extractor itself: a skip comment, an indented block, other languages.
    doc = tmp_path / "x.md"
    doc.write_text("text\n```python\nprint(1)\n```\n<!-- skip: needs a GPU -->\n"
                   "```python\nimport torch\n```\n```bash\nls\n```\n"
                   "!!! note\n    ```python\n    if True:\n        x = 8000\n    ```\n")
    assert code_blocks(doc) == [
        (2, "print(1)\n", None),
        (6, "import torch\n", "needs a GPU"),
        (13, "if True:\n    x = 8000\n", None),
    ]


@pytest.mark.skipif(not (DOCS / "hooks" / "config_table.py").is_file(),
                    reason="docs/ is not here (an installed run)")
def test_configuration_page_gets_every_variable_from_config():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_docs_config_hook",
                                                  DOCS / "hooks" / "config_table.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook.MARKER in (DOCS / "configuration.md").read_text(encoding="utf-8")
    config = hook._load_config_module(str(ROOT / "mkdocs.yml"))
    table = hook.config_table(config.VARIABLES).splitlines()
    assert len(table) == 2 + len(config.VARIABLES)
    for var, row in zip(config.VARIABLES, table[2:]):
        assert row.startswith(f"| `{var.name}` |")
        assert var.name.startswith("RAY_LITE_")
