"""Reference backend: the FlashAttention-2 algorithm in plain PyTorch.

This package is the executable specification of flash3: this file the attention (batched,
varlen, backward, KV cache), :mod:`flash3.reference.fp8` the emulation of the FP8 kernel.  The
attention stays in ``__init__.py`` because its tunables (BLOCK_M, BLOCK_N, TILE_ELEMENTS,
SPLIT_BLOCK_N) are read at call time from ``flash3.reference`` itself, where tests shrink them.

The attention is exact (fp32
accumulation), device-agnostic and memory-efficient: it tiles over queries and
keys with an online softmax and never holds a (seqlen_q x seqlen_k) matrix.
On the CPU, calls without softcap, with d_v == d and no lse gradient run torch's
own fused CPU kernel instead (flash3/_torch_cpu.py: directly for no mask or square
causal, per query block with a band mask for other windows): the same function,
computed faster.

Inputs are already validated and the window already normalized
(``masking.normalize_window``: causal is ``right == 0``, -1 is unbounded).

Attention sinks (``sinks``, one logit per query head, in the space of softmax_scale·q·kᵀ
after softcap): an extra softmax column that carries no value.  Each row's running max and
sum start from it (max = sink, sum = 1), so lse includes it and a row with no visible key
gives out 0, lse = sink; a -inf sink is no sink.  The backward returns
d_sink[h] = -sum over rows of P_sink * (rowsum(dO * O) - dlse), with P_sink = exp(sink - lse).

ALiBi (``alibi_slopes``, float32 (h,) or (b, h)): query row i of a sequence with s_q queries and
s_k keys adds -slope * |i + s_k - s_q - j| to its score with key j (in the space of
softmax_scale·q·kᵀ after softcap, before the mask: FlashAttention-2's convention, bottom-right
aligned, per sequence in varlen; a KV cache's s_k is the row's key count).  lse is the exact
log-sum-exp of those biased scores, with or without a causal mask (FlashAttention-2's causal
kernel adds slope * j instead, which shifts each row's lse by a constant; flash3 does not).  The
slopes are constants: no gradient flows to them.

Internal layout: query heads are grouped by their kv head, ``h = h_k * g``, and
the ``g`` heads of a group are folded into the row dimension, so one batched
matmul over ``(batch * h_k)`` serves GQA/MQA without copying K/V per head.
A query tile of ``block_m`` positions is ``block_m * g`` rows.
"""

from __future__ import annotations

import math

import torch

from .. import _torch_cpu, masking
from ..decode_plan import split_key_range
from ..fp8_quant import FP8_MAX
from ..rotary import apply_rotary, kvcache_rotary

# Tile sizes (query positions x keys), tuned on CPU: large tiles amortize the
# per-tile Python and kernel-launch cost; the score tile stays a few MiB.
BLOCK_M = 256
BLOCK_N = 512
TILE_ELEMENTS = 1 << 22

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_FLOOR = -1e30  # finite stand-in for a running max of -inf

# The backward's one-hot rows (bwd/kernel.cuh one_hot_rows does the same): a query row that sees
# exactly one key has softmax 1, so P = 1 there and, as D = sum_j P dP is then that key's dP,
# dS = P (dP - D) = 0 (with dlse: dS = dlse). Computed as written, P comes out 1 +- 1e-6 (the lse
# round trip) and dP - D a few ulps (two sums in different orders): dq ~1e-7 instead of 0. So where
# such a row's recomputed P is within ONE_HOT_TOL of 1, P is set to 1 and, without dlse, dS to 0.
# With the row's own lse that is exact (the round trip is a few ulps of lse * log2(e), inside the
# tolerance while |lse| < ~100); with an lse over more keys than the call sees (ring attention's
# chunks) it fires only where this key holds >= 1 - 2^-14 of the row, and the dS it drops is then
# at most 2^-13 max|dP| (the others' share times the spread of dP).
ONE_HOT_TOL = 2.0 ** -14


def _rows(x: torch.Tensor, h_k: int) -> torch.Tensor:
    """(b, s, h, d) -> fp32 (b*h_k, s*g, d), rows ordered (position, group)."""
    b, s, h, d = x.shape
    g = h // h_k
    return (x.reshape(b, s, h_k, g, d).permute(0, 2, 1, 3, 4)
            .to(torch.float32).reshape(b * h_k, s * g, d))


def _unrows(x: torch.Tensor, b: int, s: int, h_k: int, g: int, dtype) -> torch.Tensor:
    """Inverse of :func:`_rows`: (b*h_k, s*g, d) -> (b, s, h, d) in ``dtype``."""
    d = x.shape[-1]
    return (x.view(b, h_k, s, g, d).permute(0, 2, 1, 3, 4)
            .reshape(b, s, h_k * g, d).to(dtype).contiguous())


def _lse_rows_to_bhs(lse: torch.Tensor, b: int, s: int, h_k: int, g: int) -> torch.Tensor:
    """(b*h_k, s*g) -> (b, h, s)."""
    return lse.view(b, h_k, s, g).permute(0, 1, 3, 2).reshape(b, h_k * g, s).contiguous()


def _lse_bhs_to_rows(lse: torch.Tensor, h_k: int) -> torch.Tensor:
    """(b, h, s) -> (b*h_k, s*g)."""
    b, h, s = lse.shape
    g = h // h_k
    return lse.view(b, h_k, g, s).permute(0, 1, 3, 2).reshape(b * h_k, s * g)


def _tile_mask(m0, m1, n0, n1, s_q, s_k, left, right, device, chunk=0):
    """Inverted mask (True = hide) of one tile, shaped (m, 1, n) to broadcast over groups.

    None when nothing is hidden.  Tiles never reach past s_q/s_k, so visibility depends only on the key -
    query distance and two triangles give it (few ops: each op on a shared
    CPU costs a thread-pool round trip). An attention chunk (masking.py) hides the keys outside
    each row's chunk.
    """
    if chunk > 0:
        keep = masking.visible_mask(m0, m1, n0, n1, s_q, s_k, False, left, right, device=device,
                                    chunk=chunk)
        return (~keep).unsqueeze(1)
    off = s_k - s_q + m0 - n0  # local (jj - ii) of the diagonal
    ones = torch.ones(m1 - m0, n1 - n0, dtype=torch.bool, device=device)
    hide = None
    if right >= 0:
        hide = torch.triu(ones, diagonal=off + right + 1)
    if left >= 0:
        below = torch.tril(ones, diagonal=off - left - 1)
        hide = below if hide is None else hide.logical_or_(below)
    return None if hide is None else hide.unsqueeze(1)


def _sink_rows(sinks, b: int, s: int, h_k: int) -> torch.Tensor:
    """sinks (h,) -> fp32 (b*h_k, s*g) in _rows' row order (natural-log units)."""
    g = sinks.shape[0] // h_k
    return sinks.to(torch.float32).view(1, h_k, 1, g).expand(b, h_k, s, g).reshape(b * h_k, s * g)


def sink_grad(sinks, dout, out, lse, dlse=None):
    """d_sink (h,) of (b, s_q, h, d_v) dout/out and (b, h, s_q) lse (and dlse), in fp32 (fp64
    for fp64 inputs, which the tests use to check the formula)."""
    dt = torch.float64 if out.dtype == torch.float64 else torch.float32
    D = (dout.to(dt) * out.to(dt)).sum(-1).transpose(1, 2)  # (b, h, s_q)
    if dlse is not None:
        D = D - dlse.to(dt)
    lse = lse.to(dt)
    # A row whose lse is -inf (no key, sink -inf) has P_sink = 0, not exp(-inf + inf).
    p_sink = torch.exp(sinks.to(dt).view(1, -1, 1) - lse.masked_fill(lse == -math.inf, math.inf))
    return -(p_sink * D).sum(dim=(0, 2))


def _alibi_rows(slopes, b: int, h_k: int):
    """alibi_slopes (h,) or (b, h) -> fp32 (b*h_k, 1, g, 1) slopes in log2 units, to scale a
    (m, 1, n) distance tile of _rows' (position, group) rows."""
    h = slopes.shape[-1]
    sl = slopes.to(torch.float32).expand(b, h) * _LOG2E
    return sl.reshape(b * h_k, 1, h // h_k, 1)


def _alibi_dist(m0, m1, n0, n1, s_q, s_k, device):
    """|i + s_k - s_q - j| of one tile, fp32 (m, 1, n) (exact: integers below 2^24)."""
    i = torch.arange(m0, m1, device=device, dtype=torch.float32).unsqueeze(1) + float(s_k - s_q)
    j = torch.arange(n0, n1, device=device, dtype=torch.float32).unsqueeze(0)
    return (i - j).abs_().unsqueeze(1)


def _slopes_of_row(alibi_slopes, i):
    """The (h,) slopes of batch row / sequence i (None stays None)."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[i]


def _q_scale(softmax_scale: float, softcap: float) -> float:
    # Without softcap the softmax scale and log2(e) fold into q (exp2 later);
    # with softcap q carries scale/cap and tanh's output is multiplied back.
    return softmax_scale / softcap if softcap > 0 else softmax_scale * _LOG2E


def forward(q, k, v, softmax_scale: float, left: int, right: int, softcap: float = 0.0,
            block_m: int | None = None, block_n: int | None = None, sinks=None,
            alibi_slopes=None, chunk: int = 0):
    """Attention forward.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v), optional ``sinks`` (h,) and
    ``alibi_slopes`` (h,) or (b, h) float32; ``chunk``: FA3's attention_chunk (masking.py), 0 = none.
    Returns ``out`` (b, s_q, h, d_v) in q's dtype and ``lse`` (b, h, s_q) fp32.
    """
    # torch's kernel has no sinks, ALiBi nor chunks
    explicit = (bool(block_m or block_n) or sinks is not None or alibi_slopes is not None
                or chunk > 0)
    if _torch_cpu.applies(q, k, v, left, right, softcap, explicit):
        return _torch_cpu.forward(q, k, v, softmax_scale, causal=right == 0)
    if _torch_cpu.applies_masked(q, k, v, softcap, explicit):
        return _torch_cpu.forward_masked(q, k, v, softmax_scale, left, right)
    b, s_q, h, d = q.shape
    s_k, h_k, d_v = k.shape[1], k.shape[2], v.shape[-1]
    g = h // h_k
    block_m = block_m or BLOCK_M  # read at call time (tests shrink them)
    if block_n is None:
        # Keep one score tile (b·h_k heads x block_m·g rows x block_n keys, fp32) within about
        # 16 MiB: larger tiles leave the caches and the exp pass becomes memory-bound.
        block_n = BLOCK_N
        while block_n > 128 and b * h * block_m * block_n > TILE_ELEMENTS:
            block_n //= 2
    dev = q.device
    out_rows = torch.zeros(b * h_k, s_q * g, d_v, dtype=torch.float32, device=dev)
    lse_rows = torch.full((b * h_k, s_q * g), -math.inf, dtype=torch.float32, device=dev)
    if sinks is not None:  # what a row that sees no key gets: out 0, lse = sink
        lse_rows.copy_(_sink_rows(sinks, b, s_q, h_k))
    if s_q == 0 or s_k == 0 or b == 0:
        return _unrows(out_rows, b, s_q, h_k, g, q.dtype), _lse_rows_to_bhs(lse_rows, b, s_q, h_k, g)

    # Out of place: _rows may return a view of the caller's q.
    qr = _rows(q, h_k) * _q_scale(softmax_scale, softcap)
    # K and V converted once (fp32, O(s_k·d) per head: the size of the inputs, not of a score
    # matrix) so query tiles slice them instead of re-copying. V gets a column of ones so the
    # P @ V matmul also yields the row sums of P (saves a pass over the score tile).
    kt_all = k.permute(0, 2, 3, 1).to(torch.float32).reshape(b * h_k, d, s_k)
    v_ext = torch.empty(b * h_k, s_k, d_v + 1, dtype=torch.float32, device=dev)
    v_ext[..., :d_v].view(b, h_k, s_k, d_v).copy_(v.permute(0, 2, 1, 3))
    v_ext[..., d_v] = 1.0
    cap2 = softcap * _LOG2E
    alibi2 = None if alibi_slopes is None else _alibi_rows(alibi_slopes, b, h_k)

    for mb in range((s_q + block_m - 1) // block_m):
        m0, m1 = mb * block_m, min((mb + 1) * block_m, s_q)
        n_lo, n_hi = masking.key_block_range(mb, block_m, block_n, s_q, s_k, False, left, right,
                                             chunk)
        if n_lo >= n_hi:
            continue  # every row of this tile sees nothing: out 0, lse -inf (or the sink)
        u_lo, u_hi = masking.unmasked_key_block_range(mb, block_m, block_n, s_q, s_k, False, left,
                                                      right, chunk)
        q_t = qr[:, m0 * g:m1 * g]
        rows = q_t.shape[1]
        m_run = acc = None
        if sinks is not None:  # the sink is the first column: max = sink, sum = exp2(0) = 1
            sink2 = _sink_rows(sinks, b, m1 - m0, h_k) * _LOG2E
            m_run = sink2.clamp(min=_FLOOR)
            acc = torch.zeros(b * h_k, rows, d_v + 1, dtype=torch.float32, device=dev)
            acc[..., d_v] = torch.exp2(sink2 - m_run)  # 0 for a -inf sink
        for nb in range(n_lo, n_hi):
            n0, n1 = nb * block_n, min((nb + 1) * block_n, s_k)
            k_t, v_t = kt_all[..., n0:n1], v_ext[:, n0:n1]
            s = torch.bmm(q_t, k_t)  # (B, rows, n), log2 domain unless softcap
            if softcap > 0:
                s.tanh_().mul_(cap2)
            if alibi2 is not None:
                dist = _alibi_dist(m0, m1, n0, n1, s_q, s_k, dev)
                s.view(b * h_k, m1 - m0, g, n1 - n0).sub_(alibi2 * dist)
            if not (u_lo <= nb < u_hi):
                hide = _tile_mask(m0, m1, n0, n1, s_q, s_k, left, right, dev, chunk)
                if hide is not None:
                    s.view(b * h_k, m1 - m0, g, n1 - n0).masked_fill_(hide, -math.inf)
            # Running max clamped to a finite floor: a row with nothing visible
            # yet then gives exp2(-inf - floor) = 0 instead of NaN.
            m_new = s.amax(dim=-1).clamp_(min=_FLOOR)
            if m_run is not None:
                torch.maximum(m_new, m_run, out=m_new)
            s.sub_(m_new.unsqueeze(-1)).exp2_()
            if m_run is None:
                acc = torch.bmm(s, v_t)  # (B, rows, d_v + 1): [P @ V | rowsum P]
            else:
                alpha = torch.exp2(m_run.sub_(m_new))
                acc.mul_(alpha.unsqueeze(-1)).baddbmm_(s, v_t)
            m_run = m_new
        l_run = acc[..., d_v]
        acc = acc[..., :d_v]
        empty = l_run == 0
        acc.div_(l_run.masked_fill(empty, 1.0).unsqueeze(-1))
        out_rows[:, m0 * g:m0 * g + rows] = acc
        lse = (m_run + torch.log2(l_run)) * _LN2
        lse_rows[:, m0 * g:m0 * g + rows] = lse.masked_fill_(empty, -math.inf)

    return _unrows(out_rows, b, s_q, h_k, g, q.dtype), _lse_rows_to_bhs(lse_rows, b, s_q, h_k, g)


def backward(dout, q, k, v, out, lse, softmax_scale: float, left: int, right: int,
             softcap: float = 0.0, dlse=None, block_m: int | None = None,
             block_n: int | None = None, sinks=None, alibi_slopes=None, chunk: int = 0):
    """Attention backward (recomputes P from ``lse``).

    ``dlse`` (b, h, s_q), optional, is the gradient flowing into lse: since
    d lse / d score = P, it enters exactly like the row sum D (D - dlse).
    Returns ``(dq, dk, dv)`` in the input dtypes, and d_sinks (h,) fp32 last when ``sinks``
    is given (P already includes the sink through lse: dq, dk, dv need nothing else).
    ``alibi_slopes`` (h,) or (b, h): the bias enters the recomputed P only (no slope gradient).
    ``chunk``: the forward's attention chunk.
    """
    if sinks is not None:
        dsinks = sink_grad(sinks, dout, out, lse, dlse)
        return backward(dout, q, k, v, out, lse, softmax_scale, left, right, softcap, dlse,
                        block_m or BLOCK_M, block_n or BLOCK_N,
                        alibi_slopes=alibi_slopes, chunk=chunk) + (dsinks,)
    b, s_q, h, d = q.shape
    s_k, h_k, d_v = k.shape[1], k.shape[2], v.shape[-1]
    g = h // h_k
    dev = q.device
    # Rows that see exactly one key (ONE_HOT_TOL below); the torch kernels do not know them.
    single = masking.visible_counts(s_q, s_k, False, left, right, dev, chunk=chunk) == 1
    any_single = bool(single.any()) if s_k > 0 else False
    explicit = bool(block_m or block_n) or alibi_slopes is not None or chunk > 0
    whole = _torch_cpu.applies(q, k, v, left, right, softcap, explicit)
    if dlse is None and (whole or _torch_cpu.applies_masked(q, k, v, softcap, explicit)):
        # torch's kernel; rows that see one key go through it with dO = 0 (so they add exactly
        # nothing: dP = D = 0) and get their gradients from _add_one_key_rows.
        d_o = dout
        if any_single:
            d_o = dout.clone()
            d_o[:, single] = 0
        grads = (_torch_cpu.backward(d_o, q, k, v, out, lse, softmax_scale, right == 0, any_single)
                 if whole else _torch_cpu.backward_masked(d_o, q, k, v, out, lse, softmax_scale,
                                                          left, right, any_single))
        if not any_single:
            return grads
        _add_one_key_rows(grads, dout, q, k, v, out, lse, softmax_scale, left, single)
        return tuple(g_.to(x.dtype) for g_, x in zip(grads, (q, k, v)))
    block_m, block_n = block_m or BLOCK_M, block_n or BLOCK_N
    B = b * h_k
    dq_rows = torch.zeros(B, s_q * g, d, dtype=torch.float32, device=dev)
    dk_all = torch.zeros(B, s_k, d, dtype=torch.float32, device=dev)
    dv_all = torch.zeros(B, s_k, d_v, dtype=torch.float32, device=dev)

    def finish():
        dq = _unrows(dq_rows, b, s_q, h_k, g, q.dtype)
        # Contiguous outputs: the fake kernels in ops.py promise that layout.
        dk = dk_all.view(b, h_k, s_k, d).transpose(1, 2).to(k.dtype).contiguous()
        dv = dv_all.view(b, h_k, s_k, d_v).transpose(1, 2).to(v.dtype).contiguous()
        return dq, dk, dv

    if s_q == 0 or s_k == 0 or b == 0:
        return finish()

    q_plain = _rows(q, h_k)  # (B, R, d)
    qs = q_plain * _q_scale(softmax_scale, softcap)
    do_rows = _rows(dout, h_k)
    D = (do_rows * _rows(out, h_k)).sum(dim=-1)  # (B, R)
    single_rows = single.repeat_interleave(g)  # (R,): rows are (position, group)
    if dlse is not None:
        D.sub_(_lse_bhs_to_rows(dlse.to(torch.float32), h_k))
    lse2 = _lse_bhs_to_rows(lse.to(torch.float32), h_k) * _LOG2E
    # Rows that saw nothing (lse = -inf) must give P = 0: exp2(s - (+inf)) = 0.
    lse2.masked_fill_(lse2 == -math.inf, math.inf)
    k_all = k.permute(0, 2, 1, 3)  # (b, h_k, s_k, d)
    v_all = v.permute(0, 2, 1, 3)
    cap2 = softcap * _LOG2E
    alibi2 = None if alibi_slopes is None else _alibi_rows(alibi_slopes, b, h_k)

    for mb in range((s_q + block_m - 1) // block_m):
        m0, m1 = mb * block_m, min((mb + 1) * block_m, s_q)
        n_lo, n_hi = masking.key_block_range(mb, block_m, block_n, s_q, s_k, False, left, right,
                                             chunk)
        if n_lo >= n_hi:
            continue
        u_lo, u_hi = masking.unmasked_key_block_range(mb, block_m, block_n, s_q, s_k, False, left,
                                                      right, chunk)
        r0, r1 = m0 * g, m1 * g
        qs_t, qp_t, do_t = qs[:, r0:r1], q_plain[:, r0:r1], do_rows[:, r0:r1]
        D_t, lse_t = D[:, r0:r1].unsqueeze(-1), lse2[:, r0:r1].unsqueeze(-1)
        one_t = single_rows[r0:r1] if bool(single_rows[r0:r1].any()) else None
        dq_t = dq_rows[:, r0:r1]
        for nb in range(n_lo, n_hi):
            n0, n1 = nb * block_n, min((nb + 1) * block_n, s_k)
            k_t = k_all[:, :, n0:n1].to(torch.float32).reshape(B, n1 - n0, d)
            v_t = v_all[:, :, n0:n1].to(torch.float32).reshape(B, n1 - n0, d_v)
            s = torch.bmm(qs_t, k_t.transpose(1, 2))
            if softcap > 0:
                t = s.tanh_()
                s = t * cap2
            if alibi2 is not None:  # a constant of q and k: dS passes through it unchanged
                dist = _alibi_dist(m0, m1, n0, n1, s_q, s_k, dev)
                s.view(B, m1 - m0, g, n1 - n0).sub_(alibi2 * dist)
            if not (u_lo <= nb < u_hi):
                hide = _tile_mask(m0, m1, n0, n1, s_q, s_k, left, right, dev, chunk)
                if hide is not None:
                    s.view(B, m1 - m0, g, n1 - n0).masked_fill_(hide, -math.inf)
            p = s.sub_(lse_t).exp2_()  # (B, R, n)
            hot = None
            if one_t is not None:  # ONE_HOT_TOL: P = 1 there, and dS = 0 without dlse
                hot = torch.zeros_like(p, dtype=torch.bool)
                hot[:, one_t] = (p[:, one_t] - 1.0).abs_() <= ONE_HOT_TOL
                p.masked_fill_(hot, 1.0)
            dv_all[:, n0:n1].baddbmm_(p.transpose(1, 2), do_t)
            ds = torch.bmm(do_t, v_t.transpose(1, 2)).sub_(D_t).mul_(p)
            if hot is not None and dlse is None:
                ds.masked_fill_(hot, 0.0)
            if softcap > 0:
                # d(cap*tanh(x/cap))/dx = 1 - tanh^2
                ds.mul_(1.0 - t * t)
            dq_t.baddbmm_(ds, k_t, alpha=softmax_scale)
            dk_all[:, n0:n1].baddbmm_(ds.transpose(1, 2), qp_t, alpha=softmax_scale)
    return finish()


def _add_one_key_rows(grads, dout, q, k, v, out, lse, softmax_scale, left, single):
    """Adds to fp32 (dq, dk, dv) the gradients of the rows `single` marks (each sees one key, no
    softcap, no dlse), by the tiled backward's rule (ONE_HOT_TOL): a few vector operations. dq of
    those rows is overwritten (the caller's is 0 there)."""
    dq, dk, dv = grads
    s_q, s_k, h, h_k = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    rows = single.nonzero().squeeze(1)
    key = (rows + (s_k - s_q) - left).clamp(min=0) if left >= 0 else torch.zeros_like(rows)
    g = h // h_k
    f32 = lambda x: x.to(torch.float32)  # noqa: E731
    qi, doi, oi = f32(q[:, rows]), f32(dout[:, rows]), f32(out[:, rows])  # (b, n, h, .)
    kj = f32(k[:, key]).repeat_interleave(g, dim=2)
    vj = f32(v[:, key]).repeat_interleave(g, dim=2)
    lse_i = f32(lse[:, :, rows]).transpose(1, 2)
    lse_i = lse_i.masked_fill(lse_i == -math.inf, math.inf)  # as the tiled path: P = 0 there
    p = torch.exp((qi * kj).sum(-1) * softmax_scale - lse_i)
    hot = (p - 1.0).abs() <= ONE_HOT_TOL
    p.masked_fill_(hot, 1.0)
    ds = p * ((doi * vj).sum(-1) - (doi * oi).sum(-1))
    ds.masked_fill_(hot, 0.0)
    b, n, d = q.shape[0], rows.numel(), q.shape[-1]
    dq[:, rows] = softmax_scale * ds.unsqueeze(-1) * kj
    dk.index_add_(1, key, (softmax_scale * ds.unsqueeze(-1) * qi).view(b, n, h_k, g, d).sum(3))
    dv.index_add_(1, key, (p.unsqueeze(-1) * doi).view(b, n, h_k, g, -1).sum(3))


# --------------------------------------------------------------------------
# Variable-length (packed) batches: one call of the core per sequence.
# --------------------------------------------------------------------------

def _seq_bounds(cu_seqlens_q, cu_seqlens_k):
    # One host sync for the whole batch.
    return cu_seqlens_q.tolist(), cu_seqlens_k.tolist()


def _used_ends(cq, seqused_q):
    """End of sequence i's queries (or keys): cq[i] + seqused_q[i] clamped into [0, its length]
    (FA3's seqused_q/seqused_k: the first seqused[i] packed rows are used; any value is clamped, as
    the kernels do), or cq[i + 1] without it."""
    if seqused_q is None:
        return cq[1:]
    return [q0 + min(max(int(n), 0), max(q1 - q0, 0))
            for q0, q1, n in zip(cq[:-1], cq[1:], seqused_q.tolist())]


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, left, right,
                   softcap=0.0, sinks=None, alibi_slopes=None, seqused_q=None, chunk=0,
                   seqused_k=None):
    """q (total_q, h, d), k/v (total_k, h_k, d|d_v) -> out (total_q, h, d_v), lse (h, total_q).

    Tokens outside every sequence get out 0, lse -inf.  ALiBi distances are per sequence
    (``alibi_slopes`` (h,) or (b, h): row i of a (b, h) tensor is sequence i's).
    ``seqused_q`` int32 (b,) (FA3's): sequence i's queries are its first seqused_q[i] packed rows
    (clamped into [0, its length]); masks align on that count, its other rows get out 0, lse -inf.
    ``seqused_k`` likewise for keys: sequence i sees its first seqused_k[i] packed keys (clamped),
    masks aligned on that count."""
    total_q, h, _ = q.shape
    out = torch.zeros(total_q, h, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((h, total_q), -math.inf, dtype=torch.float32, device=q.device)
    cq, ck = _seq_bounds(cu_seqlens_q, cu_seqlens_k)
    ends, k_ends = _used_ends(cq, seqused_q), _used_ends(ck, seqused_k)
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], ends[i], ck[i], k_ends[i]
        if q1 == q0:
            continue
        o_i, l_i = forward(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                           softmax_scale, left, right, softcap, sinks=sinks,
                           alibi_slopes=_slopes_of_row(alibi_slopes, i), chunk=chunk)
        out[q0:q1] = o_i[0]
        lse[:, q0:q1] = l_i[0]
    return out, lse


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                    left, right, softcap=0.0, dlse=None, sinks=None, alibi_slopes=None,
                    seqused_q=None, chunk=0, seqused_k=None):
    """Gradients of :func:`varlen_forward`; tokens outside every sequence (and rows past
    ``seqused_q``, keys past ``seqused_k``) get 0.  With ``sinks``, d_sinks (h,) fp32 is returned
    last (a sum over every sequence's rows)."""
    dq, dk, dv = (torch.zeros(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))
    dsinks = None if sinks is None else torch.zeros(q.shape[1], dtype=torch.float32,
                                                    device=q.device)
    cq, ck = _seq_bounds(cu_seqlens_q, cu_seqlens_k)
    ends, k_ends = _used_ends(cq, seqused_q), _used_ends(ck, seqused_k)
    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], ends[i], ck[i], k_ends[i]
        if q1 == q0:
            continue
        dlse_i = None if dlse is None else dlse[None, :, q0:q1]
        if k1 == k0:  # no key: only the sink has a gradient (P_sink = 1)
            if sinks is not None:
                dsinks += sink_grad(sinks, dout[None, q0:q1], out[None, q0:q1],
                                    lse[None, :, q0:q1], dlse_i)
            continue
        grads = backward(dout[None, q0:q1], q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
                         out[None, q0:q1], lse[None, :, q0:q1], softmax_scale, left, right,
                         softcap, dlse=dlse_i, sinks=sinks,
                         alibi_slopes=_slopes_of_row(alibi_slopes, i), chunk=chunk)
        dq[q0:q1] = grads[0][0]
        dk[k0:k1] += grads[1][0]  # += : sequences may share keys if cu_seqlens_k overlap
        dv[k0:k1] += grads[2][0]
        if sinks is not None:
            dsinks += grads[3]
    return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


# --------------------------------------------------------------------------
# KV cache: append new keys in place, then attend per batch row.
#
# Optional features, all specified here first (the kernels follow this code):
# * rotary embedding of q and the new k (flash3/rotary.py), applied before the append;
# * FP8 caches (float8_e4m3fn) read with descales of shape (k_cache.shape[0], h_k):
#   per (batch row, kv head) for a contiguous cache, per (page, kv head) for a paged one.
#   A stored value x8 means x8.float() * descale; an append stores
#   round_e4m3(clamp(x / descale, -448, 448)) with the slab's existing descale.
#   (The Hopper decode kernel computes with x8 * descale rounded once to q's dtype, the
#   precision of a 16-bit cache: its tests' same-precision baseline rounds the same way);
# * split-KV: each row's keys dealt into num_splits ranges (decode_plan.split_key_range),
#   a partial (O, lse) per range, merged by combine_splits;
# * left padding (FA3's cache_leftpad (b,)): row i's keys are cache positions
#   [cache_leftpad[i], cache_seqlens[i] + s_new), key j at position cache_leftpad[i] + j (the
#   masks, ALiBi and split ranges count keys from there); new keys are still stored at
#   cache_seqlens[i] + t and rotated at that position (FA3's seqlen_rotary). A value outside
#   [0, cache_seqlens[i] + s_new] is clamped into it (as the kernel does).
# --------------------------------------------------------------------------

SPLIT_BLOCK_N = 128  # key-block granularity of the split ranges (that of the decode kernel)


def _cache_slots(cache_seqlens, s_new, page_table, page_size):
    """(batch index or page, offset) of the s_new slots following each row's cache."""
    b = cache_seqlens.shape[0]
    pos = cache_seqlens.to(torch.long).unsqueeze(1) + torch.arange(
        s_new, device=cache_seqlens.device).unsqueeze(0)  # (b, s_new)
    if page_table is None:
        rows = torch.arange(b, device=cache_seqlens.device).unsqueeze(1).expand(b, s_new)
        return rows, pos
    pages = torch.gather(page_table.to(torch.long), 1, pos // page_size)
    return pages, pos % page_size


def quantize_fp8_cache(x, descale):
    """x (..., h_k, d) in any float dtype, descale broadcastable to (..., h_k) -> float8_e4m3fn:
    x / descale in fp32, saturated to +-448, rounded to nearest even."""
    y = x.to(torch.float32) / descale.to(torch.float32).unsqueeze(-1)
    return y.clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequantize_fp8_cache(x8, descale):
    """float8_e4m3fn (..., h_k, d) -> fp32 x8 * descale (descale broadcastable to (..., h_k))."""
    return x8.to(torch.float32) * descale.to(torch.float32).unsqueeze(-1)


def kvcache_write(k_cache, v_cache, k, v, cache_seqlens, page_table=None, k_descale=None,
                  v_descale=None):
    """Write k/v (b, s_new, h_k, ·) into the caches right after cache_seqlens[i].

    FP8 caches take their slab's descale (k_descale/v_descale (k_cache.shape[0], h_k)); without
    descales k/v are stored in the cache's dtype (float8_e4m3fn k/v into an FP8 cache: unchanged).
    """
    if k is None or k.shape[1] == 0:
        return
    idx0, idx1 = _cache_slots(cache_seqlens, k.shape[1], page_table, k_cache.shape[1])
    if k_descale is not None:
        k = quantize_fp8_cache(k, k_descale[idx0])
        v = quantize_fp8_cache(v, v_descale[idx0])
    k_cache[idx0, idx1] = k
    v_cache[idx0, idx1] = v


def kvcache_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
                          cu_seqlens_k_new, rotary_cos=None, rotary_sin=None,
                          rotary_interleaved=False, q_per_token=True, rotary_seqlens=None):
    """The append of new keys in FA3's packed layouts (caches of q's dtype): entry i's new tokens
    are k[i] (batched (b, s_new, h_k, .)) or k[cu_seqlens_k_new[i]:cu_seqlens_k_new[i+1]]
    (packed), written (rotated first when rotary tables are given) at cache positions
    cache_seqlens[i] + t; its queries q[i] or q[cu_seqlens_q[i]:...], rotated at
    rotary_seqlens[i] (default cache_seqlens[i]) + t (``q_per_token``) or + 0.  Returns q rotated
    (packed rows of no entry copied as they are), or None without rotary.  Host reads of the
    metadata (the CPU's, and the CUDA fallback's)."""
    b = cache_seqlens.shape[0]
    lens = cache_seqlens.tolist()
    ro = lens if rotary_seqlens is None else rotary_seqlens.tolist()
    cq = None if cu_seqlens_q is None else cu_seqlens_q.tolist()
    ck = None if cu_seqlens_k_new is None else cu_seqlens_k_new.tolist()
    q_out = None if rotary_cos is None else q.clone()
    dev = q.device
    for i in range(b):
        kn, vn = ((x[i:i + 1] if ck is None else x[None, ck[i]:ck[i + 1]]) for x in (k, v))
        if rotary_cos is not None:
            pos = torch.arange(kn.shape[1], device=dev) + ro[i]
            kn = apply_rotary(kn, rotary_cos, rotary_sin, pos[None], rotary_interleaved)
            rows = slice(i, i + 1) if cq is None else slice(cq[i], cq[i + 1])
            qi = q[rows] if cq is None else q[None, rows]
            t = torch.arange(qi.shape[1], device=dev)
            qpos = (t + ro[i] if q_per_token else torch.full_like(t, ro[i]))[None]
            qi = apply_rotary(qi, rotary_cos, rotary_sin, qpos, rotary_interleaved)
            q_out[rows] = qi if cq is None else qi[0]
        if page_table is None:  # row i of a contiguous cache
            kvcache_write(k_cache[i:i + 1], v_cache[i:i + 1], kn, vn, cache_seqlens[i:i + 1])
        else:
            kvcache_write(k_cache, v_cache, kn, vn, cache_seqlens[i:i + 1], page_table[i:i + 1])
    return q_out


def kvcache_gather(cache, i, n, page_table=None, descale=None, descale_per_batch=False):
    """The first n keys of batch row i, contiguous (n, h_k, d); fp32 if ``descale`` (FP8): per
    slab (page or contiguous row), or with ``descale_per_batch`` row i's own (FA3's (b, h_k))."""
    if page_table is None:
        x = cache[i, :n]
        return x if descale is None else dequantize_fp8_cache(x, descale[i])
    pos = torch.arange(n, device=cache.device)
    pages = page_table[i].to(torch.long)[pos // cache.shape[1]]
    x = cache[pages, pos % cache.shape[1]]
    if descale is None:
        return x
    return dequantize_fp8_cache(x, descale[i] if descale_per_batch else descale[pages])


def split_partials(q, k, v, softmax_scale, left, right, softcap, ranges, alibi_slopes=None,
                   chunk=0):
    """Partial attention of q (1, s_q, h, d) over each key range [a, b) of k/v (1, n, h_k, ·).

    The mask is that of the whole row (bottom-right aligned on n keys), applied at absolute
    key positions.  Returns o (S, 1, s_q, h, d_v) fp32, each normalized over its own range,
    and lse (S, 1, h, s_q) fp32; a range with no visible key gives o = 0, lse = -inf.
    ``alibi_slopes`` (h,): the row's ALiBi slopes (distances on the whole row's n keys); ``chunk``:
    FA3's attention_chunk on the whole row (masking.py), 0 = none.
    """
    _, s_q, h, _ = q.shape
    n, h_k, d_v = k.shape[1], k.shape[2], v.shape[-1]
    g = h // h_k
    dev = q.device
    qf = q.to(torch.float32)
    kf = k.to(torch.float32).repeat_interleave(g, dim=2)
    vf = v.to(torch.float32).repeat_interleave(g, dim=2)
    o_parts, lse_parts = [], []
    for a, b in ranges:
        if a >= b:
            o_parts.append(torch.zeros(1, s_q, h, d_v, dtype=torch.float32, device=dev))
            lse_parts.append(torch.full((1, h, s_q), -math.inf, dtype=torch.float32, device=dev))
            continue
        s = torch.einsum("bqhd,bkhd->bhqk", qf, kf[:, a:b]) * softmax_scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if alibi_slopes is not None:
            dist = _alibi_dist(0, s_q, a, b, s_q, n, dev).squeeze(1)  # (s_q, b - a)
            s = s - alibi_slopes.to(torch.float32).view(1, h, 1, 1) * dist
        keep = masking.visible_mask(0, s_q, a, b, s_q, n, False, left, right, device=dev,
                                    chunk=chunk)
        s = s.masked_fill(~keep, -math.inf)
        lse = torch.logsumexp(s, dim=-1)  # (1, h, s_q); -inf where nothing is visible
        p = torch.exp(s - lse.masked_fill(lse == -math.inf, 0.0).unsqueeze(-1))
        o = torch.einsum("bhqk,bkhd->bqhd", p, vf[:, a:b])
        o_parts.append(o)
        lse_parts.append(lse)
    return torch.stack(o_parts), torch.stack(lse_parts)


def combine_splits(o_parts, lse_parts):
    """Merge split partials: o (S, b, s_q, h, d_v), lse (S, b, h, s_q) -> out (b, s_q, h, d_v)
    fp32, lse (b, h, s_q).

    lse = m + log(sum_j exp(lse_j - m)) with m the max over splits (taken as 0 when every split
    is -inf, so no inf - inf), out = sum_j exp(lse_j - lse) o_j; a row no split saw gets
    out 0 and lse -inf.  This is the math of the combine kernel.
    """
    lse_parts = lse_parts.to(torch.float32)
    m = lse_parts.amax(dim=0)
    m = m.masked_fill(m == -math.inf, 0.0)
    w = torch.exp(lse_parts - m)  # (S, b, h, s_q); exactly 0 for -inf partials
    total = w.sum(dim=0)
    lse = m + torch.log(total)  # log(0) = -inf for rows nothing saw
    scale = w / total.masked_fill(total == 0, 1.0)
    out = (o_parts.to(torch.float32) * scale.permute(0, 1, 3, 2).unsqueeze(-1)).sum(dim=0)
    return out, lse


def kvcache_forward(q, k_cache, v_cache, k, v, cache_seqlens, page_table, softmax_scale,
                    left, right, softcap=0.0, rotary_cos=None, rotary_sin=None,
                    rotary_interleaved=False, k_descale=None, v_descale=None, num_splits=1,
                    sinks=None, alibi_slopes=None, rotary_seqlens=None, cache_leftpad=None,
                    descale_per_batch=False, chunk=0):
    """Rotate (optional), append k/v to the caches (in place), then attend over cache + new keys
    (from position cache_leftpad[i] on, when given).

    ``chunk``: FA3's attention_chunk (masking.py; 0 = none) on the row's keys, positions counted
    from cache_leftpad; with it (as with a window) q is rotated per token.

    ``descale_per_batch``: FP8-cache descales (b, h_k), FA3's: row i reads its keys with its own
    descales, whatever slab holds them; new keys are then float8_e4m3fn, stored unchanged (they
    share their entry's descales).

    ``rotary_seqlens`` (b,): the rotary position of row i's first new token (default
    cache_seqlens[i], its key position).

    ``sinks`` (h,): attention sinks; with splits the sink is one more partial (o = 0,
    lse = sink) of the combine.

    q (b, s_q, h, d) -> out (b, s_q, h, d_v), lse (b, h, s_q).  ``num_splits`` > 1 computes each
    row through split_partials + combine_splits (the same result up to fp32 rounding); 0 and 1
    attend in one pass (the split count only changes speed, which the reference does not have).
    """
    if rotary_cos is not None and k is not None:
        q, k = kvcache_rotary(q, k, cache_seqlens if rotary_seqlens is None else rotary_seqlens,
                              rotary_cos, rotary_sin, rotary_interleaved,
                              left >= 0 or right >= 0 or chunk > 0)
    if descale_per_batch:  # e4m3 new keys under their entry's descales: stored as they are
        kvcache_write(k_cache, v_cache, k, v, cache_seqlens, page_table)
    else:
        kvcache_write(k_cache, v_cache, k, v, cache_seqlens, page_table, k_descale, v_descale)
    b, s_q, h, _ = q.shape
    s_new = 0 if k is None else k.shape[1]
    out = torch.zeros(b, s_q, h, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((b, h, s_q), -math.inf, dtype=torch.float32, device=q.device)
    lengths = (cache_seqlens.to(torch.long) + s_new).tolist()
    pads = [0] * b if cache_leftpad is None else cache_leftpad.tolist()
    for i in range(b):
        lp = min(max(pads[i], 0), lengths[i])
        sl_i = _slopes_of_row(alibi_slopes, i)  # distances over the row's n keys
        k_i = kvcache_gather(k_cache, i, lengths[i], page_table, k_descale, descale_per_batch)[lp:]
        v_i = kvcache_gather(v_cache, i, lengths[i], page_table, v_descale, descale_per_batch)[lp:]
        n = lengths[i] - lp
        if num_splits > 1:
            ranges = [split_key_range(j, num_splits, n, SPLIT_BLOCK_N) for j in range(num_splits)]
            o_p, l_p = split_partials(q[i:i + 1], k_i[None], v_i[None], softmax_scale, left,
                                      right, softcap, ranges, sl_i, chunk)
            if sinks is not None:
                o_p = torch.cat([o_p, torch.zeros_like(o_p[:1])])
                sink = sinks.to(torch.float32).view(1, 1, h, 1).expand(1, 1, h, s_q)
                l_p = torch.cat([l_p, sink])
            o_i, l_i = combine_splits(o_p, l_p)
        else:
            o_i, l_i = forward(q[i:i + 1], k_i[None], v_i[None], softmax_scale, left, right,
                               softcap, sinks=sinks, alibi_slopes=sl_i, chunk=chunk)
        out[i] = o_i[0].to(q.dtype)
        lse[i] = l_i[0]
    return out, lse


# --------------------------------------------------------------------------
# Packed variable-length queries against a KV cache (chunked prefill, prefix caching, mixed
# prefill/decode batches): sequence i's queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] attend to
# its seqused_k[i] keys, bottom-right aligned (causal: the last query sees every key).
# --------------------------------------------------------------------------

def varlen_cache_forward(q, k_cache, v_cache, cu_seqlens_q, seqused_k, page_table, cu_seqlens_k,
                         softmax_scale, left, right, softcap=0.0, k_descale=None, v_descale=None,
                         sinks=None, alibi_slopes=None, cache_leftpad=None, chunk=0,
                         descale_per_batch=False):
    """q (total_q, h, d) -> out (total_q, h, d_v) in q's dtype, lse (h, total_q) fp32.

    Keys of sequence i, by layout:
    * paged (``page_table`` (b, max_pages)): the first seqused_k[i] slots of pages
      page_table[i] of k_cache (num_pages, page_size, h_k, d);
    * contiguous cache (no page_table, no cu_seqlens_k): k_cache[i, :seqused_k[i]];
    * packed (``cu_seqlens_k``): k_cache[cu_seqlens_k[i]:][:n] with n = seqused_k[i] if given,
      else cu_seqlens_k[i+1] - cu_seqlens_k[i].
    FP8 caches (paged or contiguous) are read as x8 * descale (per page or batch row, kv head;
    with ``descale_per_batch`` FA3's (b, h_k): sequence i's own, whatever page holds the key).
    ``cache_leftpad`` (b,) (FA3's; paged or contiguous): sequence i's keys start at cache position
    clamp(cache_leftpad[i], 0, n) of its n, masks and ALiBi counting keys from there.
    ``chunk``: FA3's attention_chunk (masking.py), 0 = none.
    Tokens outside every sequence get out 0, lse -inf.  One host read of the metadata.
    """
    total_q, h, _ = q.shape
    out = torch.zeros(total_q, h, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.full((h, total_q), -math.inf, dtype=torch.float32, device=q.device)
    cq = cu_seqlens_q.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    ck = None if cu_seqlens_k is None else cu_seqlens_k.tolist()
    pads = None if cache_leftpad is None else cache_leftpad.tolist()
    for i in range(len(cq) - 1):
        q0, q1 = cq[i], cq[i + 1]
        if q1 == q0:
            continue
        if ck is not None:
            k0 = ck[i]
            n = used[i] if used is not None else ck[i + 1] - k0
            k_i, v_i = k_cache[k0:k0 + n], v_cache[k0:k0 + n]
        else:
            k_i = kvcache_gather(k_cache, i, used[i], page_table, k_descale, descale_per_batch)
            v_i = kvcache_gather(v_cache, i, used[i], page_table, v_descale, descale_per_batch)
            if pads is not None:
                lp = min(max(pads[i], 0), used[i])
                k_i, v_i = k_i[lp:], v_i[lp:]
        o_i, l_i = forward(q[None, q0:q1], k_i[None], v_i[None], softmax_scale, left, right,
                           softcap, sinks=sinks, alibi_slopes=_slopes_of_row(alibi_slopes, i),
                           chunk=chunk)
        out[q0:q1] = o_i[0].to(q.dtype)
        lse[:, q0:q1] = l_i[0]
    return out, lse
