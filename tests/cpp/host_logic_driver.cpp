// Exposes csrc/flash3/common/attn_logic.h to tests/test_host_logic.py: reads one query per line on
// stdin, prints one answer line per query. Built with the host C++ compiler, no CUDA needed.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "flash3/common/attn_logic.h"

using namespace flash3;

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "ranges") {  // seqlen_q seqlen_k causal left right block_m block_n
      int sq, sk, causal, left, right, bm, bn;
      in >> sq >> sk >> causal >> left >> right >> bm >> bn;
      const Mask mask = Mask::make(sq, sk, causal != 0, left, right);
      for (int m = 0; m < ceil_div(sq, bm); ++m) {
        const BlockRange r = key_block_range(mask, m, bm, bn);
        const BlockRange u = unmasked_key_block_range(mask, m, bm, bn);
        std::printf("%d %d %d %d;", r.begin, r.end, u.begin, u.end);
      }
      std::printf("\n");
    } else if (cmd == "visible") {  // seqlen_q seqlen_k causal left right
      int sq, sk, causal, left, right;
      in >> sq >> sk >> causal >> left >> right;
      const Mask mask = Mask::make(sq, sk, causal != 0, left, right);
      for (int i = 0; i < sq; ++i)
        for (int j = 0; j < sk; ++j) std::putchar(mask.visible(i, j) ? '1' : '0');
      std::printf("\n");
    } else if (cmd == "tiles") {  // m_blocks heads batch seqlen_k d d_v heads_k l2 causal
      int nm, h, b, sk, d, dv, hk, l2, causal;
      in >> nm >> h >> b >> sk >> d >> dv >> hk >> l2 >> causal;
      const TileOrder order = TileOrder::make(nm, h, b, sk, d, dv, hk, l2, causal != 0);
      std::printf("%d", order.heads_per_group);
      for (int t = 0; t < order.num_tiles(); ++t) {
        const TileCoord c = order.at(t);
        std::printf(";%d %d %d", c.m_block, c.head, c.batch);
      }
      std::printf("\n");
    } else if (cmd == "tile_shape") {  // d d_v
      int d, dv;
      in >> d >> dv;
      const TileShape s = fwd_tile_shape(d, dv);
      std::printf("%d %d %d %d %d\n", s.block_m, s.block_n, s.stages, s.num_consumers,
                  fwd_smem_bytes(d, dv));
    } else {
      std::printf("error unknown command\n");
    }
    std::fflush(stdout);
  }
  return 0;
}
