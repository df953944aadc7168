// The timing model's parameters for an H100 SXM5, one table, each value with its source. README.md
// ("Timing model") repeats the table. Never tune these to make a validation kernel (a GEMM,
// FlashAttention) come out right: those kernels are what the model is checked against.
//
// Sources:
//   [WP]   NVIDIA H100 Tensor Core GPU Architecture whitepaper (132 SMs in SXM5, 4 tensor cores and
//          4 sub-partitions per SM, 989.4 dense bf16 TFLOP/s, 494.7 tf32, 1979 fp8, 50 MB L2,
//          3.35 TB/s HBM3, 228 KB shared memory per SM; the TFLOP/s figures imply 1830 MHz boost).
//   [PG]   CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table, compute
//          capability 9.0 (results per clock per SM).
//   [LUO24] Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture",
//          arXiv 2402.13499.   [LUO25] Luo et al., "Dissecting the NVIDIA Hopper Architecture
//          through Microbenchmarking and Multiple Level Analysis", arXiv 2501.12084.
//   [H200] benchmarks/results/h200_2026-11-28.md: a lent H200 SXM (the GH100 die: the H100 SXM5's
//          132 SMs, clocks and 700 W limit, with HBM3e), Nsight Compute with --clock-control none:
//          the SM clock it sustained under a tensor-bound attention forward (d 128, s 8192). A
//          reading of the operating point, not a value solved for: no timing went into it.
//   assumption: no published value found in the time given; the comment says what it stands on.
#pragma once
#include <cstdint>

namespace hsim {
namespace tp {

// ---- machine ----
constexpr int kSMs = 132;                    // [WP] H100 SXM5
constexpr int kSubPartitions = 4;            // [WP] 4 SMSPs per SM, one warp scheduler each
// The replay counts cycles; kClockHz turns them into time. It is the clock under load ([H200]: the
// power limit holds a tensor-bound kernel below the boost clock), not the boost clock that the
// whitepaper's peak TFLOP/s are quoted at (kBoostClockHz: 989.4 at 1830 MHz is 904.5 at 1673).
constexpr double kClockHz = 1.673e9;         // [H200] 1673 MHz sustained under a d 128 attention forward
constexpr double kBoostClockHz = 1.83e9;     // [WP] 989.4e12 / (132 SMs * 4096 FLOP/clk) = 1.83 GHz
constexpr double kHbmBytesPerSec = 3.35e12;  // [WP] HBM3
constexpr int kMaxWarpsPerSM = 64;           // [PG] compute capability 9.0

// ---- issue: each SMSP issues at most one warp-instruction per cycle ([WP]: one scheduler per SMSP)
// Issue interval = cycles one warp-instruction occupies its SMSP's pipe = 32 lanes / (results per
// clock per SM / 4 SMSPs), from the [PG] table for cc 9.0:
constexpr int kFmaInterval = 1;      // [PG] 128 fp32 add/mul/fma per clk per SM -> 32/SMSP
constexpr int kHalf2Interval = 1;    // [PG] 256 f16 results per clk per SM: one x2 warp-instr/clk/SMSP
constexpr int kAluInterval = 2;      // [PG] 64 int32 add/logic/shift/compare per clk per SM -> 16/SMSP
constexpr int kMufuInterval = 8;     // [PG] 16 rcp/rsqrt/lg2/ex2/sin/cos per clk per SM -> 4/SMSP
constexpr int kCvtInterval = 8;      // [PG] 16 "all other type conversions" per clk per SM
constexpr int kShflInterval = 4;     // [PG] 32 warp shuffles per clk per SM -> 8/SMSP
constexpr int kFp64Interval = 2;     // [PG] 64 fp64 per clk per SM

// ---- latencies (cycles from issue to a dependent's issue) ----
constexpr int kFmaLatency = 4;       // [LUO24] fp32 FFMA dependent-issue latency (4 cycles since Volta)
constexpr int kAluLatency = 4;       // [LUO24] IADD3/LOP3 class: same 4-cycle pipe as FMA
constexpr int kMufuLatency = 18;     // assumption: MUFU ~ 4x FMA (Turing/Ampere dissections report 14-23)
constexpr int kCvtLatency = 6;       // assumption
constexpr int kShflLatency = 24;     // assumption: shuffles go through the LSU/crossbar (~ smem latency)
constexpr int kSmemLatency = 30;     // [LUO24] shared memory load latency, Hopper ~ 30 cycles (rounded)
constexpr int kSmemBytesPerClk = 128;   // [WP] 32 banks x 4 B per clk per SM
constexpr int kGlobalLatency = 260;  // [LUO24] L2-hit global load latency on Hopper, ~ 260 cycles (rounded)

// ---- tensor cores (wgmma) ----
// Dense FLOP per clock per SMSP tensor core: 989.4e12 / 1.83e9 / 132 / 4 = 1024 for 16-bit types
// [WP]; fp8/int8 2048, tf32 512. A warpgroup's m64nNkK wgmma is split over its 4 warps, one per SMSP:
// each warp's share is 2*16*N*K FLOP -> N/2 cycles for bf16 k16, fp8 k32 and tf32 k8 alike.
constexpr int kTensorFlopPerClk16 = 1024;   // [WP]
constexpr int kWgmmaLatency = 32;    // assumption: fixed issue->result latency beyond the pipe time
                                     // (LUO25 measures wgmma latencies by shape; not retrieved here)

// ---- barriers ----
constexpr int kNamedBarLatency = 20;   // assumption: bar.sync release -> waiter issue
constexpr int kMbarLatency = 20;       // assumption: phase completion -> try_wait success seen

// ---- TMA ----
constexpr int kTmaIssueCycles = 8;     // assumption: one TMA unit per SM, one box per 8 cycles
constexpr int kTmaLatency = 500;       // assumption: L2 hit ~ 260 [LUO24] + TMA descriptor/address generation
constexpr double kL2BytesPerClkGPU = 5120.0;
                                       // assumption: GPU-wide L2 read bandwidth, the A100
                                       // whitepaper's figure (H100's is not in [WP]); each SM gets 1/132
constexpr int kCtaLaunchCycles = 200;  // assumption: a new CTA's first instruction after its slot frees

// ptxas list-schedules straight-line code: the hardware issues SASS in order, but SASS in which
// independent arithmetic was already moved up past a stalled dependency. The replay runs PTX in
// source order, so it emulates that with a lookahead: when a warp's next instruction must wait for
// an operand or a busy pipe, the first register-independent plain arithmetic instruction among the
// next kSchedWindow (not across a branch, barrier, wait, wgmma or memory fence) issues instead.
constexpr int kSchedWindow = 32;       // assumption: ptxas schedules whole basic blocks; register pressure bounds how far

}  // namespace tp
}  // namespace hsim
