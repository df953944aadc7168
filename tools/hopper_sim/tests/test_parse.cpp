// Unit test of the PTX parser: hand-written snippets with exact expected structure, error messages,
// then every sample under tests/ptx/parse_*.ptx (nvcc 13 output of the parse_*.cu next to them) and
// the CUTLASS example 48 PTX when present, with the parse time. Regenerate a sample with
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -ptx parse_a.cu -o parse_a.ptx
// (parse_a_lineinfo.ptx adds -lineinfo, parse_a_debug.ptx uses -G instead of -O3).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "check.h"
#include "ptx_ir.h"

using namespace hsim;

namespace {

const Function* find_fn(const Module& m, const std::string& name) {
  auto it = m.global_names.find(name);
  if (it == m.global_names.end() || m.symbols[it->second].space != Symbol::kFunc) return nullptr;
  int f = m.symbols[it->second].func;
  return f < 0 ? nullptr : &m.functions[f];
}
const Symbol* find_sym(const Module& m, const std::string& name) {
  auto it = m.global_names.find(name);
  return it == m.global_names.end() ? nullptr : &m.symbols[it->second];
}
std::string reg_name(const Function& f, const Operand& o) {
  return o.kind == Operand::kReg ? f.regs[o.reg].name : std::string("<not a reg>");
}
// "op.mod1.mod2" of an instruction, to compare whole opcodes compactly.
std::string full_op(const Instr& in) {
  std::string s = in.opcode;
  for (const auto& m : in.mods) s += "." + m;
  return s;
}
const Operand& elem(const Function& f, const Operand& v, int i) { return f.vec_elems[v.vec_begin + i]; }

std::string parse_error(const std::string& text) {
  try {
    parse_ptx(text, "err.ptx");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

const char* kHeader = ".version 9.0\n.target sm_90a\n.address_size 64\n";

void test_globals() {
  std::string src = std::string(kHeader) + R"(
.global .align 4 .u32 gcount = 7;
.global .align 2 .b8 gs[6] = {1, 0, 254, 255, 3};
.global .align 8 .u64 gl = -5;
.global .align 4 .f32 gf[3] = {0f3F800000, 0fBF800000};
.global .align 8 .f64 gd = 0d4000000000000000;
.global .align 2 .u16 gh[2] = {0xFFFF, 017};
.const .align 4 .b8 cvals[8] = {1, 0, 0, 0, 2};
.global .align 8 .u64 gptr = generic(gcount);
.global .align 8 .u64 gsarr[4] = {1, generic(gs)+4, gcount, _Z5twicei};
.global .align 1 .b8 $str[] = {104, 105, 0};
.global .align 1 .b8 nz[4];
.extern .shared .align 16 .b8 dyn[];
.global .align 16 .v4.f32 vv[2];
.func  (.param .b32 func_retval0) _Z5twicei(.param .b32 _Z5twicei_param_0);
)";
  Module m = parse_ptx(src, "globals.ptx");
  CHECK_EQ(m.version_major, 9u);
  CHECK_EQ(m.version_minor, 0u);
  CHECK(m.target == "sm_90a");
  const Symbol* s = find_sym(m, "gcount");
  CHECK(s && s->space == Symbol::kGlobal && s->size == 4 && s->align == 4 && s->elem_bytes == 4);
  CHECK(s && s->init.size() == 4 && s->init[0] == 7 && s->init[1] == 0);
  s = find_sym(m, "gs");
  CHECK(s && s->size == 6 && s->init.size() == 6);
  if (s && s->init.size() == 6) {
    CHECK_EQ(s->init[2], 254);
    CHECK_EQ(s->init[3], 255);
    CHECK_EQ(s->init[4], 3);
    CHECK_EQ(s->init[5], 0);   // missing initializers are zero
  }
  s = find_sym(m, "gl");
  CHECK(s && s->init.size() == 8 && s->init[0] == 0xFB && s->init[7] == 0xFF);
  s = find_sym(m, "gf");
  CHECK(s && s->size == 12 && s->init.size() == 12);
  if (s && s->init.size() == 12) {
    CHECK_EQ(s->init[3], 0x3F);
    CHECK_EQ(s->init[7], 0xBF);
    CHECK_EQ(s->init[11], 0);
  }
  s = find_sym(m, "gd");
  CHECK(s && s->init.size() == 8 && s->init[7] == 0x40 && s->init[0] == 0);
  s = find_sym(m, "gh");
  CHECK(s && s->init.size() == 4 && s->init[0] == 0xFF && s->init[1] == 0xFF && s->init[2] == 15);
  s = find_sym(m, "cvals");
  CHECK(s && s->space == Symbol::kConst && s->size == 8 && s->init.size() == 8 && s->init[4] == 2);
  s = find_sym(m, "gptr");
  CHECK(s && s->relocs.size() == 1);
  if (s && s->relocs.size() == 1) {
    CHECK_EQ(s->relocs[0].offset, 0u);
    CHECK_EQ(s->relocs[0].sym, m.global_names.at("gcount"));
    CHECK_EQ(s->relocs[0].addend, 0);
    CHECK(s->relocs[0].generic);
  }
  s = find_sym(m, "gsarr");
  CHECK(s && s->size == 32 && s->relocs.size() == 3 && s->init.size() == 32);
  if (s && s->relocs.size() == 3) {
    CHECK_EQ(s->init[0], 1);
    CHECK_EQ(s->relocs[0].offset, 8u);
    CHECK_EQ(s->relocs[0].sym, m.global_names.at("gs"));
    CHECK_EQ(s->relocs[0].addend, 4);
    CHECK(s->relocs[0].generic);
    CHECK_EQ(s->relocs[1].offset, 16u);
    CHECK(!s->relocs[1].generic);
    CHECK_EQ(s->relocs[2].offset, 24u);
    // A function declared later in the file: resolved at the end of the module.
    CHECK_EQ(s->relocs[2].sym, m.global_names.at("_Z5twicei"));
  }
  s = find_sym(m, "$str");
  CHECK(s && s->size == 3 && s->init.size() == 3 && s->init[1] == 105);
  s = find_sym(m, "nz");
  CHECK(s && s->size == 4 && s->init.empty());
  s = find_sym(m, "dyn");
  CHECK(s && s->space == Symbol::kShared && s->is_extern && s->size == 0 && s->align == 16);
  s = find_sym(m, "vv");
  CHECK(s && s->elem_bytes == 16 && s->size == 32 && s->align == 16);
  const Function* f = find_fn(m, "_Z5twicei");
  CHECK(f && !f->has_body && f->params.size() == 1 && f->rets.size() == 1);
}

void test_functions() {
  std::string src = std::string(kHeader) + R"(
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.func  (.param .b32 func_retval0) _Z6helperi
(
	.param .b32 _Z6helperi_param_0
)
;
.weak .func _Z4voidv()
{
	ret;
}
.func  (.param .b32 func_retval0) _Z6helperi(
	.param .b32 _Z6helperi_param_0
)
{
	.reg .b32 	%r<3>;
	ld.param.u32 	%r1, [_Z6helperi_param_0];
	add.s32 %r2, %r1, 1;
	st.param.b32 	[func_retval0+0], %r2;
	ret;
}
.visible .entry _Z1kPfS_(
	.param .align 64 .b8 _Z1kPfS__param_0[128],
	.param .u64 .ptr .global .align 1 _Z1kPfS__param_1,
	.param .f32 _Z1kPfS__param_2
)
.maxntid 384, 1, 1
.minnctapersm 1
.reqnctapercluster 2, 1, 1
.explicitcluster
.maxnreg 168
{
	ret;
}
.entry k2()
.reqntid 128
.maxclusterrank 8
{
	exit;
}
)";
  Module m = parse_ptx(src, "funcs.ptx");
  const Function* vp = find_fn(m, "vprintf");
  CHECK(vp && !vp->has_body && !vp->is_entry && vp->params.size() == 2 && vp->rets.size() == 1);
  if (vp && vp->params.size() == 2) {
    const Symbol& p = m.symbols[vp->params[1]];
    CHECK(p.name == "vprintf_param_1" && p.space == Symbol::kParam && p.size == 8);
    CHECK_EQ(m.symbols[vp->rets[0]].size, 4u);
  }
  // Prototype + definition: one function, one symbol.
  int count = 0;
  for (const auto& fn : m.functions) count += fn.name == "_Z6helperi";
  CHECK_EQ(count, 1);
  const Function* h = find_fn(m, "_Z6helperi");
  CHECK(h && h->has_body && h->params.size() == 1 && h->rets.size() == 1 && h->code.size() == 4);
  if (h && h->code.size() == 4) {
    CHECK_EQ(h->code[0].ops[1].kind, Operand::kMem);
    CHECK_EQ(h->code[0].ops[1].sym, h->params[0]);
    CHECK_EQ(h->code[2].ops[0].sym, h->rets[0]);
    CHECK_EQ(m.symbols[h->sym].func, (int32_t)(h - m.functions.data()));
    CHECK_EQ(m.symbols[h->params[0]].func, (int32_t)(h - m.functions.data()));
  }
  const Function* v = find_fn(m, "_Z4voidv");
  CHECK(v && v->has_body && v->params.empty() && v->rets.empty() && v->code.size() == 1);
  const Function* k = find_fn(m, "_Z1kPfS_");
  CHECK(k && k->is_entry && k->params.size() == 3);
  if (k && k->params.size() == 3) {
    CHECK(m.symbols[k->sym].is_entry);
    const Symbol& p0 = m.symbols[k->params[0]];
    CHECK(p0.size == 128 && p0.align == 64 && p0.elem_bytes == 1);
    const Symbol& p1 = m.symbols[k->params[1]];
    CHECK(p1.size == 8 && p1.align == 8);   // .align after .ptr is the pointee's
    const Symbol& p2 = m.symbols[k->params[2]];
    CHECK(p2.size == 4 && p2.name == "_Z1kPfS__param_2");
    CHECK_EQ(k->maxntid[0], 384u);
    CHECK_EQ(k->maxntid[1], 1u);
    CHECK_EQ(k->minnctapersm, 1u);
    CHECK_EQ(k->reqnctapercluster[0], 2u);
    CHECK_EQ(k->reqnctapercluster[2], 1u);
    CHECK(k->explicitcluster);
    CHECK_EQ(k->maxnreg, 168u);
  }
  const Function* k2 = find_fn(m, "k2");
  CHECK(k2 && k2->reqntid[0] == 128 && k2->reqntid[1] == 1 && k2->maxclusterrank == 8);
  // Param names are function-scoped: not module names.
  CHECK(m.global_names.count("_Z6helperi_param_0") == 0);
}

void test_body() {
  std::string src = std::string(kHeader) + R"(
.file	1 "/tmp/x.cu"
.extern .func  (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.func _Z1fv()
{
	ret;
}
.global .align 4 .b8 garr[64];
.shared .align 8 .u64 bar;
.visible .entry kern(
	.param .u64 kern_param_0
)
{
	.local .align 16 .b8 	__local_depot0[32];
	.reg .b64 	%SP;
	.reg .b64 	%SPL;
	.reg .pred 	%p<4>;
	.reg .b16 	%rs<2>;
	.reg .f32 	%f<3>;
	.reg .b32 	%r<100>;
	.reg .f64 	%fd<2>;
	.reg .b64 	%rd<6>;
	.reg .b128 	%q1;
	.loc	1 5 3
	mov.u64 	%SPL, __local_depot0;
	ld.param.u64 	%rd1, [kern_param_0];
	mov.u32 	%r1, %tid.y;
	mov.u32 	%r2, %cluster_ctaid.z;
$L__BB0_1:
	.pragma "nounroll";
	mov.u32 	%r3, %envreg3;
	mov.u64 	%rd2, %clock64;
	mov.u32 	%r4, %globaltimer_lo;
	setp.lt.s32 	%p1|%p2, %r1, -16;
	@!%p1 bra 	$L__BB0_3;
	@%p2 bra.uni 	$L__BB0_1;
	shfl.sync.bfly.b32 	%r5|%p3, %r1, 1, 31, -1;
	mov.f32 	%f1, 0f3F800000;
	mov.f64 	%fd1, 0d3FF0000000000000;
	mov.f32 	%f2, 1.5;
	mov.b32 	%r6, 0xFFFFFFFF;
	mov.b32 	%r7, 017;
	mov.b32 	%r8, 0b101;
	mov.b32 	%r9, -2147483648;
	ld.global.u32 	%r10, [%rd1];
	ld.global.u32 	%r11, [%rd1+16];
	ld.global.u32 	%r12, [%rd1+-16];
	ld.global.u32 	%r13, [garr];
	ld.global.u32 	%r14, [garr+8];
	ld.shared.u32 	%r15, [%r5];
	ld.local.u32 	%r16, [0x1234];
	st.local.v4.u32 	[%SPL+16], {%r10, %r11, %r12, %r13};
	mov.b64 	{%r17, _}, %rd1;
	atom.global.add.u32 	%r18, [%rd1], 1;
	selp.u32 	%r19, 1, 0, !%p1;
	mov.u32 	%r20, garr;
	cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r20], [%rd1, {%r1, %r2}], [%r19];
	mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], %r1;
$L__BB0_3:
	{
	.reg .pred p;
	.reg .b32 %r1;
	setp.ne.b32 p, %r2, 0;
	mov.b32 %r1, 5;
	}
	{
	.reg .pred p;
	setp.eq.b32 p, %r1, 0;
	}
	{
	.reg .pred P1;
	LAB_WAIT:
	mbarrier.try_wait.parity.shared::cta.b64 P1, [%r20], %r1;
	@!P1 bra LAB_WAIT;
	bra DONE;
	DONE:
	}
	{
	.reg .pred P1;
	LAB_WAIT:
	@P1 bra.uni LAB_WAIT;
	}
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd1;
	.param .b64 param1;
	st.param.b64 	[param1+0], %rd2;
	.param .b32 retval0;
	call.uni (retval0),
	vprintf,
	(
	param0,
	param1
	);
	ld.param.b32 	%r21, [retval0+0];
	} // callseq 0
	{ // callseq 1, 0
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd1;
	call.uni _Z1fv, (param0);
	}
	call.uni _Z1fv, ();
	call.uni _Z1fv;
	{
	.param .b32 retval0;
	prototype_0 : .callprototype (.param .b32 _) _ (.param .b64 _);
	call (retval0), %rd3, (param0_x), prototype_0;
	}
	mov.b32 %r22, %r99;
	ret;
}
.section	.debug_str
{
$L__info_string0:
.b8 95,90,0
}
@@DWARF .byte 1
)";
  // The indirect call above names an undeclared param: that must be an error...
  std::string err = parse_error(src);
  CHECK(err.find("param0_x") != std::string::npos);
  // ... and parses once declared.
  size_t at = src.find("prototype_0 :");
  src.insert(at, ".param .b64 param0_x;\n\t");
  Module m;
  try {
    m = parse_ptx(src, "body.ptx");
  } catch (const std::exception& e) {
    std::printf("unexpected parse error: %s\n", e.what());
    CHECK(false);
    return;
  }
  const Function* k = find_fn(m, "kern");
  CHECK(k != nullptr);
  if (!k) return;
  const Function& f = *k;
  // Register slots: %SP, %SPL, %p0..3, %rs0..1, %f0..2, %r0..99, %fd0..1, %rd0..5, %q1 = 120;
  // then block-scoped p, %r1, p, P1, P1, temp_param_reg = 126.
  CHECK_EQ(f.regs.size(), 126u);
  CHECK(f.regs[0].name == "%SP" && f.regs[0].bits == 64);
  CHECK(f.regs[2].name == "%p0" && f.regs[2].bits == 1 && f.regs[2].is_pred);
  CHECK(f.regs[6].name == "%rs0" && f.regs[6].bits == 16);
  CHECK(f.regs[8].name == "%f0" && f.regs[8].bits == 32 && f.regs[8].is_float);
  CHECK(f.regs[11].name == "%r0" && f.regs[11].bits == 32 && !f.regs[11].is_float);
  CHECK(f.regs[110].name == "%r99");
  CHECK(f.regs[111].name == "%fd0" && f.regs[111].bits == 64 && f.regs[111].is_float);
  CHECK(f.regs[119].name == "%q1" && f.regs[119].bits == 128);
  CHECK_EQ(f.locals.size(), 1u);
  if (f.locals.size() == 1) {
    const Symbol& d = m.symbols[f.locals[0]];
    CHECK(d.name == "__local_depot0" && d.space == Symbol::kLocal && d.size == 32 && d.align == 16);
    CHECK_EQ(d.func, (int32_t)(k - m.functions.data()));
  }
  int i = 0;
  auto next = [&]() -> const Instr& { return f.code[i++]; };
  const Instr* in = &next();  // mov.u64 %SPL, __local_depot0
  CHECK(full_op(*in) == "mov.u64" && reg_name(f, in->ops[0]) == "%SPL");
  CHECK(in->ops[1].kind == Operand::kSym && in->ops[1].sym == f.locals[0]);
  in = &next();  // ld.param.u64 %rd1, [kern_param_0]
  CHECK(in->ops[1].kind == Operand::kMem && in->ops[1].sym == f.params[0] && in->ops[1].reg == -1 &&
        in->ops[1].imm == 0);
  in = &next();
  CHECK(in->ops[1].kind == Operand::kSreg && in->ops[1].imm == kSregTid + 1);
  in = &next();
  CHECK(in->ops[1].kind == Operand::kSreg && in->ops[1].imm == kSregClusterCtaid + 2);
  CHECK_EQ(i, 4);  // $L__BB0_1 -> instruction 4
  in = &next();
  CHECK(in->ops[1].kind == Operand::kSreg && in->ops[1].imm == kSregEnvreg0 + 3);
  in = &next();
  CHECK(in->ops[1].imm == kSregClock64);
  in = &next();
  CHECK(in->ops[1].imm == kSregGlobaltimerLo);
  in = &next();  // setp.lt.s32 %p1|%p2, %r1, -16
  CHECK(full_op(*in) == "setp.lt.s32" && in->ops.size() == 3);
  CHECK(in->ops[0].kind == Operand::kVec && in->ops[0].vec_count == 2);
  CHECK(reg_name(f, elem(f, in->ops[0], 0)) == "%p1" && reg_name(f, elem(f, in->ops[0], 1)) == "%p2");
  CHECK(in->ops[2].kind == Operand::kImm && in->ops[2].imm == -16);
  in = &next();  // @!%p1 bra $L__BB0_3
  CHECK(in->guard >= 0 && f.regs[in->guard].name == "%p1" && in->guard_neg);
  CHECK(in->opcode == "bra" && in->ops[0].kind == Operand::kLabel);
  int bra_fwd = i - 1;
  in = &next();  // @%p2 bra.uni $L__BB0_1
  CHECK(!in->guard_neg && in->mods.size() == 1 && in->mods[0] == "uni");
  CHECK(in->ops[0].kind == Operand::kLabel && in->ops[0].imm == 4);
  in = &next();  // shfl
  CHECK(full_op(*in) == "shfl.sync.bfly.b32" && in->ops.size() == 5 && in->ops[0].kind == Operand::kVec);
  CHECK(in->ops[4].kind == Operand::kImm && in->ops[4].imm == -1);
  in = &next();
  CHECK(in->ops[1].kind == Operand::kF32 && in->ops[1].imm == 0x3F800000);
  in = &next();
  CHECK(in->ops[1].kind == Operand::kF64 && (uint64_t)in->ops[1].imm == 0x3FF0000000000000ull);
  in = &next();
  CHECK(in->ops[1].kind == Operand::kF64 && (uint64_t)in->ops[1].imm == 0x3FF8000000000000ull);
  in = &next();
  CHECK(in->ops[1].kind == Operand::kImm && in->ops[1].imm == 4294967295ll);
  in = &next();
  CHECK_EQ(in->ops[1].imm, 15);
  in = &next();
  CHECK_EQ(in->ops[1].imm, 5);
  in = &next();
  CHECK_EQ(in->ops[1].imm, -2147483648ll);
  in = &next();  // [%rd1]
  CHECK(in->ops[1].kind == Operand::kMem && reg_name(f, Operand{Operand::kReg, false, in->ops[1].reg}) == "%rd1");
  CHECK(in->ops[1].sym == -1 && in->ops[1].imm == 0);
  in = &next();
  CHECK_EQ(in->ops[1].imm, 16);
  in = &next();
  CHECK_EQ(in->ops[1].imm, -16);
  in = &next();  // [garr]
  CHECK(in->ops[1].reg == -1 && in->ops[1].sym == m.global_names.at("garr") && in->ops[1].imm == 0);
  in = &next();
  CHECK(in->ops[1].sym == m.global_names.at("garr") && in->ops[1].imm == 8);
  in = &next();  // [%r5]
  CHECK(f.regs[in->ops[1].reg].name == "%r5");
  in = &next();  // [0x1234]
  CHECK(in->ops[1].kind == Operand::kMem && in->ops[1].reg == -1 && in->ops[1].sym == -1 &&
        in->ops[1].imm == 0x1234);
  in = &next();  // st.local.v4.u32 [%SPL+16], {...}
  CHECK(full_op(*in) == "st.local.v4.u32" && in->ops[1].kind == Operand::kVec && in->ops[1].vec_count == 4);
  CHECK(reg_name(f, elem(f, in->ops[1], 3)) == "%r13");
  in = &next();  // mov.b64 {%r17, _}, %rd1
  CHECK(in->ops[0].kind == Operand::kVec && in->ops[0].vec_count == 2 &&
        elem(f, in->ops[0], 1).kind == Operand::kSink && reg_name(f, elem(f, in->ops[0], 0)) == "%r17");
  in = &next();  // atom
  CHECK(full_op(*in) == "atom.global.add.u32" && in->ops.size() == 3);
  in = &next();  // selp ... !%p1
  CHECK(in->ops[3].kind == Operand::kReg && in->ops[3].neg && f.regs[in->ops[3].reg].name == "%p1");
  in = &next();  // mov.u32 %r20, garr
  CHECK(in->ops[1].kind == Operand::kSym && in->ops[1].sym == m.global_names.at("garr"));
  in = &next();  // cp.async.bulk.tensor...
  CHECK(in->opcode == "cp" && in->mods.size() == 8);
  if (in->mods.size() == 8) {
    CHECK(in->mods[4] == "shared::cluster");
    CHECK(in->mods[7] == "mbarrier::complete_tx::bytes");
  }
  CHECK(in->ops.size() == 3 && in->ops[1].kind == Operand::kMem && in->ops[1].vec_count == 2);
  if (in->ops.size() == 3)
    CHECK(reg_name(f, elem(f, in->ops[1], 1)) == "%r2" && f.regs[in->ops[1].reg].name == "%rd1");
  in = &next();  // mbarrier.try_wait.parity.shared::cta.b64 %p1, [bar], %r1
  CHECK(in->mods.size() == 4 && in->mods[2] == "shared::cta" && in->ops[1].sym == m.global_names.at("bar"));
  // $L__BB0_3 = here.
  CHECK_EQ(f.code[bra_fwd].ops[0].imm, i);
  in = &next();  // setp.ne.b32 p, %r2, 0 (block 1)
  int p_block1 = in->ops[0].reg;
  CHECK(f.regs[p_block1].name == "p" && f.regs[p_block1].is_pred);
  in = &next();  // mov.b32 %r1 (inner, shadowing) , 5
  int r1_inner = in->ops[0].reg;
  CHECK(f.regs[r1_inner].name == "%r1" && r1_inner != 12);
  in = &next();  // setp.eq.b32 p, %r1, 0 (block 2): another p, the outer %r1
  CHECK(in->ops[0].reg != p_block1 && f.regs[in->ops[0].reg].name == "p");
  CHECK_EQ(in->ops[1].reg, 12);  // outer %r1 is slot 11 + 1
  int wait1 = i;
  in = &next();  // try_wait P1
  int P1a = in->ops[0].reg;
  in = &next();  // @!P1 bra LAB_WAIT
  CHECK(in->guard == P1a && in->guard_neg && in->ops[0].kind == Operand::kLabel && in->ops[0].imm == wait1);
  in = &next();  // bra DONE (forward, block-scoped)
  CHECK(in->ops[0].kind == Operand::kLabel && in->ops[0].imm == i);
  int wait2 = i;
  in = &next();  // @P1 bra.uni LAB_WAIT in the sibling block
  CHECK(in->guard != P1a && in->guard >= 0 && in->ops[0].imm == wait2);
  // callseq 0
  in = &next();  // st.param.b64 [param0+0], %rd1
  CHECK(in->ops[0].kind == Operand::kMem && in->ops[0].sym >= 0);
  int param0_a = in->ops[0].sym;
  CHECK(m.symbols[param0_a].space == Symbol::kParam && m.symbols[param0_a].name == "param0");
  in = &next();
  in = &next();  // call.uni (retval0), vprintf, (param0, param1)
  CHECK(full_op(*in) == "call.uni" && in->ops.size() == 3);
  if (in->ops.size() == 3) {
    CHECK(in->ops[0].kind == Operand::kVec && in->ops[0].vec_count == 1);
    CHECK(elem(f, in->ops[0], 0).kind == Operand::kSym && m.symbols[elem(f, in->ops[0], 0).sym].name == "retval0");
    CHECK(in->ops[1].kind == Operand::kSym && in->ops[1].sym == m.global_names.at("vprintf"));
    CHECK(in->ops[2].kind == Operand::kVec && in->ops[2].vec_count == 2);
    CHECK(elem(f, in->ops[2], 0).sym == param0_a);
  }
  in = &next();  // ld.param.b32 %r21, [retval0+0]
  CHECK(in->ops[1].kind == Operand::kMem && m.symbols[in->ops[1].sym].name == "retval0");
  // callseq 1: its own param0
  in = &next();
  int param0_b = in->ops[0].sym;
  CHECK(param0_b >= 0 && param0_b != param0_a && m.symbols[param0_b].name == "param0");
  in = &next();  // call.uni _Z1fv, (param0)
  CHECK(in->ops.size() == 3 && in->ops[0].kind == Operand::kVec && in->ops[0].vec_count == 0);
  CHECK(in->ops[1].kind == Operand::kSym && in->ops[1].sym == m.global_names.at("_Z1fv"));
  CHECK(in->ops[2].vec_count == 1 && elem(f, in->ops[2], 0).sym == param0_b);
  in = &next();  // call.uni _Z1fv, ()
  CHECK(in->ops.size() == 3 && in->ops[0].vec_count == 0 && in->ops[2].kind == Operand::kVec &&
        in->ops[2].vec_count == 0);
  in = &next();  // call.uni _Z1fv;
  CHECK(in->ops.size() == 3 && in->ops[0].kind == Operand::kVec && in->ops[2].kind == Operand::kVec);
  in = &next();  // call (retval0), %rd3, (param0_x), prototype_0
  CHECK(in->opcode == "call" && in->mods.empty() && in->ops.size() == 4);
  if (in->ops.size() == 4) {
    CHECK(in->ops[1].kind == Operand::kReg && in->ops[2].vec_count == 1);
    CHECK(in->ops[3].kind == Operand::kSym && m.symbols[in->ops[3].sym].name == "prototype_0");
  }
  in = &next();  // mov.b32 %r22, %r99
  CHECK(reg_name(f, in->ops[1]) == "%r99");
  in = &next();
  CHECK(in->opcode == "ret" && in->ops.empty());
  CHECK_EQ((size_t)i, f.code.size());
  CHECK_EQ(f.body_params.size(), 6u);  // 2 + retval0 + 1 + retval0 + param0_x
  CHECK(f.code[0].line > 0 && f.code[1].line == f.code[0].line + 1);
}

void test_errors() {
  std::string pre = std::string(kHeader) + ".entry k()\n{\n.reg .b32 %r<2>;\n";
  std::string e = parse_error(pre + "mov.u32 %r5, 1;\n}\n");
  CHECK(e.find("err.ptx:7:") == 0 && e.find("%r5") != std::string::npos);
  e = parse_error(pre + "bra $L__nowhere;\n}\n");
  CHECK(e.find("err.ptx:7:") == 0 && e.find("$L__nowhere") != std::string::npos);
  e = parse_error(pre + "mov.u32 %r1, %bogus;\n}\n");
  CHECK(e.find("%bogus") != std::string::npos);
  e = parse_error(pre + "mov.u32 %r1 %r0;\n}\n");
  CHECK(e.find("err.ptx:7:") == 0);
  e = parse_error(pre + ".foo 1;\n}\n");
  CHECK(e.find(".foo") != std::string::npos);
  e = parse_error(pre + "mov.u32 %r1, 1;\n");
  CHECK(e.find("end of input") != std::string::npos);
  e = parse_error(std::string(kHeader) + ".global .u32 x = ;\n");
  CHECK(e.find("err.ptx:4:") == 0);
  e = parse_error(pre + "{ .reg .pred p; }\n@p bra $L;\n$L:\n}\n");  // p out of scope
  CHECK(e.find("err.ptx:8:") == 0 && e.find("'p'") != std::string::npos);
  // A label in a sibling block is not visible.
  e = parse_error(pre + "{ L1: ret; }\n{ bra L1; }\n}\n");
  CHECK(e.find("L1") != std::string::npos);
}

void test_misc() {
  std::string src = std::string(kHeader) + R"(
.extern .func __assertfail
(
	.param .b64 __assertfail_param_0
)
.noreturn;
.entry k(.param .u32 k_param_0)
{
	.reg .pred %p<2>;
	.reg .b32 %r<3>;
	ld.param.u32 %r1, [k_param_0];
L0:
	add.s32 %r2, %r1, 1;
L1:
	;
	ts: .branchtargets L0, L1, L2;
	brx.idx %r1, ts;
L2:
	mov.u64 %rd_missing_is_fine_in_comment, 0; // not parsed: see below
}
.section .debug_abbrev {
.b8 1, 17, 1
}
)";
  // The `%rd_missing...` register is undeclared: an error naming it.
  std::string e = parse_error(src);
  CHECK(e.find("%rd_missing_is_fine_in_comment") != std::string::npos);
  size_t at = src.find("\tmov.u64 %rd_missing");
  src.replace(at, src.find('\n', at) - at, "\tret;");
  Module m;
  try {
    m = parse_ptx(src, "misc.ptx");
  } catch (const std::exception& ex) {
    std::printf("unexpected parse error: %s\n", ex.what());
    CHECK(false);
    return;
  }
  const Function* af = find_fn(m, "__assertfail");
  CHECK(af && !af->has_body && af->params.size() == 1);
  const Function* k = find_fn(m, "k");
  CHECK(k && k->code.size() == 4);
  if (!k || k->code.size() != 4) return;
  const Instr& brx = k->code[2];
  CHECK(brx.opcode == "brx" && brx.ops.size() == 2 && brx.ops[1].kind == Operand::kVec &&
        brx.ops[1].vec_count == 3);
  if (brx.ops.size() == 2 && brx.ops[1].vec_count == 3) {
    CHECK_EQ(elem(*k, brx.ops[1], 0).kind, Operand::kLabel);
    CHECK_EQ(elem(*k, brx.ops[1], 0).imm, 1);
    CHECK_EQ(elem(*k, brx.ops[1], 1).imm, 2);
    CHECK_EQ(elem(*k, brx.ops[1], 2).imm, 3);
  }
}

void test_redeclarations() {
  std::string src = std::string(kHeader) + R"(
.extern .shared .align 16 .b8 dyn[];
.extern .global .align 4 .u32 x;
.entry k1()
{
	.reg .b32 %r<3>;
	mov.u32 %r1, dyn;
	ld.global.u32 %r2, [x];
	ret;
}
.extern .shared .align 16 .b8 dyn[];
.global .align 4 .u32 x = 5;
.entry k2()
{
	.reg .b32 %r<2>;
	mov.u32 %r1, dyn;
	ret;
}
)";
  Module m = parse_ptx(src, "redecl.ptx");
  const Function* k1 = find_fn(m, "k1");
  const Function* k2 = find_fn(m, "k2");
  CHECK(k1 && k2);
  if (!k1 || !k2) return;
  CHECK_EQ(k1->code[0].ops[1].sym, k2->code[0].ops[1].sym);
  CHECK_EQ(k1->code[0].ops[1].sym, m.global_names.at("dyn"));
  const Symbol& x = m.symbols[k1->code[1].ops[1].sym];
  CHECK(x.name == "x" && !x.is_extern && x.init.size() == 4 && x.init[0] == 5);
  CHECK_EQ(k1->code[1].ops[1].sym, m.global_names.at("x"));
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

void parse_file(const std::string& path) {
  std::string text;
  if (!read_file(path, &text)) {
    std::printf("cannot read %s\n", path.c_str());
    CHECK(false);
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    Module m = parse_ptx(text, path);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    size_t n = 0, bodies = 0;
    for (const auto& fn : m.functions) { n += fn.code.size(); bodies += fn.has_body; }
    std::printf("parsed %s: %.2f ms, %zu functions (%zu with body), %zu symbols, %zu instructions\n",
                path.c_str(), ms, m.functions.size(), bodies, m.symbols.size(), n);
    CHECK(n > 0);
    // Every label operand got resolved; every operand index is in range.
    bool ok = true;
    for (const auto& fn : m.functions)
      for (const auto& in : fn.code)
        for (const auto& op : in.ops) {
          if (op.kind == Operand::kLabel && (op.imm < 0 || op.imm > (int64_t)fn.code.size())) ok = false;
          if (op.kind == Operand::kReg && (op.reg < 0 || op.reg >= (int)fn.regs.size())) ok = false;
          if (op.kind == Operand::kSym && (op.sym < 0 || op.sym >= (int)m.symbols.size())) ok = false;
          if ((op.kind == Operand::kVec || op.vec_count) && op.vec_begin + op.vec_count > fn.vec_elems.size()) ok = false;
        }
    CHECK(ok);
  } catch (const std::exception& e) {
    std::printf("FAIL parsing %s: %s\n", path.c_str(), e.what());
    CHECK(false);
  }
}

void test_samples() {
  namespace fs = std::filesystem;
  std::vector<std::string> dirs;
  if (const char* d = std::getenv("HSIM_TEST_PTX_DIR")) dirs.push_back(d);
  dirs.push_back(fs::path(__FILE__).parent_path().string() + "/ptx");
  dirs.push_back("tests/ptx");
  dirs.push_back("tools/hopper_sim/tests/ptx");
  int found = 0;
  for (const std::string& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      std::string name = e.path().filename().string();
      if (name.rfind("parse_", 0) == 0 && e.path().extension() == ".ptx") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) { parse_file(f); ++found; }
    break;
  }
  CHECK(found >= 6);
  const char* big = "/tmp/ex/48_hopper_warp_specialized_gemm.ptx";
  if (std::filesystem::exists(big)) parse_file(big);
  else std::printf("skipping %s (absent)\n", big);
}

// `.reg .v2/.v4 .T v;` (PTX ISA "Vectors": vector variables of registers, elements named .x .y .z .w
// or .r .g .b .a): one register per element; v as a whole is the vector {v.x, v.y, ...}.
void test_vector_regs() {
  std::string src = std::string(kHeader) + R"(
.entry k(.param .u64 k_param_0)
{
	.reg .v2 .f32 mx;
	.reg .v4 .b32 q, w;
	.reg .b64 %rd<2>;
	ld.param.u64 %rd1, [k_param_0];
	mov.f32 mx.x, 0f3F800000;
	add.f32 mx.y, mx.x, mx.r;
	ld.global.v4.b32 q, [%rd1];
	st.global.v2.f32 [%rd1], mx;
	mov.b32 w.a, q.z;
	ret;
}
)";
  Module m = parse_ptx(src, "vec.ptx");
  const Function* f = find_fn(m, "k");
  CHECK(f != nullptr);
  if (!f) return;
  // mx.x, mx.y, q.x..q.w, w.x..w.w: 10 element registers of their element width
  int n32 = 0;
  for (const auto& r : f->regs) if (r.name.find('.') != std::string::npos) { CHECK_EQ(r.bits, 32); ++n32; }
  CHECK_EQ(n32, 10);
  const Instr& mov = f->code[1];
  CHECK(reg_name(*f, mov.ops[0]) == "mx.x");
  const Instr& add = f->code[2];
  CHECK(reg_name(*f, add.ops[0]) == "mx.y");
  CHECK_EQ(add.ops[1].reg, add.ops[2].reg);   // .r is .x
  const Instr& ld = f->code[3];
  CHECK_EQ((int)ld.ops[0].kind, (int)Operand::kVec);
  CHECK_EQ(ld.ops[0].vec_count, 4u);
  CHECK(reg_name(*f, elem(*f, ld.ops[0], 0)) == "q.x");
  CHECK(reg_name(*f, elem(*f, ld.ops[0], 3)) == "q.w");
  const Instr& st = f->code[4];
  CHECK_EQ(st.ops[1].vec_count, 2u);
  CHECK(reg_name(*f, elem(*f, st.ops[1], 1)) == "mx.y");
  const Instr& mw = f->code[5];
  CHECK(reg_name(*f, mw.ops[0]) == "w.w");
  CHECK(reg_name(*f, mw.ops[1]) == "q.z");
}

}  // namespace

int main() {
  test_globals();
  test_functions();
  test_body();
  test_errors();
  test_misc();
  test_redeclarations();
  test_vector_regs();
  test_samples();
  return hsim_test::finish();
}
