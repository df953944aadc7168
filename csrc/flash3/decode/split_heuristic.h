// Host logic of the decoding (KV-cache) kernels: split-KV count, split key ranges, page
// addressing. Plain C++17 (no CUDA headers) so the host compiler can test it; the Python
// specification is flash3/decode_plan.py and tests/test_split_heuristic.py checks that both agree.
//
// Split-KV heuristic (num_splits = 0), all integer arithmetic:
//  1. tiles >= 0.8 * num_sms (tiles = batch * h_k * ceil(s_q * g / block_m), GQA packed):
//     the grid already fills the GPU, return 1.
//  2. Candidates s = 1 .. cap with cap = min(max_splits, 128, num_sms,
//     num_n_blocks / kMinBlocksPerSplit): each split keeps >= kMinBlocksPerSplit key blocks.
//  3. Skip redundant counts: ceil(n/s) == ceil(n/(s-1)) (same blocks per split as s-1). The
//     smallest s for a blocks-per-split value leaves no split empty.
//  4. Wave efficiency w / ceil(w), w = tiles * s / num_sms; return the smallest candidate
//     within 85% of the best (more splits cost partial-O traffic and a combine pass).
//
// Page addressing contract: key position pos of a row is page_table[row][pos / page_size] at
// offset pos % page_size; a position outside [0, max_pages * page_size) or a page id outside
// [0, num_pages) is never written (the append skips it) and never read outside the cache: the
// decode kernel reads such a key as zeros (in bounds; that row's result is then wrong).
#pragma once

#include <algorithm>
#include <cstdint>

namespace flash3 {
namespace decode {

constexpr int kMaxSplits = 128;
constexpr int kMinBlocksPerSplit = 2;

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int decode_tiles(int batch, int seqlen_q, int h, int h_k, int block_m) {
  const int g = h / h_k;
  return static_cast<int>(int64_t(batch) * h_k * ceil_div64(int64_t(seqlen_q) * g, block_m));
}

inline bool split_count_eligible(int s, int n_blocks) {
  return s == 1 || ceil_div64(n_blocks, s) != ceil_div64(n_blocks, s - 1);
}

inline int num_splits_heuristic(int total_tiles, int num_sms, int num_n_blocks,
                                int max_splits = kMaxSplits) {
  if (total_tiles <= 0 || num_sms <= 0 || num_n_blocks <= 0) return 1;
  if (int64_t(total_tiles) * 5 >= int64_t(num_sms) * 4) return 1;
  const int cap = std::min({max_splits, kMaxSplits, num_sms, num_n_blocks / kMinBlocksPerSplit});
  if (cap <= 1) return 1;
  int64_t best_work = total_tiles, best_waves = ceil_div64(total_tiles, num_sms);
  for (int s = 1; s <= cap; ++s) {
    if (!split_count_eligible(s, num_n_blocks)) continue;
    const int64_t work = int64_t(total_tiles) * s, waves = ceil_div64(work, num_sms);
    if (work * best_waves > best_work * waves) { best_work = work; best_waves = waves; }
  }
  for (int s = 1; s <= cap; ++s) {
    if (!split_count_eligible(s, num_n_blocks)) continue;
    const int64_t work = int64_t(total_tiles) * s, waves = ceil_div64(work, num_sms);
    if (100 * work * best_waves >= 85 * best_work * waves) return s;
  }
  return 1;
}

// num_splits as run: 0 = heuristic, else clamped to [1, min(128, num_n_blocks)].
inline int resolve_num_splits(int num_splits, int total_tiles, int num_sms, int num_n_blocks) {
  if (num_splits <= 0) return num_splits_heuristic(total_tiles, num_sms, num_n_blocks);
  return std::max(1, std::min({num_splits, kMaxSplits, std::max(num_n_blocks, 1)}));
}

struct KeyRange {
  int begin, end;
};

// Keys [begin, end) of split `split` of a row of n_keys keys (contiguous runs of
// ceil(n_blocks / num_splits) key blocks; a split past the end is empty at n_keys).
inline KeyRange split_key_range(int split, int num_splits, int n_keys, int block_n) {
  const int64_t n_blocks = ceil_div64(n_keys, block_n);
  const int64_t per = n_blocks ? ceil_div64(n_blocks, num_splits) : 0;
  const int64_t begin = std::min<int64_t>(int64_t(split) * per * block_n, n_keys);
  const int64_t end = std::min<int64_t>(int64_t(split + 1) * per * block_n, n_keys);
  return {static_cast<int>(begin), static_cast<int>(end)};
}

struct PageSlot {
  int64_t page;  // -1: skip this key
  int offset;
};

inline PageSlot page_slot(int64_t pos, int page_size, int max_pages, int64_t num_pages,
                          const int32_t* page_table_row) {
  if (pos < 0 || page_size <= 0 || pos >= int64_t(max_pages) * page_size) return {-1, 0};
  const int64_t page = page_table_row[pos / page_size];
  if (page < 0 || page >= num_pages) return {-1, 0};
  return {page, static_cast<int>(pos % page_size)};
}

}  // namespace decode
}  // namespace flash3
