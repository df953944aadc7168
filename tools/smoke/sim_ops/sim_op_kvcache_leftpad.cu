// The simulator driver's "kvcache_leftpad" op: the driver's "kvcache" step (tools/hopper_sim/flash3/
// sim_driver.cu kvcache_step: the fused append when tensor k is given, then fwd_kvcache_sm90 and its
// combine) with FA3's cache_leftpad, the decode op's last argument. It lives here, not in
// tools/hopper_sim/flash3/ (whose bytes key the simulator's recorded ground truth); smoke_sim.py
// links it into the driver beside the sim_op_*.cu there.
//
// case.txt: the "kvcache" op's tensors and scalars, plus tensor cache_leftpad (int32 (b,)).
// Outputs: out lse k_cache v_cache, and q_out when given.
#include "sim_case.h"

#include "flash3/host/append_kv.h"
#include "flash3/host/kvcache.h"

namespace {

using namespace simdrv;
namespace host = flash3::host;

void kvcache_leftpad(const Case& c, host::Backend& be) {
  const Tensor& q = c.t("q");
  const auto page_table = view(c.opt("page_table")), k_descale = view(c.opt("k_descale")),
             v_descale = view(c.opt("v_descale"));
  const Tensor* q_att = &q;
  if (c.opt("k") != nullptr) {  // new keys: stored and rotated at cache_seqlens + t, whatever the padding
    const Tensor* q_out = c.opt("q_out");
    const auto cos = view(c.opt("rotary_cos")), sin = view(c.opt("rotary_sin")),
               ro = view(c.opt("rotary_seqlens"));
    host::append_kv_sm90(be, view(q), view(c.t("k_cache")), view(c.t("v_cache")), view(c.t("k")), view(c.t("v")),
                         view(c.t("cache_seqlens")), ptr(page_table), ptr(cos), ptr(sin),
                         c.integer("rotary_interleaved") != 0, c.integer("q_per_token") != 0, view(q_out ? *q_out : q),
                         ptr(k_descale), ptr(v_descale), ptr(ro));
    if (q_out != nullptr) q_att = q_out;
  }
  const auto sinks = view(c.opt("sinks")), cu_q = view(c.opt("cu_seqlens_q")), alibi = view(c.opt("alibi_slopes")),
             leftpad = view(c.opt("cache_leftpad"));
  host::fwd_kvcache_sm90(be, view(*q_att), view(c.t("k_cache")), view(c.t("v_cache")), view(c.t("out")),
                         view(c.t("lse")), view(c.t("seqused_k")), ptr(page_table), c.num("softmax_scale"),
                         c.integer("window_left"), c.integer("window_right"), c.num("softcap"),
                         c.integer("num_splits"), ptr(k_descale), ptr(v_descale), ptr(sinks), ptr(cu_q),
                         c.has("max_seqlen_q") ? c.integer("max_seqlen_q") : 0, ptr(alibi), ptr(leftpad));
}

const RegisterOp reg_kvcache_leftpad{{"kvcache_leftpad", kvcache_leftpad, {"out", "lse", "k_cache", "v_cache", "q_out"}}};

}  // namespace
