#!/usr/bin/env bash
# One call on a lent H100/H200 (the device tool, or any Hopper box), laid out to learn the most
# from a single 10-minute call even if every kernel hangs. Each step runs under its own timeout,
# capped by what is left of DEVICE_CHECK_BUDGET (default 570 s; 20 s are kept for the summary);
# a step with under 15 s left is skipped and reported so.
#
#   build     setup.py build_ext --inplace, MAX_JOBS=16, sm_90a                       cap 330 s
#             then, in the background, the FLASH3_DEBUG_HANG=1 build of every kernel in a
#             copy of the tree (the release build stays); stopped if nothing hangs
#   smoke     tools/smoke.py: every built kernel x its features (fwd 7, e4m3 6, bwd 7), one launch each,
#             4 isolated workers, 15 s per case, HANG / CRASH cost one cell            cap 150 s
#   selftest  tools/debug_hang_selftest.cu: the debug build's waits work (~3 s)       cap 40 s
#   hang      only if a smoke case hung: wait for the debug build and rerun the case(s)
#             on it: it prints which barrier each stuck warp waits on, then traps   left+45 s
#   sanitize  only if a case failed: memcheck, racecheck, synccheck on the first failing
#             case, memcheck on the second                                        45 s each
#   pytest    tests/test_kernel_gpu.py, test_decode_gpu.py, test_kvcache_gpu.py, test_fp8_gpu.py,
#             test_quantize_kernel.py, test_bwd_gpu.py (hanging kernels deselected,
#             60 s per test)                                                         cap 150 s
#   bench     benchmarks/bench_fwd.py, hdims that passed the smoke, 2k/8k/16k        cap 80 s
#   bench_fp8 benchmarks/bench_fp8.py --quick: FP8 vs bf16 vs cuDNN on those of 128/256,
#             2k/8k; quantize GB/s; accuracy through the kernel                      cap 60 s
#   bench_bwd benchmarks/bench_bwd.py --quick: backward and fwd+bwd vs SDPA flash/cuDNN,
#             deterministic cost, hdim 128 at 2k/8k (if hdim 128 passed the smoke)   cap 60 s
#   bench_decode benchmarks/bench_decode.py --quick: decode step GB/s vs copy bandwidth,
#             batch 8/64 x cache 8k/32k x pages none/16/64 (if hdim 128 passed)      cap 60 s
#   sanitize  if nothing failed: the three tools on tools/sanitize_small.py (memcheck: its
#             default set, a backward launch included)                             40 s each
# then tools/device_summary.py prints ONE summary table, last. Files under $OUT (9):
# summary.txt, results.json, device_check.log (every step's output), smoke.json, pytest.log,
# sanitizer.log, bench_fwd.json, bench_fp8.json, bench_bwd.json, bench_decode.json.
#
#   here:    make device-prep     # the nvidia-cutlass wheel into .whl/ (pure Python)
#   device:  make device-check    # device tool: carry [".whl"], timeout_s 600
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-build/device-check}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
WORK=$ROOT/build/device-check-work  # intermediate files (only $OUT comes back)
rm -rf "$WORK" && mkdir -p "$WORK"
LOG=$OUT/device_check.log
: > "$LOG"
BUDGET=${DEVICE_CHECK_BUDGET:-570}
RESERVE=20
PY=$(command -v "${PYTHON:-python3}") || { echo "no ${PYTHON:-python3}"; exit 1; }
[[ $PY = /* ]] || PY=$ROOT/$PY  # absolute: the hang build runs it from another directory
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the in-place build of flash3
T0=$(date +%s)

left() { echo $(( BUDGET - RESERVE - ($(date +%s) - T0) )); }
# step NAME CAP CMD...: run CMD for at most min(CAP, time left) s; output to $STEP_LOG (default
# the combined log); one row in steps.tsv (name, status, seconds, log).
step() {
  local name=$1 cap=$2 limit; shift 2
  limit=$(left); [ "$limit" -gt "$cap" ] && limit=$cap
  local log=${STEP_LOG:-$LOG}
  if [ "$limit" -lt 15 ]; then
    printf '%s\tskipped\t0\t%s\n' "$name" "$log" >> "$WORK/steps.tsv"
    echo "=== $name: skipped (out of time)" | tee -a "$LOG"
    return 99
  fi
  echo "=== $name (limit ${limit}s) $(date +%T)" | tee -a "$LOG"
  local t=$(date +%s) rc st
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in 0) st=ok ;; 124|137) st=timeout ;; *) st="exit $rc" ;; esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$st" "$(( $(date +%s) - t ))" "$log" >> "$WORK/steps.tsv"
  [ "$log" != "$LOG" ] && { echo "--- $log"; cat "$log"; } >> "$LOG"
  echo "=== $name: $st ($(( $(date +%s) - t ))s)" | tee -a "$LOG"
  return $rc
}
# san TOOL PYTHONPATH CASES...: one compute-sanitizer run of tools/sanitize_small.py (no cases:
# its default set). The caching allocator is off so memcheck sees each tensor's real bounds.
nsan=0
san() {
  local tool=$1 pp=$2; shift 2
  nsan=$((nsan + 1))
  STEP_LOG=$WORK/san$nsan.log step "$tool ${1:-default}${2:+ +$(($# - 1))}" "${SAN_CAP:-45}" \
    env PYTHONPATH="$pp" PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 \
    "$PY" tools/sanitize_small.py "$@"
}
finish() {
  for f in "$WORK"/san*.log; do
    [ -f "$f" ] && { echo "--- $f"; head -c 2000000 "$f"; }
  done > "$OUT/sanitizer.log"
  [ -s "$OUT/sanitizer.log" ] || rm -f "$OUT/sanitizer.log"
  $PY tools/device_summary.py --work "$WORK" --out "$OUT" --budget "$BUDGET" --elapsed $(( $(date +%s) - T0 ))
  exit $?
}

{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader 2>&1 | head -1
  $PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda,
                               torch.cuda.get_device_name())" 2>&1 | tail -1
  nvcc --version 2>&1 | tail -1; } > "$WORK/env.txt"
tee -a "$LOG" < "$WORK/env.txt"

# CUTLASS headers: the carried wheel, unless CUTLASS_DIR is set.
if [ -z "${CUTLASS_DIR:-}" ] && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/flash3-site \
    .whl/nvidia_cutlass-*.whl >> "$LOG" 2>&1
  export CUTLASS_DIR=/tmp/flash3-site/cutlass_library/source/include
fi
export MAX_JOBS=${MAX_JOBS:-16}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}

# The hang-diagnosis self-test (small; compiles beside the build): proves the debug build's bounded
# waits and emulated named barriers work before anyone trusts a hang report.
SELFTEST=$WORK/debug_hang_selftest
"$($PY tools/flash3_build.py --cuda-home)/bin/nvcc" -gencode=arch=compute_90a,code=sm_90a -O3 \
  -std=c++17 --expt-relaxed-constexpr -Icsrc -I"$($PY tools/flash3_build.py --cutlass)" \
  tools/debug_hang_selftest.cu -o "$SELFTEST" \
  > "$WORK/selftest_build.log" 2>&1 < /dev/null &
SELFTEST_PID=$!

STEP_LOG=$WORK/build.log step build 330 $PY setup.py build_ext --inplace || finish

# The hang-diagnosis build of every kernel starts now, in the background and in a copy of the tree
# (the release build stays), so that it is ready when the smoke matrix ends; stopped if nothing
# hangs. Its own session, so that stopping it ends every compiler it started.
HANG_DIR=/tmp/flash3-hang HB_PID=
stop_hang_build() { [ -n "$HB_PID" ] && kill -- -"$HB_PID" 2>/dev/null; HB_PID=; }
trap stop_hang_build EXIT
rm -rf "$HANG_DIR" && mkdir -p "$HANG_DIR" &&
  cp -r setup.py pyproject.toml README.md flash3 csrc tools "$HANG_DIR"/ &&
  rm -f "$HANG_DIR"/flash3/_C*.so &&
  { setsid bash -c "cd $HANG_DIR && FLASH3_DEBUG_HANG=1 timeout 400 $PY setup.py build_ext --inplace
                    echo \$? > $WORK/hang_build.rc" > "$WORK/hang_build.log" 2>&1 < /dev/null &
    HB_PID=$!; }

# Smoke matrix; its internal budget ends well before the step's timeout, so it reports "not run"
# rather than being killed.
SMOKE=$(left); [ "$SMOKE" -gt 150 ] && SMOKE=150
STEP_LOG=$WORK/smoke.log step smoke $((SMOKE + 30)) \
  $PY tools/smoke.py --budget $((SMOKE - 10)) --parallel 4 --case-timeout 15 --json "$OUT/smoke.json"
HANG_CASES='' FAIL_CASES='' BENCH_HDIMS=64,128,256 PYTEST_K=''
[ -f "$OUT/smoke.json" ] && eval "$($PY tools/smoke.py --plan "$OUT/smoke.json")"

wait "$SELFTEST_PID"
STEP_LOG=$WORK/selftest.log step debug_hang_selftest 40 \
  bash -c "cat $WORK/selftest_build.log; $SELFTEST sync && $SELFTEST hang"

# Hang diagnosis: wait for the debug build, rerun the hanging cases (at most two) on it.
if [ -n "$HANG_CASES" ] && [ -n "$HB_PID" ]; then
  STEP_LOG=$WORK/hang_build.log step "hang_build (background)" 300 \
    bash -c "while [ ! -f $WORK/hang_build.rc ]; do sleep 1; done; exit \$(cat $WORK/hang_build.rc)" &&
  STEP_LOG=$WORK/hang_rerun.log step hang_rerun 45 env PYTHONPATH="$HANG_DIR" \
    $PY tools/smoke.py --cases "$HANG_CASES" --parallel 2 --case-timeout 30 --budget 35 \
    --json "$WORK/hang.json"
fi
stop_hang_build

if [ -n "$FAIL_CASES" ]; then
  set -- $FAIL_CASES
  for tool in memcheck racecheck synccheck; do san $tool "$PYTHONPATH" "$1"; done
  [ -n "${2:-}" ] && san memcheck "$PYTHONPATH" "$2"
elif [ -n "$HANG_CASES" ] && ls "$HANG_DIR"/flash3/_C*.so >/dev/null 2>&1; then
  san memcheck "$HANG_DIR" "${HANG_CASES%% *}"  # the debug build traps instead of hanging
fi

PT=(-v -rfE --tb=line -p no:cacheprovider)
$PY -c "import xdist" 2>/dev/null && PT+=(-n 4)
$PY -c "import pytest_timeout" 2>/dev/null && PT+=(--timeout=60 -o timeout_method=thread)
[ -n "$PYTEST_K" ] && PT+=(-k "$PYTEST_K")
STEP_LOG=$OUT/pytest.log step pytest 180 $PY -m pytest "${PT[@]}" tests/test_kernel_gpu.py tests/test_decode_gpu.py \
  tests/test_kvcache_gpu.py tests/test_fp8_gpu.py tests/test_quantize_kernel.py tests/test_bwd_gpu.py
STEP_LOG=$WORK/ring_sanity.log step ring_sanity 40 $PY tools/ring_sanity.py

if [ -n "$BENCH_HDIMS" ]; then
  step bench 80 $PY benchmarks/bench_fwd.py --hdims "$BENCH_HDIMS" --seqlens 2048,8192,16384 \
    --out "$WORK/bench" && cp "$WORK/bench/bench_fwd.json" "$OUT/" 2>/dev/null
  FP8_HDIMS=$(tr , '\n' <<< "$BENCH_HDIMS" | grep -x -e 128 -e 256 | paste -sd, -)  # its bf16 rows too
  [ -n "$FP8_HDIMS" ] && step bench_fp8 60 $PY benchmarks/bench_fp8.py --quick --hdims "$FP8_HDIMS" \
    --out "$WORK/bench" && cp "$WORK/bench/bench_fp8.json" "$OUT/" 2>/dev/null
  grep -qx 128 <<< "$(tr , '\n' <<< "$BENCH_HDIMS")" && step bench_bwd 60 $PY benchmarks/bench_bwd.py \
    --quick --out "$WORK/bench" && cp "$WORK/bench/bench_bwd.json" "$OUT/" 2>/dev/null
  grep -qx 128 <<< "$(tr , '\n' <<< "$BENCH_HDIMS")" && step bench_decode 60 $PY benchmarks/bench_decode.py \
    --quick --out "$WORK/bench" && cp "$WORK/bench/bench_decode.json" "$OUT/" 2>/dev/null
fi

if [ -z "$FAIL_CASES$HANG_CASES" ]; then
  SAN_CAP=40 san memcheck "$PYTHONPATH"
  SAN_CAP=40 san racecheck "$PYTHONPATH" bf16:128:128/causal bf16:64:64/varlen bf16:256:256/full
  SAN_CAP=40 san synccheck "$PYTHONPATH" bf16:128:128/causal bf16:64:64/varlen bf16:256:256/full
fi
finish
