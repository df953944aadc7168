"""FlashAttention-3's whole forward contract, written out directly (the executable spec of the
arguments flash3's kernels do not take).

:func:`fa3_forward` computes what FA3's ``flash_attn_3::fwd`` computes, one batch entry at a time,
with the full score matrix of that entry (no tiling: a spec, sized for tests and fallbacks), in
fp32 (fp64 for fp64 inputs) with plain torch ops, so autograd differentiates it. FA3's meaning of
each argument (hopper/flash_attn_interface.py and the oracle of hopper/test_flash_attn.py):

* keys of entry i: ``k[i]`` (batched); ``k[cu_seqlens_k[i]:cu_seqlens_k[i+1]]`` (packed); the
  first ``seqused_k[i]`` of those; or, with ``cache_seqlens`` (a KV cache), cache slots
  ``[cache_leftpad[i], cache_seqlens[i] + n_new_i)`` of cache row ``cache_batch_idx[i]`` (default
  i) -- through ``page_table[cache_batch_idx[i]]`` when paged.  Key positions count from
  ``cache_leftpad[i]``.
* new keys (``k_new``/``v_new``, (b, s_new, h_k, .), or packed by ``cu_seqlens_k_new``) are first
  rotated (rotary) and written in place at slots ``cache_seqlens[i] + t`` in the cache's dtype.
* queries of entry i: ``q[i]`` or ``q[cu_seqlens_q[i]:...]``, the first ``seqused_q[i]`` of them
  (the other rows: out 0, lse -inf).
* rotary (only with new keys): position of new key t is ``rotary_seqlens[i]`` (default
  ``cache_seqlens[i]``) + t; query t the same when causal, local or chunked, else all queries at
  ``rotary_seqlens[i]``.
* scores ``scale * q.k (+ scale * qv.v)``, softcap, then the masks, bottom-right aligned on
  (n_q, n_k) of the entry: window (left, right) and ``attention_chunk`` c (query row t at diagonal
  position p = t + n_k - n_q sees only keys in [p - p mod c, p - p mod c + c)); all intersect.
* FP8 (float8_e4m3fn) q/k/v: values times their descale (b, h_k) of the *batch entry* (for q: of
  the query head's kv head), paged cache included; the output is bf16.
* a row that sees no key: out 0, lse -inf (flash3's convention).
"""

from __future__ import annotations

import torch

from .. import masking
from ..rotary import apply_rotary


def _work_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _entry_rows(x, i, cu, used):
    """Rows of batch entry i of a batched (b, s, ...) or packed (total, ...) tensor: (start, n)
    in x's row space (start None when batched)."""
    if cu is None:
        n = x.shape[1]
        start = None
    else:
        start, end = int(cu[i]), int(cu[i + 1])
        n = end - start
    if used is not None:
        n = min(n, int(used[i]))
    return start, n


def _take(x, i, start, n):
    return x[i, :n] if start is None else x[start:start + n]


def _per_head(descale, i, h, work):
    """Descale (b, h_k) of entry i, one per head of h heads (h_k groups), shaped (1, h, 1)."""
    d = descale[i].to(work)
    return d.repeat_interleave(h // d.shape[0]).view(1, h, 1)


def _cache_slots(cache, page_table_row, positions):
    """(pages, offsets) addressing slots ``positions`` of a row's (paged or contiguous) cache."""
    if page_table_row is None:
        return None, positions
    ps = cache.shape[1]
    return page_table_row.long()[positions // ps], positions % ps


def fa3_forward(q, k, v, *, softmax_scale, window_left=-1, window_right=-1, attention_chunk=0,
                softcap=0.0, qv=None, k_new=None, v_new=None, cu_seqlens_q=None,
                cu_seqlens_k=None, cu_seqlens_k_new=None, seqused_q=None, seqused_k=None,
                cache_seqlens=None, page_table=None, cache_batch_idx=None, cache_leftpad=None,
                rotary_cos=None, rotary_sin=None, rotary_seqlens=None, rotary_interleaved=True,
                q_descale=None, k_descale=None, v_descale=None):
    """Returns (out, lse): out like q with v's head dim (bf16 for FP8 q, else q's dtype), lse
    (b, h, s_q) or, for packed q, (h, total_q), fp32.  Writes new keys into k/v (the cache)."""
    fp8 = q.dtype == torch.float8_e4m3fn
    work = _work_dtype(q)
    out_dtype = torch.bfloat16 if fp8 else q.dtype
    varlen_q = cu_seqlens_q is not None
    b = cu_seqlens_q.shape[0] - 1 if varlen_q else q.shape[0]
    h, h_k, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    g = h // h_k
    out = torch.zeros(*q.shape[:-1], d_v, dtype=work, device=q.device)
    lse = torch.full((q.shape[-2], q.shape[0]) if varlen_q else (b, h, q.shape[1]),
                     float("-inf"), dtype=torch.float32, device=q.device)
    is_cache = cache_seqlens is not None
    positional = window_left >= 0 or window_right >= 0 or attention_chunk > 0
    cos = sin = None
    if rotary_cos is not None:
        cos, sin = rotary_cos.to(work), rotary_sin.to(work)
    outs, lses = [], []
    for i in range(b):
        qs, n_q = _entry_rows(q, i, cu_seqlens_q, seqused_q)
        qi = _take(q, i, qs, n_q)
        qvi = None if qv is None else _take(qv, i, qs, n_q)
        if is_cache:
            row = i if cache_batch_idx is None else int(cache_batch_idx[i])
            pt = None if page_table is None else page_table[row]
            cache_row = None if pt is not None else row
            end = int(cache_seqlens[i])
            if k_new is not None:
                ns, n_new = _entry_rows(k_new, i, cu_seqlens_k_new, None)
                kn, vn = _take(k_new, i, ns, n_new), _take(v_new, i, ns, n_new)
                if cos is not None:
                    r0 = int(end if rotary_seqlens is None else rotary_seqlens[i])
                    pos = torch.arange(n_new, device=q.device) + r0
                    kn = apply_rotary(kn.to(work)[None], cos, sin, pos[None],
                                      rotary_interleaved)[0]
                    qpos = (torch.arange(n_q, device=q.device) + r0 if positional
                            else torch.full((n_q,), r0, device=q.device))
                    qi = apply_rotary(qi[None], cos, sin, qpos[None], rotary_interleaved)[0]
                slots = torch.arange(end, end + n_new, device=q.device)
                pages, offs = _cache_slots(k, pt, slots)
                with torch.no_grad():  # the append is a side effect, not part of the function
                    for cache, new in ((k, kn), (v, vn)):
                        dst = cache[row] if pages is None else cache
                        if pages is None:
                            dst[offs] = new.to(cache.dtype)
                        else:
                            dst[pages, offs] = new.to(cache.dtype)
                end += n_new
            start = 0 if cache_leftpad is None else int(cache_leftpad[i])
            slots = torch.arange(start, end, device=q.device)
            pages, offs = _cache_slots(k, pt, slots)
            ki = k[cache_row, offs] if pages is None else k[pages, offs]
            vi = v[cache_row, offs] if pages is None else v[pages, offs]
        else:
            ks, n_k = _entry_rows(k, i, cu_seqlens_k, seqused_k)
            ki, vi = _take(k, i, ks, n_k), _take(v, i, ks, n_k)
        qf, kf, vf = qi.to(work), ki.to(work), vi.to(work)
        qvf = None if qvi is None else qvi.to(work)
        if q_descale is not None:
            qf = qf * _per_head(q_descale, i, h, work)
            qvf = None if qvf is None else qvf * _per_head(q_descale, i, h, work)
        if k_descale is not None:
            kf = kf * k_descale[i].to(work).view(1, h_k, 1)
        if v_descale is not None:
            vf = vf * v_descale[i].to(work).view(1, h_k, 1)
        kf, vf = kf.repeat_interleave(g, dim=1), vf.repeat_interleave(g, dim=1)  # (n_k, h, .)
        s = torch.einsum("thd,shd->hts", qf, kf) * softmax_scale
        if qvf is not None:
            s = s + torch.einsum("thd,shd->hts", qvf, vf) * softmax_scale
        if softcap > 0:
            s = torch.tanh(s / softcap) * softcap
        n_k = kf.shape[0]
        visible = _visible(n_q, n_k, window_left, window_right, attention_chunk, q.device)
        s = s.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # (h, n_q); -inf where a row sees nothing
        p = torch.exp(s - row_lse.masked_fill(torch.isinf(row_lse), 0.0).unsqueeze(-1))
        oi = torch.einsum("hts,shd->thd", p, vf)
        outs.append((i, qs, n_q, oi))
        lses.append(row_lse)
    for (i, qs, n_q, oi), row_lse in zip(outs, lses):
        if qs is None:
            out = out.index_put((torch.tensor([i], device=q.device),
                                 torch.arange(n_q, device=q.device)), oi)
            lse[i, :, :n_q] = row_lse.to(torch.float32).detach()
        else:
            out = out.index_put((torch.arange(qs, qs + n_q, device=q.device),), oi)
            lse[:, qs:qs + n_q] = row_lse.to(torch.float32).detach()
    return out.to(out_dtype), lse


def _visible(n_q, n_k, left, right, chunk, device):
    """(n_q, n_k) bool: key c visible to query t, every mask bottom-right aligned (masking's window,
    intersected with the query's attention chunk)."""
    keep = masking.visible_mask(0, n_q, 0, n_k, n_q, n_k, False, left, right, device=device)
    if chunk > 0:
        t = torch.arange(n_q, device=device)[:, None]
        c = torch.arange(n_k, device=device)[None, :]
        diag = t + n_k - n_q
        lo = diag - torch.remainder(diag, chunk)
        keep &= (c >= lo) & (c < lo + chunk)
    return keep
