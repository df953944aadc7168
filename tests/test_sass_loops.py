"""tools/build/sass_loops.py on a hand-written SASS listing (no GPU, no nvcc). Every expected number is
counted by hand from LISTING in the comments below."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "build"))
import sass_loops  # noqa: E402

# kern: a producer loop 0x30-0xa0 whose barrier retry sits out of line (0x1d0-0x1f0, jumping back to
# 0x50, which does not dominate it: not a loop of its own beyond the 0x1d0 self-loop), a consumer
# loop 0xc0-0x1b0, and an unreachable end-of-function self-loop at 0x200 (ignored).
# kern2: a producer loop written with numeric branch targets (0x10-0x40).
LISTING = """
	code for sm_90a
		Function : kern
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   S2R R0, SR_TID.X ;                 /* 0x0000000000007919 */
                                                                      /* 0x000e220000002100 */
        /*0010*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0020*/              @P0 BRA `(.L_x_1) ;
.L_x_0:
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2 ;
        /*0040*/             @!P1 BRA `(.L_x_5) ;
.L_x_6:
        /*0050*/                   ELECT P2, URZ, PT ;
        /*0060*/                   UTMALDG.2D [UR8], [UR10] ;
        /*0070*/                   UTMALDG.2D [UR12], [UR10] ;
        /*0080*/                   IADD3 R3, R3, -0x1, RZ ;
        /*0090*/                   ISETP.GT.AND P3, PT, R3, RZ, PT ;
        /*00a0*/              @P3 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
.L_x_1:
        /*00c0*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*00d0*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*00e0*/                   HGMMA.64x64x16.F32.BF16 R40, R8, gdesc[UR12], R40 ;
        /*00f0*/                   HGMMA.64x64x16.F32.BF16 R40, R12, gdesc[UR16], R40, gsb0 ;
        /*0100*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0110*/                   FMNMX R4, R24, R25, !PT ;
        /*0120*/                   MUFU.EX2 R24, R24 ;
        /*0130*/                   MUFU.EX2 R25, R25 ;
        /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0150*/                   MUFU.EX2 R26, R26 ;
        /*0160*/                   F2FP.BF16.F32.PACK_AB R8, R25, R24 ;
        /*0170*/                   FSEL R5, R4, RZ, P0 ;
        /*0180*/                   UIADD3 UR4, UR4, 0x2, URZ ;
        /*0190*/                   SHFL.BFLY PT, R6, R4, 0x1, 0x1f ;
        /*01a0*/                   LOP3.LUT R7, R7, 0x1, RZ, 0x3c, !PT ;
        /*01b0*/              @P0 BRA `(.L_x_1) ;
        /*01c0*/                   EXIT ;
.L_x_5:
        /*01d0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2 ;
        /*01e0*/             @!P1 BRA `(.L_x_5) ;
        /*01f0*/                   BRA `(.L_x_6) ;
.L_x_7:
        /*0200*/                   BRA `(.L_x_7) ;
		Function : kern2
        /*0000*/                   MOV R1, RZ ;
        /*0010*/                   UTMALDG.2D [UR8], [UR10] ;
        /*0020*/                   UTMALDG.2D [UR12], [UR10] ;
        /*0030*/                   ISETP.NE.AND P0, PT, R1, RZ, PT ;
        /*0040*/              @P0 BRA 0x10 ;
        /*0050*/                   EXIT ;
"""


def test_loops_of_the_listing():
    reps = sass_loops.analyze(LISTING)
    assert [(r.function, r.kind, r.start, r.end) for r in reps] == [
        ("kern", "producer", 0x30, 0xa0), ("kern", "unmasked", 0xc0, 0x1b0), ("kern2", "producer", 0x10, 0x40)]
    prod, cons, prod2 = reps

    # Producer, hot path 0x30..0xa0: 8 instructions (SYNCS, BRA, ELECT, 2 UTMALDG, IADD3, ISETP, BRA);
    # the out-of-line retry 0x1d0, 0x1e0, 0x1f0 is cold (3). No GMMA: no keys.
    assert (prod.total, prod.non_gmma, prod.cold, prod.keys) == (8, 8, 3, None)
    assert {c: n for c, n in prod.classes.items() if n} == {"sync": 2, "ctrl": 2, "tma": 2, "int": 2}

    # Consumer, 0xc0..0x1b0: 16 instructions, 4 of them HGMMA (2 SS 64x32x16 = Q.K^T, N = 32 keys;
    # 2 RS 64x64x16 = P.V, 2 x K16 = 32 keys as well): 12 others, 12 / 32 = 0.375 per key.
    assert (cons.total, cons.non_gmma, cons.keys, cons.cold) == (16, 12, 32, 0)
    assert cons.per_key == 12 / 32
    assert cons.gmma == {"HGMMA 64x32x16 SS": 2, "HGMMA 64x64x16 RS": 2}
    # mufu 3 EX2; fp32 FMNMX + FSEL; cvt F2FP; uniform UIADD3; shfl SHFL; sync 2 WARPGROUP.DEPBAR;
    # int LOP3; ctrl BRA.  4 + 3 + 2 + 1 + 1 + 1 + 2 + 1 + 1 = 16.
    assert {c: n for c, n in cons.classes.items() if n} == {
        "gmma": 4, "mufu": 3, "fp32": 2, "cvt": 1, "uniform": 1, "shfl": 1, "sync": 2, "int": 1, "ctrl": 1}
    # After the last RS HGMMA (0xf0): EX2 at 0x120 and 0x130 come before the DEPBAR 0x0 at 0x140, the
    # one at 0x150 after it; the 0x1 wait at 0x100 does not end the window.
    assert cons.ex2_under_pv == (2, 3)

    # kern2: 0x10..0x40, 2 UTMALDG, ISETP, BRA.
    assert (prod2.total, prod2.classes["tma"], prod2.classes["int"], prod2.classes["ctrl"]) == (4, 2, 1, 1)


def test_masked_label():
    # A second consumer loop with 16 (>= keys / 4) more FSEL than the first is the masked one.
    body = ["HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT", "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24, gsb0",
            "HGMMA.64x64x16.F32.BF16 R40, R8, gdesc[UR12], R40", "HGMMA.64x64x16.F32.BF16 R40, R12, gdesc[UR16], R40, gsb0",
            "MUFU.EX2 R24, R24"]
    lines, addr = ["Function : k"], 0
    for lab, extra in (("A", 0), ("B", 16)):
        lines.append(f".L_x_{lab}:")
        for op in body + ["FSEL R5, R4, RZ, P0"] * extra + [f"@P0 BRA `(.L_x_{lab})"]:
            lines.append(f"        /*{addr:04x}*/    {op} ;")
            addr += 16
    reps = sass_loops.analyze("\n".join(lines))
    assert [(r.kind, r.non_gmma) for r in reps] == [("unmasked", 2), ("masked", 18)]


def test_runtime_option_skipped():
    # A consumer loop with softcap's tanh laid out inline behind a uniform branch: counted along
    # the shorter way (the branch taken), 'laid out' counts all.
    text = """Function : k
.L_x_0:
        /*0000*/    HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0010*/    HGMMA.64x64x16.F32.BF16 R40, R8, gdesc[UR12], R40, gsb0 ;
        /*0020*/    @!P1 BRA `(.L_x_1) ;
        /*0030*/    FMUL R24, R24, R3 ;
        /*0040*/    MUFU.TANH R24, R24 ;
.L_x_1:
        /*0050*/    MUFU.EX2 R24, R24 ;
        /*0060*/    @P0 BRA `(.L_x_0) ;
"""
    (r,) = sass_loops.analyze(text)
    # laid out: 7 instructions; shortest: 0x0, 0x10, 0x20, 0x50, 0x60 = 5, 3 of them not HGMMA;
    # keys 16 (SS N = 16; one RS k16).
    assert (r.laid_out, r.total, r.non_gmma, r.keys, r.ops["MUFU"]) == (7, 5, 3, 16, 1)


def test_unrolled_loops():
    # A consumer loop unrolled twice: two S = Q.K^T (SS, N 16) and two P.V k-steps (RS, K 16):
    # 32 keys, 2 blocks of 16; 2 non-GMMA instructions (EX2, BRA) = 1 per block, 2 / 32 per key.
    # A producer loop posting K and V twice (4 expect-tx arrivals): 2 blocks, 4 UTMALDG.
    text = """Function : k
.L_x_0:
        /*0000*/    HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0010*/    HGMMA.64x64x16.F32.BF16 R40, R8, gdesc[UR12], R40, gsb0 ;
        /*0020*/    HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0030*/    HGMMA.64x64x16.F32.BF16 R40, R8, gdesc[UR12], R40, gsb0 ;
        /*0040*/    MUFU.EX2 R24, R24 ;
        /*0050*/    @P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0060*/    SYNCS.ARRIVE.TRANS64 RZ, [UR17+0x28000], R2 ;
        /*0070*/    UTMALDG.4D [UR8], [UR18], desc[UR34] ;
        /*0080*/    SYNCS.ARRIVE.TRANS64 RZ, [UR17+0x28020], R2 ;
        /*0090*/    UTMALDG.4D [UR8], [UR18], desc[UR36] ;
        /*00a0*/    SYNCS.ARRIVE.TRANS64 RZ, [UR17+0x28000], R2 ;
        /*00b0*/    UTMALDG.4D [UR8], [UR18], desc[UR34] ;
        /*00c0*/    SYNCS.ARRIVE.TRANS64 RZ, [UR17+0x28020], R2 ;
        /*00d0*/    UTMALDG.4D [UR8], [UR18], desc[UR36] ;
        /*00e0*/    @P1 BRA `(.L_x_1) ;
"""
    cons, prod = sass_loops.analyze(text)
    assert (cons.kind, cons.keys, cons.blocks, cons.non_gmma, cons.per_block, cons.per_key) == (
        "unmasked", 32, 2, 2, 1.0, 2 / 32)
    assert (prod.kind, prod.blocks, prod.total, prod.per_block, prod.ops["UTMALDG"]) == ("producer", 2, 9, 4.5, 4)


def test_stall_cycles():
    # The same shape of loop as test_runtime_option_skipped, with each instruction's high 64 bits on
    # the line below it, as cuobjdump prints them. Control bits 41.. of that word: stall (4 bits),
    # yield, write scoreboard (3), read scoreboard (3), wait mask (6). 0x000fc2... = 0x7e1 << 41:
    # stall 1, no scoreboards; 0x000fc8... stall 4; 0x000fce... stall 7; 0x000e22... = 0x711 << 41:
    # stall 1, yield, write scoreboard 0 (a MUFU); 0x000fca... stall 5.
    text = """Function : k
.L_x_0:
        /*0000*/    HGMMA.64x16x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0 ;   /* 0x0000000004187 */
                                                                                 /* 0x000fc20000000000 */
        /*0010*/    HGMMA.64x64x16.F32.BF16 R40, R8, gdesc[UR12], R40, gsb0 ;   /* 0x0000000004187 */
                                                                                 /* 0x000fc80000000000 */
        /*0020*/    @!P1 BRA `(.L_x_1) ;                                         /* 0x0000000000007 */
                                                                                 /* 0x000fce0000000000 */
        /*0030*/    FMUL R24, R24, R3 ;                                          /* 0x0000000000007 */
                                                                                 /* 0x000fce0000000000 */
        /*0040*/    MUFU.TANH R24, R24 ;                                         /* 0x0000000000007 */
                                                                                 /* 0x000fce0000000000 */
.L_x_1:
        /*0050*/    MUFU.EX2 R24, R24 ;                                          /* 0x0000000000007 */
                                                                                 /* 0x000e220000000000 */
        /*0060*/    @P0 BRA `(.L_x_0) ;                                          /* 0x0000000000007 */
                                                                                 /* 0x000fca0000000000 */
"""
    (r,) = sass_loops.analyze(text)
    # Counted path 0x0, 0x10, 0x20, 0x50, 0x60: 1 + 4 + 7 + 1 + 5 = 18; 16 keys.
    assert (r.total, r.stall_cycles, r.keys) == (5, 18, 16)
    assert r.stall_per_key == 18 / 16
    assert "| 18 | 1.12 |" in sass_loops.table("t", [r])
    # Without the encodings (test_runtime_option_skipped's listing) the column stays empty.
    (bare,) = sass_loops.analyze("\n".join(l for l in text.splitlines() if "*/    " in l or not l.strip().startswith("/*")))
    assert bare.stall_cycles is None and bare.total == 5
