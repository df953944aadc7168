# flash3 — the project's commands. `make main` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU wheel of torch for GPU-less machines; on a Hopper box install a CUDA torch first and run
# `pip install --no-build-isolation .` (see README).
TORCH  ?= torch==2.13.0
SELFTEST_FLAGS := -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr -Icsrc

.PHONY: setup main test compile-check hang-build-check extension-check device-prep device-check bench bench-fp8 \
        bench-bwd fp8-accuracy clean sim sim-flags sim-check sim-check-all sim-ground-truth sim-report perf-model

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" numpy pytest matplotlib

# `make test` installs the optional extras its tests cover (the transformers integration);
# target-specific, so it applies to the `setup` it depends on.
EXTRAS ?=
setup: $(PY)
	$(PY) -m pip install -q ".$(EXTRAS)"

main: setup
	cd /tmp && $(abspath $(PY)) -m flash3

test: EXTRAS = [transformers]
test: setup
	$(PY) -m pytest -q tests

# Compile every forward kernel TU for sm_90a and check its SASS for real Hopper code.
compile-check:
	$(PYTHON) tools/build/compile_check.py

# The hang-diagnosis build (FLASH3_DEBUG_HANG=1, bounded waits that name their barrier) of the bf16
# hdim-128 TU compiles for sm_90a, and so does its self-test
# (tools/device/device_check.sh runs both on the GPU).
hang-build-check:
	FLASH3_HDIMS=128 FLASH3_DTYPES=bf16 $(PYTHON) tools/build/compile_check.py --debug-hang
	mkdir -p build && "$$($(PYTHON) tools/build/flash3_build.py --cuda-home)/bin/nvcc" $(SELFTEST_FLAGS) \
	  -I"$$($(PYTHON) tools/build/flash3_build.py --cutlass)" tools/build/debug_hang_selftest.cu -o build/debug_hang_selftest
	for side in 1 2; do "$$($(PYTHON) tools/build/flash3_build.py --cuda-home)/bin/nvcc" $(SELFTEST_FLAGS) -DSIDE=$$side \
	  -I"$$($(PYTHON) tools/build/flash3_build.py --cutlass)" -c tools/build/debug_hang_link_check.cu \
	  -o build/debug_hang_link_check$$side.o || exit 1; done
	"$$($(PYTHON) tools/build/flash3_build.py --cuda-home)/bin/nvcc" build/debug_hang_link_check1.o \
	  build/debug_hang_link_check2.o -o build/debug_hang_link_check

# Build the real extension against a CUDA build of torch and import it (no GPU needed).
extension-check:
	bash tools/build/extension_check.sh

# Before a lent-GPU call, here: the pure-Python CUTLASS wheel into .whl/ (the device cannot
# download), and every kernel TU FLASH3_HDIMS/FLASH3_DTYPES select compiled (tools/build/prebuilt.py;
# release and hang-diagnosis variants, the simulator's cache reused) and packed into
# .carry/kernels/{release,hang}.tar.xz, and CUTLASS's validation GEMMs built for the GPU into
# .carry/cutlass/ (~10 min); prints what a call carries against its 64 MiB. The full
# set is 52 TUs per variant, 25-45 min each on 2 cores (PREP_JOBS nvcc at once, ~4 GB each).
PREP_JOBS ?= 1
device-prep:
	mkdir -p .whl && $(PYTHON) -m pip download -q --no-deps nvidia-cutlass==4.2.0.0 -d .whl
	$(PYTHON) tools/build/prebuilt.py build --variant release --pack --jobs $(PREP_JOBS)
	$(PYTHON) tools/build/prebuilt.py build --variant hang --pack --jobs $(PREP_JOBS)
	$(PYTHON) tools/hopper_sim/cutlass_device_build.py
	$(PYTHON) tools/build/prebuilt.py size

# On a lent H100/H200, one call of at most 10 minutes per stage (tools/device/device_check.sh), stage 1
# first: 1 core (link the carried kernels, smoke matrix of every kernel x feature, hang diagnosis,
# sanitizers), 2 the GPU pytest files, 3 the benchmarks. Device tool: carry [".whl", ".carry"],
# timeout_s 600. One summary table last; results.json and the logs under $$OUT.
STAGE ?= 1
device-check:
	STAGE=$(STAGE) bash tools/device/device_check.sh

bench:
	$(PY) benchmarks/bench_fwd.py

# FP8 forward TFLOP/s vs bf16 and cuDNN, quantize GB/s, accuracy through the kernel (issue 8).
bench-fp8:
	$(PY) benchmarks/bench_fp8.py

# Backward and fwd+bwd TFLOP/s vs SDPA flash/cuDNN, deterministic mode's cost.
bench-bwd:
	$(PY) benchmarks/bench_bwd.py

fp8-accuracy: setup
	$(PY) benchmarks/fp8_accuracy.py

# The Hopper simulator (tools/hopper_sim): parser, interpreter, the libcudart.so.13 replacement that
# programs load under tools/hopper_sim/simrun, and its unit tests.
SIM_DIR := tools/hopper_sim
SIM_PY   = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
sim:
	$(MAKE) -C $(SIM_DIR) -j2

# nvcc flags for programs to run under tools/hopper_sim/simrun: PTX for sm_90a kept uncompressed,
# the shared runtime (so the simulator's libcudart is the one loaded).
sim-flags:
	@echo "-gencode=arch=compute_90a,code=[sm_90a,compute_90a] -cudart shared -no-compress"

# Unit tests (numerics, tensor cores, TMA, parser), instruction semantics from the PTX ISA, every
# strict check tripped on purpose, CUTLASS's own Hopper examples under the simulator with their own
# verification; then flash3's kernels: tools/smoke/smoke.py's CI subset (every kernel TU and every feature
# at least once, each case with two schedule seeds; then, with one seed, more cases until every TU
# has three features, its family's riskiest among them: --ci-extra; both in one run, one worker per
# kernel; the TUs come from
# compile-check's objects when it ran first, else they are compiled once into
# tools/hopper_sim/build/flash3), and deliberately wrong kernels that must be caught.
SIM_SMOKE = $(SIM_PY) tools/smoke/smoke.py --backend sim --seeds 1,2
sim-check: sim
	@set -e; for t in $(SIM_DIR)/build/tests/test_*; do [ -x "$$t" ] || continue; echo "== $$t"; "$$t" | tail -3; done
	@set -e; for r in $(SIM_DIR)/tests/run_isa.py $(SIM_DIR)/tests/run_checks.py $(SIM_DIR)/tests/timing/run_timing_tests.py; do \
	  [ -f "$$r" ] || continue; echo "== $$r"; $(SIM_PY) "$$r"; done
	$(SIM_PY) $(SIM_DIR)/cutlass_examples.py --reuse-record
	$(SIM_SMOKE) --ci --ci-extra
	PYTHON=$(SIM_PY) bash $(SIM_DIR)/flash3/mutant_check.sh
	$(SIM_PY) tools/hopper_sim/timing_smoke.py

# The H100 timing model's report (tools/hopper_sim/perf_model.py): parameter table with sources, validation on
# CUTLASS's GEMMs and FlashAttention-3 (FA3_SRC=<flash-attention checkout>; without it FA3's rows
# are left out), flash3 at the same shapes, a plot -> benchmarks/results/perf_model.md.
# PERF_ROWS=paper runs every published shape (hours of CPU); validation: d 128 full and causal at
# 1k-16k plus the GEMMs at 4k/8k (~30 min of CPU with FA3); quick is a handful. PERF_ONLY=fp8,det,decode,step
# (a comma list, perf_model.py --only) runs only those rows.
PERF_ROWS ?= quick
perf-model: sim
	$(SIM_PY) tools/hopper_sim/perf_model.py --rows $(PERF_ROWS) $(if $(FA3_SRC),--fa3-src $(FA3_SRC)) $(if $(PERF_ONLY),--only $(PERF_ONLY))

# CUTLASS's Hopper examples (all of them: --all) built and run under the simulator whatever the
# record says; a passing run rewrites tools/hopper_sim/ground_truth.json (commit it: sim-check and
# sim-check-all then reuse it until the simulator, the examples, the wheel, nvcc or g++ change).
sim-ground-truth: sim
	$(SIM_PY) $(SIM_DIR)/cutlass_examples.py --all

# The whole matrix in the simulator: every case of every kernel FLASH3_HDIMS / FLASH3_DTYPES select
# (1-3 min and ~3 GB per kernel TU to compile, 2 at a time, cached), and every Hopper example of the
# CUTLASS wheel that runs on one Hopper GPU (cutlass_examples.py --all: the CI five plus 50-69 but
# 58-60, 62, 64, 65; ground_truth.json stands in when it holds them all under the current key).
# Exit 1 unless every case and example is ok.
sim-check-all: sim setup
	$(SIM_PY) $(SIM_DIR)/cutlass_examples.py --all --reuse-record
	$(SIM_SMOKE)

# README's kernel status table from the last simulator run (tools/smoke/sim_report.py).
sim-report:
	$(SIM_PY) tools/smoke/sim_report.py --update-readme

clean:
	rm -rf build dist *.egg-info $(VENV)
