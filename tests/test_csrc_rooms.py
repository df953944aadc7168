"""csrc/flash3/ includes run one way between its rooms: common/ below every kernel, decode/ on top
of fwd/ (never the reverse), bwd/ beside fwd/ (only common/ shared), host/ above them all."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLASH3 = ROOT / "csrc" / "flash3"
# The rooms each room may include from (itself included).
ALLOWED = {
    "common": {"common"},
    "fwd": {"common", "fwd"},
    "decode": {"common", "fwd", "decode"},
    "bwd": {"common", "bwd"},
    "fp8": {"common", "fp8"},
    "host": {"common", "fwd", "decode", "bwd", "fp8", "host"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"flash3/([a-z0-9_]+)/', re.M)


def includes():
    for path in sorted(FLASH3.rglob("*")):
        if path.is_file() and path.suffix in (".h", ".cuh", ".cu", ".cpp"):
            room = path.relative_to(FLASH3).parts[0]
            for target in INCLUDE.findall(path.read_text(encoding="utf-8")):
                yield path.relative_to(ROOT).as_posix(), room, target


def test_every_room_is_known():
    rooms = {p.name for p in FLASH3.iterdir() if p.is_dir()}
    assert rooms == set(ALLOWED), rooms ^ set(ALLOWED)


def test_includes_follow_the_rooms():
    found = list(includes())
    assert any(room == "decode" and target == "fwd" for _, room, target in found)
    bad = [(f, target) for f, room, target in found if target not in ALLOWED[room]]
    assert not bad, bad


def test_the_check_sees_a_wrong_include():
    line = '#include "flash3/decode/load.cuh"\n'
    assert INCLUDE.findall(line) == ["decode"] and "decode" not in ALLOWED["fwd"]
