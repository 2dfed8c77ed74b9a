"""ray_lite's layers: every import runs down the layer map, and none closes a circle.

An AST walk over every ``.py`` module of ``ray_lite/`` collects its imports of
ray_lite modules: module-level *and* inside functions (a lazy import is still
an arrow), ``import a.b``, ``from a import b`` (an arrow to ``a.b`` when it
is a module, else to ``a``), relative forms, and ``lazy_module("ray_lite.x")``.
The implicit import of a package's ``__init__`` by its submodules is not an
arrow.  ``.pyx`` files are scanned for ``ray_lite`` imports the same way as
far as their Python syntax goes (they are checked by text, below).

Two rules, checked over that graph:

(a) **Direction.**  ``LAYERS`` lists the layers from the bottom up; a module
    may import modules of its own layer or of a layer below, never above.
(b) **No circle**, at two granularities:
    - between *modules*: every module of ``ray_lite/``, a package's
      ``__init__`` counted as the package;
    - between *units*: each ``LAYERS`` entry (a ``_private`` package, a
      top-level module or package of ray_lite) is one unit, so that two
      units of one layer cannot lean on each other either.
(c) **The docstrings say it.**  Each ``_private`` package's ``__init__``
    lists what it may import ("May import: ..."); its modules import nothing
    else.
"""
import ast
import pathlib
import re

import pytest

import ray_lite

PKG = pathlib.Path(ray_lite.__file__).parent

# From the bottom up.  A name stands for the module or package and everything in it.
LAYERS = [
    ("base", ["ray_lite._version", "ray_lite._config", "ray_lite._lazy"]),
    ("compiled hot paths", ["ray_lite._fast"]),
    ("errors", ["ray_lite.exceptions"]),
    ("core: process", ["ray_lite._private", "ray_lite._private.process"]),
    ("core: links", ["ray_lite._private.links"]),
    ("core: objects", ["ray_lite._private.objects"]),
    ("core: job", ["ray_lite._private.job"]),
    ("core: scheduling", ["ray_lite._private.scheduling"]),
    ("core: actors", ["ray_lite._private.actors"]),
    ("core: node", ["ray_lite._private.node"]),
    ("core: api", ["ray_lite._private.api"]),
    ("Ray engine", ["ray_lite._ray"]),
    ("public API", ["ray_lite", "ray_lite.actor", "ray_lite.remote_function",
                    "ray_lite.runtime_context", "ray_lite.runtime_env", "ray_lite.job_config",
                    "ray_lite.message_queue", "ray_lite._raylet"]),
    ("libraries", ["ray_lite.util", "ray_lite.dag", "ray_lite.executor"]),
    ("serve", ["ray_lite.serve"]),
    ("examples", ["ray_lite._examples"]),
    ("tools", ["ray_lite.bench", "ray_lite.scripts", "ray_lite.dashboard"]),
]

# Circles between modules inside one unit that its owner is breaking apart;
# each entry names the unit.  Empty when every circle is gone.
KNOWN_MODULE_CIRCLES_INSIDE = set()


def _unit_of(module):
    """The ``LAYERS`` entry ``module`` belongs to (the longest that contains it)."""
    best = None
    for _, names in LAYERS:
        for name in names:
            if (module == name or module.startswith(name + ".")) and \
                    (best is None or len(name) > len(best)):
                best = name
    return best


def _rank():
    return {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def _module_files():
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(name, path, known):
    """The ray_lite modules ``name`` (at ``path``) imports, anywhere in it."""
    is_pkg = path.name == "__init__.py"
    found = set()

    def add(target):
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target.split(".")[0] == "ray_lite" and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                add(sub if sub in known else module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            add(node.args[0].value)
    return found


def import_graph():
    mods = _module_files()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def find_cycle(graph):
    """One circle of ``graph`` (a list that starts and ends with one node), or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def upward_imports(graph):
    rank = _rank()
    out = []
    for mod, targets in graph.items():
        for target in targets:
            if rank[_unit_of(target)] > rank[_unit_of(mod)]:
                out.append(f"{mod} -> {target}")
    return sorted(out)


def test_every_module_is_in_a_layer():
    assert [m for m in import_graph() if _unit_of(m) is None] == []


def test_no_import_runs_up_a_layer():
    assert upward_imports(import_graph()) == []


def test_no_circle_between_modules():
    graph = import_graph()
    for unit in KNOWN_MODULE_CIRCLES_INSIDE:
        for m in graph:
            if _unit_of(m) == unit:
                graph[m] = {t for t in graph[m] if _unit_of(t) != unit}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_circle_between_units():
    units = {}
    for mod, targets in import_graph().items():
        units.setdefault(_unit_of(mod), set()).update(
            u for u in map(_unit_of, targets) if u != _unit_of(mod))
    cycle = find_cycle(units)
    assert cycle is None, " -> ".join(cycle)


def test_compiled_modules_import_only_down():
    # Cython is not Python's grammar: the .pyx files' ray_lite imports by text.
    rank = _rank()
    pattern = re.compile(r"^\s*(?:from|import)\s+(ray_lite[\w.]*)", re.M)
    known = _module_files()
    for path in PKG.rglob("*.pyx"):
        me = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
        for target in pattern.findall(path.read_text()):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            assert rank[_unit_of(target)] <= rank[_unit_of(me)], f"{me} -> {target}"


def test_each_private_package_imports_what_its_docstring_allows():
    # Each ``_private`` package's __init__ says "May import: ..."; that list is
    # the truth of its arrows (``process.backend`` names the whole package).
    base = {"ray_lite._version", "ray_lite._config", "ray_lite._lazy", "ray_lite.exceptions",
            "ray_lite._fast"}
    graph = import_graph()
    packages = sorted(p.parent.name for p in (PKG / "_private").glob("*/__init__.py"))
    for pkg in packages:
        doc = ast.get_docstring(ast.parse((PKG / "_private" / pkg / "__init__.py").read_text()))
        allowed_text = doc.split("May import:", 1)[1]
        if "every other ``_private`` package" in allowed_text:
            allowed = {f"ray_lite._private.{p}" for p in packages}
        else:
            allowed = {f"ray_lite._private.{p}" for p in packages
                       if f"``{p}``" in allowed_text.split(".  ")[0]}
        allowed |= base | {f"ray_lite._private.{pkg}", "ray_lite._private"}
        for mod, targets in graph.items():
            if _unit_of(mod) != f"ray_lite._private.{pkg}":
                continue
            for target in targets:
                assert _unit_of(target) in allowed, f"{mod} -> {target}: not in {pkg}'s docstring"


# ------------------------------------------------------- the checks themselves

def test_the_cycle_check_finds_a_circle_and_passes_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("source, target", [
    ("import ray_lite.serve", "ray_lite.serve"),
    ("from ray_lite import serve", "ray_lite.serve"),
    ("def f():\n    from ...serve import api", "ray_lite.serve.api"),
    ("from ray_lite._lazy import lazy_module\nx = lazy_module('ray_lite.util', {})",
     "ray_lite.util"),
])
def test_an_upward_import_is_found_in_every_form(tmp_path, source, target):
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = _module_files()
    name = "ray_lite._private.links.mod"
    found = _imports(name, path, known)
    assert target in found
    assert upward_imports({name: found}) != []
