// Standalone driver for ONE flash3 forward kernel (bf16, d = d_v = 128) under the Hopper simulator
// (tools/hopper_sim/simrun), without torch. It links flash3's real host launch code
// (csrc/generated/fwd_bf16_hdim128_sm90.cu -> flash3::run_fwd, registered in fwd/registry.cpp)
// and fills flash3::FwdParams exactly as csrc/binding.cpp (fwd_sm90_cuda, set_q_k_out,
// set_mask_and_launch in binding_common.h) does for contiguous batched (b, s, h, d) tensors.
//
//   fwd_driver [--seed N] [--skip-launch|--flip-ref] CASE...
//      CASE = b,h,h_k,s_q,s_k,causal[,used]   e.g. 1,2,2,256,256,0
//      used: seqused_k = used - 13 * batch_row (K/V rows past it are NaN); --skip-launch and
//      --flip-ref are negative controls of the checker (they must FAIL).
//
// Per case: random N(0,1) bf16 q/k/v (fixed seed), NaN-poisoned out and lse, one launch, then
// out against an fp64 reference with the FlashAttention rule of tests/helpers.py (fa_tolerance:
// 2 * naive-bf16 error + 2 * no-op rounding + 8 eps(bf16)) and lse with tests/test_kernel_gpu.py's
// 1e-3 * (1 + max |lse|) and the same -inf pattern. Prints PASS/FAIL per case; exit 1 on any FAIL.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash3/fwd/api.h"
#include "flash3/fwd/params.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #x, __FILE__, __LINE__,             \
                   cudaGetErrorString(e_));                                                    \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

// bf16 <-> float, round to nearest even (as torch's .to(bfloat16)).
static uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
static float bf2f(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static double rbf(double x) { return bf2f(f2bf(float(x))); }  // round to bf16 (via fp32, as torch)

struct Case {
  int b, h, hk, sq, sk;
  bool causal;
  int used = -1;  // seqused_k of batch row bb: used - 13 * bb (clamped to [0, s_k]); -1 = none
};
static int used_k(const Case& c, int bb) {
  return c.used < 0 ? c.sk : std::max(0, std::min(c.sk, c.used - 13 * bb));
}

// Negative controls (the checker must report FAIL): skip the launch (out/lse stay NaN), or
// compare against the reference of the other causal flag.
static bool g_skip_launch = false, g_flip_ref = false;

// tests/helpers.py _mask: query i sees key j iff j <= i + s_k - s_q (causal, bottom-right), with
// s_k the keys used by the batch row (seqused_k; tests/test_kernel_gpu.py slices k[:, :n]).
static bool visible(const Case& c, int bb, int i, int j) {
  const int sk = used_k(c, bb);
  return j < sk && (c.causal == g_flip_ref || j <= i + sk - c.sq);
}

// tma_stride (binding_common.h) for a contiguous tensor: a size-1 dim gets a harmless stride.
static int64_t tma_stride(const std::vector<int64_t>& sizes, int dim) {
  std::vector<int64_t> st(sizes.size());
  int64_t s = 1;
  for (int d = int(sizes.size()) - 1; d >= 0; --d) { st[d] = s; s *= sizes[d]; }
  if (sizes[dim] > 1) return st[dim];
  const int64_t unit = 8;  // 16 bytes of 16-bit elements
  int64_t r = unit;
  for (int d = dim + 1; d < int(sizes.size()); ++d) r = std::max(r, st[d] * sizes[d]);
  return (r + unit - 1) / unit * unit;
}

static bool run_case(const Case& c, unsigned seed, int num_sms, int l2_bytes) {
  const int D = 128, DV = 128;
  const double scale = 1.0 / std::sqrt(double(D));
  const size_t nq = size_t(c.b) * c.sq * c.h * D, nk = size_t(c.b) * c.sk * c.hk * D,
               nv = size_t(c.b) * c.sk * c.hk * DV, no = size_t(c.b) * c.sq * c.h * DV,
               nl = size_t(c.b) * c.h * c.sq;
  std::mt19937 rng(seed * 1000003u + c.sq * 7 + c.sk + (c.causal ? 1 : 0));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> hq(nq), hk(nk), hv(nv);
  for (auto& x : hq) x = f2bf(nd(rng));
  for (auto& x : hk) x = f2bf(nd(rng));
  for (auto& x : hv) x = f2bf(nd(rng));
  if (c.used >= 0)  // rows past seqused_k: NaN garbage the kernel must never let reach O
    for (int bb = 0; bb < c.b; ++bb)
      for (int j = used_k(c, bb); j < c.sk; ++j) {
        for (int hh = 0; hh < c.hk; ++hh) {
          for (int d = 0; d < D; ++d) hk[((size_t(bb) * c.sk + j) * c.hk + hh) * D + d] = 0x7fc0;
          for (int d = 0; d < DV; ++d) hv[((size_t(bb) * c.sk + j) * c.hk + hh) * DV + d] = 0x7fc0;
        }
      }

  void *dq, *dk, *dv, *dout;
  float* dlse;
  int* dcounter = nullptr;
  int* dused = nullptr;
  CK(cudaMalloc(&dq, nq * 2));
  CK(cudaMalloc(&dk, nk * 2));
  CK(cudaMalloc(&dv, nv * 2));
  CK(cudaMalloc(&dout, no * 2));
  CK(cudaMalloc(&dlse, nl * 4));
  CK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv.data(), nv * 2, cudaMemcpyHostToDevice));
  {  // NaN poison (tests/test_kernel_gpu.py kernel_fwd)
    std::vector<uint16_t> po(no, 0x7fc0);
    std::vector<float> pl(nl, std::numeric_limits<float>::quiet_NaN());
    CK(cudaMemcpy(dout, po.data(), no * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlse, pl.data(), nl * 4, cudaMemcpyHostToDevice));
  }

  // FwdParams as binding.cpp fwd_sm90_cuda + set_q_k_out + set_mask_and_launch fill it.
  flash3::FwdParams p;
  const std::vector<int64_t> szq{c.b, c.sq, c.h, D}, szk{c.b, c.sk, c.hk, D}, szv{c.b, c.sk, c.hk, DV},
      szo{c.b, c.sq, c.h, DV};
  p.q = dq;
  p.k = dk;
  p.o = dout;
  p.lse = dlse;
  p.q_batch_stride = tma_stride(szq, 0), p.q_row_stride = tma_stride(szq, 1), p.q_head_stride = tma_stride(szq, 2);
  p.k_batch_stride = tma_stride(szk, 0), p.k_row_stride = tma_stride(szk, 1), p.k_head_stride = tma_stride(szk, 2);
  p.o_batch_stride = tma_stride(szo, 0), p.o_row_stride = tma_stride(szo, 1), p.o_head_stride = tma_stride(szo, 2);
  p.lse_batch_stride = int64_t(c.h) * c.sq;  // lse (b, h, s_q) contiguous: lse.stride(0), stride(1)
  p.lse_head_stride = c.sq;
  p.batch = c.b;
  p.seqlen_q = c.sq;
  p.seqlen_k = c.sk;
  p.num_heads = c.h;
  p.num_heads_k = c.hk;
  p.head_dim = D;
  p.head_dim_v = DV;
  p.total_q = c.b * c.sq;
  p.total_k = c.b * c.sk;
  p.v = dv;
  p.v_batch_stride = tma_stride(szv, 0), p.v_row_stride = tma_stride(szv, 1), p.v_head_stride = tma_stride(szv, 2);
  if (c.used >= 0) {
    std::vector<int> hu(c.b);
    for (int bb = 0; bb < c.b; ++bb) hu[bb] = used_k(c, bb);
    CK(cudaMalloc(&dused, 4 * c.b));
    CK(cudaMemcpy(dused, hu.data(), 4 * c.b, cudaMemcpyHostToDevice));
    p.seqused_k = dused;
  }
  p.is_bf16 = true;
  p.softmax_scale = float(scale);
  p.softcap = 0.f;
  p.is_causal = c.causal;
  p.window_left = -1;
  p.window_right = c.causal ? 0 : -1;
  p.num_sms = num_sms;
  p.l2_bytes = l2_bytes;
  if (flash3::fwd_uses_dynamic_scheduler(p)) {
    CK(cudaMalloc(&dcounter, 4));
    CK(cudaMemset(dcounter, 0, 4));
    p.tile_counter = dcounter;
  }
  // The binding asks for the wide tile on calls without a causal/local mask; only the plain
  // 128 x 128 kernel is linked here, and find_fwd_kernel falls back to it (api.h).
  const bool wide = !c.causal;
  flash3::FwdLauncher launch = flash3::find_fwd_kernel(true, D, DV, wide);
  if (!launch) {
    std::fprintf(stderr, "no bf16 d128 forward kernel registered\n");
    std::exit(2);
  }
  try {
    if (!g_skip_launch) launch(p, nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch failed: %s\n", e.what());
    std::exit(2);
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  std::vector<uint16_t> ho(no);
  std::vector<float> hl(nl);
  CK(cudaMemcpy(ho.data(), dout, no * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hl.data(), dlse, nl * 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(dq));
  CK(cudaFree(dk));
  CK(cudaFree(dv));
  CK(cudaFree(dout));
  CK(cudaFree(dlse));
  if (dcounter) CK(cudaFree(dcounter));
  if (dused) CK(cudaFree(dused));

  // FNV-1a of out's and lse's bits: runs that must agree bitwise (other seeds, SM counts) compare it.
  uint64_t hash = 1469598103934665603ull;
  auto mix = [&hash](const void* data, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) hash = (hash ^ b[i]) * 1099511628211ull;
  };
  mix(ho.data(), no * 2);
  mix(hl.data(), nl * 4);

  // References: fp64 oracle and the naive bf16 computation (tests/helpers.py attention_naive).
  double err = 0, naive_err = 0, noop = 0, lse_err = 0, lse_max = 0;
  size_t nan_out = 0, nan_lse = 0, inf_mismatch = 0;
  int worst_b = -1, worst_h = -1, worst_i = -1, worst_d = -1;
  double worst_got = 0, worst_ref = 0;
  const int g = c.h / c.hk;
  std::vector<double> s(c.sk), s16(c.sk), ref(DV), nref(DV);
  for (int bb = 0; bb < c.b; ++bb)
    for (int hh = 0; hh < c.h; ++hh)
      for (int i = 0; i < c.sq; ++i) {
        const int kh = hh / g;
        const uint16_t* qr = &hq[((size_t(bb) * c.sq + i) * c.h + hh) * D];
        double m = -INFINITY, m16 = -INFINITY;
        for (int j = 0; j < c.sk; ++j) {
          const uint16_t* kr = &hk[((size_t(bb) * c.sk + j) * c.hk + kh) * D];
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += double(bf2f(qr[d])) * double(bf2f(kr[d]));
          s[j] = acc * scale;
          s16[j] = rbf(rbf(acc) * rbf(scale));  // bf16 einsum, then * scale in bf16
          if (visible(c, bb, i, j)) { m = std::max(m, s[j]); m16 = std::max(m16, s16[j]); }
        }
        double sum = 0, sum16 = 0;
        for (int j = 0; j < c.sk; ++j)
          if (visible(c, bb, i, j)) { sum += std::exp(s[j] - m); sum16 += std::exp(s16[j] - m16); }
        const bool empty = m == -INFINITY;
        const double rlse = empty ? -INFINITY : m + std::log(sum);
        std::fill(ref.begin(), ref.end(), 0.0);
        std::fill(nref.begin(), nref.end(), 0.0);
        if (!empty)
          for (int j = 0; j < c.sk; ++j) {
            if (!visible(c, bb, i, j)) continue;
            const double pj = std::exp(s[j] - m) / sum;
            const double pj16 = rbf(float(std::exp(s16[j] - m16) / sum16));  // fp32 softmax -> bf16
            const uint16_t* vr = &hv[((size_t(bb) * c.sk + j) * c.hk + kh) * DV];
            for (int d = 0; d < DV; ++d) {
              ref[d] += pj * double(bf2f(vr[d]));
              nref[d] += pj16 * double(bf2f(vr[d]));
            }
          }
        for (int d = 0; d < DV; ++d) {
          const double got = bf2f(ho[((size_t(bb) * c.sq + i) * c.h + hh) * DV + d]);
          if (std::isnan(got)) { ++nan_out; continue; }
          const double e = std::fabs(got - ref[d]);
          if (e > err) { err = e; worst_b = bb; worst_h = hh; worst_i = i; worst_d = d; worst_got = got; worst_ref = ref[d]; }
          naive_err = std::max(naive_err, std::fabs(rbf(nref[d]) - ref[d]));
          const double x = rbf(ref[d]);
          noop = std::max(noop, std::fabs(rbf(rbf(x + 0.3) - 0.3) - ref[d]));
        }
        const double gl = hl[(size_t(bb) * c.h + hh) * c.sq + i];
        if (std::isnan(gl)) { ++nan_lse; continue; }
        if (std::isinf(gl) != std::isinf(rlse) || (std::isinf(gl) && gl > 0)) { ++inf_mismatch; continue; }
        if (!std::isinf(rlse)) { lse_err = std::max(lse_err, std::fabs(gl - rlse)); lse_max = std::max(lse_max, std::fabs(rlse)); }
      }
  const double eps = 1.0 / 128;  // torch.finfo(bfloat16).eps
  const double tol = 2 * naive_err + 2 * noop + 8 * eps;
  const double tol_nofloor = 2 * naive_err + 2 * noop;
  const double lse_tol = 1e-3 * (1 + lse_max);
  const bool ok = nan_out == 0 && nan_lse == 0 && inf_mismatch == 0 && err <= tol && lse_err <= lse_tol;
  std::printf("case b=%d h=%d h_k=%d s_q=%d s_k=%d causal=%d used=%d: out max|err| %.3e (bound %.3e = 2*naive %.3e + 2*noop %.3e + 8eps; "
              "without the 8eps floor %.3e) at [b%d,i%d,h%d,d%d] got %.6f ref %.6f; NaN out %zu; "
              "lse max|err| %.3e (bound %.3e), NaN lse %zu, -inf mismatches %zu; bits %016llx -> %s\n",
              c.b, c.h, c.hk, c.sq, c.sk, int(c.causal), c.used, err, tol, naive_err, noop, tol_nofloor, worst_b, worst_i,
              worst_h, worst_d, worst_got, worst_ref, nan_out, lse_err, lse_tol, nan_lse, inf_mismatch,
              (unsigned long long)hash, ok ? "PASS" : "FAIL");
  std::fflush(stdout);
  return ok;
}

int main(int argc, char** argv) {
  unsigned seed = 0;
  std::vector<Case> cases;
  for (int a = 1; a < argc; ++a) {
    if (!std::strcmp(argv[a], "--seed") && a + 1 < argc) { seed = unsigned(std::atoi(argv[++a])); continue; }
    if (!std::strcmp(argv[a], "--skip-launch")) { g_skip_launch = true; continue; }
    if (!std::strcmp(argv[a], "--flip-ref")) { g_flip_ref = true; continue; }
    Case c;
    int causal = 0;
    const int got = std::sscanf(argv[a], "%d,%d,%d,%d,%d,%d,%d", &c.b, &c.h, &c.hk, &c.sq, &c.sk, &causal, &c.used);
    if (got != 6 && got != 7) {
      std::fprintf(stderr, "bad case '%s' (want b,h,h_k,s_q,s_k,causal[,seqused_k])\n", argv[a]);
      return 2;
    }
    c.causal = causal != 0;
    cases.push_back(c);
  }
  if (cases.empty()) cases = {{1, 2, 2, 256, 256, false}};
  // Device attributes as binding_common.h device_info queries them.
  int dev = 0, major = 0, minor = 0, sms = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  std::printf("device sm_%d%d, %d SMs, L2 %d bytes; seed %u\n", major, minor, sms, l2, seed);
  if (major != 9 || minor != 0) { std::fprintf(stderr, "needs sm_90\n"); return 2; }
  int fails = 0;
  for (const Case& c : cases) fails += run_case(c, seed, sms, l2) ? 0 : 1;
  std::printf("%s (%d of %zu cases failed)\n", fails ? "FAIL" : "ALL PASS", fails, cases.size());
  return fails ? 1 : 0;
}
