// Exposes csrc/flash3/decode/split_heuristic.h to tests/test_split_heuristic.py: one query per
// line on stdin, one answer line per query. Built with the host C++ compiler, no CUDA needed.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "flash3/decode/split_heuristic.h"

using namespace flash3::decode;

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "splits") {  // tiles num_sms n_blocks max_splits
      int tiles, sms, nb, mx;
      in >> tiles >> sms >> nb >> mx;
      std::printf("%d\n", num_splits_heuristic(tiles, sms, nb, mx));
    } else if (cmd == "resolve") {  // num_splits tiles num_sms n_blocks
      int ns, tiles, sms, nb;
      in >> ns >> tiles >> sms >> nb;
      std::printf("%d\n", resolve_num_splits(ns, tiles, sms, nb));
    } else if (cmd == "tiles") {  // batch s_q h h_k block_m
      int b, sq, h, hk, bm;
      in >> b >> sq >> h >> hk >> bm;
      std::printf("%d\n", decode_tiles(b, sq, h, hk, bm));
    } else if (cmd == "ranges") {  // num_splits n_keys block_n
      int ns, n, bn;
      in >> ns >> n >> bn;
      for (int s = 0; s < ns; ++s) {
        const KeyRange r = split_key_range(s, ns, n, bn);
        std::printf("%d %d;", r.begin, r.end);
      }
      std::printf("\n");
    } else if (cmd == "page") {  // pos page_size num_pages max_pages table...
      long long pos, num_pages;
      int ps, mp;
      in >> pos >> ps >> num_pages >> mp;
      std::vector<int32_t> row(mp > 0 ? mp : 1);
      for (int i = 0; i < mp; ++i) in >> row[i];
      const PageSlot s = page_slot(pos, ps, mp, num_pages, row.data());
      if (s.page < 0) std::printf("skip\n");
      else std::printf("%lld %d\n", static_cast<long long>(s.page), s.offset);
    } else {
      std::printf("unknown %s\n", cmd.c_str());
    }
  }
  return 0;
}
