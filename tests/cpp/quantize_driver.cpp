// Exposes csrc/flash3/fp8/quantize.h to tests/test_quantize_kernel.py: one query per line on
// stdin, one answer line per query. Built with the host C++ compiler, no CUDA needed.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>

#include "flash3/fp8/quantize.h"

using namespace flash3;

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "structure") {  // d -> m p
      int d, m, p;
      in >> d;
      quant_block_structure(d, &m, &p);
      std::printf("%d %d\n", m, p);
    } else if (cmd == "hartley") {  // m -> m*m floats as hex bit patterns
      int m;
      in >> m;
      float c[kQuantMaxHartley * kQuantMaxHartley];
      quant_hartley(m, c);
      for (int i = 0; i < m * m; ++i) {
        uint32_t u;
        std::memcpy(&u, &c[i], 4);
        std::printf("%08x ", u);
      }
      std::printf("\n");
    } else if (cmd == "plan") {
      // b s h d block_size layout hadamard x_addr stride_b stride_s stride_h ->
      // error | m p units chunks cache threads num_blocks s_pad smem vec scale_bits
      long long addr, sb, ss, sh;
      int b, s, h, d, bs, layout, had;
      in >> b >> s >> h >> d >> bs >> layout >> had >> addr >> sb >> ss >> sh;
      QuantizeParams p{};
      static const float dummy_signs[1] = {1.0f};
      p.x = reinterpret_cast<const void*>(static_cast<uintptr_t>(addr));
      p.x_batch_stride = sb, p.x_row_stride = ss, p.x_head_stride = sh;
      p.signs = had ? dummy_signs : nullptr;
      p.batch = b, p.seqlen = s, p.heads = h, p.d = d, p.block_size = bs, p.layout = layout;
      const QuantizePlan pl = plan_quantize(p);
      if (pl.error != nullptr) {
        std::printf("error %s\n", pl.error);
        continue;
      }
      uint32_t u;
      std::memcpy(&u, &pl.hadamard_scale, 4);
      std::printf("%d %d %d %d %d %d %d %lld %d %d %08x\n", pl.m, pl.p, pl.units_per_row,
                  pl.unit_chunks, pl.cache_iters, pl.threads, pl.num_blocks,
                  static_cast<long long>(pl.s_pad), pl.smem_bytes, pl.vec_loads ? 1 : 0, u);
    } else if (cmd == "vperm") {  // -> kVPerm16, vpack_token(i), vpack_position(j)
      for (int i = 0; i < 16; ++i) std::printf("%d ", kVPerm16[i]);
      std::printf("| ");
      for (int i = 0; i < 16; ++i) std::printf("%d ", vpack_token(i));
      std::printf("| ");
      for (int j = 0; j < 16; ++j) std::printf("%d ", vpack_position(j));
      std::printf("\n");
    } else if (cmd == "vpack") {  // b h c t heads d s_pad -> offset
      long long bi, hi, c, t, heads, d, sp;
      in >> bi >> hi >> c >> t >> heads >> d >> sp;
      std::printf("%lld\n", static_cast<long long>(vpack_offset(bi, hi, c, t, heads, d, sp)));
    } else if (cmd == "walk") {
      // ntok units_per_row threads tid -> n_iter valid_units last_tok last_chunk mismatches:
      // the kernel's loop over one thread's units (quant_unit_first/next, quant_iters); every
      // stepped position is checked against idx = it * threads + tid divided in 64 bits.
      int ntok, U, nt, tid;
      in >> ntok >> U >> nt >> tid;
      const int n_iter = quant_iters(ntok, U, nt);
      QuantUnitPos pos = quant_unit_first(tid, U);
      long long valid = 0, last_tok = -1, last_chunk = -1, bad = 0;
      for (int it = 0; it < n_iter; ++it) {
        const int64_t idx = int64_t(it) * nt + tid;
        if (pos.tok != idx / U || pos.chunk != idx % U) ++bad;
        if (pos.tok < ntok) ++valid, last_tok = pos.tok, last_chunk = pos.chunk;
        quant_unit_next(pos, nt / U, nt % U, U);
      }
      std::printf("%d %lld %lld %lld %lld\n", n_iter, valid, last_tok, last_chunk, bad);
    } else {
      std::printf("unknown %s\n", cmd.c_str());
    }
  }
  return 0;
}
