#include "flash3/host/fwd.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "flash3/common/attn_logic.h"
#include "flash3/host/fwd_params.h"
#include "flash3/host/kernel_pick.h"

namespace flash3::host {

void fwd_sm90(Backend& be, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
              const TensorView& lse, const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k,
              const TensorView* seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, double softmax_scale,
              int64_t window_left, int64_t window_right, double softcap, const TensorView* sinks,
              const TensorView* alibi_slopes, const TensorView* seqused_q, int64_t attention_chunk) {
  constexpr const char* kOp = "flash3.fwd_sm90";
  // Device and dtypes.
  check(q.device.kind == DeviceKind::cuda, kOp, ": q must be a CUDA tensor, got ", q.device);
  for (const TensorView* t : {&k, &v, &out, &lse})
    check(t->device == q.device, kOp, ": all tensors must be on ", q.device, ", got one on ", t->device);
  const DeviceInfo& dev = device_info(q.device.index);
  check_hopper(dev, q, kOp);
  const DType dtype = q.dtype;  // bf16/fp16: the pick's check
  check(k.dtype == dtype && v.dtype == dtype, kOp, ": q, k and v must have the same dtype, got ", q.dtype_name, ", ",
        k.dtype_name, ", ", v.dtype_name);
  check(out.dtype == dtype, kOp, ": out must have q's dtype ", q.dtype_name, ", got ", out.dtype_name);
  check(lse.dtype == DType::f32, kOp, ": lse must be float32, got ", lse.dtype_name);
  const bool is_bf16 = dtype == DType::bf16;

  // Shapes.
  const QkvShape s =
      check_qkv_shapes(kOp, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k);
  const bool varlen = s.varlen;
  const int qdim = varlen ? 3 : 4;
  const int64_t batch = s.batch, h = s.h, d = s.d, d_v = s.d_v, seqlen_q = s.s_q, seqlen_k = s.s_k;
  const int64_t total_q = s.total_q, total_k = s.total_k;
  check_seqlens(seqused_k, "seqused_k", batch, q);
  check_seqlens(seqused_q, "seqused_q", batch, q);
  check(seqused_q == nullptr || varlen, kOp, ": seqused_q needs packed queries (cu_seqlens_q)");
  check(seqused_q == nullptr || sinks == nullptr, kOp, ": seqused_q is not supported with sinks");
  check_heads(kOp, h, s.h_k);
  check_score_options(kOp, softcap, window_left, window_right);
  check_attention_chunk(kOp, attention_chunk);
  const float* sinks_ptr = check_sinks(sinks, h, q, kOp);
  int64_t alibi_stride = 0;
  const float* alibi_ptr = check_alibi(alibi_slopes, batch, h, q, kOp, &alibi_stride);

  // Head dims without their own kernel run on the next compiled one up (TMA zero-fills the extra
  // columns).
  const FwdKernelEntry* kernel =
      checked_pick(kOp, be.build_name(), KernelFamily::fwd, q, d, d_v, softmax_scale, attention_chunk).fwd;
  if (be.tracing()) {
    std::ostringstream os;
    os << "kernel " << dtype_name(kernel->is_bf16) << " d=" << kernel->head_dim << " d_v=" << kernel->head_dim_v;
    be.trace(os.str());
  }

  if (total_q == 0 || h == 0 || batch == 0 || seqlen_q == 0) return;  // nothing to compute
  if (total_k == 0) {  // no keys at all: every row sees nothing (out 0, lse -inf or the sink, as the reference)
    be.fill(out, 0.f);
    be.fill_empty_lse(lse, sinks, varlen ? 0 : 1);
    return;
  }

  check_tma_layout(q, "q");
  check_tma_layout(k, "k");
  check_tma_layout(v, "v");
  check_tma_layout(out, "out");
  check(lse.stride(-1) == 1 || lse.size(-1) <= 1, kOp, ": lse must have a contiguous last dimension");

  FwdParams p;
  set_q_k_out(p, q, k, out, lse, cu_seqlens_q, cu_seqlens_k, batch, seqlen_q, seqlen_k);
  p.v = v.data_ptr();
  p.v_batch_stride = varlen ? 0 : tma_stride(v, 0);
  p.v_row_stride = tma_stride(v, qdim - 3);
  p.v_head_stride = tma_stride(v, qdim - 2);
  p.seqused_k = seqused_k != nullptr ? seqused_k->ptr<const int>() : nullptr;
  p.seqused_q = seqused_q != nullptr ? seqused_q->ptr<const int>() : nullptr;
  p.sinks = sinks_ptr;
  p.alibi_slopes = alibi_ptr, p.alibi_batch_stride = alibi_stride;

  p.is_bf16 = is_bf16;
  set_mask_and_launch(p, kernel->launch, be, dev, softmax_scale, softcap, window_left, window_right, kOp,
                      dtype_name(is_bf16), attention_chunk);
}

namespace {

constexpr const char* kFp8Op = "flash3.fwd_fp8_sm90";

// Entries of a descale row as the kernel reads it: one per kernel block of `kernel_block` rows.
int64_t kernel_blocks(int64_t rows, int64_t kernel_block) { return (rows + kernel_block - 1) / kernel_block; }

// A per-block descale (b, heads, blocks of `block` rows): its checks, all made before any descale is
// repeated (a refused call launches nothing). `block` must be a multiple of the kernel's block.
void check_fp8_descale(const TensorView& t, const char* name, const TensorView& q, int64_t b, int64_t heads,
                       int64_t rows, int64_t block, int64_t kernel_block) {
  check(t.dtype == DType::f32, kFp8Op, ": ", name, " must be float32, got ", t.dtype_name);
  check(t.device == q.device, kFp8Op, ": ", name, " must be on ", q.device);
  check(block > 0 && block % kernel_block == 0, kFp8Op, ": the block of ", name, " (", block,
        " rows) must be a multiple of the kernel's ", kernel_block);
  const int64_t nb = (rows + block - 1) / block, nk = kernel_blocks(rows, kernel_block);
  check_shape(t, name, {b, heads, nb});
  // The kernel reads a descale row at 32-bit element offsets (fwd/fp8_steps.cuh row_of / entry): the
  // tensor as given, or its contiguous repeat (one entry per kernel block).
  int64_t span = b * heads * nk - 1;
  if (block == kernel_block) {
    const int64_t extent[3] = {b, heads, nk};
    span = 0;
    for (int i = 0; i < 3; ++i) span += std::max<int64_t>(extent[i] - 1, 0) * std::abs(t.stride(i));
  }
  check(span < (int64_t(1) << 31), kFp8Op, ": ", name, " reaches element ", span,
        " through its strides; the kernel's offsets take below 2^31 (pass a contiguous tensor)");
}

// The checked descale as the kernel's Descale, one entry per kernel block of `kernel_block` rows;
// coarser blocks are repeated on the device by the backend (no host sync).
Descale fp8_descale(Backend& be, const TensorView& t, int64_t rows, int64_t block, int64_t kernel_block) {
  const int64_t nk = kernel_blocks(rows, kernel_block);
  const TensorView keep = block == kernel_block ? t : be.repeat_last(t, block / kernel_block, nk);
  Descale d;
  d.ptr = keep.ptr<const float>();
  d.batch_stride = keep.stride(0);
  d.head_stride = keep.stride(1);
  d.index_stride = keep.size(2) > 1 ? keep.stride(2) : 0;
  d.count = static_cast<int>(nk);
  return d;
}

}  // namespace

void fwd_fp8_sm90(Backend& be, const TensorView& q, const TensorView& k, const TensorView& vt, const TensorView& out,
                  const TensorView& lse, const TensorView& q_descale, const TensorView& k_descale,
                  const TensorView& v_descale, const TensorView* v_channel_descale, int64_t q_block, int64_t kv_block,
                  double softmax_scale, int64_t window_left, int64_t window_right, double softcap,
                  const TensorView* cu_seqlens_q, const TensorView* cu_seqlens_k, int64_t max_seqlen_q,
                  int64_t max_seqlen_k, const TensorView* seqused_q, const TensorView* seqused_k,
                  int64_t attention_chunk, bool fast_accum) {
  constexpr const char* kOp = kFp8Op;
  check(q.device.kind == DeviceKind::cuda, kOp, ": q must be a CUDA tensor, got ", q.device);
  for (const TensorView* t : {&k, &vt, &out, &lse})
    check(t->device == q.device, kOp, ": all tensors must be on ", q.device, ", got one on ", t->device);
  const DeviceInfo& dev = device_info(q.device.index);
  check_hopper(dev, q, kOp);
  for (auto [t, name] : {std::make_pair(&k, "k"), std::make_pair(&vt, "vt")})  // q's: the pick's
    check(t->dtype == DType::e4m3, kOp, ": ", name, " must be float8_e4m3fn, got ", t->dtype_name);
  check(out.dtype == DType::bf16, kOp, ": out must be bfloat16");
  check(lse.dtype == DType::f32, kOp, ": lse must be float32");
  const bool varlen = cu_seqlens_q != nullptr;
  check(varlen == (cu_seqlens_k != nullptr), kOp, ": pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&k, "k"), std::make_pair(&vt, "vt"),
                         std::make_pair(&out, "out")})
    check(t->dim() == qdim, kOp, ": ", name, " must be ", qdim, "-D, got ", t->sizes());
  const int64_t b = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  check(b >= 0, kOp, ": cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1), h_k = k.size(-2);
  const int64_t d_v = vt.size(-2), cols = vt.size(-1);
  const int64_t s_q = varlen ? max_seqlen_q : q.size(1), s_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : b * s_q, total_k = varlen ? k.size(0) : b * s_k;
  if (varlen) {
    check(max_seqlen_q >= 0 && max_seqlen_k >= 0, kOp, ": max_seqlen_q/max_seqlen_k must be >= 0 for varlen");
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(vt, "vt", {h_k, d_v, static_cast<int64_t>(fp8_varlen_vt_offset(total_k, b))});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    check_seqlens(cu_seqlens_q, "cu_seqlens_q", b + 1, q);
    check_seqlens(cu_seqlens_k, "cu_seqlens_k", b + 1, q);
  } else {
    check(seqused_q == nullptr && seqused_k == nullptr, kOp,
          ": seqused_q/seqused_k need packed sequences (cu_seqlens_q/k)");
    check_shape(k, "k", {b, s_k, h_k, d});
    check(vt.size(0) == b && vt.size(1) == h_k && cols % 16 == 0 && cols >= s_k, kOp,
          ": vt must be (b, h_k, d_v, s_pad) with s_pad a multiple of 16 >= s_k, got ", vt.sizes());
    check_shape(out, "out", {b, s_q, h, d_v});
    check_shape(lse, "lse", {b, h, s_q});
  }
  check_seqlens(seqused_q, "seqused_q", b, q);
  check_seqlens(seqused_k, "seqused_k", b, q);
  check_heads(kOp, h, h_k);
  check_score_options(kOp, softcap, window_left, window_right);
  check_attention_chunk(kOp, attention_chunk);
  check(!fast_accum || attention_chunk == 0, kOp, ": fast_accum takes no attention_chunk (no such kernel)");
  const FwdKernelEntry* picked = checked_pick(kOp, be.build_name(), KernelFamily::fwd_fp8, q, d, d_v, softmax_scale).fwd;
  // The tile of the kernel that runs (possibly a larger head dim's; with a chunk, its chunk tile):
  // descales index its key blocks.
  const TileShape tile = fast_accum          ? fwd_fp8_fast_tile_shape(picked->head_dim, picked->head_dim_v)
                         : attention_chunk > 0 ? fwd_fp8_chunk_tile_shape(picked->head_dim, picked->head_dim_v)
                                               : fwd_fp8_tile_shape(picked->head_dim, picked->head_dim_v);
  if (be.tracing()) {
    std::ostringstream os;
    os << "kernel e4m3 d=" << picked->head_dim << " d_v=" << picked->head_dim_v << " (block_n " << tile.block_n
       << (fast_accum ? ", fast accumulation)" : ")");
    be.trace(os.str());
  }

  if (b == 0 || h == 0 || s_q == 0 || total_q == 0) return;
  if (s_k == 0 || total_k == 0) {
    be.fill(out, 0.f);
    be.fill(lse, -INFINITY);
    return;
  }
  check_tma_layout(q, "q");
  check_tma_layout(k, "k");
  check_tma_layout(vt, "vt");
  check_tma_layout(out, "out");
  check(lse.stride(-1) == 1 || lse.size(-1) <= 1, kOp, ": lse must have a contiguous last dimension");

  FwdParams p;
  check_fp8_descale(q_descale, "q_descale", q, b, h, s_q, q_block, 64);
  check_fp8_descale(k_descale, "k_descale", q, b, h_k, s_k, kv_block, tile.block_n);
  // fast_accum: one v descale per (batch, kv head), applied with the row sums: the sequence as one
  // block of one row (b, h_k, 1), checked and passed as any block descale.
  const char* v_name = fast_accum ? "v_descale (one per (batch, kv head) with fast_accum)" : "v_descale";
  const int64_t v_rows = fast_accum ? 1 : s_k, v_block = fast_accum ? 1 : kv_block,
                v_kernel_block = fast_accum ? 1 : tile.block_n;
  check_fp8_descale(v_descale, v_name, q, b, h_k, v_rows, v_block, v_kernel_block);
  if (v_channel_descale != nullptr) {  // checked with the others, before any repeat launches
    const TensorView& vc = *v_channel_descale;
    check(vc.dtype == DType::f32 && vc.device == q.device, kOp, ": v_channel_descale must be float32 on ", q.device);
    check_shape(vc, "v_channel_descale", {b, h_k, d_v});
    p.fp8.v_channel = Descale{vc.ptr<const float>(), vc.stride(0), vc.stride(1), vc.stride(2), static_cast<int>(d_v)};
  }
  p.fp8.q = fp8_descale(be, q_descale, s_q, q_block, 64);
  p.fp8.k = fp8_descale(be, k_descale, s_k, kv_block, tile.block_n);
  p.fp8.v = fp8_descale(be, v_descale, v_rows, v_block, v_kernel_block);
  p.fp8.fast_accum = fast_accum;
  set_q_k_out(p, q, k, out, lse, cu_seqlens_q, cu_seqlens_k, b, s_q, s_k);
  to_int(cols, "vt columns");
  p.v = vt.data_ptr();
  // Vt: ([batch,] head, d_v, tokens); v_row_stride = the stride of the d_v index (tokens are contiguous).
  p.v_batch_stride = varlen ? 0 : tma_stride(vt, 0);
  p.v_head_stride = tma_stride(vt, qdim - 3);
  p.v_row_stride = tma_stride(vt, qdim - 2);
  p.seqused_q = seqused_q != nullptr ? seqused_q->ptr<const int>() : nullptr;
  p.seqused_k = seqused_k != nullptr ? seqused_k->ptr<const int>() : nullptr;
  p.is_bf16 = true;
  set_mask_and_launch(p, picked->launch, be, dev, softmax_scale, softcap, window_left, window_right, kOp,
                      nullptr, attention_chunk);
}

}  // namespace flash3::host
