// Exposes csrc/flash3/common/attn_logic.h and tma_check.h to tests/test_host_logic.py: reads one query per line on
// stdin, prints one answer line per query. Built with the host C++ compiler, no CUDA needed.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "flash3/common/attn_logic.h"
#include "flash3/common/tma_check.h"
#include "flash3/common/total_rows.h"
#include "flash3/fwd/api.h"

using namespace flash3;

// The mask of a query line: "seqlen_q seqlen_k causal left right", or with a chunk appended as
// "...right cN" (attention_chunk N; the "c" keeps it apart from the command's own numbers).
Mask read_mask(std::istream& in) {
  int sq, sk, causal, left, right, chunk = 0;
  in >> sq >> sk >> causal >> left >> right;
  if ((in >> std::ws).peek() == 'c') {
    in.get();
    in >> chunk;
  }
  return Mask::make(sq, sk, causal != 0, left, right, chunk);
}

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "ranges") {  // seqlen_q seqlen_k causal left right block_m block_n
      const Mask mask = read_mask(in);
      int bm, bn;
      in >> bm >> bn;
      for (int m = 0; m < ceil_div(mask.seqlen_q, bm); ++m) {
        const BlockRange r = key_block_range(mask, m, bm, bn);
        const BlockRange u = unmasked_key_block_range(mask, m, bm, bn);
        std::printf("%d %d %d %d;", r.begin, r.end, u.begin, u.end);
      }
      std::printf("\n");
    } else if (cmd == "decode_ranges") {  // seqlen_q seqlen_k causal left right block_m block_n g splits
      const Mask mask = read_mask(in);
      int bm, bn, g, splits;
      in >> bm >> bn >> g >> splits;
      for (int m = 0; m < ceil_div(mask.seqlen_q * g, bm); ++m)
        for (int s = 0; s < splits; ++s) {
          const DecodeRanges r = decode_block_ranges(mask, m, bm, bn, g, s, splits);
          // the chunk-free kernels' form (first_key/last_key) must give the same ranges
          const DecodeRanges o = decode_block_ranges<false>(mask, m, bm, bn, g, s, splits);
          const bool same = o.tokens.begin == r.tokens.begin && o.tokens.end == r.tokens.end &&
                            o.blocks.begin == r.blocks.begin && o.blocks.end == r.blocks.end &&
                            o.unmasked.begin == r.unmasked.begin && o.unmasked.end == r.unmasked.end;
          std::printf("%d %d %d %d %d %d%s;", r.tokens.begin, r.tokens.end, r.blocks.begin, r.blocks.end,
                      r.unmasked.begin, r.unmasked.end, same ? "" : " 999");
        }
      std::printf("\n");
    } else if (cmd == "row_keys") {  // seqlen_q seqlen_k causal left right -> per row: Mask::row_keys
      const Mask mask = read_mask(in);
      for (int i = 0; i < mask.seqlen_q; ++i) {
        const KeyRun run = mask.row_keys(i);
        std::printf("%s%d %d", i ? ";" : "", run.lo, run.hi);
      }
      std::printf("\n");
    } else if (cmd == "qranges") {  // seqlen_q seqlen_k causal left right block_m block_n
      const Mask mask = read_mask(in);
      int bm, bn;
      in >> bm >> bn;
      for (int n = 0; n < ceil_div(mask.seqlen_k, bn); ++n) {
        const BlockRange r = query_block_range(mask, n, bm, bn);
        const BlockRange u = unmasked_query_block_range(mask, n, bm, bn);
        std::printf("%d %d %d %d;", r.begin, r.end, u.begin, u.end);
      }
      std::printf("\n");
    } else if (cmd == "vt_offset") {  // first_key batch -> FP8 varlen Vt column
      long long first_key, batch;
      in >> first_key >> batch;
      std::printf("%lld\n", fp8_varlen_vt_offset(first_key, batch));
    } else if (cmd == "total_rows") {  // total varlen -> kernel_total_rows (-1: rejected)
      long long total;
      int varlen;
      in >> total >> varlen;
      std::printf("%lld\n", kernel_total_rows(total, varlen != 0));
    } else if (cmd == "padded_offset") {  // first_row batch align -> padded_seq_offset
      long long first_row, batch;
      int align;
      in >> first_row >> batch >> align;
      std::printf("%lld\n", padded_seq_offset(first_row, batch, align));
    } else if (cmd == "queries") {  // seqlen_q seqlen_k causal left right key_begin key_end
      const Mask mask = read_mask(in);
      int k0, k1;
      in >> k0 >> k1;
      for (int j = k0; j < k1; ++j) std::printf("%d %d;", mask.first_query(j), mask.last_query(j));
      std::printf("\n");
    } else if (cmd == "key_counts") {  // seqlen_q seqlen_k causal left right: Mask::key_count per row
      const Mask mask = read_mask(in);
      for (int i = 0; i < mask.seqlen_q; ++i) std::printf("%d;", mask.key_count(i));
      std::printf("\n");
    } else if (cmd == "bwd_ranges") {  // seqlen_q seqlen_k causal left right block_m block_n
      // Per query block: "begin end rank..." (key_block_range, bwd_dq_rank of each key block in
      // it); then "|" and per key block: "begin end" (query_block_range).
      const Mask mask = read_mask(in);
      int bm, bn;
      in >> bm >> bn;
      for (int m = 0; m < ceil_div(mask.seqlen_q, bm); ++m) {
        const BlockRange r = key_block_range(mask, m, bm, bn);
        std::printf("%d %d", r.begin, r.end);
        for (int n = r.begin; n < r.end; ++n) std::printf(" %d", bwd_dq_rank(mask, m, n, bm, bn));
        std::printf(";");
      }
      std::printf("|");
      for (int n = 0; n < ceil_div(mask.seqlen_k, bn); ++n) {
        const BlockRange r = query_block_range(mask, n, bm, bn);
        std::printf("%d %d;", r.begin, r.end);
      }
      std::printf("\n");
    } else if (cmd == "bwd_key_blocks") {  // n_blocks deterministic: bwd_key_block of every blockIdx.x
      int n, det;
      in >> n >> det;
      for (int x = 0; x < n; ++x) std::printf("%d ", bwd_key_block(x, n, det != 0));
      std::printf("\n");
    } else if (cmd == "bwd_tile_shape") {  // d d_v -> block_m block_n stages_q stages_do split_d smem
      int d, dv;
      in >> d >> dv;
      const BwdTileShape s = bwd_tile_shape(d, dv);
      std::printf("%d %d %d %d %d %d\n", s.block_m, s.block_n, s.stages_q, s.stages_do,
                  s.split_d ? 1 : 0, bwd_smem_bytes(d, dv));
    } else if (cmd == "visible") {  // seqlen_q seqlen_k causal left right
      const Mask mask = read_mask(in);
      for (int i = 0; i < mask.seqlen_q; ++i)
        for (int j = 0; j < mask.seqlen_k; ++j) std::putchar(mask.visible(i, j) ? '1' : '0');
      std::printf("\n");
    } else if (cmd == "row_bounds") {  // seqlen_q seqlen_k causal left right -> per row: key_floor last_key
      const Mask mask = read_mask(in);
      for (int i = 0; i < mask.seqlen_q; ++i) std::printf("%s%d %d", i ? ";" : "", mask.key_floor(i), mask.last_key(i + 1));
      std::printf("\n");
    } else if (cmd == "tiles" || cmd == "tile_pairs") {  // m_blocks heads batch seqlen_k d d_v heads_k l2 causal
      // (tile_pairs: the 2-CTA cluster numbering, TileOrder::at_pair_tile)
      int nm, h, b, sk, d, dv, hk, l2, causal;
      in >> nm >> h >> b >> sk >> d >> dv >> hk >> l2 >> causal;
      const TileOrder order = TileOrder::make(nm, h, b, sk, d, dv, hk, l2, causal != 0);
      std::printf("%d", order.heads_per_group);
      for (int t = 0; t < order.num_tiles(); ++t) {
        const TileCoord c = cmd == "tile_pairs" ? order.at_pair_tile(t) : order.at(t);
        std::printf(";%d %d %d", c.m_block, c.head, c.batch);
      }
      std::printf("\n");
    } else if (cmd == "tile_shape") {  // d d_v -> block_m block_n stages consumers smem v_stages own_o
      int d, dv;
      in >> d >> dv;
      const TileShape s = fwd_tile_shape(d, dv);
      std::printf("%d %d %d %d %d %d %d\n", s.block_m, s.block_n, s.stages, s.num_consumers, fwd_smem_bytes(d, dv),
                  fwd_v_stages(s, d, dv), int(fwd_own_o_buffer(s, d, dv)));
    } else if (cmd == "fp8_tile_shape") {  // d d_v variant (0 plain, 1 chunk, 2 fast) -> block_m block_n stages consumers
      int d, dv, variant;
      in >> d >> dv >> variant;
      const TileShape s = variant == 2 ? fwd_fp8_fast_tile_shape(d, dv)
                          : variant    ? fwd_fp8_chunk_tile_shape(d, dv)
                                       : fwd_fp8_tile_shape(d, dv);
      std::printf("%d %d %d %d\n", s.block_m, s.block_n, s.stages, s.num_consumers);
    } else if (cmd == "decode_tile_shape") {  // d d_v fp8_cache -> block_m block_n stages consumers smem
      int d, dv, fp8;
      in >> d >> dv >> fp8;
      const TileShape s = decode_tile_shape(d, dv, fp8 != 0);
      std::printf("%d %d %d %d %d\n", s.block_m, s.block_n, s.stages, s.num_consumers,
                  decode_smem_bytes(d, dv, s.block_n, fp8 != 0));
    } else if (cmd == "tma") {  // elem_bytes rank base_offset dims[rank] strides[rank] box[rank]
      int eb, rank;
      long long offset;
      in >> eb >> rank >> offset;
      int64_t dims[5] = {}, strides[5] = {};
      int box[5] = {};
      for (int i = 0; i < rank; ++i) in >> dims[i];
      for (int i = 0; i < rank; ++i) in >> strides[i];
      for (int i = 0; i < rank; ++i) in >> box[i];
      alignas(16) static char buffer[64];
      const std::string problem = tma_tensor_problem("t", buffer + offset, eb, rank, dims, strides, box);
      std::printf("%s\n", problem.empty() ? "ok" : problem.c_str());
    } else if (cmd == "pick") {  // is_bf16 d d_v [D DV ...] -> picked "D DV" or "none"
      int bf16, d, dv;
      in >> bf16 >> d >> dv;
      std::vector<FwdKernelEntry> entries;
      for (int kd, kdv; in >> kd >> kdv;) entries.push_back({true, kd, kdv, nullptr});
      for (auto& e : entries) e.is_bf16 = bf16 != 0;  // one dtype per query; the other never matches
      entries.push_back({bf16 == 0, 8, 8, nullptr});
      const FwdKernelEntry* e = pick_fwd_kernel(entries, bf16 != 0, d, dv);
      if (e == nullptr) std::printf("none\n");
      else std::printf("%d %d\n", e->head_dim, e->head_dim_v);
    } else {
      std::printf("error unknown command\n");
    }
    std::fflush(stdout);
  }
  return 0;
}
