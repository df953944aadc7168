# flash3's bf16 d=128 BACKWARD (preprocess + main + postprocess) under the Hopper simulator, no torch.
#   make -C tools/hopper_sim/flash3 -f bwd.mk     build bwd_driver (the bwd kernel TU: a few min / ~3-4 GB)
#   tools/hopper_sim/flash3/run_bwd.sh            build, then run the cases under simrun
# Outputs in tools/hopper_sim/build/flash3_bwd/ (git-ignored). The forward (to get out and lse) is the
# plain 128 x 128 kernel object tools/hopper_sim/flash3/Makefile builds in build/flash3/ (same flags as
# here); this makefile builds it there through that Makefile when it is missing.
# Kernel flags: tools/flash3_build.py NVCC_KERNEL_FLAGS with the simulator's -gencode (sm_90a SASS +
# compute_90a PTX, which the simulator executes), -cudart shared and -no-compress.
ROOT     := $(abspath ../../..)
BUILD    := $(abspath ../build/flash3_bwd)
FWDBUILD := $(abspath ../build/flash3)
NVCC     ?= nvcc
CUTLASS  ?= $(shell python3 $(ROOT)/tools/flash3_build.py --cutlass)
SIMARCH  := -gencode=arch=compute_90a,code=[sm_90a,compute_90a]
KFLAGS   := $(SIMARCH) -O3 -DNDEBUG --use_fast_math -std=c++17 --expt-relaxed-constexpr -no-compress -Xptxas=-v
INC      := -I$(ROOT)/csrc -I$(CUTLASS) -I$(CUTLASS)/../tools/util/include
HDRS     := $(wildcard $(ROOT)/csrc/flash3/bwd/*.h $(ROOT)/csrc/flash3/bwd/*.cuh $(ROOT)/csrc/flash3/common/*.h \
                       $(ROOT)/csrc/flash3/common/*.cuh)

.PHONY: all
all: $(BUILD)/bwd_driver

$(BUILD)/bwd_bf16_hdim128_sm90.o: $(ROOT)/csrc/generated/bwd_bf16_hdim128_sm90.cu $(HDRS)
	@mkdir -p $(BUILD)/keep
	@echo "nvcc $(notdir $<) (a few minutes)"
	@/usr/bin/time -f "$(notdir $<): wall %e s, max RSS %M KB" $(NVCC) $(KFLAGS) $(INC) -keep -keep-dir $(BUILD)/keep -c $< -o $@ > $@.log 2>&1 \
	  || { cat $@.log; rm -f $@; exit 1; }
	@tail -1 $@.log

$(BUILD)/bwd_registry.o: $(ROOT)/csrc/flash3/bwd/registry.cpp $(ROOT)/csrc/flash3/bwd/api.h $(ROOT)/csrc/flash3/bwd/params.h
	@mkdir -p $(BUILD)
	$(NVCC) $(SIMARCH) -std=c++17 -O2 -x cu -I$(ROOT)/csrc -c $< -o $@

$(FWDBUILD)/fwd_bf16_hdim128_sm90.o $(FWDBUILD)/registry.o:
	$(MAKE) -C $(ROOT)/tools/hopper_sim/flash3 $@

$(BUILD)/bwd_driver.o: bwd_driver.cu $(ROOT)/csrc/flash3/fwd/api.h $(ROOT)/csrc/flash3/fwd/params.h \
                       $(ROOT)/csrc/flash3/bwd/api.h $(ROOT)/csrc/flash3/bwd/params.h
	@mkdir -p $(BUILD)
	$(NVCC) $(SIMARCH) -std=c++17 -O2 -I$(ROOT)/csrc -c $< -o $@

$(BUILD)/bwd_driver: $(BUILD)/bwd_driver.o $(BUILD)/bwd_registry.o $(BUILD)/bwd_bf16_hdim128_sm90.o \
                     $(FWDBUILD)/registry.o $(FWDBUILD)/fwd_bf16_hdim128_sm90.o
	$(NVCC) $(SIMARCH) -cudart shared -no-compress $^ -o $@
