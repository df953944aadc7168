"""tools/ is split by concern, and its Python imports run one way: build/ (toolchain, kernel
objects, compile check) at the bottom, smoke/ (the smoke matrix's cases and its simulator backend)
on it, device/ (the lent-GPU kit) and hopper_sim/'s flash3 reports on those; no import cycle, and
no tool imports tests/ (tests may import tools' helpers: tests/helpers.py takes the oracles from
tools/smoke/smoke_checks.py).

Every tools/**/*.py is parsed with ast; every import counts, module-level or inside a function.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
# The folders each folder's modules may import from (itself included).
ALLOWED = {
    "build": {"build"},
    "smoke": {"smoke", "build"},
    "device": {"device", "smoke", "build"},
    "hopper_sim": {"hopper_sim", "smoke", "build"},
    "fa3_peer": {"fa3_peer"},
}


def modules():
    """{module name: path} of the tools' Python files (generated build trees left out)."""
    mods = {}
    for p in sorted(TOOLS.rglob("*.py")):
        rel = p.relative_to(TOOLS)
        if "build" in rel.parts[1:] or rel.parts[0] not in ALLOWED:
            continue
        assert p.stem not in mods, f"two tools named {p.stem}: {mods[p.stem]} and {rel}"
        mods[p.stem] = rel
    return mods


def imports(path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def graph():
    mods = modules()
    return mods, {m: sorted({i for i in imports(TOOLS / rel) if i in mods and i != m}) for m, rel in mods.items()}


# tools/flash3_build.py -> build/flash3_build.py: a symlink for tools/hopper_sim/Makefile, whose bytes
# key the simulator's ground-truth record (hopper_sim/cutlass_examples.py); the Makefile moves to the
# new path with the next simulator change, which re-records anyway, and the link goes.
SIM_KEYED_LINKS = {"flash3_build.py": "build/flash3_build.py"}


def test_every_tool_sits_in_a_room():
    top = sorted(p.name for p in TOOLS.glob("*.py") if p.name not in SIM_KEYED_LINKS)
    assert not top, f"a tool at tools/'s top level: {top}"
    for name, target in SIM_KEYED_LINKS.items():
        link = TOOLS / name
        assert link.is_symlink() and Path(str(link.readlink())) == Path(target), f"tools/{name}"
    assert {"smoke", "smoke_sim", "compile_check", "device_summary", "perf_model"} <= set(modules())


def test_imports_follow_the_rooms():
    mods, edges = graph()
    bad = [(m, i) for m, deps in edges.items() for i in deps if mods[i].parts[0] not in ALLOWED[mods[m].parts[0]]]
    assert not bad, bad


def test_no_import_cycle():
    mods, edges = graph()
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for d in edges[m]:
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in mods:
        if m not in state:
            visit(m, [m])


def test_no_tool_imports_tests():
    test_modules = {p.stem for p in (ROOT / "tests").glob("*.py")}
    for rel in modules().values():
        text = (TOOLS / rel).read_text(encoding="utf-8")
        assert not set(imports(TOOLS / rel)) & test_modules, rel
        assert '/ "tests"' not in text and "'tests'" not in text, rel


def test_the_cycle_check_sees_a_cycle(monkeypatch):
    monkeypatch.setattr(__import__(__name__), "graph", lambda: ({"a": Path("build/a.py"), "b": Path("build/b.py")},
                                                                 {"a": ["b"], "b": ["a"]}))
    try:
        test_no_import_cycle()
    except AssertionError as e:
        assert "a -> b -> a" in str(e) or "b -> a -> b" in str(e)
    else:
        raise AssertionError("the cycle went unseen")
