#!/usr/bin/env bash
# Nsight Compute on FA3's and flash3's d 128 forward at the same shape (b 2, s 8192, h 16,
# non-causal), on a lent Hopper GPU: the stall reasons, issue-slot use and tensor-pipe activity of
# both kernels side by side (the timing model's breakdown has the same fields). Clocks left alone
# (--clock-control none). FA3's binary: .carry/fa3/fa3_fwd_hdim128-* (tools/fa3_peer/build.py
# --cudart static); its kernel is named `device_kernel`, flash3's `fwd_kernel`.
# Writes ncu_fa3.csv, ncu_flash3.csv and ncu_flash3_nocluster.csv (flash3 with FLASH3_FWD_CLUSTER=1)
# under $OUT (or DIR, the first argument) and prints the headline metrics of each. Needs flash3._C built in place (PYTHONPATH=. imports it).
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-${OUT:-build/device-profile}}
mkdir -p "$DIR"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "device_profile: no ncu"; exit 1; }
SEC=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis
     --section InstructionStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis
     --metrics "regex:sm__pipe_.*tensor.*cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,smsp__inst_executed.sum,sm__cycles_elapsed.avg")
FA3=$(ls .carry/fa3/fa3_fwd_hdim128-* 2>/dev/null | head -1)
if [ -n "$FA3" ]; then
  timeout 90 "$NCU" --clock-control none -k regex:device_kernel -s 2 -c 1 "${SEC[@]}" --csv --page details \
    "$FA3" 2 8192 16 128 0 0 132 3 > "$DIR/ncu_fa3.csv" 2>&1
  echo "ncu fa3: exit $?"
else
  echo "ncu fa3: no .carry/fa3/fa3_fwd_hdim128-* carried"
fi
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 120 "$NCU" --clock-control none -k regex:fwd_kernel -s 2 -c 1 \
  "${SEC[@]}" --csv --page details "${PYTHON:-python3}" -c "
import torch, flash3
q, k, v = (torch.randn(2, 8192, 16, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
for _ in range(4):
    flash3.attention(q, k, v, causal=False)
torch.cuda.synchronize()" > "$DIR/ncu_flash3.csv" 2>&1
echo "ncu flash3: exit $?"
# The same call on single CTAs (FLASH3_FWD_CLUSTER=1): since 2026-12-02 full attention at d 128 runs
# in 2-CTA clusters with K/V multicast (fwd/launch.cuh); the L2 throughput and the SM clock of the
# two say whether halving K/V's L2 reads is what closes the gap to FA3 (49% against its 30% on 11-30).
FLASH3_FWD_CLUSTER=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 120 "$NCU" --clock-control none \
  -k regex:fwd_kernel -s 2 -c 1 "${SEC[@]}" --csv --page details "${PYTHON:-python3}" -c "
import torch, flash3
q, k, v = (torch.randn(2, 8192, 16, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
for _ in range(4):
    flash3.attention(q, k, v, causal=False)
torch.cuda.synchronize()" > "$DIR/ncu_flash3_nocluster.csv" 2>&1
echo "ncu flash3 (single CTAs): exit $?"
"${PYTHON:-python3}" - "$DIR" <<'PY'
import csv, sys, pathlib
keys = ("Duration", "SM Frequency", "Issue Slots Busy", "Executed Ipc Active", "Registers Per Thread",
        "L2 Cache Throughput", "DRAM Throughput", "Cluster Size",
        "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active")
for f in ("fa3", "flash3", "flash3_nocluster"):
    path = pathlib.Path(sys.argv[1]) / f"ncu_{f}.csv"
    if not path.exists():
        continue
    lines = path.read_text(errors="replace").splitlines()
    head = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    print(f"== {f}" + ("" if head is not None else ": no profile (see the csv)"))
    if head is None:
        continue
    rows = list(csv.DictReader(lines[head:]))
    for r in rows:
        name = r.get("Metric Name", "")
        if name in keys or (name.startswith("smsp__average_warps_issue_stalled_")
                            and float((r.get("Metric Value") or "0").replace(",", "") or 0) >= 0.1):
            print(f"  {name}: {r.get('Metric Value')} {r.get('Metric Unit')}")
PY

# Where the stalls sit, per SASS instruction (PROFILE_SOURCE=0 skips it): Nsight Compute's warp
# stall sampling (SourceCounters) of the same two kernels, saved as reports (src_fa3/src_flash3.ncu-rep,
# readable in the Nsight Compute GUI) and printed as SASS with the samples per instruction
# (source_fa3.csv, source_flash3.csv); tools/device/stall_sites.py lists the instructions the most
# samples fell on and totals each stall reason over the consumer loop. The 11-30 lease saw flash3's
# `long_scoreboard` at 0.70 an issue against FA3's 0.21 and could not say where.
if [ "${PROFILE_SOURCE:-1}" != 0 ]; then
  SRC=(--section SourceCounters --section WarpStateStats --import-source no)
  if [ -n "$FA3" ]; then
    timeout 90 "$NCU" --clock-control none -k regex:device_kernel -s 2 -c 1 "${SRC[@]}" -f -o "$DIR/src_fa3" \
      "$FA3" 2 8192 16 128 0 0 132 3 > "$DIR/src_fa3.log" 2>&1
    echo "ncu source fa3: exit $?"
  fi
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 120 "$NCU" --clock-control none -k regex:fwd_kernel -s 2 -c 1 \
    "${SRC[@]}" -f -o "$DIR/src_flash3" "${PYTHON:-python3}" -c "
import torch, flash3
q, k, v = (torch.randn(2, 8192, 16, 128, device='cuda', dtype=torch.bfloat16) for _ in range(3))
for _ in range(4):
    flash3.attention(q, k, v, causal=False)
torch.cuda.synchronize()" > "$DIR/src_flash3.log" 2>&1
  echo "ncu source flash3: exit $?"
  for f in fa3 flash3; do
    [ -f "$DIR/src_$f.ncu-rep" ] || continue
    timeout 60 "$NCU" -i "$DIR/src_$f.ncu-rep" --page source --csv --print-source sass > "$DIR/source_$f.csv" 2>&1
    echo "ncu source page $f: exit $?"
    "${PYTHON:-python3}" tools/device/stall_sites.py "$DIR/source_$f.csv" --name "$f"
  done
fi
