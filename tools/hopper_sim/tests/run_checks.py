#!/usr/bin/env python3
"""Tests that each strict check of the Hopper simulator fires on a tiny kernel written to trip it,
and that the same kernel done correctly trips none.

The programs live in tests/checks/*.cu; each holds several cases run as `PROGRAM CASE bad|good`.
A trip case passes when the bad run exits 86 with `hopper_sim: <check>:` on stderr (plus any
extra substrings listed), and its good twin exits 0 with no `hopper_sim:` line. Clean-only cases
just need the good run to pass. Binaries are cached in build/checks keyed by a hash of the source,
common.h, the nvcc flags and the nvcc version.

  tools/hopper_sim/tests/run_checks.py [-j N] [--no-make] [-k SUBSTRING] [-v]

Prints one line per case and finally `N passed, M failed`; exits 1 when anything failed.
Cases marked xfail document a known simulator bug: their failure is reported as XFAIL and does not
count; if one passes (XPASS) it counts as a failure so the mark gets removed.
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
SRC = os.path.join(HERE, "checks")
OUT = os.path.join(SIM, "build", "checks")
SIMRUN = simbuild.SIMRUN

# program -> byte replacements applied to the built binary (the PTX is embedded uncompressed).
# setmaxnreg: ptxas rejects a count that is not a multiple of 8, so the source says 56 and the PTX
# the simulator reads is patched to 52.
PROGRAMS = {
    "sync": [],
    "mem": [],
    "wgmma": [],
    "wgmma_async": [],
    "gmem": [],
    "race": [],
    "setmaxnreg": [(b"setmaxnreg.dec.sync.aligned.u32 56;", b"setmaxnreg.dec.sync.aligned.u32 52;")],
}

# (program, case, expected check or None for a clean-only case, extra substrings the bad run's
#  message must hold, extra simrun options, xfail reason or None)
CASES = [
    ("sync", "deadlock_bar", "deadlock", ["named barrier 1 (32 of 64 arrived)", "warp 0 lanes 0xffffffff"], [], None),
    ("sync", "deadlock_mbar", "deadlock", ["mbarrier at shared 0x", "phase 0, parity 0, pending 1 of 1", "warp 1 lanes"], [], None),
    ("sync", "named_barrier_mismatch", "named-barrier", ["barrier 1 used with"], [], None),
    ("sync", "named_barrier_count", "named-barrier", ["thread count 48 is not a positive multiple of 32"], [], None),
    ("sync", "named_barrier_id", "named-barrier", ["barrier id 16"], [], None),
    ("sync", "mbar_overarrive", "mbarrier-overarrive", ["count 3", "2 arrivals pending"], [], None),
    ("sync", "mbar_tx", "mbarrier-tx", ["1048576"], [], None),
    ("sync", "mbar_uninit", "mbarrier", ["before mbarrier.init"], [], None),
    ("sync", "mbar_overwrite", "mbarrier", ["overwrites a live mbarrier"], [], None),
    ("sync", "warp_sync", "warp-sync", ["not in membermask", "lane 0 "], [], None),
    ("sync", "warp_divergence", "warp-divergence", ["different collective instructions"], [], None),
    ("sync", "shfl_source", "shfl-source", ["reads lane 20"], [], None),
    ("sync", "cluster_barrier", "cluster-barrier", ["without a preceding barrier.cluster.arrive"], [], None),
    ("sync", "producer_consumer", None, [], ["--schedules", "3"], None),
    ("sync", "trap", "trap", ["executed trap"], [], None),
    ("sync", "device_assert", "device-assert", ["sync.cu:", "x == 0"], [], None),
    ("mem", "global_oob_read", "global-bounds", ["read of 4 bytes", "outside every allocation"], [], None),
    ("mem", "global_oob_write", "global-bounds", ["write of 4 bytes", "outside every allocation"], [], None),
    ("mem", "global_misaligned", "global-misaligned", ["misaligned 8-byte access"], [], None),
    ("mem", "shared_oob", "shared-bounds", ["at shared offset 0x100 past the launch's 256 bytes"], [], None),
    ("mem", "shared_misaligned", "shared-misaligned", ["misaligned 4-byte access at 0x2"], [], None),
    ("mem", "async_inflight_load", "async-inflight", ["read of shared offset", "still writing"], [], None),
    ("mem", "async_inflight_store", "async-inflight", ["wait_group.read"], [], None),
    ("mem", "async_waw", "async-inflight", ["two asynchronous copies wrote while both were in flight"], ["--seed", "2"], None),
    ("mem", "async_unobserved", "async-unobserved", ["has not observed that phase"], ["--schedules", "3"], None),
    ("mem", "proxy_fence_bulk", "proxy-fence", ["no fence.proxy.async", "cp.async.bulk.global.shared::cta"], [], None),
    ("mem", "bulk_copy_size", "bulk-copy", ["size 40 is not a multiple of 16"], [], None),
    ("mem", "address_space", "address-space", ["cvta.to.shared"], [], None),
    # regression cases: both were simulator bugs (the exit check was unreachable; ldmatrix treated a
    # concurrent bulk-store read of the same bytes as an error)
    ("mem", "async_at_exit", "async-at-exit", [], [], None),
    ("mem", "ldmatrix_during_store", None, [], ["--schedules", "4"], None),
    ("mem", "pipeline", None, [], ["--schedules", "3"], None),
    ("wgmma", "wgmma_register_race", "wgmma-register-race", ["read before the wgmma.wait_group", "mov.b32"], [], None),
    ("wgmma", "wgmma_fence", "wgmma-fence", ["after the last wgmma.fence"], [], None),
    ("wgmma", "wgmma_proxy", "async-proxy-read", ["operand A", "no fence.proxy.async before this wgmma"], [], None),
    ("wgmma_async", "wgmma_operand_overwrite", "wgmma-operand-overwrite",
     ["a bulk copy (issued)", "still reads as operand B", "no wgmma.wait_group"], ["--schedules", "3"], None),
    ("wgmma_async", "early_release", "wgmma-operand-overwrite", ["a bulk copy (issued)", "operand B"],
     ["--schedules", "3"], None),
    ("wgmma_async", "wgmma_unobserved", "async-unobserved",
     ["wgmma operand A", "no thread of the warpgroup has observed"], ["--schedules", "3"], None),
    # global memory ordering: a bulk reduction/store handed to another CTA through a global flag
    ("gmem", "dq_read_wait", "global-async-order", ["reduction onto global", "not after its completion",
                                                    "wait_group without .read"], ["--schedules", "3"], None),
    ("gmem", "dq_no_release", "global-async-order", ["that flag write released nothing"], ["--schedules", "3"], None),
    ("gmem", "store_read_wait", "global-async-order", ["read of global", "asynchronous global store",
                                                       "not after its completion"], ["--schedules", "3"], None),
    ("gmem", "flag_no_acquire", "global-async-order", ["an acquire (ld.acquire, or a fence after the load) is missing"],
     ["--schedules", "3"], None),
    ("gmem", "unordered_reduce", None, [], ["--schedules", "3"], None),
    # shared-memory races (plain accesses no synchronization orders)
    ("race", "shared_race_rw", "shared-race", ["read of shared offset", "thread 0 (warp 0, lane 0)"],
     ["--schedules", "3"], None),
    ("race", "shared_race_ww_warp", "shared-race", ["write of shared offset", "(warp 0, lane"],
     ["--schedules", "3"], None),
    ("race", "shared_race_mbar", "shared-race", ["write of shared offset", "thread 0 (warp 0, lane 0)"],
     ["--schedules", "3"], None),
    ("race", "shared_race_war", "shared-race", ["write of shared offset", "thread 32 (warp 1, lane 0) read"],
     ["--schedules", "3"], None),
    ("race", "shared_race_store_src", "shared-race", ["a bulk/TMA copy's read", "thread 32 (warp 1, lane 0)"],
     ["--schedules", "3"], None),
    ("setmaxnreg", "setmaxnreg_dec", "setmaxnreg", [".dec to 48 from a budget of 40"], [], None),
    ("setmaxnreg", "setmaxnreg_mult8", "setmaxnreg", ["register count 52"], [], None),
]


def build(prog, nvver):
    return simbuild.build(prog, SRC, 'common.h', OUT, nvver, PROGRAMS[prog])


def simrun(exe, args, opts):
    r = subprocess.run([SIMRUN, *opts, exe, *args], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def first_sim_line(err):
    for line in err.splitlines():
        if line.startswith("hopper_sim:"):
            return line
    return err.strip().splitlines()[-1] if err.strip() else ""


def run_case(exe, case):
    """Returns (ok, detail)."""
    prog, name, check, extra, opts, _ = case
    problems = []
    detail = ""
    if check:
        rc, out, err = simrun(exe, [name, "bad"], opts)
        want = "hopper_sim: %s:" % check
        if rc != 86 or want not in err:
            problems.append("bad run: exit %d, wanted 86 with '%s' (%s)" % (rc, want, first_sim_line(err) or out.strip()))
        else:
            i = err.index(want)
            msg = err[i:]
            miss = [s for s in extra if s not in msg]
            if miss:
                problems.append("bad run message lacks %s: %s" % (miss, msg.strip()))
            detail = msg.strip().splitlines()[0]
    rc, out, err = simrun(exe, [name, "good"], opts)
    if rc != 0 or "hopper_sim:" in err:
        problems.append("good run: exit %d (%s)" % (rc, first_sim_line(err) or out.strip()))
    return not problems, "; ".join(problems) if problems else detail


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2, help="parallel builds/runs")
    ap.add_argument("--no-make", action="store_true", help="do not run make for the simulator library first")
    ap.add_argument("-k", default="", help="only cases whose program/case name contains this")
    ap.add_argument("-v", action="store_true", help="print the check message of passing trip cases")
    a = ap.parse_args()
    t0 = time.time()
    err = simbuild.prepare(a.no_make)
    if err:
        print(err)
        return 2
    os.makedirs(OUT, exist_ok=True)
    cases = [c for c in CASES if a.k in "%s/%s" % (c[0], c[1])]
    progs = sorted({c[0] for c in cases})
    nvver = simbuild.nvcc_version()
    exes, build_err = {}, {}
    with cf.ThreadPoolExecutor(max(1, a.j)) as ex:
        for prog, (exe, err, built) in zip(progs, ex.map(lambda p: build(p, nvver), progs)):
            if exe:
                exes[prog] = exe
                if built:
                    print("built %s (%s)" % (prog, os.path.relpath(exe, SIM)))
            else:
                build_err[prog] = err
                print("BUILD FAILED %s:\n%s" % (prog, err))
    tb = time.time() - t0
    passed = failed = xfailed = 0
    runnable = [c for c in cases if c[0] in exes]
    with cf.ThreadPoolExecutor(max(1, a.j)) as ex:
        futs = [ex.submit(run_case, exes[c[0]], c) for c in runnable]
        for c, fu in zip(runnable, futs):
            prog, name, check, _, _, xfail = c
            label = "%s/%s" % (prog, name)
            kind = check or "clean"
            try:
                ok, detail = fu.result()
            except subprocess.TimeoutExpired:
                ok, detail = False, "timed out"
            if xfail:
                if ok:
                    failed += 1
                    print("XPASS %-40s %-20s now passes: remove its xfail mark (%s)" % (label, kind, xfail))
                else:
                    xfailed += 1
                    print("XFAIL %-40s %-20s known simulator bug: %s [%s]" % (label, kind, xfail, detail))
            elif ok:
                passed += 1
                print("PASS  %-40s %-20s%s" % (label, kind, ("  " + detail) if a.v and detail else ""))
            else:
                failed += 1
                print("FAIL  %-40s %-20s %s" % (label, kind, detail))
    for c in cases:
        if c[0] in build_err:
            failed += 1
            print("FAIL  %-40s %-20s the program did not build" % ("%s/%s" % (c[0], c[1]), c[2] or "clean"))
    print("(builds %.1f s, total %.1f s%s)" % (tb, time.time() - t0,
                                               ", %d expected failures: known simulator bugs" % xfailed if xfailed else ""))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
