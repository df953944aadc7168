"""flash3 reference backend vs torch's CPU scaled_dot_product_attention.

Prints a table (forward, and forward + backward) with the time ratio
flash3 / SDPA; lower is better, 1.0 is parity.  Two flash3 columns: the default
path (torch's fused CPU kernel where its mask is flash3's, see flash3/_torch_cpu.py;
all shapes here qualify) and the tiled reference that serves everything else
(sliding windows, softcap, bottom-right causal with s_q != s_k, lse gradients).
Run:

    python benchmarks/cpu_speed.py [--quick] [--threads N] [--no-tiled] [--window W]

--window W: flash3 with causal=True, window_size=(W, 0) (a sliding window; the default path then
runs torch's kernel per query block with a band mask), SDPA with the equivalent dense boolean
attn_mask (what a user without flash3 would pass); "causal" rows only.
"""

import argparse
import time

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # run from a checkout
import flash3  # noqa: E402

SHAPES = [  # (batch, seqlen, heads, headdim)
    (1, 1024, 8, 64),
    (1, 2048, 8, 128),
    (2, 2048, 16, 64),
    (1, 4096, 8, 64),
    (4, 1024, 16, 128),
]


def best_time(fn, reps):
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench(b, s, h, d, causal, backward, reps, tiled, window=None):
    q, k, v = (torch.randn(b, s, h, d, requires_grad=backward) for _ in range(3))
    g = torch.randn(b, s, h, d)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(backward)
                  for x in (q, k, v))
    gt = g.transpose(1, 2).contiguous()

    kw = dict(causal=causal) if window is None else dict(causal=True, window_size=(window, 0))
    mask = None
    if window is not None:
        i = torch.arange(s)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)

    def ours():
        o = flash3.attention(q, k, v, **kw)
        if backward:
            o.backward(g)

    def sdpa():
        o = (F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal) if mask is None
             else F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask))
        if backward:
            o.backward(gt)

    with torch.set_grad_enabled(backward):
        t_ours, t_sdpa = best_time(ours, reps), best_time(sdpa, reps)
        t_tiled = float("nan")
        if tiled:
            flash3._torch_cpu.USE_TORCH_CPU_KERNEL = False
            try:
                t_tiled = best_time(ours, reps)
            finally:
                flash3._torch_cpu.USE_TORCH_CPU_KERNEL = True
        return t_ours, t_sdpa, t_tiled


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="two shapes, one repetition")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: torch's default). On a shared, loaded machine "
                         "--threads 1 gives stable ratios; many threads make each of the "
                         "reference's many ops wait for descheduled workers")
    ap.add_argument("--no-tiled", action="store_true", help="skip the tiled-reference column")
    ap.add_argument("--window", type=int, default=None,
                    help="sliding window (causal, window_size=(W, 0)); SDPA gets the dense mask")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = SHAPES[:2] if args.quick else SHAPES
    reps = 1 if args.quick else 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, "
          f"tiles {flash3.reference.BLOCK_M}x{flash3.reference.BLOCK_N}"
          + ("" if args.window is None else f", sliding window {args.window} (SDPA: dense mask)"))
    print(f"{'b':>2} {'s':>5} {'h':>3} {'d':>4} {'causal':>6} {'pass':>8} "
          f"{'flash3 ms':>10} {'sdpa ms':>9} {'ratio':>6} {'tiled ms':>9} {'ratio':>6}")
    worst = [0.0, 0.0]
    for (b, s, h, d) in shapes:
        for causal in ((False, True) if args.window is None else (True,)):
            for backward in (False, True):
                t_ours, t_sdpa, t_tiled = bench(b, s, h, d, causal, backward, reps,
                                                not args.no_tiled, args.window)
                worst = [max(worst[0], t_ours / t_sdpa), max(worst[1], t_tiled / t_sdpa)]
                print(f"{b:>2} {s:>5} {h:>3} {d:>4} {str(causal):>6} "
                      f"{'fwd+bwd' if backward else 'fwd':>8} {t_ours * 1e3:>10.1f} "
                      f"{t_sdpa * 1e3:>9.1f} {t_ours / t_sdpa:>6.2f} {t_tiled * 1e3:>9.1f} "
                      f"{t_tiled / t_sdpa:>6.2f}")
    print(f"worst ratio: flash3 {worst[0]:.2f}x sdpa's time"
          + ("" if args.no_tiled else f", tiled reference {worst[1]:.2f}x"))


if __name__ == "__main__":
    main()
