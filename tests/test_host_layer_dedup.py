"""No op body written twice: the torch bindings (csrc/*.cpp, csrc/*.h) and the simulator's driver
(tools/hopper_sim/flash3/) share no run of six or more lines. Both call the host layer
(csrc/flash3/host/) instead; a run found here is logic copied back into one of the callers.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = 6  # lines


def runs(path: Path, n: int = RUN) -> dict:
    """{tuple of n consecutive non-blank lines, stripped: first line number} of a file."""
    lines = [(i + 1, line.strip()) for i, line in enumerate(path.read_text().splitlines()) if line.strip()]
    return {tuple(t for _, t in lines[i:i + n]): lines[i][0] for i in range(len(lines) - n + 1)}


def name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def shared_runs(left: list, right: list, n: int = RUN) -> list:
    """(left file:line, right file:line, first line of the run) for each run of n lines in both."""
    found = []
    for a in left:
        ra = runs(a, n)
        for b in right:
            for key, line_b in runs(b, n).items():
                if key in ra:
                    found.append((f"{name(a)}:{ra[key]}", f"{name(b)}:{line_b}", key[0]))
    return found


def bindings() -> list:
    return sorted(p for p in (ROOT / "csrc").iterdir() if p.suffix in (".cpp", ".h"))


def sim_driver() -> list:
    return sorted(p for p in (ROOT / "tools" / "hopper_sim" / "flash3").iterdir() if p.suffix in (".cu", ".h", ".cpp"))


def test_bindings_and_simulator_driver_share_no_run_of_six_lines():
    assert bindings() and sim_driver()
    found = shared_runs(bindings(), sim_driver())
    assert not found, "logic written twice (move it into csrc/flash3/host/):\n" + "\n".join(
        f"  {a} = {b}: {first}" for a, b, first in found[:20])


def test_the_check_finds_a_copied_body(tmp_path):
    """The check itself: lines pasted from a binding into a driver file are found."""
    adapter = ROOT / "csrc" / "torch_adapter.h"
    pasted = tmp_path / "pasted.cu"
    pasted.write_text("// pasted\n" + "\n".join(adapter.read_text().splitlines()[60:75]))
    assert [a for a, _, _ in shared_runs(bindings(), [pasted])] and all(
        a.startswith("csrc/torch_adapter.h:") for a, _, _ in shared_runs(bindings(), [pasted]))
