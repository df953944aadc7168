// The driver's "bwd" op: torch.ops.flash3.bwd_sm90 through the host layer (csrc/flash3/host/bwd.cpp,
// the code csrc/bwd_binding.cpp runs), on the case's tensors.
//   tensors: dout q k v out lse dq dk dv, optional dlse cu_seqlens_q cu_seqlens_k seqused_q sinks
//            dsinks alibi_slopes
//   scalars: max_seqlen_q max_seqlen_k softmax_scale window_left window_right softcap
//            deterministic, optional attention_chunk
//   outputs: dq dk dv, dsinks (when given)
#include "sim_case.h"

#include "flash3/host/bwd.h"

namespace {

using namespace simdrv;

void bwd(const Case& c, flash3::host::Backend& be) {
  const auto dlse = view(c.opt("dlse")), cu_q = view(c.opt("cu_seqlens_q")), cu_k = view(c.opt("cu_seqlens_k")),
             sinks = view(c.opt("sinks")), dsinks = view(c.opt("dsinks")), alibi = view(c.opt("alibi_slopes")),
             used_q = view(c.opt("seqused_q"));
  flash3::host::bwd_sm90(be, view(c.t("dout")), view(c.t("q")), view(c.t("k")), view(c.t("v")), view(c.t("out")),
                         view(c.t("lse")), ptr(dlse), view(c.t("dq")), view(c.t("dk")), view(c.t("dv")), ptr(cu_q),
                         ptr(cu_k), c.integer("max_seqlen_q"), c.integer("max_seqlen_k"), c.num("softmax_scale"),
                         c.integer("window_left"), c.integer("window_right"),
                         c.num("softcap"), c.integer("deterministic") != 0, ptr(sinks), ptr(dsinks),
                         ptr(alibi), ptr(used_q), c.has("attention_chunk") ? c.integer("attention_chunk") : 0);
}

// The backward's kernels are in sim_driver.cu's kernel lists (host::kernel_lists_json).
const RegisterOp reg_bwd{{"bwd", bwd, {"dq", "dk", "dv", "dsinks"}}};

}  // namespace
