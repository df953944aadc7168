#!/usr/bin/env bash
# flash3's bf16 d=128 forward kernel under the Hopper simulator against an fp64 reference, no torch.
#
#   tools/hopper_sim/flash3/run_fwd.sh [--quick] [--seeds "1 2"] [--sms "4 2 1"] [--schedules N]
#
# Builds (make -C tools/hopper_sim lib, make -C tools/hopper_sim/flash3; the two kernel TUs are
# compiled once and cached in tools/hopper_sim/build/flash3), then for each binary (the plain
# 128 x 128 kernel alone; plain + wide 128 x 176 as a full build dispatches), each SM count and
# seed runs every case under simrun (strict checks on; --uninit), checks out/lse against the fp64
# reference with the FlashAttention rule of tests/helpers.py, checks that out/lse are bitwise the
# same in every run of a binary, and runs two negative controls that must FAIL.
# Exit status 0 only if everything passed.
set -u
HERE="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
SIM="$HERE/.."
BUILD="$SIM/build/flash3"
seeds="1 2" sms_list="4 2 1" schedules=1 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --seeds) seeds="$2"; shift 2 ;;
    --sms) sms_list="$2"; shift 2 ;;
    --schedules) schedules="$2"; shift 2 ;;
    *) echo "usage: $0 [--quick] [--seeds \"1 2\"] [--sms \"4 2 1\"] [--schedules N]" >&2; exit 2 ;;
  esac
done

make -s -C "$SIM" lib || exit 1
make -s -C "$HERE" || exit 1

# b,h,h_k,s_q,s_k,causal[,seqused_k]
CASES=(
  1,2,2,192,192,0  1,2,2,256,256,0  1,2,2,200,200,0            # full: 2 query tiles, partial tail
  1,2,2,256,256,1  1,2,2,200,200,1                              # causal s_q = s_k
  1,2,2,200,328,1  1,2,2,256,384,1                              # causal s_q < s_k
  1,2,2,328,200,1  1,2,2,300,200,1                              # causal s_q > s_k: empty rows/tiles
  2,4,2,200,264,0  2,4,1,136,300,1                              # GQA, MQA, batch 2
  2,2,2,200,300,0,250  2,2,1,192,300,1,10                       # seqused_k (NaN past it; 0 keys)
  1,2,2,1,1,0  1,2,2,17,40,1  1,1,1,64,1000,0                   # tiny, many key blocks
)
[ "$quick" = 1 ] && CASES=(1,2,2,256,256,0 1,2,2,200,200,0 1,2,2,200,328,1 1,2,2,328,200,1) && seeds="1" sms_list="4"

fail=0
declare -A bits
for bin in fwd_driver fwd_driver_wide; do
  for sms in $sms_list; do
    for seed in $seeds; do
      log="$BUILD/run_${bin}_sms${sms}_seed${seed}.log"
      start=$(date +%s.%N)
      "$SIM/simrun" --sms "$sms" --seed "$seed" --schedules "$schedules" --uninit "$BUILD/$bin" --seed "$seed" \
        "${CASES[@]}" > "$log" 2>&1
      rc=$?
      secs=$(echo "$(date +%s.%N) - $start" | bc)
      npass=$(grep -c -- '-> PASS' "$log")
      printf '%-16s sms %s seed %s: rc %s, %s/%s cases PASS, %.1f s  (%s)\n' "$bin" "$sms" "$seed" "$rc" "$npass" \
        "${#CASES[@]}" "$secs" "$log"
      [ "$rc" = 0 ] || { fail=1; grep -E 'hopper_sim:|FAIL|error' "$log" | head -5; }
      # Bitwise agreement across SM counts and seeds (the input seed is the driver's --seed; group by it).
      while read -r c h; do
        key="$bin/$seed/$c"
        if [ -n "${bits[$key]:-}" ] && [ "${bits[$key]}" != "$h" ]; then
          echo "  NOT BITWISE EQUAL: $key: ${bits[$key]} vs $h (sms $sms)"; fail=1
        fi
        bits[$key]="$h"
      done < <(sed -nE 's/^case (.*): out .* bits ([0-9a-f]+) -> .*/\1 \2/p' "$log" | tr ' ' '_' | sed -E 's/_([0-9a-f]{16})$/ \1/')
    done
  done
done
# Summary of errors against the bound (last run of each binary).
for bin in fwd_driver fwd_driver_wide; do
  echo "== $bin (last run): out max|err| / bound, lse max|err| / bound"
  ls -t "$BUILD"/run_${bin}_sms*.log | head -1 | xargs sed -nE \
    's/^case (.*): out max\|err\| ([^ ]+) \(bound ([^ ]+) .* lse max\|err\| ([^ ]+) \(bound ([^)]+)\).* -> (.*)$/  \1: out \2 \/ \3, lse \4 \/ \5 \6/p'
done

# Negative controls: the checker must see unwritten outputs and a wrong mask.
for ctl in --skip-launch --flip-ref; do
  "$SIM/simrun" --sms 4 "$BUILD/fwd_driver" "$ctl" 1,2,2,200,328,1 1,2,2,256,256,0 > "$BUILD/control$ctl.log" 2>&1
  if [ $? = 1 ] && [ "$(grep -c -- '-> FAIL' "$BUILD/control$ctl.log")" = 2 ]; then
    echo "negative control $ctl: FAIL as it must"
  else
    echo "negative control $ctl: did NOT fail: the checker is broken"; fail=1
  fi
done
[ "$fail" = 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL"
exit "$fail"
