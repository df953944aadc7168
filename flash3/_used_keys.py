"""FA3's seqused_k for the varlen backward kernel, which has no seqused_k: the used keys of every
sequence (its first seqused_k[i] packed keys, clamped into [0, its length]) gathered into packed
k/v with their own cu_seqlens_k, and dk/dv scattered back (0 for the unused keys).

All on the device (no host read: capturable); any value of cu_seqlens_k/seqused_k gathers and
scatters inside the tensors (a source row outside k is read clamped and its gradient dropped).
"""

from __future__ import annotations

import torch


def compact(k, v, cu_seqlens_k, seqused_k):
    """-> (k_used, v_used, cu_used int32 (b + 1,), scatter) where scatter(dx_used) is dx (k's rows)."""
    total = k.shape[0]
    cu = cu_seqlens_k.to(torch.int64)
    lens = (cu[1:] - cu[:-1]).clamp(min=0)
    used = torch.minimum(seqused_k.to(torch.int64).clamp(min=0), lens)
    cu_used = torch.cat([used.new_zeros(1), used.cumsum(0)])
    rows = torch.arange(total, device=k.device)
    seq = torch.searchsorted(cu_used[1:], rows, right=True).clamp(max=max(used.shape[0] - 1, 0))
    src = cu[:-1][seq] + rows - cu_used[seq] if used.shape[0] else rows
    # Rows past the last used key belong to no sequence (the kernel never reads them); a source
    # outside k (bad cu_seqlens_k) too: read clamped, their gradient goes to a dropped row.
    keep = (rows < cu_used[-1]) & (src >= 0) & (src < total)
    src_read = src.clamp(0, max(total - 1, 0))
    dst = torch.where(keep, src, torch.full_like(src, total))

    def scatter(dx):
        out = dx.new_zeros(total + 1, *dx.shape[1:])
        # accumulate: overlapping sequences share keys (their gradients add, as the reference's)
        return out.index_put_((dst,), dx, accumulate=True)[:total]

    if total == 0:
        return k, v, cu_used.to(torch.int32), lambda dx: dx
    return (k.index_select(0, src_read), v.index_select(0, src_read), cu_used.to(torch.int32),
            scatter)
