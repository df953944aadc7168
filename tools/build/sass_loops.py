#!/usr/bin/env python3
"""Per-iteration instruction mix of the kernels' loops, from their SASS.

Usage: sass_loops.py FILE [FILE ...]   (a cubin/object, run through `cuobjdump -sass`, or a SASS text
listing such as build/sass/<tu>.sass); --md writes the tables as markdown.

For every function it builds the control-flow graph (branch targets, fall-through), finds the natural
loops (a back edge u -> h where h dominates u) and keeps the ones worth reading:
  consumer  a loop with HGMMA/QGMMA and MUFU.EX2 that holds no inner loop with a GMMA (a mainloop
            step loop; the persistent tile loop around it is left out). Of a function's consumer loops
            the one with the fewest instructions is labelled `unmasked`, a loop with at least
            keys/4 more FSEL than it `masked` (a masked score costs one FSEL, its compare an R2P bit
            or an ISETP; a thread holds keys/2 scores per iteration, at least half of them in a
            masked block).
  producer  a loop with >= 2 UTMALDG and no GMMA whose inner loops do not qualify themselves (the
            K/V block loop; the elect loops around single TMA issues are inside it).
Per iteration: the hot blocks are the loop's blocks laid out between its header and its last back
edge; cold blocks the compiler moved out of line (a barrier's retry loop) are counted apart
(`cold`). An inner loop in the hot path (an elect or spin loop) counts once. A consumer loop is
counted along its shortest forward path from header to back edge (its branches are uniform: a
runtime option such as softcap's tanh, laid out inline, is skipped); `laid out` counts every hot
instruction. A producer loop counts every hot block (the warp issues its leader's TMA branch too).

keys: the keys one iteration covers = the RS GMMAs (P.V, A from registers: `R, R, gdesc[UR]`) times
  their K (each k-step of P.V takes K keys); the tile's kBlockN is the N of the SS GMMA (Q.K^T, both
  operands in shared memory: `R, gdesc[UR], ...`), and blocks = keys / kBlockN (more than 1 where
  the compiler unrolled the loop). A producer loop's blocks: its expect-tx arrivals
  (SYNCS.ARRIVE.TRANS64) / 2, one for the K and one for the V stage of each block; per block =
  non-GMMA instructions / blocks, UTMALDG per block likewise.
per key: instructions other than HGMMA/QGMMA per iteration / keys (every warp of the warpgroup issues
  each of them once per key block, so this is per warp per key).
EX2 under P.V: MUFU.EX2 between the loop's last RS GMMA and the first `WARPGROUP.DEPBAR.LE gsb0, 0x0`
  after it (the exponentials that run while the P.V is in flight).
stall cycles: the sum of the stall counts ptxas wrote into the counted instructions' control bits: the
  cycles the warp waits after issuing each before it may issue its next, fixed-latency dependencies
  and pipe throughput (MUFU's 8 cycles a warp on a sub-partition) included. A lower bound of the
  warp's iteration, before any variable-latency wait (WGMMA, barriers, memory), and the `wait` stall
  reason of Nsight Compute. The control bits are bits 105-108 of the 128-bit instruction (stall), then
  yield, write and read scoreboard, wait mask and reuse flags (Jia et al., "Dissecting the NVIDIA
  Volta GPU Architecture via Microbenchmarking", 2018, section 2.2; the same layout on sm_90: each
  MUFU sets a write scoreboard that the FADD reading its result waits on). cuobjdump prints the
  instruction's high 64 bits on the line after it; a listing without them leaves the column empty.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# "/*01a0*/   @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;"
_INSN = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(?:\{\s*)?(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Za-z0-9_]+)*)\s*([^;]*)")
_LABEL = re.compile(r"^\s*(\.L_x_\d+|\.L_\w+):")
_TARGET_LABEL = re.compile(r"`\((\.L_\w+)\)")
# The high 64 bits of the instruction above, alone on their line.
_HI_WORD = re.compile(r"^\s*/\*\s*(0x[0-9a-fA-F]{16})\s*\*/\s*$")
_TARGET_ADDR = re.compile(r"(0x[0-9a-fA-F]+)\s*$")
_GMMA = ("HGMMA", "QGMMA")
_GMMA_SHAPE = re.compile(r"\.(\d+)x(\d+)x(\d+)")

CLASSES = ("gmma", "mufu", "fp32", "cvt", "int", "uniform", "shfl", "sync", "mem", "tma", "ctrl", "other")
_FP32 = {"FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP", "FSWZADD", "FRND", "FCHK", "FMNMX3"}
_CVT = {"F2FP", "F2F", "I2F", "F2I", "I2FP", "F2IP"}
_INT = {"IMAD", "IADD3", "IADD", "LOP3", "LOP", "SHF", "PRMT", "ISETP", "SEL", "LEA", "IMNMX", "VIMNMX", "IABS",
        "POPC", "FLO", "BMSK", "BREV", "PLOP3", "P2R", "R2P", "MOV", "IMUL", "SGXT", "IDP", "LEA.HI", "VIADD",
        "VIADDMNMX", "IMAD.WIDE", "ISCADD", "BFE", "BFI", "S2R", "CS2R", "R2UR", "S2UR", "LDC"}
_TMA = ("UTMALDG", "UTMASTG", "UBLKCP", "UTMACMDFLUSH", "UTMAPF", "UTMACCTL", "UBLKRED", "UBLKPF")
_SYNC = {"BAR", "SYNCS", "WARPGROUP", "DEPBAR", "MEMBAR", "FENCE", "WARPSYNC", "ELECT", "BSSY", "BSYNC",
         "NANOSLEEP", "ERRBAR", "CCTL", "USETMAXREG", "VOTE", "VOTEU", "YIELD", "UCGABAR_ARV", "UCGABAR_WAIT"}
_MEM = {"LD", "ST", "LDS", "STS", "LDG", "STG", "LDL", "STL", "LDSM", "STSM", "ATOM", "ATOMS", "ATOMG", "RED",
        "LDGSTS", "LDGDEPBAR", "ULDC", "LDCU"}
_CTRL = {"BRA", "EXIT", "CALL", "RET", "BRX", "JMP", "JMX", "BPT", "NOP", "BREAK", "KILL"}


def op_class(op: str) -> str:
    if op in _GMMA:
        return "gmma"
    if op == "MUFU":
        return "mufu"
    if op in _FP32:
        return "fp32"
    if op in _CVT:
        return "cvt"
    if op in _TMA:
        return "tma"
    if op == "SHFL":
        return "shfl"
    if op in _SYNC:
        return "sync"
    if op in _MEM:
        return "mem"
    if op in _CTRL:
        return "ctrl"
    if op in _INT:
        return "int"
    if op.startswith("U"):
        return "uniform"
    return "other"


@dataclass
class Insn:
    addr: int
    pred: str   # "" or "@!P0" ...
    op: str     # HGMMA
    mods: str   # .64x128x16.F32.BF16
    args: str
    stall: int | None = None  # control bits' stall count (None: the listing has no encodings)

    @property
    def full(self) -> str:
        return self.op + self.mods


@dataclass
class Function:
    name: str
    insns: list = field(default_factory=list)
    labels: dict = field(default_factory=dict)  # label -> address of the next instruction


def parse_sass(text: str) -> list[Function]:
    funcs: list[Function] = []
    pending: list[str] = []
    expect_hi = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Function :"):
            funcs.append(Function(s.split(":", 1)[1].strip()))
            continue
        if not funcs:
            continue
        f = funcs[-1]
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _HI_WORD.match(line)
        if m and f.insns and f.insns[-1].stall is None and expect_hi:
            f.insns[-1].stall = stall_count(int(m.group(1), 16))
            expect_hi = False
            continue
        m = _INSN.match(line)
        if not m:
            continue
        expect_hi = True
        ins = Insn(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4), m.group(5).strip())
        for lab in pending:
            f.labels[lab] = ins.addr
        pending = []
        f.insns.append(ins)
    return funcs


def stall_count(hi: int) -> int:
    """The stall count of an instruction's control bits, from its high 64 bits (bits 105-108 of 128)."""
    return (hi >> 41) & 0xF


def branch_target(f: Function, ins: Insn) -> int | None:
    m = _TARGET_LABEL.search(ins.args)
    if m:
        return f.labels.get(m.group(1))
    m = _TARGET_ADDR.search(ins.args)
    return int(m.group(1), 16) if m else None


def _unconditional(ins: Insn) -> bool:
    return ins.pred in ("", "@PT", "@UPT")


@dataclass
class Loop:
    header: int                  # block index
    blocks: set
    hot: list                    # instruction indices, laid out between header and the last latch
    cold: int                    # instructions of the loop's out-of-line blocks
    short: list                  # instruction indices of the shortest hot path header -> a latch
    parent: "Loop | None" = None
    children: list = field(default_factory=list)


def find_loops(f: Function) -> tuple[list, list]:
    """(blocks as (first, last) instruction index ranges, natural loops)."""
    ins = f.insns
    if not ins:
        return [], []
    idx_of = {x.addr: i for i, x in enumerate(ins)}
    leaders = {0}
    for i, x in enumerate(ins):
        if x.op in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET"):
            if i + 1 < len(ins):
                leaders.add(i + 1)
            t = branch_target(f, x) if x.op in ("BRA", "JMP") else None
            if t is not None and t in idx_of:
                leaders.add(idx_of[t])
    starts = sorted(leaders)
    blocks = [(s, (starts[k + 1] if k + 1 < len(starts) else len(ins)) - 1) for k, s in enumerate(starts)]
    block_of = {s: k for k, (s, _) in enumerate(blocks)}
    succ = [[] for _ in blocks]
    for k, (s, e) in enumerate(blocks):
        last = ins[e]
        falls = True
        if last.op in ("BRA", "JMP"):
            t = branch_target(f, last)
            if t is not None and t in idx_of:
                succ[k].append(block_of[idx_of[t]])
            falls = not _unconditional(last)
        elif last.op in ("EXIT", "RET", "BRX", "JMX"):
            falls = not _unconditional(last)
        if falls and k + 1 < len(blocks):
            succ[k].append(k + 1)
    pred = [[] for _ in blocks]
    for k, ss in enumerate(succ):
        for t in ss:
            pred[t].append(k)
    # Dominators (Cooper, Harvey, Kennedy) over the blocks reachable from the entry.
    order, seen, stack = [], {0}, [(0, iter(succ[0]))]
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(node)
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(succ[nxt])))
    rpo = order[::-1]
    rank = {b: r for r, b in enumerate(rpo)}
    idom = {0: 0}

    def intersect(a, b):
        while a != b:
            while rank[a] > rank[b]:
                a = idom[a]
            while rank[b] > rank[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            ps = [p for p in pred[b] if p in idom]
            if not ps:
                continue
            new = ps[0]
            for p in ps[1:]:
                new = intersect(p, new)
            if idom.get(b) != new:
                idom[b] = new
                changed = True

    def dominates(h, u):
        while True:
            if u == h:
                return True
            if u == 0:
                return False
            u = idom[u]

    latches: dict[int, list] = {}
    for u in seen:
        for h in succ[u]:
            if h in seen and dominates(h, u):
                latches.setdefault(h, []).append(u)
    loops = []
    for h, us in latches.items():
        body, work = {h}, [u for u in us if u != h]
        body.update(work)
        while work:
            x = work.pop()
            for p in pred[x]:
                if p not in body and p in seen:
                    body.add(p)
                    work.append(p)
        lo, hi = blocks[h][0], max(blocks[u][1] for u in us)
        hot = [i for b in sorted(body) for i in range(blocks[b][0], blocks[b][1] + 1) if lo <= i <= hi]
        cold = sum(blocks[b][1] - blocks[b][0] + 1 for b in body) - len(hot)
        loops.append(Loop(h, body, hot, cold, _shortest_path(blocks, succ, body, h, us, lo, hi)))
    # Nesting: the smallest enclosing loop is the parent.
    loops.sort(key=lambda L: len(L.blocks))
    for i, L in enumerate(loops):
        for P in loops[i + 1:]:
            if L.header in P.blocks and L.blocks <= P.blocks and P is not L:
                L.parent = P
                P.children.append(L)
                break
    return blocks, loops


def _shortest_path(blocks, succ, body, h, latches, lo, hi) -> list:
    """Instruction indices of the cheapest way through one iteration: from the header to a latch over
    the hot blocks, forward edges only (an inner loop counts once, a cold detour not at all). A
    runtime option the compiler laid out inline (softcap's tanh, when off) is skipped this way."""
    hot_blocks = sorted(b for b in body if lo <= blocks[b][0] and blocks[b][1] <= hi)
    size = lambda b: blocks[b][1] - blocks[b][0] + 1  # noqa: E731
    dist, prev = {h: size(h)}, {h: None}
    for b in hot_blocks:
        if b not in dist:
            continue
        for t in succ[b]:
            if t in body and t > b and lo <= blocks[t][0] and blocks[t][1] <= hi:
                d = dist[b] + size(t)
                if d < dist.get(t, 1 << 60):
                    dist[t], prev[t] = d, b
    ends = [u for u in latches if u in dist]
    if not ends:
        return []
    b, path = min(ends, key=lambda u: dist[u]), []
    while b is not None:
        path.append(b)
        b = prev[b]
    return [i for b in reversed(path) for i in range(blocks[b][0], blocks[b][1] + 1)]


@dataclass
class LoopReport:
    function: str
    kind: str            # unmasked / masked / consumer / producer
    start: int           # address of the header
    end: int             # address of the last hot instruction
    total: int
    non_gmma: int
    keys: int | None
    keys_how: str
    gmma: dict           # "64x128x16 SS" -> count
    classes: dict
    ops: Counter
    ex2_under_pv: tuple | None  # (under, total) or None
    cold: int
    laid_out: int = 0    # every hot instruction, the runtime options' too (consumer loops)
    blocks: int = 1      # key blocks per iteration (the compiler may unroll)
    stall_cycles: int | None = None  # sum of the counted instructions' stall counts

    @property
    def stall_per_key(self) -> float | None:
        return self.stall_cycles / self.keys if self.keys and self.stall_cycles is not None else None

    @property
    def per_block(self) -> float:
        return self.non_gmma / self.blocks

    @property
    def per_key(self) -> float | None:
        return self.non_gmma / self.keys if self.keys else None


def _is_rs(ins: Insn) -> bool:  # A operand in registers: "R24, R120, gdesc[UR8], ..."
    return re.match(r"R\d+, R\d+, ", ins.args) is not None


def _subtree_ops(L: Loop, f: Function, blocks) -> Counter:
    c = Counter()
    for b in L.blocks:
        for i in range(blocks[b][0], blocks[b][1] + 1):
            c[f.insns[i].op] += 1
    return c


def analyze_function(f: Function) -> list[LoopReport]:
    blocks, loops = find_loops(f)
    out = []
    for L in loops:
        ops_all = _subtree_ops(L, f, blocks)
        has_gmma = any(ops_all[g] for g in _GMMA)
        hot = [f.insns[i] for i in L.hot]
        ex2 = sum(1 for x in hot if x.full == "MUFU.EX2")
        kind = None
        if has_gmma and ex2:
            if not any(any(_subtree_ops(C, f, blocks)[g] for g in _GMMA) for C in L.children):
                kind = "consumer"
        elif not has_gmma and ops_all["UTMALDG"] >= 2:
            if not any(_subtree_ops(C, f, blocks)["UTMALDG"] >= 2 for C in L.children):
                kind = "producer"
        if kind is None:
            continue
        # Consumer: the shortest path (its branches are uniform: softcap or not, never both).
        # Producer: every hot block (the leader's TMA issue is on the warp's path too).
        path = [f.insns[i] for i in L.short] if kind == "consumer" and L.short else hot
        r = report_loop(f.name, kind, path, L.cold)
        r.laid_out = len(hot)
        out.append(r)
    cons = [r for r in out if r.kind == "consumer"]
    if cons:
        base = min(cons, key=lambda r: r.total)
        for r in cons:
            quarter = (r.keys or 0) // 4
            r.kind = ("masked" if r is not base and quarter and r.ops["FSEL"] >= base.ops["FSEL"] + quarter
                      else "unmasked")
    out.sort(key=lambda r: r.start)
    return out


def report_loop(name: str, kind: str, hot: list, cold: int) -> LoopReport:
    ops = Counter(x.op for x in hot)
    classes = Counter(op_class(x.op) for x in hot)
    gmma = Counter()
    keys_ss = set()
    rs_k, rs_count = None, 0
    for x in hot:
        if x.op in _GMMA:
            m = _GMMA_SHAPE.search(x.mods)
            shape = f"{m.group(1)}x{m.group(2)}x{m.group(3)}" if m else x.mods
            rs = _is_rs(x)
            gmma[f"{x.op} {shape} {'RS' if rs else 'SS'}"] += 1
            if m and rs:
                rs_k, rs_count = int(m.group(3)), rs_count + 1
            elif m:
                keys_ss.add(int(m.group(2)))
    keys, how, block_n = None, "", None
    if len(keys_ss) == 1:
        block_n = keys_ss.pop()
    if rs_count and rs_k:  # every key of the iteration goes through one P.V k-step
        keys, how = rs_count * rs_k, "RS GMMA count x K"
        if block_n and keys % block_n:
            how += f" (not a multiple of the SS GMMA's N {block_n}!)"
    elif block_n:
        keys, how = block_n, "N of the SS GMMA"
    blocks = keys // block_n if keys and block_n and keys % block_n == 0 else 1
    if kind == "producer":  # a K and a V stage posted (expect-tx arrival) per key block
        blocks = max(1, sum(1 for x in hot if x.full.startswith("SYNCS.ARRIVE.TRANS64")) // 2)
    n_gmma = sum(ops[g] for g in _GMMA)
    ex2_pv = None
    last_rs = max((i for i, x in enumerate(hot) if x.op in _GMMA and _is_rs(x)), default=None)
    if last_rs is not None:
        under = 0
        for x in hot[last_rs + 1:]:
            if x.full == "WARPGROUP.DEPBAR.LE" and x.args.replace(" ", "").endswith(",0x0"):
                break
            under += x.full == "MUFU.EX2"
        ex2_pv = (under, sum(1 for x in hot if x.full == "MUFU.EX2"))
    stalls = None if any(x.stall is None for x in hot) else sum(x.stall for x in hot)
    return LoopReport(name, kind, hot[0].addr, hot[-1].addr, len(hot), len(hot) - n_gmma, keys, how,
                      dict(gmma), {c: classes.get(c, 0) for c in CLASSES}, ops, ex2_pv, cold, blocks=blocks,
                      stall_cycles=stalls)


def sass_of(path: Path, cuobjdump: str | None = None) -> str:
    data = path.read_bytes()
    if data[:4] == b"\x7fELF":
        if cuobjdump is None:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import flash3_build as fb  # noqa: E402
            cuobjdump = fb.find_cuobjdump(fb.find_cuda_home()[0])
        if cuobjdump is None:
            raise RuntimeError("no cuobjdump for " + str(path))
        return subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return data.decode(errors="replace")


def analyze(text: str) -> list[LoopReport]:
    return [r for f in parse_sass(text) for r in analyze_function(f)]


_INT_TOP = ("UTMALDG", "IMAD", "IADD3", "LOP3", "SHF", "PRMT", "ISETP", "SEL", "LEA", "MOV", "R2UR")


def table(name: str, reports: list[LoopReport]) -> str:
    """A markdown table of one TU's loops."""
    hdr = ["function", "loop", "addr", "keys", "blocks", "laid out", "instrs", "non-GMMA", "per block", "per key",
           "stall cycles", "per key", *CLASSES[1:], "cold",
           "EX2 under P.V", "GMMA", "int/uniform detail"]
    lines = [f"### {name}", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    short = {}
    for r in reports:
        short.setdefault(r.function, f"f{len(short)}")
    for r in reports:
        detail = ", ".join(f"{o} {r.ops[o]}" for o in _INT_TOP if r.ops[o])
        detail += ", F2FP %d, FSEL %d, U* %d" % (r.ops["F2FP"], r.ops["FSEL"], r.classes["uniform"])
        cells = [short[r.function], r.kind, f"{r.start:#x}-{r.end:#x}", str(r.keys or "-"), str(r.blocks),
                 str(r.laid_out), str(r.total), str(r.non_gmma), f"{r.per_block:.1f}",
                 f"{r.per_key:.2f}" if r.per_key else "-",
                 str(r.stall_cycles) if r.stall_cycles is not None else "-",
                 f"{r.stall_per_key:.2f}" if r.stall_per_key is not None else "-",
                 *(str(r.classes[c]) for c in CLASSES[1:]), str(r.cold),
                 "%d/%d" % r.ex2_under_pv if r.ex2_under_pv else "-",
                 ", ".join(f"{k} x{v}" for k, v in sorted(r.gmma.items())) or "-", detail]
        lines.append("| " + " | ".join(cells) + " |")
    if not reports:
        lines.append("| (no consumer or producer loop found) |")
    lines.append("")
    for fn, s in short.items():
        lines.append(f"- {s}: `{fn[:160]}`")
    lines.append("")
    return "\n".join(lines)


LEGEND = ("Per iteration of each loop (one K/V block), per warp. keys = kBlockN, the N of the loop's SS "
          "GMMA (Q.K^T) times blocks (unrolled iterations). per block / per key = non-GMMA instructions / blocks / keys; UTMALDG in the detail column are per iteration. Classes: mufu, fp32 (FADD FMUL FFMA FMNMX "
          "FSEL FSETP), cvt (F2FP F2F I2F ...), int (IMAD IADD3 LOP3 SHF PRMT ISETP SEL LEA MOV S2R R2UR LDC "
          "...), uniform (U* but TMA), shfl, sync (BAR SYNCS WARPGROUP ELECT ...), mem (LD/ST/LDS/STS/LDG/"
          "STG/ULDC ...), tma (UTMALDG UTMASTG UBLKCP ...), ctrl (BRA EXIT NOP ...). cold: instructions of "
          "the loop's out-of-line blocks (not counted). EX2 under P.V: exponentials between the last RS "
          "GMMA and its WARPGROUP.DEPBAR 0x0, of the loop's total. stall cycles: the sum of the counted "
          "instructions' control-bit stall counts (a lower bound of the warp's cycles per iteration before "
          "variable-latency waits), and per key. Made by tools/build/sass_loops.py.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--md", type=Path, help="also write the tables here (markdown)")
    args = ap.parse_args(argv)
    parts = [LEGEND]
    for p in args.files:
        parts.append(table(p.name.split(".")[0], analyze(sass_of(p))))
    text = "\n".join(parts)
    print(text)
    if args.md:
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
