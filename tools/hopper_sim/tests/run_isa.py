#!/usr/bin/env python3
"""Instruction-semantics tests of the Hopper simulator: expected values worked by hand from the PTX ISA.

The programs live in tests/isa/*.cu; each holds several instruction families run as `PROGRAM FAMILY`.
A family prints `CASE <family> <name> ok|FAIL got=.. want=..` per case and `FAMILY <family> P F`.
Binaries are cached in build/isa keyed by a hash of the source, isa.h, the nvcc flags and nvcc version
(the same scheme as run_checks.py).

  tools/hopper_sim/tests/run_isa.py [-j N] [--no-make] [-k SUBSTRING] [-v]

Prints one line per family and finally `N passed, M failed` (counting cases; a family that does not run
to completion counts as one failed case). Known simulator bugs are marked in XFAIL (whole family) or
XFAIL_CASES (case-name prefixes): their failures are reported as XFAIL and do not count; one that passes
(XPASS) counts as a failure so the mark gets removed. Exits 1 when anything failed.
"""
import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import time

import simbuild

HERE = os.path.dirname(os.path.abspath(__file__))
SIM = simbuild.SIM
SRC = os.path.join(HERE, "isa")
OUT = os.path.join(SIM, "build", "isa")
SIMRUN = simbuild.SIMRUN

PROGRAMS = {
    "int": ["arith", "mad", "mul24", "divrem", "minmax", "minmax_x2", "absneg", "bits", "bfe", "bmsk", "bfi", "shift",
            "shf", "prmt", "prmt_modes", "lop3", "selp", "setp", "setp_bool", "cvt_int"],
    "fp": ["cvt_fi", "cvt_half", "cvt_half_rmrp", "cvt_packed", "f32arith", "fdiv", "half2", "copysign_testp"],
    "warp": ["shfl", "warpcoll", "warp_partial", "warp_partial_concurrent", "atom", "ldst"],
    "sync": ["mbarrier", "mbarrier_done", "mbar_pc", "bar", "bar_red", "cluster"],
    "review": ["bulkgroup", "clusterexit", "ignoresrc", "packed", "s2sreduce"],
}

# Whole families that fail because of a known simulator bug: "prog/family" -> reason.
XFAIL = {
    "sync/mbarrier": "mbarrier.pending_count is not simulated (exit 87)",
}
# Individual cases: ("prog/family", case-name prefix) -> reason. The bugs this suite found (bfind
# .shiftamt, mad.hi.sat, slct NaN/.ftz, narrow signed cvt, integer min/max .relu and 16x2, prmt
# modes, activemask, disjoint warp collectives, non-blocking test_wait, bar.red) are fixed; their
# cases stay as regression tests.
XFAIL_CASES = {}


def build(prog, nvver):
    return simbuild.build(prog, SRC, 'isa.h', OUT, nvver, ())


def run_family(exe, fam):
    """Returns (cases [(name, ok, detail)], error or None)."""
    try:
        r = subprocess.run([SIMRUN, exe, fam], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return [], "timed out"
    cases, done = [], False
    for line in r.stdout.splitlines():
        m = re.match(r"CASE (\S+) (.*) (ok|FAIL) (got=\S+ want=\S+)$", line)
        if m:
            cases.append((m.group(2), m.group(3) == "ok", m.group(4)))
        elif line.startswith("FAMILY "):
            done = True
    if r.returncode != 0 or not done:
        msg = next((l for l in r.stderr.splitlines() if l.startswith("hopper_sim:")), None) or \
              (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or [""])[-1]
        return cases, "exit %d: %s" % (r.returncode, msg)
    return cases, None


def case_xfail(key, name):
    for (k, prefix), why in XFAIL_CASES.items():
        if k == key and name.startswith(prefix):
            return why
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2, help="parallel builds/runs")
    ap.add_argument("--no-make", action="store_true", help="do not run make for the simulator library first")
    ap.add_argument("-k", default="", help="only families whose prog/family contains this")
    ap.add_argument("-v", action="store_true", help="print every failing case, not only the first few")
    a = ap.parse_args()
    t0 = time.time()
    err = simbuild.prepare(a.no_make)
    if err:
        print(err)
        return 2
    os.makedirs(OUT, exist_ok=True)
    fams = [(p, f) for p, fl in PROGRAMS.items() for f in fl if a.k in "%s/%s" % (p, f)]
    progs = sorted({p for p, _ in fams})
    nvver = simbuild.nvcc_version()
    exes = {}
    passed = failed = xfailed = 0
    with cf.ThreadPoolExecutor(max(1, a.j)) as ex:
        for prog, (exe, err, built) in zip(progs, ex.map(lambda p: build(p, nvver), progs)):
            if exe:
                exes[prog] = exe
                if built:
                    print("built %s (%s)" % (prog, os.path.relpath(exe, SIM)))
            else:
                print("BUILD FAILED %s:\n%s" % (prog, err))
    tb = time.time() - t0
    runnable = [(p, f) for p, f in fams if p in exes]
    with cf.ThreadPoolExecutor(max(1, a.j)) as ex:
        futs = [ex.submit(run_family, exes[p], f) for p, f in runnable]
        for (p, f), fu in zip(runnable, futs):
            key = "%s/%s" % (p, f)
            cases, err = fu.result()
            fam_x = XFAIL.get(key)
            bad = [(n, d) for n, ok, d in cases if not ok and not case_xfail(key, n)]
            xf = [(n, d) for n, ok, d in cases if not ok and case_xfail(key, n)]
            xpass = [n for n, ok, d in cases if ok and case_xfail(key, n)]
            good = sum(1 for n, ok, d in cases if ok and not case_xfail(key, n))
            if fam_x:
                if not bad and not err and not xf:
                    failed += 1
                    print("XPASS %-32s %d cases now pass: remove its xfail mark (%s)" % (key, len(cases), fam_x))
                else:
                    xfailed += 1
                    what = err or "%d of %d cases fail, e.g. %s %s" % (len(bad) + len(xf), len(cases), *(bad + xf)[0])
                    print("XFAIL %-32s known simulator bug: %s [%s]" % (key, fam_x, what))
                continue
            passed += good
            failed += len(bad) + len(xpass) + (1 if err else 0)
            xfailed += len(xf)
            status = "PASS " if not bad and not xpass and not err else "FAIL "
            line = "%s %-32s %d cases, %d passed" % (status, key, len(cases), good)
            if xf:
                line += ", %d xfail" % len(xf)
            if bad:
                line += ", %d FAILED" % len(bad)
            if err:
                line += "; did not finish: %s" % err
            print(line)
            for n, d in bad[: None if a.v else 5]:
                print("      FAIL  %s: %s" % (n, d))
            if bad and not a.v and len(bad) > 5:
                print("      ... %d more (use -v)" % (len(bad) - 5))
            for n in xpass:
                print("      XPASS %s now passes: remove its xfail mark (%s)" % (n, case_xfail(key, n)))
            for n, d in xf[: None if a.v else 3]:
                print("      XFAIL %s: %s [%s]" % (n, case_xfail(key, n), d))
    for p, f in fams:
        if p not in exes:
            failed += 1
            print("FAIL  %-32s the program did not build" % ("%s/%s" % (p, f)))
    print("(builds %.1f s, total %.1f s%s)" % (tb, time.time() - t0,
                                               ", %d expected failures: known simulator bugs" % xfailed if xfailed else ""))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
