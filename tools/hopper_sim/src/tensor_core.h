// Warpgroup MMA (wgmma.mma_async) and ldmatrix/stmatrix with PTX ISA semantics: matrix descriptors
// decoded bit by bit into the canonical shared-memory layouts, register fragments as the ISA draws
// them. Pure functions over a CTA's shared memory bytes and the participating threads' registers.
#pragma once
#include <cstdint>
#include <string>

namespace hsim::tc {

enum class EType : uint8_t { kF16, kBF16, kTF32, kE4M3, kE5M2, kF32, kS8, kU8, kS32 };
int ebits(EType t);  // 16, 16, 32, 8, 8, 32, 8, 8, 32

// The 64-bit shared memory matrix descriptor (PTX ISA, "Matrix Descriptor Format").
struct Desc {
  uint32_t start_addr = 0;   // bytes (field << 4)
  uint32_t lbo = 0;          // leading dimension byte offset (field << 4)
  uint32_t sbo = 0;          // stride dimension byte offset (field << 4)
  uint32_t base_offset = 0;  // 3-bit matrix base offset
  uint32_t swizzle = 0;      // 0 = no swizzle (interleave), else 32, 64 or 128 (bytes)
};
Desc decode_desc(uint64_t d);

// Shared memory (shared::cta byte address) of element (mn, k) of a wgmma operand in shared memory.
// A: mn = row in [0, 64); B: mn = column in [0, N). k in [0, K). k_major: the operand is K-major
// (imm-trans = 0); otherwise MN-major (transposed; 16-bit types only).
uint32_t element_addr(const Desc& d, int mn, int k, int elem_bits, bool k_major);

// Read-only view of one CTA's shared memory with its strictness shadow.
struct Smem {
  const uint8_t* bytes = nullptr;   // shared::cta address a is bytes[a]
  uint32_t size = 0;                // valid addresses: [0, size)
  const uint8_t* shadow = nullptr;  // may be null; shadow[a] != 0: not readable by the async proxy
                                    // now (in-flight copy destination, unfenced generic write, ...)
};

struct Wgmma {
  int m = 64, n = 8, k = 16;
  EType a = EType::kBF16, b = EType::kBF16, d = EType::kF32;
  bool a_regs = false;                   // RS form: A from registers
  bool a_k_major = true, b_k_major = true;   // imm-trans-a/-b == 0
  int scale_a = 1, scale_b = 1;          // imm-scale-a/-b (+1 or -1)
};
int d_regs_per_thread(const Wgmma& w);  // f32/s32 accumulators: n/2; f16: n/4 (packed f16x2)

// Executes one wgmma for a warpgroup. a_frag: 128 threads x 4 32-bit registers (RS form only,
// thread t of the warpgroup at a_frag[4*t .. 4*t+3]). d: 128 threads x d_regs_per_thread(w) words,
// thread t at d[t*nd ..]; read when scale_d, always written. Each product is exact and the K-chunk
// sum is formed in double, then D = round_f32(sum + D) once per instruction (documented choice).
// Returns false with *err naming the operand, element and address on an illegal access (out of
// shared memory, misaligned start, shadowed byte) or an unsupported shape/type.
bool wgmma(const Wgmma& w, uint64_t desc_a, uint64_t desc_b, const uint32_t* a_frag, uint32_t* d,
           bool scale_d, const Smem& smem, std::string* err);

// ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16: row_addr[lane] for lanes 0..8*num-1 gives
// each 8x8 matrix row's 16-byte row start (shared::cta); out[lane*4 + j] = lane's j-th result reg.
bool ldmatrix(int num, bool trans, const uint32_t row_addr[32], uint32_t out[32 * 4], const Smem& smem,
              std::string* err);
// stmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16: the inverse; writes bytes (mutable view).
bool stmatrix(int num, bool trans, const uint32_t row_addr[32], const uint32_t in[32 * 4], uint8_t* smem,
              uint32_t smem_size, std::string* err);

}  // namespace hsim::tc
