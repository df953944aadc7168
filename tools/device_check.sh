#!/usr/bin/env bash
# One call on a lent H100/H200 (device tool, or any Hopper box): build the extension with all
# cores, run the GPU tests, compute-sanitizer memcheck + racecheck on small shapes, and print the
# benchmark table. Logs go to $OUT (or build/device-check). Budget: under 10 minutes in all
# (build 4, tests 2.5, benchmark 1.5, sanitizers 2 x 45 s); a rebuild on a warm machine is
# incremental. BENCH_SEQLENS=512,1024,...,16384 runs the full benchmark grid.
#
#   here:    make device-prep            # puts the nvidia-cutlass wheel into .whl/ (pure Python)
#   device:  bash tools/device_check.sh  # with .whl carried along
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/device-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the in-place build of flash3
status=0
step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.log, remember failures
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

# CUTLASS headers: the carried wheel, unless CUTLASS_DIR is set or the wheel is installed.
if [ -z "${CUTLASS_DIR:-}" ] && ls .whl/nvidia_cutlass-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/flash3-site .whl/nvidia_cutlass-*.whl
  export CUTLASS_DIR=/tmp/flash3-site/cutlass_library/source/include
fi

export MAX_JOBS=${MAX_JOBS:-16}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
step build 240 $PY setup.py build_ext --inplace || { echo "build failed"; exit 1; }
step kernel_info 60 $PY -c "import flash3, torch; print(torch.ops.flash3.kernel_info())"
step tests_gpu 150 $PY -m pytest -q -x -rs tests/test_kernel_gpu.py
step sanitizer_memcheck 45 compute-sanitizer --tool memcheck --error-exitcode 9 $PY tools/sanitize_small.py
step sanitizer_racecheck 45 compute-sanitizer --tool racecheck --error-exitcode 9 $PY tools/sanitize_small.py
step bench 90 $PY benchmarks/bench_fwd.py --seqlens ${BENCH_SEQLENS:-512,2048,8192,16384} --out "$OUT"
echo "device-check: $([ $status -eq 0 ] && echo PASS || echo FAIL) (logs in $OUT)"
exit $status
