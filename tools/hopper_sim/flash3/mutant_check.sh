#!/usr/bin/env bash
# Deliberately wrong kernels must be caught. Exit 0 only when every mutant is.
#  1. causal rows that see one key too many: a copy of csrc/ with Mask::last_key off by one
#     (csrc/flash3/common/attn_logic.h, which the kernels' masks and key-block ranges use) is built
#     for bf16 d 64 (FLASH3_SIM_CSRC) and its causal smoke case run in the simulator; it must come
#     out "wrong".
#  2. the deterministic backward bumping its dQ semaphore after cp.async.bulk.wait_group.read
#     (csrc/flash3/bwd/kernel.cuh, write_dq): the next CTA's reduction may start before this one's
#     has landed. The values usually come out right (the simulator lands the copy in time, or the
#     sum is exact); the simulator's global-async-order check must report it. Built for bf16 d 128,
#     its "determ" smoke case must end with that check (status "crash").
#  The simulator's object cache is keyed on the sources a TU includes, not on where the tree lives, so
#  a mutant compiles only the TUs its change reaches (the backward one for 2, the d 64 forward for 1,
#  3 and 4); the rest are compile-check's objects.
#  3. a consumer releasing its V stage (the empty-barrier arrive) before the wgmma.wait_group that
#     covers the P.V reading it (csrc/flash3/fwd/mainloop.cuh, step): the producer may refill the
#     stage under the in-flight wgmma. The values may still come out right; the simulator's
#     wgmma-operand-overwrite check must report it. Built for bf16 d 64 (one TU), its "full" smoke
#     case must end with that check (status "crash").
#  4. varlen O rows copied out of shared memory without the consumers' barrier after the stmatrix
#     that staged them (csrc/flash3/fwd/epilogue.cuh, the packed-rows branch): a thread reads rows
#     another warp writes. The values often come out right (the simulator may run every stmatrix
#     first); the simulator's shared-race check must report it. Built for bf16 d 192 (its O is still
#     staged in V's buffer; d <= 128 have O's own buffer and never take that branch), its "varlen"
#     smoke case must end with that check (status "crash").
#  5. not a kernel: a check added to the host layer (csrc/flash3/host/fwd.cpp, the code the torch
#     bindings run) must refuse the simulator's smoke case too (status "error" with its message),
#     proving that the smoke goes through the host layer rather than a copy of it. Only the driver's
#     host objects recompile.
#  6. a warp overwriting its O slab (kOwnOBuffer, csrc/flash3/fwd/epilogue.cuh store_warp_slab) before
#     its previous tile's TMA store has read it (lane 0's cp.async.bulk.wait_group.read removed). Built
#     for bf16 d 128 (the narrow tile, which has O's own buffer), its "causal" smoke case on one SM
#     (every CTA stores several tiles) must end with the async-inflight check.
#  MUTANT=causal|dq_read_wait|v_early_release|o_rows_unsynced|host_probe|o_slab_reuse runs only one. They
#  run four at a time (below).
set -uo pipefail
cd "$(dirname "$0")/../../.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
only=${MUTANT:-}
fail=0

# replace_once FILE OLD NEW: OLD must occur exactly once in FILE, and becomes NEW (else exit 1).
replace_once() {
  "$PY" - "$@" <<'PYEOF'
import sys
path, old, new = sys.argv[1:4]
s = open(path).read()
if s.count(old) != 1:
    sys.exit(1)
open(path, "w").write(s.replace(old, new))
PYEOF
}

mutant_causal() {
  cp -r csrc "$tmp/csrc"
  sed -i 's/row_end - 1 + offset() + right + 1)/row_end - 1 + offset() + right + 2)/' "$tmp/csrc/flash3/common/attn_logic.h"
  if cmp -s csrc/flash3/common/attn_logic.h "$tmp/csrc/flash3/common/attn_logic.h"; then
    echo "mutant_check: the mutation did not apply (attn_logic.h changed?)"; return 1
  fi
  FLASH3_SIM_CSRC="$tmp/csrc" FLASH3_HDIMS=64 FLASH3_DTYPES=bf16 "$PY" tools/smoke/smoke.py --backend sim \
    --cases bf16:64:64/causal --json "$tmp/smoke.json" > "$tmp/log" 2>&1
  local status
  status=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["cases"][0]["status"])' "$tmp/smoke.json" 2>/dev/null)
  if [ "$status" = wrong ]; then
    echo "mutant_check: causal rows seeing one key too many: caught ($(grep -m1 'bf16 64 causal: wrong' "$tmp/log" | sed 's/^ *//'))"
    return 0
  fi
  echo "mutant_check: the wrong kernel was NOT caught (status '$status'):"; tail -20 "$tmp/log"; return 1
}

# caught_by_check DIR HDIMS CASE CHECK WHAT [SMOKE ARGS...]: the bf16 smoke CASE, built from DIR/csrc, must end
# with the simulator's strict check CHECK (status "crash", detail "hopper_sim: CHECK: ...").
caught_by_check() {
  local dir=$1 hdims=$2 case_=$3 check=$4 what=$5 tag
  shift 5
  tag=$(basename "$dir")
  FLASH3_SIM_CSRC="$(pwd)/$dir/csrc" FLASH3_HDIMS=$hdims FLASH3_DTYPES=bf16 "$PY" tools/smoke/smoke.py --backend sim \
    --cases "$case_" --json "$tmp/$tag.json" "$@" > "$tmp/$tag.log" 2>&1
  local res
  res=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["cases"][0]; print(c["status"], c.get("detail", ""))' \
        "$tmp/$tag.json" 2>/dev/null)
  case "$res" in
    "crash hopper_sim: $check:"*)
      echo "mutant_check: $what: caught (${res:0:300})"; return 0 ;;
  esac
  echo "mutant_check: $what: NOT caught ('${res:0:300}'):"; tail -20 "$tmp/$tag.log"; return 1
}

mutant_dq_read_wait() {
  local dir=tools/hopper_sim/build/mutant_dq_read_wait
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc "$dir/csrc"
  local f="$dir/csrc/flash3/bwd/kernel.cuh"
  # the deterministic branch's full wait (the only such line that starts with the asm statement)
  sed -i 's/^\( *\)asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory");$/\1asm volatile("cp.async.bulk.wait_group.read 0;\\n" ::: "memory");/' "$f"
  if [ "$(diff csrc/flash3/bwd/kernel.cuh "$f" | grep -c '^>')" != 1 ]; then
    echo "mutant_check: the dQ semaphore mutation did not apply to exactly one line (bwd/kernel.cuh changed?)"; return 1
  fi
  caught_by_check "$dir" 128 bwd:bf16:128:128/determ global-async-order "dQ semaphore bumped after wait_group.read"
}

mutant_v_early_release() {
  local dir=tools/hopper_sim/build/mutant_v_early_release
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc "$dir/csrc"
  local release=$'    pipe_v.consumer_release(state_v);\n'
  local head=$'    pipe_k.consumer_release(state_k);\n    ++state_k;\n'
  local body=$'    // The exponentials of the first kPinCols columns run under the P.V; the wait for it follows\n'
  body+=$'    // them (pinned), the rest run after it, beside P\'s conversion (FwdTraits::kPinCols).\n'
  body+=$'    constexpr int kPinCols = Tr::kPinCols;\n    constexpr bool kSplit = kPinCols < Tr::kBlockN / 4;\n'
  body+=$'    softmax_block<kMask, false, kPinCols>(params, tSrS, tScS_rc, w, n, fr);\n    pin_before_wait<kSplit>(smem, fr);\n'
  body+=$'    warpgroup_wait<0>();  // P.V done: O and the P registers may be touched again\n'
  replace_once "$dir/csrc/flash3/fwd/mainloop.cuh" "$head$body$release" "$head$release$body" ||
    { echo "mutant_check: the V early-release mutation did not apply (mainloop.cuh step changed?)"; return 1; }
  caught_by_check "$dir" 64 bf16:64:64/full wgmma-operand-overwrite "V stage released before the P.V's wait"
}

mutant_o_rows_unsynced() {
  local dir=tools/hopper_sim/build/mutant_o_rows_unsynced
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc "$dir/csrc"
  replace_once "$dir/csrc/flash3/fwd/epilogue.cuh" $'    } else {\n      sync_consumers(w.index);\n      constexpr int kChunks' \
    $'    } else {\n      constexpr int kChunks' ||
    { echo "mutant_check: the O-rows mutation did not apply (epilogue.cuh changed?)"; return 1; }
  caught_by_check "$dir" 192x192 bf16:192:192/varlen shared-race "varlen O rows read before the consumers' barrier"
}

mutant_o_slab_reuse() {
  local dir=tools/hopper_sim/build/mutant_o_slab_reuse
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc "$dir/csrc"
  replace_once "$dir/csrc/flash3/fwd/epilogue.cuh" $'    if (lane == 0) tma_store_wait<0>();\n    __syncwarp();\n' \
    $'    __syncwarp();\n' ||
    { echo "mutant_check: the O-slab mutation did not apply (epilogue.cuh changed?)"; return 1; }
  caught_by_check "$dir" 128 bf16:128:128/causal async-inflight "O slab rewritten before its TMA store read it" --sms 1
}

mutant_host_probe() {
  local dir=tools/hopper_sim/build/mutant_host_probe
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc "$dir/csrc"
  local f="$dir/csrc/flash3/host/fwd.cpp"
  local anchor=$'  constexpr const char* kOp = "flash3.fwd_sm90";\n'
  replace_once "$f" "$anchor" "$anchor"$'  check(false, "host-layer probe: ", kOp);\n'
  if [ "$(diff csrc/flash3/host/fwd.cpp "$f" | grep -c '^>')" != 1 ]; then
    echo "mutant_check: the host-layer probe did not apply to exactly one line (host/fwd.cpp changed?)"; return 1
  fi
  FLASH3_SIM_CSRC="$(pwd)/$dir/csrc" FLASH3_HDIMS=64 FLASH3_DTYPES=bf16 "$PY" tools/smoke/smoke.py --backend sim \
    --cases bf16:64:64/full --json "$tmp/host_probe.json" > "$tmp/host_probe.log" 2>&1
  local res
  res=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["cases"][0]; print(c["status"], c.get("detail", ""))' \
        "$tmp/host_probe.json" 2>/dev/null)
  case "$res" in
    "error sim_driver: error: host-layer probe: flash3.fwd_sm90"*)
      echo "mutant_check: a check added to the host layer: seen by the simulator's smoke (${res:0:200})"; return 0 ;;
  esac
  echo "mutant_check: a check added to the host layer was NOT seen by the smoke ('${res:0:300}'):"
  tail -20 "$tmp/host_probe.log"; return 1
}

# The mutants run four at a time (each is mostly one nvcc of ~1 min and 2-4 GB, then a short
# simulation; they share no file but the object cache, whose writes are atomic; five kernel nvcc at
# once would crowd the memory), the next starting as one ends; their reports print in order afterwards.
mutants=(causal dq_read_wait v_early_release o_rows_unsynced o_slab_reuse host_probe)  # the longest first
running=0
for m in "${mutants[@]}"; do
  if [ -z "$only" ] || [ "$only" = "$m" ]; then
    if [ "$running" -ge 4 ]; then
      wait -n || fail=1
      running=$((running - 1))
    fi
    "mutant_$m" > "$tmp/report_$m" 2>&1 &
    running=$((running + 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || fail=1
  running=$((running - 1))
done
for m in "${mutants[@]}"; do
  [ -f "$tmp/report_$m" ] && cat "$tmp/report_$m"
done
exit $fail
