// Simulator driver ops (linked by tools/smoke/smoke_sim.py build_driver beside
// tools/hopper_sim/flash3/'s own, which stay as recorded): torch.ops.flash3.fwd_sm90 and bwd_sm90
// called with their trailing seqused_q argument (FA3's; int32 (b,), varlen), which the driver's
// "fwd" and "bwd" ops do not pass.
//   fwd_seqused_q: the "fwd" op's tensors and scalars plus tensor seqused_q; outputs out lse
//   bwd_seqused_q: the "bwd" op's tensors and scalars plus tensor seqused_q; outputs dq dk dv
#include "../../hopper_sim/flash3/sim_case.h"

#include "flash3/host/bwd.h"
#include "flash3/host/fwd.h"

namespace {

using namespace simdrv;
namespace host = flash3::host;

void fwd_seqused_q(const Case& c, host::Backend& be) {
  const auto cu_q = view(c.opt("cu_seqlens_q")), cu_k = view(c.opt("cu_seqlens_k")),
             used = view(c.opt("seqused_k")), sinks = view(c.opt("sinks")), alibi = view(c.opt("alibi_slopes")),
             used_q = view(c.opt("seqused_q"));
  host::fwd_sm90(be, view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")), view(c.t("lse")), ptr(cu_q),
                 ptr(cu_k), ptr(used), c.integer("max_seqlen_q"), c.integer("max_seqlen_k"), c.num("softmax_scale"),
                 c.integer("window_left"), c.integer("window_right"), c.num("softcap"), ptr(sinks), ptr(alibi),
                 ptr(used_q));
}

void bwd_seqused_q(const Case& c, host::Backend& be) {
  const auto dlse = view(c.opt("dlse")), cu_q = view(c.opt("cu_seqlens_q")), cu_k = view(c.opt("cu_seqlens_k")),
             sinks = view(c.opt("sinks")), dsinks = view(c.opt("dsinks")), alibi = view(c.opt("alibi_slopes")),
             used_q = view(c.opt("seqused_q"));
  host::bwd_sm90(be, view(c.t("dout")), view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")),
                 view(c.t("lse")), ptr(dlse), view(c.t("dq")), view(c.t("dk")), view(c.t("dv")), ptr(cu_q), ptr(cu_k),
                 c.integer("max_seqlen_q"), c.integer("max_seqlen_k"), c.num("softmax_scale"),
                 c.integer("window_left"), c.integer("window_right"), c.num("softcap"),
                 c.integer("deterministic") != 0, ptr(sinks), ptr(dsinks), ptr(alibi), ptr(used_q));
}

const RegisterOp reg_fwd_seqused_q{{"fwd_seqused_q", fwd_seqused_q, {"out", "lse"}}};
const RegisterOp reg_bwd_seqused_q{{"bwd_seqused_q", bwd_seqused_q, {"dq", "dk", "dv", "dsinks"}}};

}  // namespace
