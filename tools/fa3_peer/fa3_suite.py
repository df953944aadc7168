#!/usr/bin/env python3
"""Run FlashAttention-3's own test suite (hopper/test_flash_attn.py) against flash3, on the CPU.

    python tools/fa3_peer/fa3_suite.py --fa3-src /path/to/flash-attention [--max-seqlen 256] [--sample N [--shard K]] \
        [--max-hdim 128] [pytest args, e.g. -k "output or kvcache" -x --maxfail 5]

(or FA3_SRC=/path/to/flash-attention).  The checkout is read, never fetched.  FA3's test file is
copied into a temporary directory with only the *device* changed -- ``device = "cuda"`` becomes
``"cpu"`` and the sm90 capability probe that gates FP8 is answered as Hopper; the race test's 70 GiB
dummy allocation (GPU memory pressure) shrinks to 1 MiB and its 1000 repetitions to 3 -- next to
its helpers
(test_util.py, padding.py, copied as they are).  A conftest in that directory

* makes ``import flash_attn_interface`` load ``flash3.flash_attn_interface`` (a sys.modules
  alias: FA3's tests call flash3's functions, nothing in between), and
* changes the *sizes*: it deselects the parametrizations with seqlen_q or seqlen_k above
  --max-seqlen or a head dim above --max-hdim (the CPU reference materializes each entry's
  scores), and with --sample N keeps one case in N, chosen by a hash of its id (the same cases
  on every run; --shard K picks which: shards 0..N-1 cover the suite once; ~27.5k cases remain at
  the default sizes, ~3.5 hours on two cores: a 1/16 shard took 13 min).

Needs einops (FA3's test helpers import it) and pytest.  FA3's rotary tests need
flash_attn.layers.rotary, which its file imports optionally (without it those cases use
rotary_fraction 0 only).  Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (text in FA3's file, replacement, how many times it must occur at least): the device, and the
# race test's sizes -- its 70 GiB "memory load" (GPU memory it fills to provoke races; a CPU run
# cannot allocate it, and it touches no result) and its 1000 repetitions (a GPU race's odds; each
# is a batch-60 forward and backward, minutes on the CPU): 3.
DEVICE_PATCHES = [
    ('device = "cuda"', 'device = "cpu"', 1),
    ('torch.cuda.get_device_capability("cuda")[0] < 9', "False", 1),
    ("torch.empty(70 * 1024 ** 3, dtype=torch.uint8, device=device)",
     "torch.empty(1024 ** 2, dtype=torch.uint8, device=device)", 0),
    ("    for i in range(1000):\n        torch.random.manual_seed(42)\n        out = flash_attn_func(",
     "    for i in range(3):\n        torch.random.manual_seed(42)\n        out = flash_attn_func(", 0),
]

CONFTEST = '''\
import os
import sys
import zlib

sys.path.insert(0, {repo!r})
import flash3.flash_attn_interface  # noqa: E402

sys.modules["flash_attn_interface"] = flash3.flash_attn_interface

MAX_SEQLEN = int(os.environ["FA3_SUITE_MAX_SEQLEN"])
MAX_HDIM = int(os.environ["FA3_SUITE_MAX_HDIM"])
SAMPLE = int(os.environ["FA3_SUITE_SAMPLE"])
SHARD = int(os.environ["FA3_SUITE_SHARD"])


def sampled_out(nodeid):
    return SAMPLE > 1 and zlib.crc32(nodeid.encode()) % SAMPLE != SHARD


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        p = getattr(item, "callspec", None)
        p = p.params if p is not None else {{}}
        big = (max(p.get("seqlen_q", 0), p.get("seqlen_k", 0), p.get("seqlen", 0)) > MAX_SEQLEN
               or p.get("d", 0) > MAX_HDIM or sampled_out(item.nodeid))
        (drop if big else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
'''


def build(hopper: str, where: str) -> str:
    """Write the patched copy of FA3's tests and the conftest into ``where``; returns the path."""
    for helper in ("test_util.py", "padding.py"):
        shutil.copy(os.path.join(hopper, helper), os.path.join(where, helper))
    with open(os.path.join(hopper, "test_flash_attn.py")) as f:
        text = f.read()
    for old, new, at_least in DEVICE_PATCHES:
        n = text.count(old)
        if n < at_least:
            raise SystemExit(f"fa3_suite: FA3's test file no longer contains {old!r}: update "
                             "DEVICE_PATCHES for this checkout")
        text = text.replace(old, new)
    target = os.path.join(where, "test_flash_attn.py")
    with open(target, "w") as f:
        f.write(text)
    with open(os.path.join(where, "conftest.py"), "w") as f:
        f.write(CONFTEST.format(repo=REPO))
    return target


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fa3-src", default=os.environ.get("FA3_SRC"),
                    help="a flash-attention checkout (default: $FA3_SRC)")
    ap.add_argument("--max-seqlen", type=int, default=256)
    ap.add_argument("--max-hdim", type=int, default=128)
    ap.add_argument("--sample", type=int, default=1,
                    help="keep one case in N (a hash of the case id: the same cases every run)")
    ap.add_argument("--shard", type=int, default=0,
                    help="with --sample N: keep the cases whose hash is K mod N (shards 0..N-1 cover the suite)")
    ap.add_argument("--keep", action="store_true", help="keep the generated directory")
    args, pytest_args = ap.parse_known_args(argv)
    if not args.fa3_src:
        ap.error("give --fa3-src or FA3_SRC (a flash-attention checkout)")
    hopper = os.path.join(os.path.abspath(args.fa3_src), "hopper")
    if not os.path.isfile(os.path.join(hopper, "test_flash_attn.py")):
        ap.error(f"{hopper}/test_flash_attn.py not found")
    where = tempfile.mkdtemp(prefix="fa3_suite_")
    try:
        target = build(hopper, where)
        os.environ["FA3_SUITE_MAX_SEQLEN"] = str(args.max_seqlen)
        os.environ["FA3_SUITE_MAX_HDIM"] = str(args.max_hdim)
        os.environ["FA3_SUITE_SAMPLE"] = str(args.sample)
        os.environ["FA3_SUITE_SHARD"] = str(args.shard)
        import pytest
        return int(pytest.main([target, "--rootdir", where, "-p", "no:cacheprovider",
                                *pytest_args]))
    finally:
        if args.keep:
            print(f"fa3_suite: generated files kept in {where}")
        else:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
