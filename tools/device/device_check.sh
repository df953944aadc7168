#!/usr/bin/env bash
# A lent H100/H200 in stages, each one call of at most 10 minutes and useful alone (STAGE=1|2|3,
# default 1; run stage 1 first). Each step runs under its own timeout, capped by what is left of
# DEVICE_CHECK_BUDGET (default 570 s; 20 s kept for the summary); a step with under 15 s left is
# "skipped (out of time)", never ok and never a failure of what it would have checked.
#
#   every stage  preflight  ninja, compute-sanitizer, nvcc: present or a clear message
#                kernels    the objects of `make device-prep` (.carry/kernels/release.tar.xz,
#                           checked against the sources: tools/build/prebuilt.py); stale or absent: compile
#                           FLASH3_HDIMS=64,128 FLASH3_DTYPES=bf16 here, heaviest first, 16 at once,
#                           and link whatever finished in time                          cap 300 s
#                build      setup.py build_ext --inplace, FLASH3_PREBUILT: only the torch-facing
#                           sources compile (ninja; incremental on a warm machine)     cap 200 s
#   1 core       smoke      tools/smoke/smoke.py: every built kernel x feature, decode rows included,
#                           8 isolated workers, 15 s per case                           cap 280 s
#                           meanwhile, in a copy of the tree, the hang-diagnosis extension
#                           (FLASH3_DEBUG_HANG=1, .carry/kernels/hang.tar.xz or compiled)
#                selftest   tools/build/debug_hang_selftest.cu: the debug build's waits work
#                hang       only if a case hung: rerun it (at most two) on the hang build; stuck
#                           warps print barrier, phase and tile, then trap
#                sanitize   memcheck, racecheck, synccheck on the first failing case, else on
#                           three small ok cases (tools/device/sanitize_small.py)           45 s each
#   2 tests      pytest     the GPU test files (a hung kernel's tests deselected when stage 1
#                           ran on this machine before), 60 s per test; ring_sanity
#   3 bench      bench_fwd, bench_fp8, bench_bwd, bench_decode (--quick): flash3 against SDPA
#                           cuDNN/flash and cuBLAS
# then tools/device/device_summary.py prints ONE summary table, last. Under $OUT (at most 6 files):
# summary.txt, results.json (every benchmark's rows too), device_check.log, smoke.json,
# pytest.log, sanitizer.log.
#
#   here:    make device-prep                 # .whl/ (CUTLASS) and .carry/kernels/
#   device:  make device-check STAGE=1        # device tool: carry [".whl", ".carry"], timeout_s 600
#            make device-check STAGE=2, then STAGE=3 (warm machine: the build is reused)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
STAGE=${STAGE:-1}
case $STAGE in 1|2|3) ;; *) echo "device-check: STAGE must be 1, 2 or 3 (got $STAGE)"; exit 2 ;; esac
OUT=${OUT:-build/device-check}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
BUILD=${DEVICE_CHECK_BUILD:-$ROOT/build}  # (tests point these two elsewhere)
CARRY=${DEVICE_CHECK_CARRY:-$ROOT/.carry/kernels}
WORK=$BUILD/device-check-work   # this call's intermediate files (only $OUT comes back)
STATE=$BUILD/device-check-state # kept between calls on a warm machine: stage 1's smoke.json
rm -rf "$WORK" && mkdir -p "$WORK" "$STATE"
LOG=$OUT/device_check.log
: > "$LOG"
BUDGET=${DEVICE_CHECK_BUDGET:-570}
RESERVE=${DEVICE_CHECK_RESERVE:-20}
MIN_STEP=${DEVICE_CHECK_MIN_STEP:-15}
# Stage 1: seconds kept after the smoke matrix (self-test, hang rerun, sanitizers), and which
# sanitizer tools run (a shorter lease: fewer tools, a smaller reserve; DEVICE_CHECK_HANG_BUILD=0
# also leaves out the hang-diagnosis build beside the smoke).
AFTER_SMOKE=${DEVICE_CHECK_AFTER_SMOKE:-200}
SANITIZERS=${DEVICE_CHECK_SANITIZERS:-memcheck racecheck synccheck}
HANG_BUILD=${DEVICE_CHECK_HANG_BUILD:-1}
PY=$(command -v "${PYTHON:-python3}") || { echo "device-check: no ${PYTHON:-python3}"; exit 1; }
[[ $PY = /* ]] || PY=$ROOT/$PY
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the in-place build of flash3
export FLASH3_FORCE_CUDA=1  # a declined CUDA build fails loudly instead of installing pure Python
T0=$(date +%s)

left() { echo $(( BUDGET - RESERVE - ($(date +%s) - T0) )); }
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-$LOG}" >> "$WORK/steps.tsv"; }
# skip NAME WHY: a step that does not run, and why.
skip() { row "$1" "skipped ($2)" 0; echo "=== $1: skipped ($2)" | tee -a "$LOG"; }
# step NAME CAP CMD...: run CMD for at most min(CAP, time left) s; output to $STEP_LOG (default
# the combined log); one row in steps.tsv (name, status, seconds, log).
step() {
  local name=$1 cap=$2 limit; shift 2
  limit=$(left); [ "$limit" -gt "$cap" ] && limit=$cap
  local log=${STEP_LOG:-$LOG}
  if [ "$limit" -lt "$MIN_STEP" ]; then skip "$name" "out of time"; return 99; fi
  echo "=== $name (limit ${limit}s) $(date +%T)" | tee -a "$LOG"
  local t=$(date +%s) rc st
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in 0) st=ok ;; 124|137) st=timeout ;; *) st="exit $rc" ;; esac
  row "$name" "$st" "$(( $(date +%s) - t ))" "$log"
  [ "$log" != "$LOG" ] && { echo "--- $log"; cat "$log"; } >> "$LOG"
  echo "=== $name: $st ($(( $(date +%s) - t ))s)" | tee -a "$LOG"
  return $rc
}
finish() {
  for f in "$WORK"/san*.log; do
    [ -f "$f" ] && { echo "--- $f"; head -c 2000000 "$f"; }
  done > "$OUT/sanitizer.log"
  [ -s "$OUT/sanitizer.log" ] || rm -f "$OUT/sanitizer.log"
  $PY tools/device/device_summary.py --work "$WORK" --out "$OUT" --budget "$BUDGET" --stage "$STAGE" \
    --elapsed $(( $(date +%s) - T0 ))
  exit $?
}

# --- preflight: the tools each stage needs, named when missing.
{ echo "stage $STAGE"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader 2>&1 | head -1
  $PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
                               torch.cuda.get_device_name())" 2>&1 | tail -1
  nvcc --version 2>&1 | tail -1; } > "$WORK/env.txt"
tee -a "$LOG" < "$WORK/env.txt"
MISSING=
command -v ninja >/dev/null || $PY -c "import ninja" 2>/dev/null || MISSING+=" ninja"
HAVE_SAN=1; command -v compute-sanitizer >/dev/null || { HAVE_SAN=; MISSING+=" compute-sanitizer"; }
command -v nvcc >/dev/null || MISSING+=" nvcc"
if [ -n "$MISSING" ]; then
  echo "device-check: NOT FOUND:$MISSING (ninja: torch compiles the bindings one file at a time" \
       "without it; compute-sanitizer: the sanitizer steps are skipped; nvcc: nothing can be" \
       "compiled here, only prebuilt objects linked)" | tee -a "$LOG"
  row preflight "missing:$MISSING" 0
else
  row preflight ok 0
fi

# CUTLASS headers: the carried wheel, unless CUTLASS_DIR is set.
if [ -z "${CUTLASS_DIR:-}" ] && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/flash3-site \
    .whl/nvidia_cutlass-*.whl >> "$LOG" 2>&1
  export CUTLASS_DIR=/tmp/flash3-site/cutlass_library/source/include
fi
export MAX_JOBS=${MAX_JOBS:-16}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
PRE=$BUILD/prebuilt

# --- kernels: carried objects that match the sources, else a time-capped build of a subset.
# prepare VARIANT: unpack and check .carry/kernels/VARIANT.tar.xz; exports the knobs it was made
# with. Returns 1 (and says why) when absent or stale.
prepare() {
  local v=$1 knobs
  [ -f "$CARRY/$v.tar.xz" ] || { echo "device-check: no $CARRY/$v.tar.xz (make device-prep here)"; return 1; }
  $PY tools/build/prebuilt.py unpack --variant "$v" --dir "$PRE" --carry "$CARRY" || return 1
  knobs=$($PY tools/build/prebuilt.py check --variant "$v" --dir "$PRE") ||
    { echo "device-check: the carried $v objects are stale or incomplete: not used"; return 1; }
  eval "$knobs"
}
t=$(date +%s)
if prepare release > "$WORK/kernels.log" 2>&1; then
  row kernels "ok (carried)" $(( $(date +%s) - t )) "$WORK/kernels.log"
else
  row kernels "not carried" $(( $(date +%s) - t )) "$WORK/kernels.log"
  tail -2 "$WORK/kernels.log" | tee -a "$LOG"
  export FLASH3_HDIMS=64,128 FLASH3_DTYPES=bf16 FLASH3_PREBUILT_ALLOW_MISSING=1
  CAP=$(( $(left) / 2 )); [ "$CAP" -gt 300 ] && CAP=300  # half of what is left, the rest to test
  STEP_LOG=$WORK/kernels_build.log step "kernels (compiled here)" "$CAP" \
    $PY tools/build/prebuilt.py build --variant release --dir "$PRE" --cache "$PRE/cache" --jobs 16 \
    --budget $(( CAP * 2 / 3 ))  # no compile starts late: the heaviest take ~150 s
fi
cp "$PRE/release/manifest.json" "$WORK/kernels.json" 2>/dev/null
export FLASH3_PREBUILT=$PRE/release
STEP_LOG=$WORK/build.log step build 200 $PY setup.py build_ext --inplace || finish
HANG_CASES='' FAIL_CASES='' SAN_CASES='' BENCH_HDIMS='' PYTEST_K=''

if [ "$STAGE" = 1 ]; then
  # The hang-diagnosis extension, in the background and in a copy of the tree (the release build
  # stays), ready when the smoke matrix ends; stopped if nothing hangs. Its own session, so that
  # stopping it ends every compiler it started.
  HANG_DIR=$BUILD/hang-tree HB_PID=
  stop_hang_build() { [ -n "$HB_PID" ] && kill -- -"$HB_PID" 2>/dev/null; HB_PID=; }
  trap stop_hang_build EXIT
  if [ "$HANG_BUILD" != 0 ]; then  # 0: no CPU taken from the smoke, no hang rerun
    if [ -n "${FLASH3_PREBUILT_ALLOW_MISSING:-}" ] || ! prepare hang >> "$LOG" 2>&1; then
      HANG_OBJ="$PY tools/build/prebuilt.py build --variant hang --dir $PRE --cache $PRE/cache --jobs 8 --nice &&"
    else
      HANG_OBJ=
    fi
    rm -rf "$HANG_DIR" && mkdir -p "$HANG_DIR" &&
      cp -r setup.py pyproject.toml README.md flash3 csrc tools "$HANG_DIR"/ &&
      rm -f "$HANG_DIR"/flash3/_C*.so &&
      { setsid bash -c "$HANG_OBJ cd $HANG_DIR && FLASH3_DEBUG_HANG=1 FLASH3_PREBUILT=$PRE/hang \
                        timeout 400 $PY setup.py build_ext --inplace
                        echo \$? > $WORK/hang_build.rc" > "$WORK/hang_build.log" 2>&1 < /dev/null &
        HB_PID=$!; }
  fi
  # The self-test of the hang-diagnosis build's bounded waits (small; compiles beside the smoke).
  SELFTEST=$WORK/debug_hang_selftest
  nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc \
    -I"$($PY tools/build/flash3_build.py --cutlass)" tools/build/debug_hang_selftest.cu -o "$SELFTEST" \
    > "$WORK/selftest_build.log" 2>&1 < /dev/null &
  SELFTEST_PID=$!

  # Smoke matrix; its internal budget ends before the step's timeout, so it reports "not run"
  # rather than being killed.
  SMOKE=$(( $(left) - AFTER_SMOKE )); [ "$SMOKE" -gt 280 ] && SMOKE=280
  STEP_LOG=$WORK/smoke.log step smoke $((SMOKE + 30)) \
    $PY tools/smoke/smoke.py --budget $((SMOKE > 20 ? SMOKE - 10 : 10)) --parallel 8 --case-timeout 15 \
    --json "$OUT/smoke.json"
  [ -f "$OUT/smoke.json" ] && cp "$OUT/smoke.json" "$STATE/smoke.json" &&
    eval "$($PY tools/smoke/smoke.py --plan "$OUT/smoke.json")"

  wait "$SELFTEST_PID"
  STEP_LOG=$WORK/selftest.log step debug_hang_selftest 40 \
    bash -c "cat $WORK/selftest_build.log; r=0; for m in sync 'hang mbar' 'hang named'; do $SELFTEST \$m || r=1; done; exit \$r"

  if [ -n "$HANG_CASES" ] && [ "$HANG_BUILD" = 0 ]; then
    skip hang_rerun "DEVICE_CHECK_HANG_BUILD=0"
  elif [ -n "$HANG_CASES" ]; then
    STEP_LOG=$WORK/hang_build.log step "hang_build (background)" 300 \
      bash -c "while [ ! -f $WORK/hang_build.rc ]; do sleep 1; done; exit \$(cat $WORK/hang_build.rc)" &&
    STEP_LOG=$WORK/hang_rerun.log step hang_rerun 45 env PYTHONPATH="$HANG_DIR" \
      $PY tools/smoke/smoke.py --cases "$HANG_CASES" --parallel 2 --case-timeout 30 --budget 35 \
      --json "$WORK/hang.json"
  fi
  stop_hang_build

  # san TOOL PYTHONPATH CASES...: one compute-sanitizer run of tools/device/sanitize_small.py. The
  # caching allocator is off so memcheck sees each tensor's real bounds.
  nsan=0
  san() {
    local tool=$1 pp=$2; shift 2
    local name="$tool $1${2:+ +$(($# - 1))}"
    nsan=$((nsan + 1))
    if [ -z "$HAVE_SAN" ]; then skip "$name" "no compute-sanitizer"; return; fi
    STEP_LOG=$WORK/san$nsan.log step "$name" 45 \
      env PYTHONPATH="$pp" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
      compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
      "$PY" tools/device/sanitize_small.py "$@"
  }
  if [ -n "$FAIL_CASES" ]; then
    set -- $FAIL_CASES
    for tool in $SANITIZERS; do san $tool "$PYTHONPATH" "$1"; done
  elif [ -n "$SAN_CASES" ]; then
    for tool in $SANITIZERS; do san $tool "$PYTHONPATH" $SAN_CASES; done
  elif [ -n "$HANG_CASES" ] && ls "$HANG_DIR"/flash3/_C*.so >/dev/null 2>&1; then
    san memcheck "$HANG_DIR" "${HANG_CASES%% *}"  # the debug build traps instead of hanging
  else
    skip sanitizers "no failing case and no small passing one to run them on"
  fi
fi

if [ "$STAGE" = 2 ]; then
  [ -f "$STATE/smoke.json" ] && eval "$($PY tools/smoke/smoke.py --plan "$STATE/smoke.json")"
  PT=(-v -rfE --tb=line -p no:cacheprovider)
  $PY -c "import xdist" 2>/dev/null && PT+=(-n 4)
  $PY -c "import pytest_timeout" 2>/dev/null && PT+=(--timeout=60 -o timeout_method=thread)
  [ -n "$PYTEST_K" ] && PT+=(-k "$PYTEST_K")
  # Every GPU test file (tests/*_gpu.py: a new kernel path's file joins without an edit here).
  STEP_LOG=$OUT/pytest.log step pytest 420 $PY -m pytest "${PT[@]}" tests/*_gpu.py \
    tests/test_quantize_kernel.py
  STEP_LOG=$WORK/ring_sanity.log step ring_sanity 40 $PY tools/device/ring_sanity.py
fi

if [ "$STAGE" = 3 ]; then
  [ -f "$STATE/smoke.json" ] && eval "$($PY tools/smoke/smoke.py --plan "$STATE/smoke.json")"
  # Without stage 1's verdicts (a fresh machine): the built bf16 head dims of 64/128/256.
  [ -f "$STATE/smoke.json" ] || BENCH_HDIMS=$($PY -c "import json, torch, flash3
print(','.join(str(d) for d in (64, 128, 256) if ['bf16', d, d] in json.loads(torch.ops.flash3.kernel_info())['fwd']))" 2>> "$LOG")
  B=$WORK/bench
  has() { tr , '\n' <<< "$BENCH_HDIMS" | grep -qx "$1"; }
  if [ -z "$BENCH_HDIMS" ]; then
    skip bench "no bf16 64/128/256 kernel built and passing"
  else
    step bench 150 $PY benchmarks/bench_fwd.py --hdims "$BENCH_HDIMS" --seqlens 2048,8192,16384 --out "$B"
    FP8_HDIMS=$(tr , '\n' <<< "$BENCH_HDIMS" | grep -x -e 128 -e 256 | paste -sd, -)
    if [ -n "$FP8_HDIMS" ]; then step bench_fp8 100 $PY benchmarks/bench_fp8.py --quick --hdims "$FP8_HDIMS" --out "$B"
    else skip bench_fp8 "hdim 128/256 not built or not passing"; fi
    if has 128; then
      step bench_bwd 100 $PY benchmarks/bench_bwd.py --quick --out "$B"
      step bench_decode 100 $PY benchmarks/bench_decode.py --quick --out "$B"
    else
      skip bench_bwd "hdim 128 not built or not passing"; skip bench_decode "hdim 128 not built or not passing"
    fi
  fi
fi
finish
