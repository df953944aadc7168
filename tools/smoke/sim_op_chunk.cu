// The simulator driver's "fwd_chunk" and "bwd_chunk" ops: torch.ops.flash3.fwd_sm90 / bwd_sm90 with
// their attention_chunk argument (FA3's chunked local attention), through the host layer. The
// driver's own "fwd"/"bwd" (tools/hopper_sim/flash3/, frozen: its bytes key recorded ground truth)
// predate the argument; tools/smoke/smoke_sim.py links this file beside them (SIM_OPS).
//   tensors and scalars: the driver's "fwd" / "bwd" ops' (sim_driver.cu, sim_op_bwd.cu), and the
//   scalar attention_chunk
//   outputs: out lse / dq dk dv (dsinks when given)
#include "../hopper_sim/flash3/sim_case.h"

#include "flash3/host/bwd.h"
#include "flash3/host/fwd.h"

namespace {

using namespace simdrv;
namespace host = flash3::host;

void fwd_chunk(const Case& c, host::Backend& be) {
  const auto cu_q = view(c.opt("cu_seqlens_q")), cu_k = view(c.opt("cu_seqlens_k")),
             used = view(c.opt("seqused_k")), sinks = view(c.opt("sinks")), alibi = view(c.opt("alibi_slopes"));
  host::fwd_sm90(be, view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")), view(c.t("lse")), ptr(cu_q),
                 ptr(cu_k), ptr(used), c.integer("max_seqlen_q"), c.integer("max_seqlen_k"), c.num("softmax_scale"),
                 c.integer("window_left"), c.integer("window_right"), c.num("softcap"), ptr(sinks), ptr(alibi),
                 c.integer("attention_chunk"));
}

void bwd_chunk(const Case& c, host::Backend& be) {
  const auto dlse = view(c.opt("dlse")), cu_q = view(c.opt("cu_seqlens_q")), cu_k = view(c.opt("cu_seqlens_k")),
             sinks = view(c.opt("sinks")), dsinks = view(c.opt("dsinks")), alibi = view(c.opt("alibi_slopes"));
  host::bwd_sm90(be, view(c.t("dout")), view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")),
                 view(c.t("lse")), ptr(dlse), view(c.t("dq")), view(c.t("dk")), view(c.t("dv")), ptr(cu_q), ptr(cu_k),
                 c.integer("max_seqlen_q"), c.integer("max_seqlen_k"), c.num("softmax_scale"),
                 c.integer("window_left"), c.integer("window_right"), c.num("softcap"),
                 c.integer("deterministic") != 0, ptr(sinks), ptr(dsinks), ptr(alibi), c.integer("attention_chunk"));
}

const RegisterOp reg_fwd_chunk{{"fwd_chunk", fwd_chunk, {"out", "lse"}}};
const RegisterOp reg_bwd_chunk{{"bwd_chunk", bwd_chunk, {"dq", "dk", "dv", "dsinks"}}};

}  // namespace
