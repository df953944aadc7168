// Driver for flash3's ops under the Hopper simulator (tools/hopper_sim/simrun), without torch: one
// op call described by files. This file: main, and the forward ops: torch.ops.flash3.fwd_sm90,
// fwd_fp8_sm90, and one decode step (attention_kvcache's kernel path: append_kv_sm90 when new keys
// are given, then fwd_kvcache_sm90 and its combine). Other ops live in their own files
// (sim_op_*.cu, each registering itself with RegisterOp; sim_case.h has what they share).
//
//   sim_driver --info            print kernel_info()'s JSON ("fwd", "fwd_fp8", "decode",
//                                "decode_fp8_cache", and the other ops' lists) for the linked TUs
//   sim_driver CASE_DIR          run the call in CASE_DIR/case.txt, write CASE_DIR/NAME.out.bin for
//                                output the op names (fwd, fwd_fp8: out lse; kvcache: out lse
//                                k_cache v_cache, and q_out when given; bwd: dq dk dv;
//                                quantize_fp8: out descale)
//
// It links flash3's real host code (the generated kernel TUs the build selected, fwd/registry.cpp)
// and mirrors csrc/binding.cpp (fwd_sm90_cuda, fwd_fp8_sm90_cuda, fp8_descale),
// csrc/kvcache_binding.cpp (fwd_kvcache_sm90_cuda), csrc/decode_binding.cpp (append_kv_sm90_cuda) and
// csrc/binding_common.h (tma_stride, check_tma_layout, check_shape, set_q_k_out,
// set_mask_and_launch) line for line on a minimal tensor type instead of at::Tensor, so FwdParams
// gets exactly what the torch binding would give it. Keep the two in step.
//
// case.txt (written by tools/smoke_sim.py, write_case), one item per line, '#' comments:
//   flash3-sim-case 1
//   op fwd | fwd_fp8 | kvcache | bwd | quantize_fp8 | (the other ops' names)
//   tensor NAME DTYPE NDIM SIZE... STRIDE... [random|nan]
//                                                data: CASE_DIR/NAME.bin, the elements from offset 0
//                                                to the largest one addressed (row-major for
//                                                contiguous tensors), little endian; or made by the
//                                                driver: N(0,1) values / NaN (large timing cases)
//   NAME VALUE                                   scalars: max_seqlen_q max_seqlen_k softmax_scale
//                                                causal window_left window_right softcap q_block
//                                                kv_block (floats in any strtod form, e.g. hex)
// DTYPE: bf16 fp16 e4m3 f32 i32. Tensors: q k v out lse (v is the op's vt for fwd_fp8), optional
// cu_seqlens_q cu_seqlens_k seqused_k sinks (float32 (h,), attention sinks; not fwd_fp8); fwd_fp8:
// q_descale k_descale v_descale, optional v_channel_descale. kvcache: q k_cache v_cache out lse
// seqused_k, optional page_table, k_descale v_descale (FP8 caches), sinks, cu_seqlens_q (varlen q:
// q/out (total_q, h, .), lse (h, total_q), scalar max_seqlen_q); scalars softmax_scale causal
// window_left window_right softcap num_splits; the fused append when tensor k is given: k v
// cache_seqlens, optional rotary_cos rotary_sin q_out (q_out with rotary: the attention then takes
// q_out, as flash3/ops.py attention_kvcache does), scalars rotary_interleaved q_per_token.
// seqused_k is what ops.py computes (cache_seqlens + s_new, clamped to int32). bwd (sim_op_bwd.cu,
// torch.ops.flash3.bwd_sm90): dout q k v out lse dq dk dv, optional dlse cu_seqlens_q cu_seqlens_k
// sinks dsinks; scalars max_seqlen_q max_seqlen_k softmax_scale causal window_left window_right
// softcap deterministic. quantize_fp8 (sim_op_quantize.cu, torch.ops.flash3.quantize_fp8_sm90): x
// out descale, optional signs mean channel_descale; scalars block_size layout. Outputs hold what the
// caller passed (NaN poison, the caches' old contents); after the launches the driver writes their
// whole buffers to NAME.out.bin.
//
// Exit: 0 launched and synchronized; 3 the call was refused (what TORCH_CHECK or the launcher would
// raise; the message goes to stderr as "sim_driver: error: ..."); 2 bad case files or CUDA errors.
#include "sim_case.h"

#include "flash3/common/attn_logic.h"
#include "flash3/decode/append_kv.h"
#include "flash3/decode/combine.h"
#include "flash3/decode/split_heuristic.h"

namespace {

using namespace simdrv;

// ---- csrc/binding.cpp fwd_sm90_cuda ------------------------------------------------------------

void fwd_sm90(const Case& c, const DeviceInfo& dev) {
  const Tensor &q = c.t("q"), &k = c.t("k"), &v = c.t("v"), &out = c.t("out"), &lse = c.t("lse");
  const Tensor *cu_seqlens_q = c.opt("cu_seqlens_q"), *cu_seqlens_k = c.opt("cu_seqlens_k"),
               *seqused_k = c.opt("seqused_k"), *sinks = c.opt("sinks");
  const int64_t max_seqlen_q = c.integer("max_seqlen_q"), max_seqlen_k = c.integer("max_seqlen_k");
  const double softmax_scale = c.num("softmax_scale"), softcap = c.num("softcap");
  const bool causal = c.integer("causal") != 0;
  const int64_t window_left = c.integer("window_left"), window_right = c.integer("window_right");

  check(dev.major == 9 && dev.minor == 0, "flash3.fwd_sm90 needs an sm_90 (Hopper) GPU; it is sm_", dev.major, dev.minor);
  const DType dtype = q.dtype;
  check(dtype == DType::bf16 || dtype == DType::fp16, "flash3.fwd_sm90: q must be bfloat16 or float16, got ",
        dtype_str(dtype));
  check(k.dtype == dtype && v.dtype == dtype, "flash3.fwd_sm90: q, k and v must have the same dtype, got ",
        dtype_str(dtype), ", ", dtype_str(k.dtype), ", ", dtype_str(v.dtype));
  check(out.dtype == dtype, "flash3.fwd_sm90: out must have q's dtype ", dtype_str(dtype), ", got ", dtype_str(out.dtype));
  check(lse.dtype == DType::f32, "flash3.fwd_sm90: lse must be float32, got ", dtype_str(lse.dtype));
  const bool is_bf16 = dtype == DType::bf16;

  const bool varlen = cu_seqlens_q != nullptr;
  check((cu_seqlens_q != nullptr) == (cu_seqlens_k != nullptr),
        "flash3.fwd_sm90: pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_tuple(&q, "q"), std::make_tuple(&k, "k"), std::make_tuple(&v, "v"),
                         std::make_tuple(&out, "out")})
    check(t->dim() == qdim, "flash3.fwd_sm90: ", name, " must be ", qdim, "-D (",
          varlen ? "varlen: (total, heads, dim)" : "(batch, seqlen, heads, dim)", "), got ", shape_str(t->sizes));
  const int64_t batch = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  check(batch >= 0, "flash3.fwd_sm90: cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1);
  const int64_t h_k = k.size(-2), d_v = v.size(-1);
  const int64_t seqlen_q = varlen ? max_seqlen_q : q.size(1);
  const int64_t seqlen_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : batch * seqlen_q;
  const int64_t total_k = varlen ? k.size(0) : batch * seqlen_k;
  if (varlen) {
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(v, "v", {total_k, h_k, d_v});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    check(max_seqlen_q >= 0 && max_seqlen_k >= 0, "flash3.fwd_sm90: max_seqlen_q/max_seqlen_k must be >= 0 for varlen");
  } else {
    check_shape(k, "k", {batch, seqlen_k, h_k, d});
    check_shape(v, "v", {batch, seqlen_k, h_k, d_v});
    check_shape(out, "out", {batch, seqlen_q, h, d_v});
    check_shape(lse, "lse", {batch, h, seqlen_q});
  }
  check_seqlens(cu_seqlens_q, "cu_seqlens_q", batch + 1);
  check_seqlens(cu_seqlens_k, "cu_seqlens_k", batch + 1);
  check_seqlens(seqused_k, "seqused_k", batch);
  check(h_k > 0 && h % h_k == 0, "flash3.fwd_sm90: the number of query heads (", h,
        ") must be a multiple of the number of kv heads (", h_k, ")");
  check(d % 8 == 0 && d_v % 8 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256,
        "flash3.fwd_sm90: head dims must be multiples of 8 in [8, 256], got d=", d, " d_v=", d_v);
  check(softcap >= 0.0, "flash3.fwd_sm90: softcap must be >= 0 (0 = off), got ", softcap);
  check(softmax_scale > 0.0 && std::isfinite(softmax_scale), "flash3.fwd_sm90: softmax_scale must be finite and > 0, got ",
        softmax_scale);
  check(window_left >= -1 && window_right >= -1, "flash3.fwd_sm90: window sizes must be >= -1 (-1 = unbounded)");
  const float* sinks_ptr = check_sinks(sinks, h, "flash3.fwd_sm90");

  const bool wide = !causal && window_left < 0 && window_right < 0;
  const flash3::FwdLauncher launch =
      flash3::find_fwd_kernel(is_bf16, static_cast<int>(d), static_cast<int>(d_v), wide);
  check(launch != nullptr, "flash3.fwd_sm90: no ", dtype_name(is_bf16), " kernel for head dim (", d, ", ", d_v,
        ") or larger in this build of sim_driver");
  {  // which registered entry that is (for the log)
    const flash3::FwdKernelEntry* e =
        flash3::pick_fwd_kernel(flash3::fwd_kernels(), is_bf16, int(d), int(d_v), wide);
    std::fprintf(stderr, "sim_driver: kernel %s d=%d d_v=%d%s\n", dtype_name(e->is_bf16), e->head_dim,
                 e->head_dim_v, e->wide ? " wide" : "");
  }

  if (total_q == 0 || h == 0 || batch == 0 || seqlen_q == 0) return;
  if (total_k == 0) {
    fill(out, 0.f);
    fill_empty_lse(lse, sinks, varlen ? 0 : 1);
    return;
  }
  check_tma_layout(q, "q");
  check_tma_layout(k, "k");
  check_tma_layout(v, "v");
  check_tma_layout(out, "out");
  check(lse.stride(-1) == 1 || lse.size(-1) <= 1, "flash3.fwd_sm90: lse must have a contiguous last dimension");

  flash3::FwdParams p;
  set_q_k_out(p, q, k, out, lse, cu_seqlens_q, cu_seqlens_k, batch, seqlen_q, seqlen_k);
  p.v = v.data_ptr();
  p.v_batch_stride = varlen ? 0 : tma_stride(v, 0);
  p.v_row_stride = tma_stride(v, qdim - 3);
  p.v_head_stride = tma_stride(v, qdim - 2);
  p.seqused_k = seqused_k != nullptr ? static_cast<const int*>(seqused_k->data_ptr()) : nullptr;
  p.sinks = sinks_ptr;
  p.alibi_slopes = check_alibi(c.opt("alibi_slopes"), batch, h, "flash3.fwd_sm90", &p.alibi_batch_stride);
  p.is_bf16 = is_bf16;
  set_mask_and_launch(p, launch, dev, softmax_scale, softcap, causal, window_left, window_right, "flash3.fwd_sm90",
                      dtype_name(is_bf16));
}

// ---- csrc/binding.cpp fp8_descale and fwd_fp8_sm90_cuda -----------------------------------------

// t.repeat_interleave(block / kernel_block, 2).narrow(2, 0, nk) when the blocks differ, else t.
flash3::Descale fp8_descale(const Tensor& t, const char* name, int64_t b, int64_t heads, int64_t rows, int64_t block,
                            int64_t kernel_block) {
  check(t.dtype == DType::f32, "flash3.fwd_fp8_sm90: ", name, " must be float32, got ", dtype_str(t.dtype));
  check(block > 0 && block % kernel_block == 0, "flash3.fwd_fp8_sm90: the block of ", name, " (", block,
        " rows) must be a multiple of the kernel's ", kernel_block);
  const int64_t nb = (rows + block - 1) / block, nk = (rows + kernel_block - 1) / kernel_block;
  check_shape(t, name, {b, heads, nb});
  flash3::Descale d;
  if (block == kernel_block) {
    d.ptr = static_cast<const float*>(t.data_ptr());
    d.batch_stride = t.stride(0);
    d.head_stride = t.stride(1);
    d.index_stride = t.size(2) > 1 ? t.stride(2) : 0;
  } else {
    const int64_t r = block / kernel_block;
    std::vector<float> src(t.bytes / 4), rep(size_t(b * heads * nb * r));
    if (t.bytes) ck(cudaMemcpy(src.data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < heads; ++j)
        for (int64_t x = 0; x < nb * r; ++x)
          rep[(i * heads + j) * nb * r + x] = src[i * t.stride(0) + j * t.stride(1) + (x / r) * t.stride(2)];
    // The narrowed view keeps the repeated tensor's strides: (heads * nb * r, nb * r, 1), size nk.
    const Tensor keep = device_copy(rep, {b, heads, nb * r});
    d.ptr = static_cast<const float*>(keep.ptr);
    d.batch_stride = keep.stride(0);
    d.head_stride = keep.stride(1);
    d.index_stride = nk > 1 ? keep.stride(2) : 0;
  }
  d.count = static_cast<int>(nk);
  return d;
}

void fwd_fp8_sm90(const Case& c, const DeviceInfo& dev) {
  const Tensor &q = c.t("q"), &k = c.t("k"), &vt = c.t("v"), &out = c.t("out"), &lse = c.t("lse");
  const Tensor &q_descale = c.t("q_descale"), &k_descale = c.t("k_descale"), &v_descale = c.t("v_descale");
  const Tensor* v_channel_descale = c.opt("v_channel_descale");
  const Tensor *cu_seqlens_q = c.opt("cu_seqlens_q"), *cu_seqlens_k = c.opt("cu_seqlens_k");
  const int64_t q_block = c.integer("q_block"), kv_block = c.integer("kv_block");
  const int64_t max_seqlen_q = c.has("max_seqlen_q") ? c.integer("max_seqlen_q") : 0,
                max_seqlen_k = c.has("max_seqlen_k") ? c.integer("max_seqlen_k") : 0;
  const double softmax_scale = c.num("softmax_scale"), softcap = c.num("softcap");
  const bool causal = c.integer("causal") != 0;
  const int64_t window_left = c.integer("window_left"), window_right = c.integer("window_right");

  check(dev.major == 9 && dev.minor == 0, "flash3.fwd_fp8_sm90 needs an sm_90 (Hopper) GPU");
  for (auto [t, name] : {std::make_tuple(&q, "q"), std::make_tuple(&k, "k"), std::make_tuple(&vt, "vt")})
    check(t->dtype == DType::e4m3, "flash3.fwd_fp8_sm90: ", name, " must be float8_e4m3fn, got ", dtype_str(t->dtype));
  check(out.dtype == DType::bf16, "flash3.fwd_fp8_sm90: out must be bfloat16");
  check(lse.dtype == DType::f32, "flash3.fwd_fp8_sm90: lse must be float32");
  const bool varlen = cu_seqlens_q != nullptr;
  check((cu_seqlens_q != nullptr) == (cu_seqlens_k != nullptr),
        "flash3.fwd_fp8_sm90: pass both cu_seqlens_q and cu_seqlens_k, or neither");
  const int qdim = varlen ? 3 : 4;
  for (auto [t, name] : {std::make_tuple(&q, "q"), std::make_tuple(&k, "k"), std::make_tuple(&vt, "vt"),
                         std::make_tuple(&out, "out")})
    check(t->dim() == qdim, "flash3.fwd_fp8_sm90: ", name, " must be ", qdim, "-D, got ", shape_str(t->sizes));
  const int64_t b = varlen ? cu_seqlens_q->numel() - 1 : q.size(0);
  check(b >= 0, "flash3.fwd_fp8_sm90: cu_seqlens_q must have batch + 1 >= 1 entries");
  const int64_t h = q.size(-2), d = q.size(-1), h_k = k.size(-2);
  const int64_t d_v = vt.size(-2), cols = vt.size(-1);
  const int64_t s_q = varlen ? max_seqlen_q : q.size(1), s_k = varlen ? max_seqlen_k : k.size(1);
  const int64_t total_q = varlen ? q.size(0) : b * s_q, total_k = varlen ? k.size(0) : b * s_k;
  if (varlen) {
    check(max_seqlen_q >= 0 && max_seqlen_k >= 0,
          "flash3.fwd_fp8_sm90: max_seqlen_q/max_seqlen_k must be >= 0 for varlen");
    check_shape(k, "k", {total_k, h_k, d});
    check_shape(vt, "vt", {h_k, d_v, static_cast<int64_t>(flash3::fp8_varlen_vt_offset(total_k, b))});
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
    check_seqlens(cu_seqlens_q, "cu_seqlens_q", b + 1);
    check_seqlens(cu_seqlens_k, "cu_seqlens_k", b + 1);
  } else {
    check_shape(k, "k", {b, s_k, h_k, d});
    check(vt.size(0) == b && vt.size(1) == h_k && cols % 16 == 0 && cols >= s_k,
          "flash3.fwd_fp8_sm90: vt must be (b, h_k, d_v, s_pad) with s_pad a multiple of 16 >= s_k, got ",
          shape_str(vt.sizes));
    check_shape(out, "out", {b, s_q, h, d_v});
    check_shape(lse, "lse", {b, h, s_q});
  }
  check(h_k > 0 && h % h_k == 0, "flash3.fwd_fp8_sm90: the number of query heads (", h,
        ") must be a multiple of the number of kv heads (", h_k, ")");
  check(d % 16 == 0 && d_v % 16 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256,
        "flash3.fwd_fp8_sm90: head dims must be multiples of 16 in [16, 256], got d=", d, " d_v=", d_v);
  check(softcap >= 0.0, "flash3.fwd_fp8_sm90: softcap must be >= 0 (0 = off), got ", softcap);
  check(softmax_scale > 0.0 && std::isfinite(softmax_scale),
        "flash3.fwd_fp8_sm90: softmax_scale must be finite and > 0, got ", softmax_scale);
  check(window_left >= -1 && window_right >= -1, "flash3.fwd_fp8_sm90: window sizes must be >= -1 (-1 = unbounded)");
  const flash3::FwdKernelEntry* picked =
      flash3::pick_fwd_kernel(flash3::fwd_fp8_kernels(), true, static_cast<int>(d), static_cast<int>(d_v), false);
  check(picked != nullptr, "flash3.fwd_fp8_sm90: no FP8 kernel for head dim (", d, ", ", d_v,
        ") or larger in this build of sim_driver");
  const flash3::FwdLauncher launch = picked->launch;
  const flash3::TileShape tile = flash3::fwd_fp8_tile_shape(picked->head_dim, picked->head_dim_v);
  std::fprintf(stderr, "sim_driver: kernel e4m3 d=%d d_v=%d (block_n %d)\n", picked->head_dim, picked->head_dim_v,
               tile.block_n);

  if (b == 0 || h == 0 || s_q == 0 || total_q == 0) return;
  if (s_k == 0 || total_k == 0) {
    fill(out, 0.f);
    fill(lse, -std::numeric_limits<float>::infinity());
    return;
  }
  check_tma_layout(q, "q");
  check_tma_layout(k, "k");
  check_tma_layout(vt, "vt");
  check_tma_layout(out, "out");
  check(lse.stride(-1) == 1 || lse.size(-1) <= 1, "flash3.fwd_fp8_sm90: lse must have a contiguous last dimension");

  flash3::FwdParams p;
  p.fp8.q = fp8_descale(q_descale, "q_descale", b, h, s_q, q_block, 64);
  p.fp8.k = fp8_descale(k_descale, "k_descale", b, h_k, s_k, kv_block, tile.block_n);
  p.fp8.v = fp8_descale(v_descale, "v_descale", b, h_k, s_k, kv_block, tile.block_n);
  if (v_channel_descale != nullptr) {
    const Tensor& vc = *v_channel_descale;
    check(vc.dtype == DType::f32, "flash3.fwd_fp8_sm90: v_channel_descale must be float32");
    check_shape(vc, "v_channel_descale", {b, h_k, d_v});
    p.fp8.v_channel = flash3::Descale{static_cast<const float*>(vc.data_ptr()), vc.stride(0), vc.stride(1),
                                      vc.stride(2), static_cast<int>(d_v)};
  }
  set_q_k_out(p, q, k, out, lse, cu_seqlens_q, cu_seqlens_k, b, s_q, s_k);
  to_int(cols, "vt columns");
  p.v = vt.data_ptr();
  p.v_batch_stride = varlen ? 0 : tma_stride(vt, 0);
  p.v_head_stride = tma_stride(vt, qdim - 3);
  p.v_row_stride = tma_stride(vt, qdim - 2);
  p.is_bf16 = true;
  set_mask_and_launch(p, launch, dev, softmax_scale, softcap, causal, window_left, window_right,
                      "flash3.fwd_fp8_sm90", nullptr);
}

// ---- csrc/decode_binding.cpp append_kv_sm90_cuda -------------------------------------------------
// (at::assert_no_overlap / assert_no_internal_overlap: every case tensor is its own allocation.)

void check_append_rows(const Tensor& t, const char* name, const Tensor& q, int64_t dim0, int64_t dim2, int64_t dim3,
                       bool fp8 = false) {
  const DType dtype = fp8 ? DType::e4m3 : q.dtype;
  check(t.dtype == dtype, "flash3.append_kv_sm90: ", name, " must have dtype ", dtype_str(dtype), ", got ",
        dtype_str(t.dtype));
  check(t.dim() == 4 && (dim0 < 0 || t.size(0) == dim0) && t.size(2) == dim2 && t.size(3) == dim3,
        "flash3.append_kv_sm90: ", name, " has shape ", shape_str(t.sizes), ", expected (", dim0, ", *, ", dim2,
        ", ", dim3, ")");
  check(t.stride(3) == 1 || t.size(3) == 1, "flash3.append_kv_sm90: ", name, " must have a contiguous last dimension");
}

void append_kv_sm90(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& k, const Tensor& v,
                    const Tensor& cache_seqlens, const Tensor* page_table, const Tensor* rotary_cos,
                    const Tensor* rotary_sin, bool rotary_interleaved, bool q_per_token, const Tensor& q_out,
                    const Tensor* k_descale, const Tensor* v_descale) {
  check(q.dtype == DType::bf16 || q.dtype == DType::fp16, "flash3.append_kv_sm90: q must be bfloat16 or float16, got ",
        dtype_str(q.dtype));
  const int64_t b = q.size(0), s_q = q.size(1), h = q.size(2), d = q.size(3);
  const int64_t h_k = k_cache.size(2), d_v = v_cache.size(3), s_new = k.size(1);
  check_append_rows(q, "q", q, b, h, d);
  check_append_rows(q_out, "q_out", q, b, h, d);
  check(q_out.size(1) == s_q, "flash3.append_kv_sm90: q_out must have q's shape");
  const bool fp8 = k_cache.dtype == DType::e4m3;
  check_append_rows(k_cache, "k_cache", q, -1, h_k, d, fp8);
  check_append_rows(v_cache, "v_cache", q, k_cache.size(0), h_k, d_v, fp8);
  check((k_descale != nullptr) == fp8 && (v_descale != nullptr) == fp8,
        "flash3.append_kv_sm90: k_descale and v_descale go with (and only with) a float8_e4m3fn cache");
  if (fp8)
    for (const Tensor* t : {k_descale, v_descale})
      check(t->dtype == DType::f32 && t->dim() == 2 && t->size(0) == k_cache.size(0) && t->size(1) == h_k,
            "flash3.append_kv_sm90: descales must be float32 (", k_cache.size(0), ", ", h_k, "), got ",
            dtype_str(t->dtype), " ", shape_str(t->sizes));
  check(v_cache.size(1) == k_cache.size(1), "flash3.append_kv_sm90: v_cache must match k_cache");
  check_append_rows(k, "k", q, b, h_k, d);
  check_append_rows(v, "v", q, b, h_k, d_v);
  check(v.size(1) == s_new, "flash3.append_kv_sm90: v must have k's number of tokens");
  check(cache_seqlens.dtype == DType::i32 && cache_seqlens.dim() == 1 && cache_seqlens.size(0) == b &&
            (cache_seqlens.stride(0) == 1 || b <= 1),
        "flash3.append_kv_sm90: cache_seqlens must be a contiguous int32 (", b, ",) tensor");

  flash3::AppendKvParams p{};
  p.k = k.data_ptr(), p.v = v.data_ptr();
  p.k_batch_stride = k.stride(0), p.k_row_stride = k.stride(1), p.k_head_stride = k.stride(2);
  p.v_batch_stride = v.stride(0), p.v_row_stride = v.stride(1), p.v_head_stride = v.stride(2);
  p.k_cache = k_cache.data_ptr(), p.v_cache = v_cache.data_ptr();
  p.kc_batch_stride = k_cache.stride(0), p.kc_row_stride = k_cache.stride(1);
  p.kc_head_stride = k_cache.stride(2);
  p.vc_batch_stride = v_cache.stride(0), p.vc_row_stride = v_cache.stride(1);
  p.vc_head_stride = v_cache.stride(2);
  p.q = q.data_ptr(), p.q_out = q_out.data_ptr();
  p.q_batch_stride = q.stride(0), p.q_row_stride = q.stride(1), p.q_head_stride = q.stride(2);
  p.qo_batch_stride = q_out.stride(0), p.qo_row_stride = q_out.stride(1);
  p.qo_head_stride = q_out.stride(2);
  p.cache_seqlens = static_cast<const int32_t*>(cache_seqlens.data_ptr());
  if (page_table != nullptr) {
    const Tensor& pt = *page_table;
    check(pt.dtype == DType::i32 && pt.dim() == 2 && pt.size(0) == b && (pt.stride(1) == 1 || pt.size(1) == 1),
          "flash3.append_kv_sm90: page_table must be int32 (", b, ", max_pages) with contiguous rows");
    p.page_table = static_cast<const int32_t*>(pt.data_ptr());
    p.page_table_stride = pt.stride(0);
    p.max_pages = to_int(pt.size(1), "page_table.size(1)");
    p.num_pages = k_cache.size(0);
  } else {
    check(k_cache.size(0) == b, "flash3.append_kv_sm90: k_cache must have batch ", b);
  }
  p.page_size = to_int(k_cache.size(1), "k_cache.size(1)");
  check(int64_t(p.max_pages) * p.page_size <= std::numeric_limits<int32_t>::max(),
        "flash3.append_kv_sm90: page_table addresses more than 2^31 keys per row");
  check((rotary_cos != nullptr) == (rotary_sin != nullptr), "flash3.append_kv_sm90: rotary_cos and rotary_sin go together");
  if (rotary_cos != nullptr) {
    const Tensor &c = *rotary_cos, &s = *rotary_sin;
    for (const Tensor* t : {&c, &s})
      check(t->dtype == DType::f32 && t->dim() == 2 && t->stride(1) == 1 && t->stride(0) == t->size(1) &&
                t->sizes == c.sizes && t->size(0) >= 1 && 2 * t->size(1) <= d,
            "flash3.append_kv_sm90: rotary tables must be contiguous float32 "
            "(seqlen_ro >= 1, rotary_dim / 2) with rotary_dim <= ", d, ", same shape");
    p.rotary_cos = static_cast<const float*>(c.data_ptr()), p.rotary_sin = static_cast<const float*>(s.data_ptr());
    p.seqlen_ro = to_int(c.size(0), "rotary_cos.size(0)");
    p.rotary_dim = to_int(2 * c.size(1), "rotary_dim");
  }
  p.rotary_interleaved = rotary_interleaved;
  p.q_per_token = q_per_token;
  p.batch = to_int(b, "batch"), p.s_new = to_int(s_new, "k.size(1)");
  p.s_q = to_int(s_q, "q.size(1)");
  p.h = to_int(h, "q.size(2)"), p.h_k = to_int(h_k, "k_cache.size(2)");
  p.d = to_int(d, "q.size(3)"), p.d_v = to_int(d_v, "v_cache.size(3)");
  p.is_bf16 = q.dtype == DType::bf16;
  if (fp8) {
    p.k_descale = static_cast<const float*>(k_descale->data_ptr());
    p.v_descale = static_cast<const float*>(v_descale->data_ptr());
    p.kd_slab_stride = k_descale->stride(0), p.kd_head_stride = k_descale->stride(1);
    p.vd_slab_stride = v_descale->stride(0), p.vd_head_stride = v_descale->stride(1);
  }
  std::fprintf(stderr, "sim_driver: flash3.append_kv_sm90 b=%d s_new=%d s_q=%d h=%d h_k=%d d=%d d_v=%d paged=%d "
               "page_size=%d rotary_dim=%d interleaved=%d per_token=%d fp8=%d\n", p.batch, p.s_new, p.s_q, p.h, p.h_k,
               p.d, p.d_v, int(p.page_table != nullptr), p.page_size, p.rotary_dim, int(p.rotary_interleaved),
               int(p.q_per_token), int(fp8));
  const int err = flash3::run_append_kv(p, nullptr);
  check(err == 0, "flash3.append_kv_sm90: launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// ---- csrc/kvcache_binding.cpp fwd_kvcache_sm90_cuda ----------------------------------------------

void fwd_kvcache_sm90(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                      const Tensor& lse, const Tensor& seqused_k, const Tensor* page_table, double softmax_scale,
                      bool causal, int64_t window_left, int64_t window_right, double softcap, int64_t num_splits,
                      const Tensor* k_descale, const Tensor* v_descale, const Tensor* sinks,
                      const Tensor* cu_seqlens_q, int64_t max_seqlen_q, const DeviceInfo& dev,
                      const Tensor* alibi_slopes = nullptr) {
  constexpr const char* kOp = "flash3.fwd_kvcache_sm90";
  check(dev.major == 9 && dev.minor == 0, kOp, " needs an sm_90 (Hopper) GPU; it is sm_", dev.major, dev.minor);
  const DType dtype = q.dtype;
  check(dtype == DType::bf16 || dtype == DType::fp16, kOp, ": q must be bfloat16 or float16, got ", dtype_str(dtype));
  check(out.dtype == dtype, kOp, ": out must have q's dtype ", dtype_str(dtype));
  const bool fp8_cache = k_cache.dtype == DType::e4m3;
  check(fp8_cache ? v_cache.dtype == DType::e4m3 : k_cache.dtype == dtype && v_cache.dtype == dtype, kOp,
        ": k_cache and v_cache must both have q's dtype ", dtype_str(dtype), " or both be float8_e4m3fn, got ",
        dtype_str(k_cache.dtype), " and ", dtype_str(v_cache.dtype));
  check((k_descale != nullptr) == fp8_cache && (v_descale != nullptr) == fp8_cache, kOp,
        fp8_cache ? ": an FP8 cache needs k_descale and v_descale" : ": descales go with an FP8 cache only");
  check(lse.dtype == DType::f32, kOp, ": lse must be float32");
  const bool is_bf16 = dtype == DType::bf16;
  const bool varlen_q = cu_seqlens_q != nullptr;
  const int64_t q_dims = varlen_q ? 3 : 4;  // varlen: q/out (total_q, h, ·)
  for (auto [t, name] : {std::make_pair(&q, "q"), std::make_pair(&out, "out")})
    check(t->dim() == q_dims, kOp, ": ", name, " must be ", q_dims, "-D", varlen_q ? " with cu_seqlens_q" : "",
          ", got ", shape_str(t->sizes));
  for (auto [t, name] : {std::make_pair(&k_cache, "k_cache"), std::make_pair(&v_cache, "v_cache")})
    check(t->dim() == 4, kOp, ": ", name, " must be 4-D, got ", shape_str(t->sizes));
  if (varlen_q) {
    const Tensor& cu = *cu_seqlens_q;
    check(cu.dtype == DType::i32, kOp, ": cu_seqlens_q must be int32, got ", dtype_str(cu.dtype));
    check(cu.dim() == 1 && cu.size(0) >= 1 && (cu.stride(0) == 1 || cu.size(0) <= 1), kOp,
          ": cu_seqlens_q must be a contiguous (batch + 1,) vector, got ", shape_str(cu.sizes));
    check(max_seqlen_q >= 0, kOp, ": max_seqlen_q must be >= 0, got ", max_seqlen_q);
  } else {
    check(max_seqlen_q == 0, kOp, ": max_seqlen_q goes with cu_seqlens_q");
  }
  const int64_t b = varlen_q ? cu_seqlens_q->size(0) - 1 : q.size(0);
  const int64_t s_q = varlen_q ? max_seqlen_q : q.size(1), total_q = varlen_q ? q.size(0) : b * s_q;
  const int64_t h = q.size(-2), d = q.size(-1);
  const int64_t slabs = k_cache.size(0), slab_rows = k_cache.size(1), h_k = k_cache.size(2);
  const int64_t d_v = v_cache.size(3);
  check_shape(k_cache, "k_cache", {slabs, slab_rows, h_k, d});
  check_shape(v_cache, "v_cache", {slabs, slab_rows, h_k, d_v});
  if (varlen_q) {
    check_shape(out, "out", {total_q, h, d_v});
    check_shape(lse, "lse", {h, total_q});
  } else {
    check_shape(out, "out", {b, s_q, h, d_v});
    check_shape(lse, "lse", {b, h, s_q});
  }
  check_seqlens(&seqused_k, "seqused_k", b);
  check(h_k > 0 && h % h_k == 0, kOp, ": the number of query heads (", h,
        ") must be a multiple of the number of kv heads (", h_k, ")");
  check(d % 8 == 0 && d_v % 8 == 0 && d > 0 && d_v > 0 && d <= 256 && d_v <= 256, kOp,
        ": head dims must be multiples of 8 in [8, 256], got d=", d, " d_v=", d_v);
  check(softcap >= 0.0, kOp, ": softcap must be >= 0 (0 = off)");
  check(softmax_scale > 0.0 && std::isfinite(softmax_scale), kOp, ": softmax_scale must be finite and > 0");
  check(window_left >= -1 && window_right >= -1, kOp, ": window sizes must be >= -1");
  check(num_splits >= 0, kOp, ": num_splits must be >= 0 (0 = automatic)");
  const float* sinks_ptr = check_sinks(sinks, h, kOp);
  int64_t capacity = slab_rows;
  if (page_table != nullptr) {
    const Tensor& pt = *page_table;
    check(pt.dtype == DType::i32 && pt.dim() == 2 && pt.size(0) == b && (pt.stride(1) == 1 || pt.size(1) == 1), kOp,
          ": page_table must be int32 (", b, ", max_pages) with contiguous rows");
    capacity = pt.size(1) * slab_rows;
  } else {
    check(slabs == b, kOp, ": a cache without page_table must have batch ", b, " rows, got ", slabs);
  }
  check(capacity <= (int64_t(1) << 30), kOp, ": more than 2^30 keys per row");
  check(s_q * (h / h_k) <= (int64_t(1) << 30), kOp, ": s_q * (h / h_k) must be <= 2^30");
  if (fp8_cache)
    for (auto [t, name] : {std::make_pair(k_descale, "k_descale"), std::make_pair(v_descale, "v_descale")})
      check(t->dtype == DType::f32 && t->dim() == 2 && t->size(0) == slabs && t->size(1) == h_k, kOp, ": ", name,
            " must be float32 (", slabs, ", ", h_k, "), got ", dtype_str(t->dtype), " ", shape_str(t->sizes));
  const flash3::FwdKernelEntry* entry =
      flash3::pick_fwd_kernel(flash3::fwd_decode_kernels(fp8_cache), is_bf16, int(d), int(d_v), false);
  check(entry != nullptr, kOp, ": no ", dtype_name(is_bf16), fp8_cache ? " FP8-cache" : "",
        " decode kernel for head dim (", d, ", ", d_v, ") or larger in this build of sim_driver");
  std::fprintf(stderr, "sim_driver: kernel decode %s%s d=%d d_v=%d\n", dtype_name(entry->is_bf16),
               fp8_cache ? " kve4m3" : "", entry->head_dim, entry->head_dim_v);
  if (total_q == 0 || h == 0) return;
  if (varlen_q) {  // rows of no sequence are never visited by a tile
    fill(out, 0.f);
    fill(lse, -std::numeric_limits<float>::infinity());
  }
  if (b == 0 || s_q == 0) return;
  if (slabs == 0 || slab_rows == 0 || capacity == 0) {
    fill(out, 0.f);
    fill_empty_lse(lse, sinks, varlen_q ? 0 : 1);
    if (varlen_q && sinks != nullptr) {  // rows of no sequence: -inf (the binding's masked_fill_)
      int end = 0;
      ck(cudaMemcpy(&end, static_cast<const int*>(cu_seqlens_q->data_ptr()) + b, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      const float ninf = -std::numeric_limits<float>::infinity();
      for (int64_t head = 0; head < h; ++head)
        for (int64_t r = std::max<int64_t>(end, 0); r < total_q; ++r)
          ck(cudaMemcpy(static_cast<float*>(lse.data_ptr()) + head * lse.strides[0] + r * lse.strides[1], &ninf, 4,
                        cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    return;
  }
  check_tma_layout(q, "q", kOp);
  check_tma_layout(k_cache, "k_cache", kOp);
  check_tma_layout(v_cache, "v_cache", kOp);
  check_tma_layout(out, "out", kOp);
  check(lse.stride(-1) == 1 || lse.size(-1) <= 1, kOp, ": lse must have a contiguous last dimension");

  flash3::FwdParams p;
  set_q_k_out(p, q, k_cache, out, lse, nullptr, nullptr, b, s_q, capacity);
  if (varlen_q) {  // packed q/out rows (no batch stride), lse (h, total_q)
    p.q_batch_stride = 0, p.q_row_stride = tma_stride(q, 0), p.q_head_stride = tma_stride(q, 1);
    p.o_batch_stride = 0, p.o_row_stride = tma_stride(out, 0), p.o_head_stride = tma_stride(out, 1);
    p.lse_batch_stride = 0, p.lse_head_stride = lse.stride(0);
    p.total_q = to_int(total_q, "total_q");
    p.cu_seqlens_q = static_cast<const int*>(cu_seqlens_q->data_ptr());
  }
  p.v = v_cache.data_ptr();
  p.v_batch_stride = tma_stride(v_cache, 0);
  p.v_row_stride = tma_stride(v_cache, 1);
  p.v_head_stride = tma_stride(v_cache, 2);
  p.seqused_k = static_cast<const int*>(seqused_k.data_ptr());
  p.slab_rows = to_int(slab_rows, "slab_rows");
  p.num_slabs = to_int(slabs, "num_slabs");
  if (page_table != nullptr) {
    p.page_table = static_cast<const int*>(page_table->data_ptr());
    p.page_table_stride = page_table->stride(0);
  }
  p.is_bf16 = is_bf16;
  p.sinks = sinks_ptr;
  p.alibi_slopes = check_alibi(alibi_slopes, b, h, kOp, &p.alibi_batch_stride);
  if (fp8_cache) {
    auto descale = [](const Tensor& t) {
      flash3::Descale ds;
      ds.ptr = static_cast<const float*>(t.data_ptr());
      ds.batch_stride = t.stride(0), ds.head_stride = t.stride(1);
      return ds;
    };
    p.k_cache_descale = descale(*k_descale);
    p.v_cache_descale = descale(*v_descale);
  }
  const flash3::TileShape tile = flash3::decode_tile_shape(entry->head_dim, entry->head_dim_v, fp8_cache);
  const int tiles = flash3::decode::decode_tiles(int(b), int(s_q), int(h), int(h_k), tile.block_m);
  const int n_blocks = int(flash3::decode::ceil_div64(capacity, tile.block_n));
  p.num_splits = flash3::decode::resolve_num_splits(int(num_splits), tiles, dev.num_sms, n_blocks);
  if (p.num_splits > 1) {  // at::empty: uninitialized (simrun --uninit fills it with 0xFF)
    void *o = nullptr, *l = nullptr;
    const size_t rows = varlen_q ? size_t(total_q) : size_t(b) * s_q;  // varlen: by packed row
    ck(cudaMalloc(&o, size_t(p.num_splits) * rows * h * d_v * 4), "cudaMalloc");
    ck(cudaMalloc(&l, size_t(p.num_splits) * h * rows * 4), "cudaMalloc");
    if (varlen_q) {  // at::full(-inf): rows of no sequence
      std::vector<float> inf(size_t(p.num_splits) * h * rows, -std::numeric_limits<float>::infinity());
      ck(cudaMemcpy(l, inf.data(), inf.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    g_scratch.push_back(o);
    g_scratch.push_back(l);
    p.o_partial = static_cast<float*>(o);
    p.lse_partial = static_cast<float*>(l);
  }
  std::fprintf(stderr, "sim_driver: %s block_n=%d capacity=%lld paged=%d slab_rows=%d num_splits=%d (asked %lld)\n",
               kOp, tile.block_n, (long long)capacity, int(page_table != nullptr), p.slab_rows, p.num_splits,
               (long long)num_splits);
  set_mask_and_launch(p, entry->launch, dev, softmax_scale, softcap, causal, window_left, window_right, kOp,
                      dtype_name(is_bf16));
  if (p.num_splits > 1) {
    flash3::CombineParams cp{};
    cp.o_partial = p.o_partial;
    cp.lse_partial = p.lse_partial;
    cp.out = out.data_ptr();
    cp.o_batch_stride = out.stride(0), cp.o_row_stride = out.stride(1), cp.o_head_stride = out.stride(2);
    cp.lse = static_cast<float*>(lse.data_ptr());
    cp.lse_batch_stride = lse.stride(0), cp.lse_head_stride = lse.stride(1);
    cp.num_splits = p.num_splits;
    cp.batch = p.batch, cp.seqlen_q = p.seqlen_q, cp.num_heads = p.num_heads, cp.head_dim_v = p.head_dim_v;
    if (varlen_q) {  // the packed layout is the batched one with b = 1, s_q = total_q
      cp.o_batch_stride = 0, cp.o_row_stride = out.stride(0), cp.o_head_stride = out.stride(1);
      cp.lse_batch_stride = 0, cp.lse_head_stride = lse.stride(0);
      cp.batch = 1, cp.seqlen_q = p.total_q;
      cp.seq_end = p.cu_seqlens_q + b;  // rows after the last sequence keep out 0, lse -inf
    }
    cp.is_bf16 = is_bf16;
    cp.sinks = sinks_ptr;
    const int err = flash3::run_combine(cp, nullptr);
    check(err == 0, kOp, ": combine launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(err)));
  }
}

// flash3/ops.py attention_kvcache's kernel path: the fused append (when the case has new keys),
// then the decode kernel on q_out (rotary) or q.
void kvcache_step(const Case& c, const DeviceInfo& dev) {
  const Tensor &q = c.t("q"), &k_cache = c.t("k_cache"), &v_cache = c.t("v_cache");
  const Tensor* page_table = c.opt("page_table");
  const Tensor *k_descale = c.opt("k_descale"), *v_descale = c.opt("v_descale");
  const Tensor* q_att = &q;
  if (c.opt("k") != nullptr) {
    const Tensor* q_out = c.opt("q_out");
    append_kv_sm90(q, k_cache, v_cache, c.t("k"), c.t("v"), c.t("cache_seqlens"), page_table, c.opt("rotary_cos"),
                   c.opt("rotary_sin"), c.integer("rotary_interleaved") != 0, c.integer("q_per_token") != 0,
                   q_out ? *q_out : q, k_descale, v_descale);
    if (q_out != nullptr) q_att = q_out;
  }
  fwd_kvcache_sm90(*q_att, k_cache, v_cache, c.t("out"), c.t("lse"), c.t("seqused_k"), page_table,
                   c.num("softmax_scale"), c.integer("causal") != 0, c.integer("window_left"),
                   c.integer("window_right"), c.num("softcap"), c.integer("num_splits"), k_descale, v_descale,
                   c.opt("sinks"), c.opt("cu_seqlens_q"), c.has("max_seqlen_q") ? c.integer("max_seqlen_q") : 0,
                   dev, c.opt("alibi_slopes"));
}

// kernel_info()'s "fwd", "fwd_fp8", "decode" and "decode_fp8_cache" lists, as binding.cpp prints them.
std::string fwd_info() {
  std::string s;
  char buf[64];
  auto out = [&](const char* fmt, auto... a) { std::snprintf(buf, sizeof buf, fmt, a...); s += buf; };
  std::vector<std::tuple<int, int, int>> entries;
  for (const flash3::FwdKernelEntry& e : flash3::fwd_kernels())
    entries.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());
  out("\"fwd\": [");
  for (size_t i = 0; i < entries.size(); ++i)
    out("%s[\"%s\", %d, %d]", i ? ", " : "", std::get<0>(entries[i]) == 0 ? "bf16" : "fp16",
        std::get<1>(entries[i]), std::get<2>(entries[i]));
  std::vector<std::pair<int, int>> fp8;
  for (const flash3::FwdKernelEntry& e : flash3::fwd_fp8_kernels()) fp8.emplace_back(e.head_dim, e.head_dim_v);
  std::sort(fp8.begin(), fp8.end());
  fp8.erase(std::unique(fp8.begin(), fp8.end()), fp8.end());
  out("], \"fwd_fp8\": [");
  for (size_t i = 0; i < fp8.size(); ++i) out("%s[%d, %d]", i ? ", " : "", fp8[i].first, fp8[i].second);
  for (bool fp8_cache : {false, true}) {
    std::vector<std::tuple<int, int, int>> dec;
    for (const flash3::FwdKernelEntry& e : flash3::fwd_decode_kernels(fp8_cache))
      dec.emplace_back(e.is_bf16 ? 0 : 1, e.head_dim, e.head_dim_v);
    std::sort(dec.begin(), dec.end());
    dec.erase(std::unique(dec.begin(), dec.end()), dec.end());
    out("], \"%s\": [", fp8_cache ? "decode_fp8_cache" : "decode");
    for (size_t i = 0; i < dec.size(); ++i)
      out("%s[\"%s\", %d, %d]", i ? ", " : "", std::get<0>(dec[i]) == 0 ? "bf16" : "fp16",
          std::get<1>(dec[i]), std::get<2>(dec[i]));
  }
  out("]");
  return s;
}

const RegisterOp reg_fwd{{"fwd", fwd_sm90, {"out", "lse"}, fwd_info}};
const RegisterOp reg_fwd_fp8{{"fwd_fp8", fwd_fp8_sm90, {"out", "lse"}}};
const RegisterOp reg_kvcache{{"kvcache", kvcache_step, {"out", "lse", "k_cache", "v_cache", "q_out"}}};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && !std::strcmp(argv[1], "--info")) {
    std::string s = "{";
    for (const Op& op : ops())
      if (op.info) s += op.info() + ", ";
    std::printf("%s\"arch\": \"sm_90a\", \"backend\": \"hopper_sim\"}\n", s.c_str());
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: sim_driver --info | sim_driver CASE_DIR\n");
    return 2;
  }
  const Case c = load_case(argv[1]);
  const Op* op = nullptr;
  for (const Op& o : ops())
    if (c.op == o.name) op = &o;
  if (op == nullptr) fatal("unknown op '" + c.op + "'");
  const DeviceInfo dev = device_info();
  try {
    op->run(c, dev);
  } catch (const Refused& e) {
    std::fprintf(stderr, "sim_driver: error: %s\n", e.what());
    return 3;
  }
  ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  // no_outputs 1: a timing case (tools/perf_model.py), whose outputs nobody reads
  const bool write_outputs = c.scalars.count("no_outputs") == 0 || c.integer("no_outputs") == 0;
  for (const char* n : write_outputs ? op->outputs : std::vector<const char*>{}) {
    if (c.opt(n) == nullptr) continue;  // an optional output (q_out: only with rotary)
    const Tensor& t = c.t(n);
    std::vector<char> host(t.bytes);
    if (t.bytes) ck(cudaMemcpy(host.data(), t.ptr, t.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    write_file(c.dir + "/" + n + ".out.bin", host.data(), host.size());
  }
  for (auto& [name, t] : c.tensors) ck(cudaFree(t.ptr), "cudaFree");
  for (void* p : g_scratch) ck(cudaFree(p), "cudaFree");
  return 0;
}
