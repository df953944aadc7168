"""flash3/ imports run one way: down the layer table of flash3/__init__.py's docstring, no cycle.

Every flash3/**/*.py is parsed with ast; every import counts, module-level or inside a function,
absolute or relative (a lazy import hides a cycle from Python, not from a reader).
"""

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flash3"
EXTENSION = "flash3._C"  # compiled, so it has no .py file


def layer_table(doc):
    """{module: (layer, group, layer name)} from the table after "Layers, top to bottom" (layer
    0 is the top; groups of a layer are separated by "|"; parentheses are comments)."""
    lines = doc.split("Layers, top to bottom", 1)[1].splitlines()
    rows = itertools.takewhile(str.strip, itertools.dropwhile(lambda l: not l.startswith("    "), lines))
    table = {}
    for layer, row in enumerate(rows):
        name, modules = row.split(":", 1)
        for group, names in enumerate(re.sub(r"\([^)]*\)", "", modules).split("|")):
            for mod in names.split(","):
                mod = mod.strip()
                table["flash3" if mod == "flash3" else f"flash3.{mod}"] = (layer, group, name.strip())
    return table


def package_modules():
    """{module name: path} of every .py file under flash3/."""
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def imports(module, path, known):
    """(imported flash3 module, line) for every import statement in the file."""
    def resolve(name):  # the longest known module that `name` starts with
        while name not in known and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "flash3":
                    yield resolve(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1 packages
                pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "flash3":
                continue
            for alias in node.names:  # `from pkg import mod` imports the module pkg.mod
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else resolve(base)), node.lineno


def violations(edges, table):
    """Messages for edges (src, dst, where) that go up the table, sideways across groups, or
    close a cycle, and for modules missing from the table."""
    out = []
    for src, dst, where in dict.fromkeys(edges):  # `from m import a, b` is one edge
        missing = [m for m in (src, dst) if m not in table]
        if missing:
            out.append(f"{where}: {src} -> {dst}: {', '.join(missing)} not in the layer table")
            continue
        (ls, gs, ns), (ld, gd, nd) = table[src], table[dst]
        if ld < ls:
            out.append(f"{where}: {src} -> {dst} imports upward ({ns} -> {nd})")
        elif ld == ls and gd != gs:
            out.append(f"{where}: {src} -> {dst} imports sideways (across the groups of {ns})")
    graph = {}
    for src, dst, _ in edges:
        if src != dst:
            graph.setdefault(src, set()).add(dst)
    state, stack = {}, []  # state: 1 on the DFS stack, 2 done

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                out.append("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def test_checker_catches_cycle_upward_and_sideways_imports():
    table = {"top": (0, 0, "top"), "a": (1, 0, "low"), "b": (1, 0, "low"), "c": (1, 1, "low")}
    edges = [("top", "a", "x.py:1"), ("a", "b", "x.py:2"), ("b", "a", "x.py:3"),
             ("b", "top", "x.py:4"), ("a", "c", "x.py:5"), ("a", "nowhere", "x.py:6")]
    found = violations(edges, table)
    assert "x.py:4: b -> top imports upward (low -> top)" in found
    assert "x.py:5: a -> c imports sideways (across the groups of low)" in found
    assert "x.py:6: a -> nowhere: nowhere not in the layer table" in found
    assert any(v.startswith("import cycle: ") and "a -> b -> a" in v for v in found), found
    assert len(found) == 5, found  # the b -> top edge also closes top -> a -> b -> top
    assert violations([("top", "a", "x.py:1"), ("a", "b", "x.py:2")], table) == []


def test_import_resolution(tmp_path):
    pkg = tmp_path / "flash3" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .. import ops\nfrom . import leaf\n")
    (pkg / "leaf.py").write_text("def f():\n    from ..api import attention\n    import flash3.sub\n"
                                 "from flash3 import _C\nimport torch\n")
    known = {"flash3", "flash3.ops", "flash3.api", "flash3.sub", "flash3.sub.leaf", EXTENSION}
    assert sorted(imports("flash3.sub", pkg / "__init__.py", known)) == [
        ("flash3.ops", 1), ("flash3.sub.leaf", 2)]
    assert sorted(imports("flash3.sub.leaf", pkg / "leaf.py", known)) == [
        ("flash3._C", 4), ("flash3.api", 2), ("flash3.sub", 3)]


def test_flash3_imports_follow_the_layers():
    modules = package_modules()
    table = layer_table(ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())))
    stale = sorted(set(table) - set(modules) - {EXTENSION})
    assert not stale, f"the layer table names modules that do not exist: {stale}"
    known = set(modules) | {EXTENSION}
    edges = [(mod, dst, f"{path.relative_to(ROOT)}:{line}")
             for mod, path in modules.items() for dst, line in imports(mod, path, known)]
    unplaced = sorted(set(modules) - set(table))
    found = violations(edges, table) + [f"{m} is not in the layer table" for m in unplaced]
    assert not found, "\n".join(found)
