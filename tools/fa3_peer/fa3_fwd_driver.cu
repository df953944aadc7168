// Runs FlashAttention-3's own sm90 forward kernel (built from a flash-attention checkout, never
// copied here) on random bf16 inputs (e4m3 with -DFA3_FP8: q, k, v in FP8, descales of 1 per
// (batch, kv head), out bf16, as FA3's FP8 API call), for the Hopper simulator and its timing
// model: FA3 is our benchmark peer. The parameters are filled as FA3's hopper/flash_api.cpp fills
// them for a batched, non-varlen, non-paged, no-split call (read there, written here from
// scratch); no torch.
//
//   fa3_fwd_driver B S H D [causal 0|1] [check_rows N] [num_sm N] [time_iters N]
//
// time_iters > 0 (on a real GPU) times that many launches after 3 warm-ups with CUDA events, one
// pair per launch around the launch alone (the causal scheduler's tile counter is zeroed before
// each, outside the events, as FA3's flash_api zeroes it per call), and prints the median.
//
// check_rows > 0 compares that many query rows of every (batch, head) with an fp64 reference
// (exit 1 beyond bf16 tolerance); 0 skips the check (timing runs with CTAs sampled away leave most
// of O unwritten). The kernel instance comes from FA3's instantiation file for head dim D
// (flash_fwd_hdim<D>_bf16_sm90.cu, or _e4m3_ with FA3_FP8), linked beside this file by
// tools/fa3_peer/build.py.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#include <cutlass/numeric_types.h>

#include "flash.h"

#ifndef FA3_HDIM
#error "build.py defines FA3_HDIM (the head dim of the linked instantiation)"
#endif

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "fa3_fwd_driver: %s: %s\n", #x, cudaGetErrorString(e_)); std::exit(2); } } while (0)

namespace {

uint16_t to_bf16(float f) {   // round to nearest even
  uint32_t u; std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
uint8_t to_e4m3(float f) {   // round to nearest even, saturating at 448 (no NaN from finite input)
  const uint8_t sign = f < 0 ? 0x80 : 0;
  double a = std::fabs(double(f));
  if (a >= 464) return sign | 0x7E;   // 448 = 1.75 * 2^8; 464, a tie, rounds to even (448)
  int e = a > 0 ? int(std::floor(std::log2(a))) : -10;
  if (e < -6) e = -6;                  // subnormals: unit 2^-9
  const double unit = std::ldexp(1.0, e - 3);
  double m = std::nearbyint(a / unit);   // round half even (default rounding mode)
  if (m >= 16) { m /= 2; ++e; }
  if (m < 8) return sign | uint8_t(m);   // subnormal (e == -6)
  return sign | uint8_t(((e + 7) << 3) | (int(m) - 8));
}
double from_e4m3(uint8_t x) {
  const int e = (x >> 3) & 15, m = x & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return x & 0x80 ? -v : v;
}
double from_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4);
  return f;
}

struct Lcg {   // deterministic inputs, N(0,1) by Box-Muller
  uint64_t s;
  double uniform() { s = s * 6364136223846793005ull + 1442695040888963407ull; return ((s >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double normal() { return std::sqrt(-2 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s B S H D [causal] [check_rows] [num_sm] [time_iters]\n", argv[0]);
    return 2;
  }
  const int b = std::atoi(argv[1]), s = std::atoi(argv[2]), h = std::atoi(argv[3]), d = std::atoi(argv[4]);
  const bool causal = argc > 5 && std::atoi(argv[5]) != 0;
  const int check_rows = argc > 6 ? std::atoi(argv[6]) : 8;
  const int num_sm = argc > 7 ? std::atoi(argv[7]) : 132;
  const int time_iters = argc > 8 ? std::atoi(argv[8]) : 0;
  if (d != FA3_HDIM || b < 1 || s < 1 || h < 1) {
    std::fprintf(stderr, "fa3_fwd_driver: built for D=%d, got B=%d S=%d H=%d D=%d\n", FA3_HDIM, b, s, h, d);
    return 2;
  }
  const size_t n = size_t(b) * s * h * d;
#ifdef FA3_FP8
  using Element = cutlass::float_e4m3_t;
  using Raw = uint8_t;
  auto encode = to_e4m3;
  auto decode = from_e4m3;
#else
  using Element = cutlass::bfloat16_t;
  using Raw = uint16_t;
  auto encode = to_bf16;
  auto decode = from_bf16;
#endif
  std::vector<Raw> hq(n), hk(n), hv(n);
  Lcg rng{12345};
  for (auto* t : {&hq, &hk, &hv})
    for (auto& x : *t) x = encode(float(rng.normal()));

  void *q, *k, *v, *o, *lse;
  const size_t in_bytes = n * sizeof(Raw);
  CK(cudaMalloc(&q, in_bytes)); CK(cudaMalloc(&k, in_bytes)); CK(cudaMalloc(&v, in_bytes));
  CK(cudaMalloc(&o, n * 2)); CK(cudaMalloc(&lse, size_t(b) * h * s * 4));
  CK(cudaMemcpy(q, hq.data(), in_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, hk.data(), in_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(v, hv.data(), in_bytes, cudaMemcpyHostToDevice));
  CK(cudaMemset(o, 0xFF, n * 2));   // poison: NaN in bf16 (the output is bf16 for FP8 inputs too)

  // Layout (b, s, h, d), contiguous: strides in elements.
  Flash_fwd_params p;
  std::memset(&p, 0, sizeof(p));
#ifdef FA3_FP8
  p.is_e4m3 = true;   // flash_api: is_bf16 is the input's dtype; the FP8 kernel writes bf16
  // Descales of 1, one per (batch, kv head) as FA3's API takes them (loaded, as a real call's are).
  float* descale[3];
  std::vector<float> ones(size_t(b) * h, 1.f);
  for (auto*& dp : descale) {
    CK(cudaMalloc(&dp, ones.size() * 4));
    CK(cudaMemcpy(dp, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  }
  p.q_descale_ptr = descale[0]; p.k_descale_ptr = descale[1]; p.v_descale_ptr = descale[2];
  p.q_descale_batch_stride = p.k_descale_batch_stride = p.v_descale_batch_stride = h;
  p.q_descale_head_stride = p.k_descale_head_stride = p.v_descale_head_stride = 1;
#else
  p.is_bf16 = true;
#endif
  p.q_ptr = q; p.k_ptr = k; p.v_ptr = v; p.o_ptr = o;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = int64_t(h) * d;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.v_dim_stride = 1;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = int64_t(s) * h * d;
  p.softmax_lse_ptr = lse;
  p.b = p.b_k = b; p.h = p.h_k = h;
  p.seqlen_q = p.seqlen_k = s;
  p.seqlen_q_rounded = p.seqlen_k_rounded = (s + 127) / 128 * 128;
  p.d = p.dv = d;
  p.d_rounded = p.dv_rounded = d;   // 64/128/256 are their own rounding
  p.total_q = p.total_k = b * s;
  p.scale_softmax = float(1.0 / std::sqrt(double(d)));
  p.softcap = 0.f;
  p.p_dropout = 1.f; p.rp_dropout = 1.f; p.p_dropout_in_uint8_t = 255;
  // causal = window (-1, 0): flash_api turns the open sides into seqlen - 1
  p.is_causal = causal; p.is_local = false;
  p.window_size_left = s - 1; p.window_size_right = causal ? 0 : s - 1;
  p.attention_chunk = 0;
  p.arch = 90; p.num_sm = num_sm;
  p.num_splits = 1; p.pack_gqa = false;
  p.page_size = 1;   // no page table
  p.head_swizzle = causal; p.varlen_sort_batches = true;
  int* sem = nullptr;   // the dynamic (causal) scheduler's tile counter, zeroed
  if (causal) { CK(cudaMalloc(&sem, 16)); CK(cudaMemset(sem, 0, 16)); p.tile_count_semaphore = sem; }

  run_mha_fwd_<90, Element, FA3_HDIM, FA3_HDIM, false, false, false, false>(p, nullptr);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::printf("fa3_fwd_driver: b=%d s=%d h=%d d=%d causal=%d ran\n", b, s, h, d, int(causal));
  if (time_iters > 0) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int it = -3; it < time_iters; ++it) {
      if (sem) CK(cudaMemsetAsync(sem, 0, 16));
      CK(cudaEventRecord(e0));
      run_mha_fwd_<90, Element, FA3_HDIM, FA3_HDIM, false, false, false, false>(p, nullptr);
      CK(cudaEventRecord(e1));
      CK(cudaGetLastError());
      CK(cudaEventSynchronize(e1));
      float t = 0; CK(cudaEventElapsedTime(&t, e0, e1));
      if (it >= 0) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double flops = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
    std::printf("fa3_fwd_driver: time b=%d s=%d h=%d d=%d causal=%d median_ms=%.4f min_ms=%.4f tflops=%.1f iters=%d\n",
                b, s, h, d, int(causal), med, ms.front(), flops / (med * 1e-3) / 1e12, time_iters);
  }
  if (check_rows <= 0) return 0;

  std::vector<uint16_t> ho(n);
  CK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
  double max_err = 0;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> sc(s), acc(d);
  for (int bi = 0; bi < b; ++bi)
    for (int hi = 0; hi < h; ++hi)
      for (int r = 0; r < check_rows && r < s; ++r) {
        const int i = int((int64_t(r) * 7919 + bi * 31 + hi * 17) % s);   // spread over the tiles
        auto at = [&](const auto& t, int row, int c) {
          return decode(t[((size_t(bi) * s + row) * h + hi) * d + c]);
        };
        const int last = causal ? i : s - 1;
        double mx = -1e300;
        for (int j = 0; j <= last; ++j) {
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += at(hq, i, c) * at(hk, j, c);
          sc[j] = dot * scale; mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j <= last; ++j) {
          const double pj = std::exp(sc[j] - mx); sum += pj;
          for (int c = 0; c < d; ++c) acc[c] += pj * at(hv, j, c);
        }
        for (int c = 0; c < d; ++c) {
          const double got = from_bf16(ho[((size_t(bi) * s + i) * h + hi) * d + c]), want = acc[c] / sum;
          const double err = std::isnan(got) ? 1e30 : std::fabs(got - want);
          max_err = std::max(max_err, err);
        }
      }
  // bf16 output of values |O| < ~1: a few ulps of 2^-8 plus the kernel's bf16 P rounding (FP8: P
  // in e4m3, 3 mantissa bits, and FA3's truncating FP8 accumulation; the reference uses the same
  // e4m3 inputs)
#ifdef FA3_FP8
  const double tol = 6e-2;
#else
  const double tol = 2e-2;
#endif
  std::printf("fa3_fwd_driver: max |O - O_fp64| over %d rows per head = %.3g (tol %.3g)\n", check_rows, max_err, tol);
  return max_err <= tol ? 0 : 1;
}
