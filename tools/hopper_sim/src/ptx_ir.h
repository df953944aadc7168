// The parsed form of a PTX module, as nvcc emits it for sm_90a. Purely syntactic: the parser keeps
// each instruction's opcode and dot-modifiers as written; the interpreter decodes their meaning.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace hsim {

// Special registers (%tid.x ...). The parser maps names to these codes; component .x/.y/.z = +0/1/2.
enum Sreg : int32_t {
  kSregTid = 0, kSregNtid = 3, kSregCtaid = 6, kSregNctaid = 9,
  kSregClusterid = 12, kSregNclusterid = 15, kSregClusterCtaid = 18, kSregClusterNctaid = 21,
  kSregLaneid = 24, kSregWarpid, kSregNwarpid, kSregSmid, kSregNsmid, kSregGridid,
  kSregClusterCtarank, kSregClusterNctarank, kSregIsExplicitCluster,
  kSregLanemaskEq, kSregLanemaskLe, kSregLanemaskLt, kSregLanemaskGe, kSregLanemaskGt,
  kSregClock, kSregClockHi, kSregClock64, kSregGlobaltimer, kSregGlobaltimerLo, kSregGlobaltimerHi,
  kSregDynamicSmemSize, kSregTotalSmemSize, kSregAggrSmemSize,
  kSregEnvreg0,  // %envreg<n> = kSregEnvreg0 + n (n < 32)
  kSregCount = kSregEnvreg0 + 32,
};

struct Operand {
  enum Kind : uint8_t {
    kNone,
    kReg,     // reg = register slot
    kImm,     // imm = integer value (decimal/hex/octal/binary literal, sign applied)
    kF32,     // imm = raw IEEE bits of a 0fXXXXXXXX literal (or a decimal float literal rounded to f32)
    kF64,     // imm = raw IEEE bits of a 0dXXXXXXXXXXXXXXXX literal (or a decimal float literal)
    kVec,     // {a, b, ...}: elems = Function::vec_elems[vec_begin .. vec_begin + vec_count)
    kMem,     // [base + offset]: reg = base register slot or -1, sym = symbol or -1, imm = offset
    kSym,     // a symbol's name used as a value (address of a variable, a function, a param)
    kLabel,   // branch target: imm = instruction index in Function::code
    kSreg,    // imm = Sreg code
    kSink,    // `_`
  };
  Kind kind = kNone;
  bool neg = false;     // `!%p` as an operand (e.g. in selp/and.pred or a predicate input of wgmma)
  int32_t reg = -1;
  int32_t sym = -1;
  int64_t imm = 0;
  uint32_t vec_begin = 0, vec_count = 0;
};

struct Instr {
  std::string opcode;              // "ld", "mbarrier", "wgmma", "cp", "bra", ...
  std::vector<std::string> mods;   // the dot-modifiers in order, without the dot:
                                   // "ld.global.nc.v4.u32" -> {"global","nc","v4","u32"};
                                   // "mbarrier.try_wait.parity.shared::cta.b64" ->
                                   // {"try_wait","parity","shared::cta","b64"}
  std::vector<Operand> ops;        // in source order; for `setp ... %p|%q, a, b` the destination is a
                                   // kVec of two registers; call's `(ret), func, (args)` lists are kVec
  int32_t guard = -1;              // `@%p` predicate register slot, or -1
  bool guard_neg = false;          // `@!%p`
  int32_t line = 0;                // 1-based line in the PTX text
};

struct Symbol {
  enum Space : uint8_t { kGlobal, kConst, kShared, kLocal, kParam, kFunc, kTexref };
  std::string name;                // as written (block-scoped names are unique per symbol anyway)
  Space space = kGlobal;
  bool is_extern = false;          // `.extern` (e.g. dynamic shared memory `[]`)
  bool is_entry = false;           // kFunc: a kernel (.entry)
  uint64_t size = 0;               // bytes (0 for `[]` arrays)
  uint32_t align = 1;              // bytes (explicit .align, else the element size)
  uint32_t elem_bytes = 1;         // element size of its type (.b8 -> 1, .u64 -> 8, .v4.f32 -> 16)
  std::vector<uint8_t> init;       // initial bytes (empty when no initializer; then zero-filled)
  struct Reloc { uint64_t offset; int32_t sym; int64_t addend; bool generic; };
  std::vector<Reloc> relocs;       // initializer elements that are symbol addresses: the 8 bytes at
                                   // `offset` get address(sym) + addend (generic() or plain name)
  int32_t func = -1;               // kFunc: index into Module::functions (-1 if only declared);
                                   // kLocal/kParam declared inside a function: the owning function
};

struct RegInfo {
  std::string name;                // "%r12", "%p3", or a block-scoped name like "p"
  uint16_t bits = 32;              // declared width: .pred -> 1, .b16/.f16 -> 16, .b32 -> 32, .b64 -> 64, .b128 -> 128
  bool is_pred = false;
  bool is_float = false;           // declared .f16/.f32/.f64 (information only)
};

struct Function {
  std::string name;
  bool is_entry = false;
  int32_t sym = -1;                       // its kFunc symbol
  std::vector<int32_t> params;            // formal parameters (kParam symbols), in order
  std::vector<int32_t> rets;              // return parameters of a .func (kParam symbols)
  std::vector<int32_t> body_params;       // .param declared in the body (call arguments), kParam
  std::vector<int32_t> locals;            // .local declared in the body (e.g. __local_depot0)
  std::vector<int32_t> shared;            // .shared declared in the body
  std::vector<RegInfo> regs;              // register slots; block-scoped declarations get own slots
  std::vector<Instr> code;
  std::vector<Operand> vec_elems;         // storage of kVec elements
  // Performance / launch directives (0 = absent).
  uint32_t maxntid[3] = {0, 0, 0}, reqntid[3] = {0, 0, 0};
  uint32_t minnctapersm = 0, maxnreg = 0, maxclusterrank = 0;
  uint32_t reqnctapercluster[3] = {0, 0, 0};
  bool explicitcluster = false;
  bool has_body = false;                  // false for `.extern .func` declarations (vprintf, ...)
};

struct Module {
  std::string source;                     // a name for messages (file or kernel image)
  uint32_t version_major = 0, version_minor = 0;
  std::string target;                     // "sm_90a"
  std::vector<Symbol> symbols;
  std::unordered_map<std::string, int32_t> global_names;   // module-scope names -> symbol index
  std::vector<Function> functions;
};

// Parses PTX text. On a syntax error throws std::runtime_error("file:line: message").
// Handles: comments, .version/.target/.address_size, .file/.loc/.section/@@DWARF (skipped),
// module- and function-scope variable declarations with initializers (numbers, float literals,
// symbol addresses, generic(sym)), .entry/.func with params and return params, performance
// directives, `{ }` scopes with block-scoped .reg/.param declarations, `.reg .b32 %r<N>;` ranges,
// labels, guards, all operand forms above, `.pragma`, `call` in all its forms, and inline-asm
// chunks that nvcc pastes verbatim.
Module parse_ptx(const std::string& text, const std::string& source_name);

}  // namespace hsim
