"""Public functions of flash3: validate, then call the registered operators."""

from __future__ import annotations

import numbers

import torch

from . import _backend, _checks, masking, ops, ops_serve, validation


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
              return_lse=False, q_descale=None, k_descale=None, v_descale=None,
              fp8_block_size=(128, 128), deterministic=False, v_channel_descale=None, sinks=None,
              alibi_slopes=None, attention_chunk=0, fp8_fast_accum=False):
    """Scaled dot-product attention, FlashAttention-3 semantics.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v) with h % h_k == 0.
    Returns out (b, s_q, h, d_v) in q's dtype, and lse (b, h, s_q) fp32 if
    ``return_lse``.  Masks are bottom-right aligned; ``causal`` is window
    ``(left, 0)``.  float8_e4m3fn inputs need descales and return bf16 (no grad):
    ``q_descale`` (b, h_k) or per block of ``fp8_block_size[0]`` rows, ``k_descale`` and
    ``v_descale`` (b, h_k) or per block of ``fp8_block_size[1]`` keys, optional
    ``v_channel_descale`` (b, h_k, d_v) applied to the output's columns (flash3/fp8.py).
    ``fp8_fast_accum=True`` (float8 only; like torch._scaled_mm's use_fast_accum) trades accuracy
    for speed as FA3's FP8 kernel does: P@V accumulates over all keys in the tensor cores' FP8
    accumulator (truncating adds) instead of flash3's default two-level accumulation (an fp32 add
    per key block); ``v_descale`` must then be (b, h_k), k/v blocks multiples of 128, no
    ``attention_chunk`` (flash3/reference/fp8.py, 6').
    ``deterministic=True`` makes the backward bitwise reproducible run to run (the
    reference backward always is).

    ``sinks`` (h,) float, optional: attention sinks (gpt-oss), one logit per query head in the
    space of softmax_scale·q·kᵀ after softcap.  It joins every row's softmax denominator and
    carries no value; lse includes it (a row with no visible key gets out 0, lse = sink); its
    gradient is returned; a -inf sink is no sink.  The forward kernel adds it (its epilogue); the
    backward has no kernel with sinks yet: on CUDA it runs the reference backend with a one-time
    warning.  Not with float8 inputs.

    ``alibi_slopes`` float32 (h,) or (b, h), optional: ALiBi, FlashAttention-2's convention.
    Query row i adds -slope·|i + s_k - s_q - j| to its score with key j (in the space of
    softmax_scale·q·kᵀ after softcap; bottom-right aligned like the masks).  lse is the exact
    log-sum-exp of the biased scores, causal or not (FlashAttention-2's causal kernel adds
    slope·j instead, which shifts each row's lse by a constant: flash3's differs from it there,
    its out does not).  No gradient flows to the slopes.  Not with float8 inputs.  On Hopper the
    forward and decode kernels take them for head dims up to 128 (larger ones run on the reference
    with a one-time warning), the backward kernel for every head dim.

    ``attention_chunk`` int >= 0: FA3's chunked local attention (Llama 4), 0 = off. Query row i
    (diagonal p = i + s_k - s_q) sees only the keys of its chunk, ``[p - p % c, p - p % c + c)``
    (Python's ``%``), intersected with the window/causal mask (flash3/masking.py). Forward and
    backward kernels on Hopper (float8 inputs: the FP8 forward kernel); not with sinks
    (NotImplementedError).
    """
    _checks.batched(q, k, v)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    _checks.fp8_descales(q, k, v, q_descale, k_descale, v_descale, fp8_block_size, v_channel_descale,
                         fast_accum=fp8_fast_accum)
    _checks.flag("deterministic", deterministic)
    _checks.sinks(q, sinks)
    _checks.alibi_slopes(q, alibi_slopes, q.shape[0])
    chunk = _checks.attention_chunk(attention_chunk, sinks=sinks is not None)
    if fp8_fast_accum and chunk:
        raise ValueError("attention_chunk is not available with fp8_fast_accum (no such FP8 kernel)")
    if sinks is not None:
        out, lse = ops_serve.attention_sinks_fwd(q, k, v, sinks, scale, left, right, softcap,
                                                 deterministic, alibi_slopes)
    elif _checks.is_fp8(q):
        out, lse = ops.run(ops.attention_fp8, q, k, v, q_descale, k_descale, v_descale, scale,
                           left, right, softcap, int(fp8_block_size[0]), int(fp8_block_size[1]),
                           v_channel_descale, chunk, bool(fp8_fast_accum))
    else:
        out, lse = ops.run(ops.attention_fwd, q, k, v, scale, left, right, softcap, deterministic,
                           alibi_slopes, chunk)
    return (out, lse) if return_lse else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                     return_lse=False, deterministic=False, q_descale=None, k_descale=None,
                     v_descale=None, fp8_block_size=(128, 128), v_channel_descale=None,
                     sinks=None, page_table=None, seqused_k=None, alibi_slopes=None,
                     seqused_q=None, attention_chunk=0, fp8_fast_accum=False):
    """Attention over packed variable-length sequences.

    q (total_q, h, d), k/v (total_k, h_k, d|d_v); sequence i is rows
    cu_seqlens[i]:cu_seqlens[i+1] (int32, length batch + 1).  Masks apply per
    sequence.  Returns out (total_q, h, d_v) and, if ``return_lse``, lse (h, total_q).
    ``deterministic`` as in :func:`attention`.  float8_e4m3fn inputs as in
    :func:`attention`, descales indexed by sequence: (b, h_k) per head, or per block
    (b, heads, ceil(max_seqlen / block)) with blocks counted from each sequence's start;
    ``fp8_fast_accum`` as in :func:`attention` (v_descale (b, h_k); not with a cache).
    ``sinks`` (h,) as in :func:`attention`.  ``alibi_slopes`` (h,) or (batch, h) as in
    :func:`attention`, distances per sequence (its own s_q and s_k).  ``attention_chunk`` as in
    :func:`attention`, per sequence (not with keys from a cache).

    ``seqused_q`` int32 (b,) (FA3's): sequence i's queries are only its first seqused_q[i] packed
    rows (any value is clamped into [0, its length]); masks and ALiBi align on that count, its
    other rows get out 0, lse -inf, and in the backward dq 0 (they add nothing to dk/dv).  Kernels
    on CUDA (16-bit: forward and backward; float8: the FP8 forward); not with sinks, page_table or
    seqused_k on a cache (NotImplementedError).

    ``seqused_k`` int32 (b,) with packed 16-bit (or fp32) k/v, or float8_e4m3fn q/k/v
    (``cu_seqlens_k``, no page_table, no sinks): sequence i sees only its first seqused_k[i] packed
    keys (any value clamped into [0, its length]; FA3's), masks aligned on that count; with
    seqused_q and attention_chunk too, and autograd for 16-bit inputs (dk/dv 0 for the unused
    keys).  On CUDA the varlen forward kernel (16-bit or FP8) takes it, and the backward kernel
    runs on the used keys gathered into packed k/v of their own (a copy of them; no host reads).
    FP8 descale blocks still count from each sequence's first row.

    Keys from a cache (chunked prefill, prefix caching, mixed prefill/decode batches), forward
    only; on CUDA the decode kernel runs paged and contiguous caches (16-bit q, a cache of q's
    dtype or float8_e4m3fn; sinks too; no host reads), other CUDA calls (a packed cache with
    cu_seqlens_k and sinks or FP8, fp32 q) raise NotImplementedError; CPU tensors run the
    reference: ``seqused_k`` as above (a packed cache with sinks or FP8); with ``page_table``
    int32 (b, max_pages), k/v are a
    paged cache (num_pages, page_size, h_k, d|d_v) (any page size), cu_seqlens_k must be None
    and seqused_k gives each sequence's key count.  Masks are bottom-right aligned per
    sequence.  A float8_e4m3fn paged cache takes fp16/bf16/fp32 q and ``k_descale``/
    ``v_descale`` (num_pages, h_k), as :func:`attention_with_kvcache`'s FP8 cache.
    """
    # seqused_k on packed 16-bit/fp32 k/v (FA3's varlen seqused_k): the varlen kernels (the forward
    # takes it, the backward runs on the used keys gathered), with seqused_q, chunk and autograd;
    # on packed float8 q/k/v the FP8 varlen forward. Other key layouts (paged, contiguous cache), an
    # FP8 cache with 16-bit q and sinks: the cache path (forward only).
    on_cache = page_table is not None or (seqused_k is not None and (
        cu_seqlens_k is None or sinks is not None or (not _checks.is_fp8(q) and (
            _checks.is_fp8(k) or k_descale is not None or v_descale is not None))))
    if seqused_q is not None:
        for n, t in (("sinks", sinks), ("page_table", page_table),
                     ("seqused_k", seqused_k if on_cache else None)):
            if t is not None:
                raise NotImplementedError(f"attention_varlen: seqused_q with {n} is not implemented")
    _checks.attention_chunk(attention_chunk, **{"page_table/seqused_k": on_cache})
    if on_cache and fp8_fast_accum is not False:
        raise ValueError("fp8_fast_accum is not used with page_table/seqused_k (keys from a cache)")
    if on_cache:
        for n, t in (("q_descale", q_descale), ("v_channel_descale", v_channel_descale)):
            if t is not None:
                raise ValueError(f"{n} is not used with page_table/seqused_k (an FP8 cache takes "
                                 "k_descale/v_descale per page or sequence, kv head)")
        _checks.flag("deterministic", deterministic)
        return _varlen_on_cache(q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, page_table,
                                cu_seqlens_k, causal, softmax_scale, window_size, softcap,
                                k_descale, v_descale, sinks, return_lse, "attention_varlen",
                                "seqused_k", "k", "v", alibi_slopes=alibi_slopes)
    if cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k is required without page_table")
    _checks.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if seqused_k is not None:
        _checks.seqused_q(q, seqused_k, cu_seqlens_q.shape[0] - 1, "seqused_k")
    if seqused_q is not None:
        _checks.seqused_q(q, seqused_q, cu_seqlens_q.shape[0] - 1)
    _checks.flag("deterministic", deterministic)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    b = cu_seqlens_q.shape[0] - 1
    _checks.fp8_descales(q, k, v, q_descale, k_descale, v_descale, fp8_block_size, v_channel_descale,
                         varlen=(b, int(max_seqlen_q), int(max_seqlen_k)), fast_accum=fp8_fast_accum)
    _checks.sinks(q, sinks)
    _checks.alibi_slopes(q, alibi_slopes, b)
    chunk = _checks.attention_chunk(attention_chunk, sinks=sinks is not None)
    if fp8_fast_accum and chunk:
        raise ValueError("attention_chunk is not available with fp8_fast_accum (no such FP8 kernel)")
    if sinks is not None:
        out, lse = ops_serve.attention_varlen_sinks_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, sinks,
                                                        int(max_seqlen_q), int(max_seqlen_k),
                                                        scale, left, right, softcap, deterministic,
                                                        alibi_slopes)
    elif _checks.is_fp8(q):
        out, lse = ops.run(ops.attention_fp8_varlen, q, k, v, cu_seqlens_q, cu_seqlens_k,
                           int(max_seqlen_q), int(max_seqlen_k), q_descale, k_descale, v_descale,
                           scale, left, right, softcap, int(fp8_block_size[0]),
                           int(fp8_block_size[1]), v_channel_descale, seqused_q, seqused_k, chunk,
                           bool(fp8_fast_accum))
    else:
        out, lse = ops.run(ops.attention_varlen_fwd, q, k, v, cu_seqlens_q, cu_seqlens_k,
                           int(max_seqlen_q), int(max_seqlen_k), scale, left, right, softcap,
                           deterministic, alibi_slopes, seqused_q, chunk, seqused_k)
    return (out, lse) if return_lse else out


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens,
                           page_table=None, causal=False, softmax_scale=None,
                           window_size=(-1, -1), softcap=0.0, return_lse=False, num_splits=0,
                           rotary_cos=None, rotary_sin=None, rotary_interleaved=False,
                           k_descale=None, v_descale=None, sinks=None, cu_seqlens_q=None,
                           max_seqlen_q=None, alibi_slopes=None, rotary_seqlens=None,
                           cache_leftpad=None, descale_per_batch=False, cu_seqlens_k_new=None,
                           attention_chunk=0):
    """Decoding attention against a KV cache (forward only).

    k_cache/v_cache are (b, capacity, h_k, d|d_v), or paged
    (num_pages, page_size, h_k, d|d_v) addressed through int32 ``page_table``
    (b, max_pages).  New keys k/v (b, s_new, h_k, ·), if given, are written in
    place at positions cache_seqlens[i]... and attended to: row i sees
    cache_seqlens[i] + s_new keys.  ``cache_seqlens`` is int32 (b,) or an int.
    Returns out (b, s_q, h, d_v) and, if ``return_lse``, lse (b, h, s_q).

    ``num_splits``: split each row's keys over that many CTAs (split-KV, merged by an
    lse-weighted combine); 0 picks a count from the SM count and the problem size
    (flash3.decode_plan).  It changes speed only: the result is the same up to fp32
    rounding.  The reference computes the splits explicitly when num_splits > 1.

    ``sinks`` (h,) as in :func:`attention` (forward only here): the decode kernel adds them (its
    epilogue, or the split-KV combine).  ``alibi_slopes`` (h,) or (b, h) as in :func:`attention`,
    with row i's s_k its key count (cache_seqlens[i] + s_new) and s_q the query count.

    ``cache_leftpad`` (int32 (b,), FA3's argument): row i's keys start at cache position
    cache_leftpad[i]: it sees positions [cache_leftpad[i], cache_seqlens[i] + s_new), key j at
    cache_leftpad[i] + j for the masks (bottom-right aligned on that count) and ALiBi; new keys are
    still stored, and rotated, at cache_seqlens[i] + t (FA3's rule).  Paged caches too (the
    kernel then gathers rows).  Validation mode checks 0 <= cache_leftpad[i] <=
    cache_seqlens[i] + s_new; otherwise the kernel and the reference clamp it into that range.

    ``attention_chunk`` (int >= 0, FA3's chunked local attention, 0 = off) as in
    :func:`attention`, on row i's keys (positions from cache_leftpad[i]) and the queries aligned at
    their end; with rotary, q is then rotated per token (as for causal/local).  The decode
    kernels take it at every head dim.

    Packed queries (``cu_seqlens_q`` int32 (b + 1,), ``max_seqlen_q``): q is (total_q, h, d),
    sequence i's queries q[cu_seqlens_q[i]:cu_seqlens_q[i+1]] (any count, 0 included) attend
    to its cache_seqlens[i] cached keys (+ its new ones), masks bottom-right aligned per
    sequence; returns out (total_q, h, d_v) and lse (h, total_q).  On CUDA the decode kernel runs
    it (``num_splits`` as above; packed rows of no sequence get out 0, lse -inf); sinks,
    cache_leftpad, new k/v and rotary included (with an FP8 cache: new k/v only with
    ``descale_per_batch``, and no rotary, as below); fp32 q raises NotImplementedError there.

    Packed new keys (``cu_seqlens_k_new`` int32 (b + 1,), FA3's): k/v are (total_new, h_k, ·),
    entry i's new keys k[cu_seqlens_k_new[i]:cu_seqlens_k_new[i+1]] (any count, 0 included),
    stored (rotated) at cache_seqlens[i] + t as above; q batched or packed.  Query t of packed
    entry i takes rotary position (rotary_seqlens or cache_seqlens)[i] + t when causal or local
    (else + 0), as a batched row does.  New keys in a packed layout (cu_seqlens_k_new, or with
    cu_seqlens_q) are appended first (the fused append on CUDA: ops_serve.kvcache_append_packed)
    and attended to as part of each entry's cache_seqlens[i] + n_new_i keys.  An FP8 cache takes
    them with ``descale_per_batch`` (float8_e4m3fn k/v copied unchanged, no rotary); with
    descales per slab NotImplementedError.  In the value contract below s_new is then entry i's count
    n_new_i; validation mode also checks that cu_seqlens_k_new (like cu_seqlens_q) starts at 0,
    never decreases and ends within k's rows.  The fused append reads cu_seqlens_* on the device
    only: a packed row no entry holds is never appended, and rows never leave their tensors.

    Rotary (``rotary_cos``/``rotary_sin`` (seqlen_ro, rotary_dim / 2), needs k/v): the first
    rotary_dim channels of q and of the new k are rotated before the append, GPT-NeoX halves
    (``rotary_interleaved=False``) or GPT-J pairs (True).  New k token t of row i is at
    position cache_seqlens[i] + t; q token t too when causal, local (window_size !=
    (-1, -1)) or chunked, otherwise every q token of row i is at cache_seqlens[i] (flash-attn's rule).
    ``rotary_seqlens`` (int32 (b,), FA3's argument) moves those positions: rotary_seqlens[i]
    takes cache_seqlens[i]'s place in them (the keys are still stored at cache_seqlens[i] + t).

    FP8 cache: k_cache/v_cache float8_e4m3fn with fp16/bf16/fp32 q and new k/v, and float32
    ``k_descale``/``v_descale`` of shape (k_cache.shape[0], h_k): per (batch row, kv head)
    for a contiguous cache, per (page, kv head) for a paged one.  A stored value x8 stands
    for x8 * descale; new k/v are stored as e4m3(clamp(x / descale, -448, 448)) with their
    slab's descale.  The output has q's dtype.  On Hopper with bf16/fp16 q the fused append
    quantizes and the decode kernel reads the e4m3 bytes, computing with x8 * descale rounded
    once to q's dtype.  ``descale_per_batch=True`` (FA3's layout): k_descale/v_descale are
    (b, h_k) and row i reads every key with its own descales, whatever page holds it (a page
    shared by rows is read with each row's); new k/v are then float8_e4m3fn bytes under those
    descales (FA3's), copied into the cache unchanged (TypeError for other dtypes; rotary with
    them raises NotImplementedError); packed queries (b = cu_seqlens_q's sequences) and packed
    new keys (cu_seqlens_k_new) included, on the kernels on CUDA.

    Value contract (no host synchronization).  Shapes, dtypes and devices are always
    checked.  The *values* of cache_seqlens, page_table (and descales, rotary range) are
    checked only in validation mode (flash3.validation: always for CPU tensors; for CUDA
    tensors after ``flash3.set_validation(True)`` or with FLASH3_VALIDATE=1; never inside
    CUDA graph capture or torch.compile tracing).  A rejected call raises ValueError and
    leaves the caches untouched.  With validation off the caller guarantees, for every row
    i: 0 <= cache_seqlens[i] and cache_seqlens[i] + s_new <= capacity (contiguous) or
    <= max_pages * page_size (paged), every page id among the first
    ceil((cache_seqlens[i] + s_new) / page_size) entries of page_table[i] in
    [0, num_pages), and for rotary cache_seqlens[i] + max(s_new, s_q) <= seqlen_ro.
    What happens otherwise: the reference (CPU, and the CUDA fallback: fp32 q, caches the
    kernel cannot address) uses PyTorch advanced indexing, so an out-of-range slot raises
    IndexError on the CPU and a device-side assert on CUDA (the CUDA context is then
    unusable), and a negative cache_seqlens or page id indexes from the end of the cache
    (Python semantics), so it may overwrite another row's slots.  The kernels skip instead:
    the fused append writes no slot outside the cache and no page id outside
    [0, num_pages), and the attention kernel reads at most min(cache_seqlens[i] + s_new,
    capacity) keys; a key behind a bad page id reads as zero.  Rotary positions are clamped
    to [0, seqlen_ro - 1] everywhere.
    """
    chunk = _checks.attention_chunk(attention_chunk)
    varlen = cu_seqlens_q is not None or max_seqlen_q is not None
    if cu_seqlens_k_new is not None or (varlen and (k is not None or v is not None)):
        return _kvcache_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                      causal, softmax_scale, window_size, softcap, return_lse,
                                      num_splits, rotary_cos, rotary_sin, rotary_interleaved,
                                      k_descale, v_descale, sinks, cu_seqlens_q, max_seqlen_q,
                                      alibi_slopes, rotary_seqlens, cache_leftpad,
                                      cu_seqlens_k_new, descale_per_batch, chunk)
    if varlen:
        return _kvcache_varlen(q, k_cache, v_cache, cache_seqlens, page_table, causal,
                               softmax_scale, window_size, softcap, return_lse, num_splits,
                               rotary_cos, rotary_sin, k_descale, v_descale, sinks, cu_seqlens_q,
                               max_seqlen_q, alibi_slopes, rotary_seqlens, cache_leftpad, chunk,
                               descale_per_batch)
    cache_seqlens = _checks.kvcache(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                    num_splits)
    _checks.kvcache_extras(q, k_cache, k, page_table, rotary_cos, rotary_sin,
                           rotary_interleaved, k_descale, v_descale, rotary_seqlens,
                           cache_leftpad, descale_per_batch)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    _checks.sinks(q, sinks)
    _checks.alibi_slopes(q, alibi_slopes, q.shape[0])
    out, lse = ops.run(ops.attention_kvcache, q, k_cache, v_cache, k, v, cache_seqlens,
                       page_table, scale, left, right, softcap, rotary_cos, rotary_sin,
                       rotary_interleaved, k_descale, v_descale, int(num_splits), sinks,
                       alibi_slopes, rotary_seqlens, cache_leftpad, bool(descale_per_batch), chunk)
    return (out, lse) if return_lse else out


def _kvcache_varlen(q, k_cache, v_cache, cache_seqlens, page_table, causal, softmax_scale,
                    window_size, softcap, return_lse, num_splits, rotary_cos, rotary_sin,
                    k_descale, v_descale, sinks, cu_seqlens_q, max_seqlen_q, alibi_slopes=None,
                    rotary_seqlens=None, cache_leftpad=None, chunk=0, descale_per_batch=False):
    """attention_with_kvcache with packed queries (cu_seqlens_q) and no new keys."""
    if cu_seqlens_q is None or max_seqlen_q is None:
        raise ValueError("cu_seqlens_q and max_seqlen_q must be given together")
    for n, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                 ("rotary_seqlens", rotary_seqlens)):
        if t is not None:
            raise ValueError(f"{n} needs the new keys k and v (the rotary embedding is applied to "
                             "q and the appended k)")
    _checks.num_splits(num_splits)
    cache_seqlens = _varlen_cache_seqlens(q, cache_seqlens, cu_seqlens_q)
    return _varlen_on_cache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, cache_seqlens,
                            page_table, None, causal, softmax_scale, window_size, softcap,
                            k_descale, v_descale, sinks, return_lse, "attention_with_kvcache",
                            "cache_seqlens", "k_cache", "v_cache", num_splits, alibi_slopes,
                            cache_leftpad, chunk, descale_per_batch)


def _varlen_cache_seqlens(q, cache_seqlens, cu_seqlens_q):
    """cache_seqlens of packed queries as a tensor: an int is every sequence's."""
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens must be >= 0, got {cache_seqlens}")
        _checks.tensor("cu_seqlens_q", cu_seqlens_q, 1)
        cache_seqlens = torch.full((cu_seqlens_q.shape[0] - 1,), int(cache_seqlens),
                                   dtype=torch.int32, device=q.device)
    return cache_seqlens


def _packed_queries_kernel_check(q, k, v, scale, cu_seqlens_k, sinks, alibi_slopes, cache_leftpad,
                                 descale_per_batch, chunk, who, what):
    """CUDA packed queries against a KV cache run on the decode kernel only (the reference reads
    the metadata on the host, so it is CPU-only): NotImplementedError, naming `what`, when the
    kernel cannot take this call."""
    if not q.is_cuda:
        return
    reason = (ops_serve.varlen_kvcache_reason(q, k, v, scale, cu_seqlens_k, sinks, alibi_slopes,
                                              cache_leftpad, descale_per_batch)
              or _backend.kernel_chunk_reason(q, "decode", chunk, v.shape[-1]))
    if reason is not None:
        raise NotImplementedError(f"{who}: {what} (packed queries against a KV cache) cannot run "
                                  f"the CUDA kernel: {reason}; the reference runs on CPU tensors")


def _append_new_keys(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
                     cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved, local, rotary_seqlens):
    """The fused append of new keys (batched or packed by cu_seqlens_k_new) into the cache, in
    place; returns q (rotated when rotary tables are given) and each entry's key count after the
    append (no host read; the kernel clamps it into [0, capacity])."""
    q_rot = ops_serve.kvcache_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table,
                                            cu_seqlens_q, cu_seqlens_k_new, rotary_cos,
                                            rotary_sin, bool(rotary_interleaved), local,
                                            rotary_seqlens)
    if rotary_cos is not None:
        q = q_rot
    n_new = (k.shape[1] if cu_seqlens_k_new is None
             else (cu_seqlens_k_new[1:] - cu_seqlens_k_new[:-1]).to(torch.int64))
    seqused = (cache_seqlens.to(torch.int64) + n_new).clamp(0, 2**31 - 1).to(torch.int32)
    return q, seqused


def _kvcache_append_packed(q, k_cache, v_cache, k, v, cache_seqlens, page_table, causal,
                           softmax_scale, window_size, softcap, return_lse, num_splits,
                           rotary_cos, rotary_sin, rotary_interleaved, k_descale, v_descale,
                           sinks, cu_seqlens_q, max_seqlen_q, alibi_slopes, rotary_seqlens,
                           cache_leftpad, cu_seqlens_k_new, descale_per_batch, chunk=0):
    """attention_with_kvcache with new keys in FA3's packed layouts (k/v packed by
    cu_seqlens_k_new, and/or q by cu_seqlens_q): every check first (nothing is written by a
    rejected call), then the append (ops_serve.kvcache_append_packed, rotating q with the keys),
    then the attention of each entry over its cache_seqlens[i] + n_new_i keys (the decode kernel
    on CUDA; no host reads)."""
    who = "attention_with_kvcache"
    varlen = cu_seqlens_q is not None or max_seqlen_q is not None
    if varlen and (cu_seqlens_q is None or max_seqlen_q is None):
        raise ValueError("cu_seqlens_q and max_seqlen_q must be given together")
    if k is None or v is None:
        raise ValueError("k and v must be given together" if (k is None) != (v is None) else
                         "cu_seqlens_k_new needs the new keys k and v (it packs them)")
    fp8 = _checks.is_fp8(k_cache) or _checks.is_fp8(v_cache)
    if descale_per_batch and not (_checks.is_fp8(k_cache) and _checks.is_fp8(v_cache)):
        raise ValueError("descale_per_batch goes with a float8_e4m3fn cache (k_cache is "
                         f"{k_cache.dtype})")
    if fp8 and not descale_per_batch:  # FA3's layout only: e4m3 new keys, copied unchanged
        raise NotImplementedError(f"{who}: new keys packed by cu_seqlens_k_new or with packed "
                                  "queries (cu_seqlens_q) on a float8_e4m3fn cache take FA3's "
                                  "descales (descale_per_batch=True, float8_e4m3fn k/v); with "
                                  "descales per slab they are not implemented")
    _checks.num_splits(num_splits)
    if varlen:
        cache_seqlens = _varlen_cache_seqlens(q, cache_seqlens, cu_seqlens_q)
        _checks.varlen_cache(q, k_cache, v_cache, cu_seqlens_q, max_seqlen_q, cache_seqlens,
                             page_table, None, k_descale, v_descale, "cache_seqlens", "k_cache",
                             "v_cache", descale_per_batch=descale_per_batch)
        b = cu_seqlens_q.shape[0] - 1
    else:
        cache_seqlens = _checks.kvcache(q, k_cache, v_cache, None, None, cache_seqlens, page_table,
                                        num_splits)
        b = q.shape[0]
    _checks.new_keys(q, k_cache, v_cache, k, v, cu_seqlens_k_new, b)
    _checks.kvcache_extras(q, k_cache, k, page_table, rotary_cos, rotary_sin, rotary_interleaved,
                           k_descale, v_descale, rotary_seqlens, cache_leftpad,
                           descale_per_batch, batch=b)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    _checks.sinks(q, sinks)
    _checks.alibi_slopes(q, alibi_slopes, b)
    local = left >= 0 or right >= 0 or chunk > 0  # causal, local or chunked: q rotated per token
    if varlen:  # the decode kernel, or no call at all (checked before the append)
        _packed_queries_kernel_check(q, k_cache, v_cache, scale, None, sinks, alibi_slopes,
                                     cache_leftpad, descale_per_batch, chunk, who, "cu_seqlens_q")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, k_cache, v_cache)):
        raise NotImplementedError(f"{who}: new keys are appended in place, forward only (no "
                                  "backward); call it under torch.no_grad()")
    if validation.validation_enabled(q, cache_seqlens, page_table, cu_seqlens_q, cu_seqlens_k_new):
        news, qs = _checks.appended_lengths(q, k, varlen, cu_seqlens_q, max_seqlen_q, cu_seqlens_k_new)
        _checks.kvcache_values(k_cache, cache_seqlens, news, page_table, qs, rotary_cos, local,
                               k_descale, v_descale, rotary_seqlens=rotary_seqlens,
                               cache_leftpad=cache_leftpad)
    q, seqused = _append_new_keys(q, k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q,
                                  cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved, local,
                                  rotary_seqlens)
    if varlen:
        out, lse = ops_serve.attention_varlen_kvcache(q, k_cache, v_cache, cu_seqlens_q, seqused,
                                                      page_table, None, int(max_seqlen_q), scale,
                                                      left, right, softcap, k_descale, v_descale,
                                                      sinks, int(num_splits), alibi_slopes,
                                                      cache_leftpad, chunk,
                                                      **_per_batch_kw(descale_per_batch))
    else:
        out, lse = ops.run(ops.attention_kvcache, q, k_cache, v_cache, None, None, seqused,
                           page_table, scale, left, right, softcap, None, None, False, k_descale,
                           v_descale, int(num_splits), sinks, alibi_slopes, None, cache_leftpad,
                           bool(descale_per_batch), chunk)
    return (out, lse) if return_lse else out


def _varlen_on_cache(q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, page_table, cu_seqlens_k,
                     causal, softmax_scale, window_size, softcap, k_descale, v_descale, sinks,
                     return_lse, who, lens_name, kn, vn, num_splits=0, alibi_slopes=None,
                     cache_leftpad=None, chunk=0, descale_per_batch=False):
    """Packed queries against a paged, contiguous or packed cache (the decode kernel on CUDA, the
    reference on the CPU; forward). ``descale_per_batch``: an FP8 cache's descales are FA3's
    (b, h_k)."""
    _checks.varlen_cache(q, k, v, cu_seqlens_q, max_seqlen_q, seqused_k, page_table,
                         cu_seqlens_k, k_descale, v_descale, lens_name, kn, vn,
                         descale_per_batch=descale_per_batch)
    if cache_leftpad is not None:  # (the descales again: an FP8 cache requires them)
        _checks.kvcache_extras(q, k, None, page_table, None, None, False, k_descale, v_descale,
                               cache_leftpad=cache_leftpad, descale_per_batch=descale_per_batch,
                               batch=cu_seqlens_q.shape[0] - 1)
    scale, left, right, softcap = _checks.options(q, causal, softmax_scale, window_size, softcap)
    left, right = masking.normalize_window(causal, (left, right))
    _checks.sinks(q, sinks)
    _checks.alibi_slopes(q, alibi_slopes, cu_seqlens_q.shape[0] - 1)
    what = ("cu_seqlens_q" if kn == "k_cache" else "page_table" if page_table is not None
            else lens_name)
    _packed_queries_kernel_check(q, k, v, scale, cu_seqlens_k, sinks, alibi_slopes, cache_leftpad,
                                 descale_per_batch, chunk, who, what)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (q, k, v, sinks)):
        raise NotImplementedError(f"{who}: {what} is forward only (no backward); call it under "
                                  "torch.no_grad() or with tensors that do not require grad")
    out, lse = ops_serve.attention_varlen_kvcache(q, k, v, cu_seqlens_q, seqused_k, page_table,
                                                  cu_seqlens_k, int(max_seqlen_q), scale, left,
                                                  right, softcap, k_descale, v_descale, sinks,
                                                  int(num_splits), alibi_slopes, cache_leftpad, chunk,
                                                  **_per_batch_kw(descale_per_batch))
    return (out, lse) if return_lse else out


def _per_batch_kw(descale_per_batch):
    """descale_per_batch for the packed-query op, passed only when set (as the kernels' optional
    arguments are)."""
    return {"descale_per_batch": True} if descale_per_batch else {}
