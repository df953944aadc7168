#!/usr/bin/env bash
# The whole of a short lease in ONE device call (15 minutes of device time, a machine start
# included, leave room for about 600 s of command): stage 1 of tools/device/device_check.sh (correctness:
# smoke matrix, memcheck; no hang-diagnosis build) and stage 3 (benchmarks) on the build stage 1
# made, after FA3's own forward timed on the same GPU (our benchmark peer, built HERE from a
# flash-attention checkout, copied to .carry/fa3/:
#   FA3_SRC=... python tools/fa3_peer/build.py --hdim 128 --cudart static --out .carry/fa3).
# Budgets: FA3 timing starts no run after 30 s (15 s each; SESSION_FA3=0 skips it); SESSION_S1
# (default 290 s, of which SESSION_AFTER_SMOKE, default 100 s, is kept after the smoke matrix);
# SESSION_S2 (default 0: stage 2, the GPU pytest files, runs between 1 and 3 when set); SESSION_S3
# (220 s). Each stage's budget is cut to what is left of SESSION_DEADLINE (default 570 s from the
# start: a 600 s call still ends with its tarball written).
# A stage 1 whose extension did not build skips the rest (stage 3 would fail the same way).
# SESSION_PROFILE=1 adds tools/device/device_profile.sh (Nsight Compute on FA3 and flash3, at most
# SESSION_PROFILE_S = 200 s; lower the stage budgets to fit).
# SESSION_H2H (default on with an FA3 binary carried): tools/device/head_to_head.py after stage 1.
# SESSION_CUTLASS (default on with .carry/cutlass/ carried): CUTLASS's GEMM examples timed after FA3.
# Under $OUT: s1_summary.txt, [head_to_head.txt,] [s2_summary.txt,] s3_summary.txt, fa3.txt,
# [cutlass.txt, cutlass_gemms.json,] [profile.txt,] session.tgz (every file).
#
#   device tool: command `bash tools/device/device_session.sh`, carry [".whl", ".carry"], timeout_s 600
set -uo pipefail
cd "$(dirname "$0")/../.."
FINAL=${OUT:-build/device-session}
mkdir -p "$FINAL" && FINAL=$(cd "$FINAL" && pwd)
BUILD=${DEVICE_CHECK_BUILD:-$PWD/build}  # device_check.sh's own (tests point it elsewhere)
S=$BUILD/device-session-files
rm -rf "$S" && mkdir -p "$S/s1" "$S/s3"
T0=$(date +%s)
DEADLINE=${SESSION_DEADLINE:-570}
# budget CAP: CAP, or what is left of the deadline if less.
budget() { local l=$(( DEADLINE - ($(date +%s) - T0) )); l=$(( l < $1 ? l : $1 )); echo $(( l > 1 ? l : 1 )); }

# FA3 timed on the FA3 paper's setup (16k tokens, hidden 2048: h = 2048 / d), 30 timed launches
# each: the bf16 forward at d 128 over s 2k/8k/16k, then any other carried FA3 binary (forward at
# another head dim, e4m3 forward, backward; tools/fa3_peer/build.py --cudart static --out
# .carry/fa3) at s 8k; no run starts after SESSION_FA3_S (default 30 s).
FA3_S=${SESSION_FA3_S:-30}
fa3_time() {  # BINARY S D CAUSAL [deterministic, for the backward]
  local bin=$1 s=$2 d=$3 c=$4
  [ $(( $(date +%s) - T0 )) -lt "$FA3_S" ] || { echo "fa3 $(basename "$bin") s=$s causal=$c: not run ($FA3_S s used)"; return; }
  case $bin in
    *bwd*) timeout 20 "$bin" $((16384 / s)) $s $((2048 / d)) $d $c 0 132 0 20 2>&1 | tail -2 ;;
    *) timeout 15 "$bin" $((16384 / s)) $s $((2048 / d)) $d $c 2 132 30 2>&1 | tail -2 ;;
  esac || echo "fa3 $(basename "$bin") s=$s causal=$c: exit ${PIPESTATUS[0]}"
}
FA3=$(ls .carry/fa3/fa3_fwd_hdim128-* 2>/dev/null | head -1)
[ "${SESSION_FA3:-1}" = 0 ] && FA3=  # already measured in this lease
if [ -n "$FA3" ]; then
  for causal in 0 1; do
    for s in 2048 8192 16384; do fa3_time "$FA3" $s 128 $causal; done
  done > "$FINAL/fa3.txt"
  for bin in $(ls .carry/fa3/fa3_* 2>/dev/null | grep -v -e '\.o$' -e '^.carry/fa3/fa3_fwd_hdim128-'); do
    d=$(sed -E 's/.*hdim([0-9]+).*/\1/' <<< "$bin")
    for causal in 0 1; do fa3_time "$bin" 8192 "$d" $causal; done
  done >> "$FINAL/fa3.txt"
else
  echo "FA3 not timed (SESSION_FA3=0, or no .carry/fa3/fa3_fwd_hdim128-* carried)" > "$FINAL/fa3.txt"
fi
echo "fa3: done after $(( $(date +%s) - T0 )) s" >> "$S/session.log"

# CUTLASS's GEMM examples 48/49/54 (the timing model's validation GEMMs) at 4096^3 and 8192^3, when
# carried (built here by `python tools/hopper_sim/cutlass_device_build.py`, into .carry/cutlass/): 48 by
# its own timer, 49 and 54 by Nsight Compute (tools/device/cutlass_gemms.py); at most
# SESSION_CUTLASS_S (default 90 s); SESSION_CUTLASS=0 skips it.
if ls .carry/cutlass/48 >/dev/null 2>&1 && [ "${SESSION_CUTLASS:-1}" != 0 ]; then
  "${PYTHON:-python3}" tools/device/cutlass_gemms.py --dir .carry/cutlass --out "$FINAL/cutlass_gemms.json" \
    --budget "$(budget ${SESSION_CUTLASS_S:-90})" > "$FINAL/cutlass.txt" 2>&1
  echo "cutlass: exit $? after $(( $(date +%s) - T0 )) s" >> "$S/session.log"
fi

OUT=$S/s1 STAGE=1 DEVICE_CHECK_BUDGET=$(budget ${SESSION_S1:-290}) DEVICE_CHECK_AFTER_SMOKE=${SESSION_AFTER_SMOKE:-100} \
  DEVICE_CHECK_SANITIZERS=memcheck DEVICE_CHECK_HANG_BUILD=0 bash tools/device/device_check.sh > "$S/s1.out" 2>&1
echo "stage 1: exit $? after $(( $(date +%s) - T0 )) s" >> "$S/session.log"
cp "$S/s1/summary.txt" "$FINAL/s1_summary.txt" 2>/dev/null || tail -40 "$S/s1.out" > "$FINAL/s1_summary.txt"

BUILT=; grep -q "^build	ok" "$BUILD/device-check-work/steps.tsv" 2>/dev/null && BUILT=1

# FA3 and flash3's forward timed the same way in turns (tools/device/head_to_head.py: one launch
# between two events, FA3's driver's method, with the SM clock read before each run), on stage 1's
# build; SESSION_H2H_S (default 60 s) caps it, SESSION_H2H=0 skips it.
if [ -n "$BUILT" ] && [ -n "$FA3" ] && [ "${SESSION_H2H:-1}" != 0 ]; then
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout "$(budget ${SESSION_H2H_S:-60})" "${PYTHON:-python3}" \
    tools/device/head_to_head.py --fa3 "$FA3" --json "$S/head_to_head.json" > "$FINAL/head_to_head.txt" 2>&1
  echo "head to head: exit $? after $(( $(date +%s) - T0 )) s" >> "$S/session.log"
fi
if [ -n "$BUILT" ] && [ "${SESSION_S2:-0}" -gt 0 ]; then
  mkdir -p "$S/s2"
  OUT=$S/s2 STAGE=2 DEVICE_CHECK_BUDGET=$(budget $SESSION_S2) bash tools/device/device_check.sh > "$S/s2.out" 2>&1
  echo "stage 2: exit $? after $(( $(date +%s) - T0 )) s" >> "$S/session.log"
  cp "$S/s2/summary.txt" "$FINAL/s2_summary.txt" 2>/dev/null || tail -40 "$S/s2.out" > "$FINAL/s2_summary.txt"
fi

if [ -n "$BUILT" ]; then
  OUT=$S/s3 STAGE=3 DEVICE_CHECK_BUDGET=$(budget ${SESSION_S3:-220}) bash tools/device/device_check.sh > "$S/s3.out" 2>&1
  echo "stage 3: exit $? after $(( $(date +%s) - T0 )) s" >> "$S/session.log"
  cp "$S/s3/summary.txt" "$FINAL/s3_summary.txt" 2>/dev/null || tail -40 "$S/s3.out" > "$FINAL/s3_summary.txt"
else
  echo "stage 3: skipped (stage 1's build did not succeed)" >> "$S/session.log"
fi

# SESSION_PROFILE=1: Nsight Compute on FA3's and flash3's d 128 forward (tools/device/device_profile.sh)
# after the stages, on stage 1's build.
if [ "${SESSION_PROFILE:-0}" = 1 ]; then
  mkdir -p "$S/profile"
  timeout "$(budget ${SESSION_PROFILE_S:-200})" bash tools/device/device_profile.sh "$S/profile" > "$FINAL/profile.txt" 2>&1
  echo "profile: exit $? after $(( $(date +%s) - T0 )) s" >> "$S/session.log"
fi

tar czf "$FINAL/session.tgz" -C "$S" . 2>/dev/null
for f in s1_summary.txt head_to_head.txt s2_summary.txt s3_summary.txt fa3.txt cutlass.txt profile.txt; do
  [ -f "$FINAL/$f" ] && { echo "##### $f"; cat "$FINAL/$f"; }
done
cat "$S/session.log"
