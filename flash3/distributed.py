"""Context parallelism: ring attention over ``torch.distributed``.

One sequence is sharded along its length over the ranks of a process group; every rank holds the
q, k and v of its own positions.  :func:`ring_attention` passes the K/V shards around the ring
(rank r sends to r + 1), computing attention of its local queries against the shard at hand with
flash3's own operators (so the Hopper kernel when it applies) while the next shard is in flight,
and merges the partial results with their log-sum-exp.  The backward runs the ring the other way
(r sends to r - 1): K/V travel once more, each accompanied by an fp32 dK/dV accumulator that
collects every rank's contribution and ends at the shard's owner.

Layouts (see :func:`shard_ranges`), for a sequence of S positions over W ranks:

* ``load_balance=True`` (default): S is cut into 2W chunks; rank r holds chunks r and 2W-1-r,
  concatenated.  Under a causal mask every rank then does the same work (one early chunk with
  little to attend to, one late chunk with much), and each ring step is a single kernel call.
* ``load_balance=False``: S is cut into W contiguous chunks, rank r holds chunk r (rank W-1 does
  W times the causal work of rank 0).

Chunk sizes follow ``torch.tensor_split``: when S is not divisible, the first S % (2W) (resp.
S % W) chunks are one longer.  With ``load_balance=False`` ring_attention accepts any local
lengths (rank r then holds the positions after those of ranks 0..r-1).

Importing this module initializes nothing.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch
import torch.distributed as dist

from . import _checks, masking, ops, reference

__all__ = ["ring_attention", "shard_ranges", "shard_sequence", "unshard_sequence"]

_INF = math.inf


# ---------------------------------------------------------------------------- layout
def _split_sizes(n: int, parts: int) -> List[int]:
    """torch.tensor_split's sizes: the first n % parts pieces are one longer."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def shard_ranges(seqlen: int, world_size: int, *,
                 load_balance: bool = True) -> List[List[Tuple[int, int]]]:
    """The layout: for each rank, the ``(start, length)`` position ranges it holds, in local order.

    >>> shard_ranges(16, 2)
    [[(0, 4), (12, 4)], [(4, 4), (8, 4)]]
    >>> shard_ranges(10, 2, load_balance=False)
    [[(0, 5)], [(5, 5)]]

    The global positions of rank r's tokens (e.g. for rotary embeddings) are
    ``shard_sequence(torch.arange(seqlen), r, world_size, dim=0)``.
    """
    seqlen = _checks.int_at_least("seqlen", seqlen, 0)
    world_size = _checks.int_at_least("world_size", world_size, 1)
    _checks.flag("load_balance", load_balance)
    parts = 2 * world_size if load_balance else world_size
    sizes = _split_sizes(seqlen, parts)
    starts = [sum(sizes[:i]) for i in range(parts)]
    if load_balance:
        return [[(starts[r], sizes[r]), (starts[parts - 1 - r], sizes[parts - 1 - r])]
                for r in range(world_size)]
    return [[(starts[r], sizes[r])] for r in range(world_size)]


def _dim_arg(x, dim):
    _checks.int_at_least("dim", dim, -x.dim())
    if dim >= x.dim():
        raise ValueError(f"dim must be in [{-x.dim()}, {x.dim()}) for a {x.dim()}-D tensor, got {dim}")
    return dim % x.dim()


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, *, dim: int = 1,
                   load_balance: bool = True) -> torch.Tensor:
    """Rank ``rank``'s shard of the full sequence ``x`` (positions along ``dim``).

    Returns a new contiguous tensor (differentiable: gradients flow back into ``x``).  Use the
    same ``load_balance`` in :func:`ring_attention` and :func:`unshard_sequence`.  For q/k/v/out
    (b, s, h, d) the sequence dim is 1; for lse (b, h, s) it is 2.
    """
    _checks.tensor("x", x)
    dim = _dim_arg(x, dim)
    world_size = _checks.int_at_least("world_size", world_size, 1)
    rank = _checks.int_at_least("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    ranges = shard_ranges(x.shape[dim], world_size, load_balance=load_balance)[rank]
    return torch.cat([x.narrow(dim, s, n) for s, n in ranges], dim).contiguous()


def _reassemble(shards, dim, load_balance):
    """The full sequence from the shards of every rank, in rank order."""
    lens = [t.shape[dim] for t in shards]
    W, S = len(shards), sum(lens)
    if load_balance:
        ranges = shard_ranges(S, W, load_balance=True)
        _check_balanced_lengths(lens, ranges, "shards")
    else:
        ranges = [[(sum(lens[:r]), lens[r])] for r in range(W)]
    pieces = []
    for t, rr in zip(shards, ranges):
        off = 0
        for start, n in rr:
            pieces.append((start, t.narrow(dim, off, n)))
            off += n
    pieces.sort(key=lambda p: p[0])
    return torch.cat([p for _, p in pieces], dim)


def unshard_sequence(shards, *, group=None, dim: int = 1, load_balance: bool = True) -> torch.Tensor:
    """The full sequence, from every rank's shard (the inverse of :func:`shard_sequence`).

    ``shards`` is either a list of the shards of all ranks in rank order (no communication), or
    this rank's shard alone: then it is all-gathered over ``group`` (default: the default
    group; shards may differ in length) and every rank gets the full sequence.  The gathered
    result is not differentiable.
    """
    _checks.flag("load_balance", load_balance)
    if isinstance(shards, (list, tuple)):
        if not shards:
            raise ValueError("shards must not be empty")
        for i, t in enumerate(shards):
            _checks.tensor(f"shards[{i}]", t)
        dim = _dim_arg(shards[0], dim)
        for i, t in enumerate(shards[1:], 1):
            if t.dim() != shards[0].dim() or any(
                    a != b for j, (a, b) in enumerate(zip(t.shape, shards[0].shape)) if j != dim):
                raise ValueError(f"shards[{i}] has shape {tuple(t.shape)}, which does not match "
                                 f"shards[0] {tuple(shards[0].shape)} outside dim {dim}")
        return _reassemble(list(shards), dim, load_balance)
    x = _checks.tensor("shards", shards)
    dim = _dim_arg(x, dim)
    group, W, _ = _group_info(group, "unshard_sequence")
    if W == 1:
        return _reassemble([x.detach()], dim, load_balance)
    dev = _meta_device(group, x)
    meta = torch.tensor(list(x.shape) + [x.dim()], dtype=torch.int64, device=dev)
    metas = [torch.empty_like(meta) for _ in range(W)]
    dist.all_gather(metas, meta, group=group)
    metas = [m.tolist() for m in metas]
    for r, m in enumerate(metas):
        if m[-1] != x.dim() or any(a != b for j, (a, b) in enumerate(zip(m, x.shape)) if j != dim):
            raise ValueError(f"rank {r}'s shard has shape {tuple(m[:-1])}, which does not match "
                             f"this rank's {tuple(x.shape)} outside dim {dim}")
    lens = [m[dim] for m in metas]
    pad = list(x.shape)
    pad[dim] = max(lens)
    buf = x.detach().new_zeros(pad)
    buf.narrow(dim, 0, x.shape[dim]).copy_(x.detach())
    bufs = [torch.empty_like(buf) for _ in range(W)]
    dist.all_gather(bufs, buf.contiguous(), group=group)
    return _reassemble([b.narrow(dim, 0, n) for b, n in zip(bufs, lens)], dim, load_balance)


def _check_balanced_lengths(lens, ranges, what):
    want = [sum(n for _, n in rr) for rr in ranges]
    if list(lens) != want:
        raise ValueError(
            f"the local lengths of the {what} ({list(lens)}, total {sum(lens)}) do not follow the "
            f"load-balanced layout over {len(lens)} ranks, which needs {want}: shard with "
            f"flash3.distributed.shard_sequence(..., load_balance=True), or pass "
            f"load_balance=False for contiguous shards of any length")


# ---------------------------------------------------------------------------- process group
def _group_info(group, who):
    if not dist.is_available():
        raise RuntimeError(f"flash3.distributed.{who} needs torch.distributed, which this torch "
                           f"build does not have")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup or None, "
                        f"got {type(group).__name__}")
    if not dist.is_initialized():
        raise RuntimeError(f"flash3.distributed.{who} needs an initialized process group: call "
                           f"torch.distributed.init_process_group() first (group=None means the "
                           f"default group)")
    group = dist.group.WORLD if group is None else group
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"group: this process (global rank {dist.get_rank()}) is not a member "
                         f"of the group")
    return group, dist.get_world_size(group), me


def _meta_device(group, x):
    """Where small collectives run: CUDA for NCCL groups, else the CPU."""
    if x.is_cuda and "nccl" in str(dist.get_backend(group)).lower():
        return x.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------- chunk calls
# Module-level indirections so tests can observe the order of communication and compute.
def _chunk_fwd(q, k, v, scale, left, right, softcap):
    return ops.run(ops.attention_fwd, q, k, v, scale, left, right, softcap)


def _chunk_bwd(dout, q, k, v, out, lse, dlse, scale, left, right, softcap):
    return ops.run(ops.attention_bwd, dout, q, k, v, out, lse, dlse, scale, left, right, softcap)


def _exchange(send, dst, recv, src, group):
    """Start sending ``send`` to global rank dst and receiving ``recv`` from src; returns works."""
    return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, dst, group),
                                   dist.P2POp(dist.irecv, recv, src, group)])


def _wait(works):
    for w in works:
        w.wait()


# ---------------------------------------------------------------------------- planning
def _pair(oq, nq, ok, nk, left, right):
    """Query positions [oq, oq+nq) against keys [ok, ok+nk) under the global window.

    Query p sees key p' when p - left <= p' <= p + right (-1 = unbounded), i.e. locally
    j - i in [lo, hi].  Returns None when nothing is visible, else (i0, i1, j0, j1, wl, wr): the
    rows and keys that take part and the window that expresses the band in flash3's
    bottom-right convention on that sub-block.  Rows and keys cut off see / are seen by nothing;
    since the bottom-right diagonal only depends on where the block ends, trimming the ends puts
    it inside the band, which makes both window sides >= 0.
    """
    if nq <= 0 or nk <= 0:
        return None
    lo = oq - ok - left if left >= 0 else None
    hi = oq - ok + right if right >= 0 else None
    i0 = max(0, -hi) if hi is not None else 0
    i1 = min(nq, nk - lo) if lo is not None else nq
    j0 = max(0, lo) if lo is not None else 0
    j1 = min(nk, nq + hi) if hi is not None else nk
    if i0 >= i1 or j0 >= j1:
        return None
    wl = -1 if lo is None else j1 - i1 - lo
    wr = -1 if hi is None else hi - (j1 - i1)
    assert wl >= -1 and wr >= -1
    if wl >= j1 - j0 - 1:  # the left edge cuts nothing in this block
        wl = -1
    if wr >= i1 - i0 - 1:
        wr = -1
    return i0, i1, j0, j1, wl, wr


def _segments(ranges):
    """(start, length) ranges in local order -> (global start, length, local start), empty ones dropped."""
    segs, off = [], 0
    for s, n in ranges:
        if n > 0:
            segs.append((s, n, off))
        off += n
    return segs


def _plan(q_segs, k_segs, left, right, same_rank):
    """Kernel calls for local queries against one rank's keys: (qa, qb, ka, kb, wl, wr), local."""
    if same_rank:
        pairs = list(zip(q_segs, q_segs[1:]))
        contiguous = all(a[0] + a[1] == b[0] for a, b in pairs)
        ordered = all(a[0] + a[1] <= b[0] for a, b in pairs)
        if contiguous or (ordered and left < 0 and right in (-1, 0)):
            # The local block is one range of positions (any window is then the global one), or
            # local order is global order, which is all that causal (or full) needs: one call.
            n = sum(s[1] for s in q_segs)
            return [(0, n, 0, n, left, right)] if n else []
    calls, full = [], []
    for qi, (oq, nq, lq) in enumerate(q_segs):
        for ki, (ok, nk, lk) in enumerate(k_segs):
            p = _pair(oq, nq, ok, nk, left, right)
            if p is None:
                continue
            i0, i1, j0, j1, wl, wr = p
            calls.append((lq + i0, lq + i1, lk + j0, lk + j1, wl, wr))
            if (i0, i1, j0, j1, wl, wr) == (0, nq, 0, nk, -1, -1):
                full.append((qi, ki))
    if calls and len(full) == len(calls):
        # Every pair unmasked: if they form a rectangle of adjacent segments, one call does it.
        qs = sorted({qi for qi, _ in full})
        ks = sorted({ki for _, ki in full})
        if (len(full) == len(qs) * len(ks) and qs == list(range(qs[0], qs[-1] + 1))
                and ks == list(range(ks[0], ks[-1] + 1))):
            qa, qb = q_segs[qs[0]][2], q_segs[qs[-1]][2] + q_segs[qs[-1]][1]
            ka, kb = k_segs[ks[0]][2], k_segs[ks[-1]][2] + k_segs[ks[-1]][1]
            return [(qa, qb, ka, kb, -1, -1)]
    return calls


class _Ring:
    """Everything a call needs besides tensors: group, peers, layout, options, plans."""

    def __init__(self, group, world, me, lengths, ranges, q, k, v, scale, left, right, softcap):
        self.group, self.W, self.me = group, world, me
        self.lengths = lengths
        self.next = dist.get_global_rank(group, (me + 1) % world) if world > 1 else None
        self.prev = dist.get_global_rank(group, (me - 1) % world) if world > 1 else None
        self.scale, self.left, self.right, self.softcap = scale, left, right, softcap
        b, _, _, d = q.shape
        self.h_k, self.d, self.d_v = k.shape[2], d, v.shape[3]
        self.b = b
        segs = [_segments(r) for r in ranges]
        self.plans = [_plan(segs[me], segs[s], left, right, s == me) for s in range(world)]

    def kv_numel(self, src):
        n = self.b * self.lengths[src] * self.h_k
        return n * self.d, n * self.d_v

    def unpack(self, buf, src):
        """Views k (b, L, h_k, d), v (b, L, h_k, d_v) of source rank src in a flat buffer."""
        nk, nv = self.kv_numel(src)
        L = self.lengths[src]
        return (buf[:nk].view(self.b, L, self.h_k, self.d),
                buf[nk:nk + nv].view(self.b, L, self.h_k, self.d_v))

    def empty_kv(self, src, dtype, device):
        return torch.empty(sum(self.kv_numel(src)), dtype=dtype, device=device)


def _pack(k, v):
    return torch.cat([k.reshape(-1), v.reshape(-1)])


# ---------------------------------------------------------------------------- the ring
def _merge(out, lse, qa, qb, o, l):
    """Fold a partial (o, l) for rows [qa, qb) into the fp32 accumulators with the split-KV
    combine (reference.combine_splits: lse-weighted, -inf safe)."""
    o_acc, l_acc = out[:, qa:qb], lse[:, :, qa:qb]
    merged_o, merged_l = reference.combine_splits(torch.stack((o_acc, o.to(torch.float32))),
                                                  torch.stack((l_acc, l)))
    o_acc.copy_(merged_o)
    l_acc.copy_(merged_l)


def _ring_forward(ring, q, k, v):
    b, L, h, _ = q.shape
    out = torch.zeros(b, L, h, ring.d_v, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, L), -_INF, dtype=torch.float32, device=q.device)
    W, me = ring.W, ring.me
    kv = _pack(k, v) if W > 1 else None
    k_s, v_s = k, v
    for step in range(W):
        src = (me - step) % W  # K/V move r -> r+1: at step t we hold those of rank r - t
        if step + 1 < W:  # start the next shard's transfer before computing on this one
            nxt = ring.empty_kv((src - 1) % W, k.dtype, k.device)
            works = _exchange(kv, ring.next, nxt, ring.prev, ring.group)
        if step > 0:
            k_s, v_s = ring.unpack(kv, src)
        for qa, qb, ka, kb, wl, wr in ring.plans[src]:
            o, l = _chunk_fwd(q[:, qa:qb], k_s[:, ka:kb], v_s[:, ka:kb], ring.scale, wl, wr,
                              ring.softcap)
            _merge(out, lse, qa, qb, o, l)
        if step + 1 < W:
            _wait(works)
            kv = nxt
    return out.to(q.dtype), lse


def _ring_backward(ring, dout, dlse, q, k, v, out, lse):
    """dq, dk, dv; every chunk pair uses the global out and lse, which makes its dq, dk, dv the
    exact contribution of that pair (P recomputed as exp(s - lse), D = rowsum(dO * O) - dlse)."""
    W, me = ring.W, ring.me
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = _pack(k, v) if W > 1 else None
    k_s, v_s = k, v
    acc_works = acc_in = None  # the dK/dV in flight: (works, the buffer being sent)
    for step in range(W):
        src = (me + step) % W  # the other way: K/V move r -> r-1, at step t we hold rank r + t's
        if step + 1 < W:
            nxt = ring.empty_kv((src + 1) % W, k.dtype, k.device)
            works = _exchange(kv, ring.prev, nxt, ring.next, ring.group)
        if step > 0:
            k_s, v_s = ring.unpack(kv, src)
        # dK/dV of this source, fp32, packed so that they travel as one message.
        acc = torch.zeros(sum(ring.kv_numel(src)), dtype=torch.float32, device=q.device)
        dk_s, dv_s = ring.unpack(acc, src)
        for qa, qb, ka, kb, wl, wr in ring.plans[src]:
            dq_c, dk_c, dv_c = _chunk_bwd(
                dout[:, qa:qb], q[:, qa:qb], k_s[:, ka:kb], v_s[:, ka:kb], out[:, qa:qb],
                lse[:, :, qa:qb], None if dlse is None else dlse[:, :, qa:qb], ring.scale, wl,
                wr, ring.softcap)
            dq[:, qa:qb] += dq_c
            dk_s[:, ka:kb] += dk_c
            dv_s[:, ka:kb] += dv_c
        if W > 1:
            if acc_works is not None:
                # Ranks src, src-1, ..., r+1 have added theirs (sent one step ago by rank r+1).
                _wait(acc_works[0])
                acc += acc_in
            # Pass it on towards rank r-1; after the last step it reaches its owner.
            acc_in = torch.empty(sum(ring.kv_numel((src + 1) % W)), dtype=torch.float32,
                                 device=q.device)
            # (the sent buffer stays referenced until its send has been waited for)
            acc_works = (_exchange(acc, ring.prev, acc_in, ring.next, ring.group), acc)
        if step + 1 < W:
            _wait(works)
            kv = nxt
    if W > 1:
        _wait(acc_works[0])
        acc = acc_in  # this rank's own dK/dV, summed over every rank's queries
    dk, dv = ring.unpack(acc, me)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring):
        out, lse = _ring_forward(ring, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        dq, dk, dv = _ring_backward(ctx.ring, dout, dlse, q, k, v, out, lse)
        return dq, dk, dv, None


# ---------------------------------------------------------------------------- public entry
_DTYPE_CODES = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def _agree(metas, names):
    """Raise if the ranks passed different values for any of ``names``."""
    for i, name in enumerate(names):
        vals = [m[i] for m in metas]
        if any(x != vals[0] for x in vals):
            if name == "dtype":
                inv = {c: str(t) for t, c in _DTYPE_CODES.items()}
                vals = [inv[x] for x in vals]
            raise ValueError(f"ring_attention: the ranks of the group disagree on {name} "
                             f"(per rank: {vals}); every rank must make the same call on its "
                             f"shard")


def ring_attention(q, k, v, *, group=None, causal=False, softmax_scale=None,
                   window_size=(-1, -1), softcap=0.0, load_balance=True, return_lse=False):
    """Attention over a sequence sharded across the ranks of ``group`` (context parallelism).

    q (b, s_local, h, d), k (b, s_local, h_k, d), v (b, s_local, h_k, d_v): this rank's shard
    of the sequence in the layout of :func:`shard_sequence` with the same ``load_balance``
    (self-attention: q, k and v hold the same positions).  The result equals
    ``flash3.attention`` on the full sequence (same options, masks relative to the full
    sequence), sharded the same way: out (b, s_local, h, d_v) and, if ``return_lse``, lse
    (b, h, s_local) fp32.  Differentiable in q, k and v (lse too).

    Every rank of the group must make the call (it is a collective), and the backward too.
    ``group=None`` is the default group; with one rank this is a plain ``flash3.attention``.
    """
    _checks.batched(q, k, v)
    if _checks.is_fp8(q):
        raise TypeError("ring_attention does not take float8_e4m3fn inputs")
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k has seqlen {k.shape[1]} but q has {q.shape[1]}: ring_attention shards "
                         f"one sequence (self-attention), so q, k and v hold the same positions")
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    _checks.flag("load_balance", load_balance)
    _checks.flag("return_lse", return_lse)
    group, W, me = _group_info(group, "ring_attention")

    b, L, h, d = q.shape
    h_k, d_v = k.shape[2], v.shape[3]
    if W > 1:
        names = ("batch size", "heads of q", "heads of k", "head dim", "head dim of v", "dtype",
                 "load_balance", "window (left)", "window (right)", "device type")
        mine = [b, h, h_k, d, d_v, _DTYPE_CODES[q.dtype], int(load_balance), left, right,
                int(q.is_cuda)]
        meta = torch.tensor([L] + mine, dtype=torch.int64, device=_meta_device(group, q))
        metas = [torch.empty_like(meta) for _ in range(W)]
        dist.all_gather(metas, meta, group=group)
        metas = [m.tolist() for m in metas]
        _agree([m[1:] for m in metas], names)
        lengths = [m[0] for m in metas]
    else:
        lengths = [L]
    S = sum(lengths)
    if load_balance:
        ranges = shard_ranges(S, W, load_balance=True)
        _check_balanced_lengths(lengths, ranges, "q/k/v shards")
    else:
        ranges = [[(sum(lengths[:r]), lengths[r])] for r in range(W)]
    ring = _Ring(group, W, me, lengths, ranges, q, k, v, scale, left, right, softcap)
    out, lse = _RingAttention.apply(q, k, v, ring)
    return (out, lse) if return_lse else out
