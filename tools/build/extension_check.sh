#!/usr/bin/env bash
# `make extension-check`: prove that the torch binding builds and links, without a GPU.
#
# In a venv (build/ext-venv, created once and reused) with the CUDA build of torch from PyPI
# (unpinned `torch`, ~2.7 GB with its nvidia-* wheels; pip caches it), nvidia-cutlass, ninja and
# setuptools, build the real extension with one kernel (FLASH3_HDIMS=128 FLASH3_DTYPES=bf16),
# install it, import flash3._C and check the ops it registers. Exit non-zero on any failure.
#
# Knobs:
#   FLASH3_EXT_VENV=DIR        use this venv instead of build/ext-venv (e.g. an existing one with a
#                              CUDA torch, to skip the download)
#   FLASH3_EXT_NO_INSTALL=1    don't pip-install the build requirements into the venv
#   FLASH3_HDIMS, FLASH3_DTYPES   kernel subset (default 128 / bf16); the import check expects
#                              every selected kernel to be registered
#   FLASH3_EXTRA_INCLUDE_DIRS  test hook: include dirs searched before csrc/ (a stand-in kernel)
#   FLASH3_EXT_COMPILE=1       compile the kernel TUs here rather than link compile-check's objects
#                              (tools/build/prebuilt.py, from the simulator's cache, hash-checked)
#   MAX_JOBS                   parallel compiles (default 2)
# --venv-only: create the venv and install the requirements, nothing else (.ci/run starts it in the
# background at the start, to overlap the ~2.7 GB download with the CPU-bound steps).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
VENV=${FLASH3_EXT_VENV:-$ROOT/build/ext-venv}
LOG=$ROOT/build/extension-check.log
mkdir -p "$ROOT/build"
start=$SECONDS
say() { echo "extension-check [$((SECONDS - start))s]: $*"; }
die() { echo "extension-check: FAILED: $*" >&2; exit 1; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV"
  "$PYTHON" -m venv "$VENV" || die "cannot create a venv with $PYTHON"
fi
PY=$VENV/bin/python

if [ "${FLASH3_EXT_NO_INSTALL:-0}" != 1 ]; then
  say "installing torch (CUDA build from PyPI), nvidia-cutlass, ninja, setuptools into $VENV"
  if ! "$PY" -m pip install --disable-pip-version-check --progress-bar off \
      torch "nvidia-cutlass==4.2.0.0" ninja "setuptools>=64" wheel >"$ROOT/build/extension-check-pip.log" 2>&1; then
    grep -v "is ignored: it is neither" "$ROOT/build/extension-check-pip.log" | tail -20 >&2
    die "pip could not install the build requirements into $VENV"
  fi
fi

if [ "${1:-}" = "--venv-only" ]; then say "venv ready"; exit 0; fi

TORCH_INFO=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)') \
  || die "torch does not import in $VENV"
say "torch $TORCH_INFO"
case "$TORCH_INFO" in
  *" None") die "torch in $VENV is a CPU-only build ($TORCH_INFO); this check needs the CUDA build
  (rm -rf $VENV and rerun, or point FLASH3_EXT_VENV at a venv with a CUDA torch)" ;;
esac

CUDA_HOME=$("$PY" tools/build/flash3_build.py --cuda-home) || die "no CUDA toolkit (nvcc) found"
export CUDA_HOME
say "CUDA toolkit: $CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | grep -o 'release [0-9.]*'))"

export FLASH3_HDIMS=${FLASH3_HDIMS:-128}
export FLASH3_DTYPES=${FLASH3_DTYPES:-bf16}
export MAX_JOBS=${MAX_JOBS:-2}
export FLASH3_FORCE_CUDA=1            # a silent pure-Python fallback would make this check pass
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}  # no GPU to detect (setup.py passes -gencode anyway)
unset FLASH3_SKIP_CUDA

# compile-check's objects sit in the simulator's cache under a key that includes the CUTLASS include
# path they were compiled against: build against the same wheel (the project venv's, the same pinned
# version) when there is one, so they are linked rather than compiled a second time (~170 s on CI).
if [ -z "${CUTLASS_DIR:-}" ] && [ -x "$ROOT/.venv/bin/python" ] \
    && inc=$("$ROOT/.venv/bin/python" tools/build/flash3_build.py --cutlass 2>/dev/null) && [ -n "$inc" ]; then
  export CUTLASS_DIR=$inc
  say "CUTLASS headers: $inc (the project venv's wheel, as compile-check's)"
fi

# The kernel TUs compile-check already compiled (the simulator's object cache, the same flags as
# setup.py's plus PTX) are linked, not compiled a second time: tools/build/prebuilt.py copies them (and
# compiles what the cache lacks) and setup.py's FLASH3_PREBUILT checks each object's hash against
# the sources and flags before linking it. What this step proves is that the bindings build and link
# against those kernels and a CUDA torch; compile-check proves the kernels compile.
# FLASH3_EXT_COMPILE=1: compile every kernel TU here instead.
if [ "${FLASH3_EXT_COMPILE:-0}" != 1 ] && [ -z "${FLASH3_PREBUILT:-}" ] && [ -z "${FLASH3_EXTRA_INCLUDE_DIRS:-}" ]; then
  say "kernel objects from compile-check's cache (tools/build/prebuilt.py; FLASH3_EXT_COMPILE=1 compiles them here)"
  "$PY" tools/build/prebuilt.py build --variant release --dir "$ROOT/build/ext-prebuilt" --jobs "$MAX_JOBS" \
    >"$ROOT/build/extension-check-prebuilt.log" 2>&1 \
    || { tail -20 "$ROOT/build/extension-check-prebuilt.log" >&2; die "tools/build/prebuilt.py could not provide the kernel objects"; }
  export FLASH3_PREBUILT=$ROOT/build/ext-prebuilt/release
fi

say "building flash3._C (FLASH3_HDIMS=$FLASH3_HDIMS FLASH3_DTYPES=$FLASH3_DTYPES MAX_JOBS=$MAX_JOBS${FLASH3_PREBUILT:+, kernels linked from ${FLASH3_PREBUILT#$ROOT/}}); log: ${LOG#$ROOT/}"
if ! "$PY" -m pip install -v --no-build-isolation --no-deps --disable-pip-version-check . >"$LOG" 2>&1; then
  grep -E "error|Error|flash3:" "$LOG" | grep -v "is ignored" | tail -40 >&2 || true
  die "building the extension failed (full log: $LOG)"
fi
grep -E "^ *flash3: " "$LOG" | sed 's/^ *//' | sort -u || true
say "built and installed"

# Import it from outside the source tree, so the installed package is the one tested.
cd /tmp
FLASH3_ROOT=$ROOT "$PY" - <<'EOF' || die "import check failed"
import json, os, sys
import torch
import flash3._C  # noqa: F401  (registers torch.ops.flash3.*)
import flash3
print(f"extension-check: flash3._C = {flash3._C.__file__}")
assert not flash3._C.__file__.startswith(os.path.join(os.environ["FLASH3_ROOT"], "flash3") + os.sep), \
    "imported the source tree's flash3/, not the installed package"

info = json.loads(torch.ops.flash3.kernel_info())
print(f"extension-check: kernel_info() = {info}")
assert info["arch"] == "sm_90a", info

sys.path.insert(0, os.environ["FLASH3_ROOT"] + "/csrc")
import generate_kernels as gk
for kind in ("fwd", "bwd"):
    want = {(k.dtype, k.head_dim, k.head_dim_v) for k in gk.selected_kernels() if k.kind == kind}
    have = {tuple(e) for e in info[kind]}
    assert want <= have, f"{kind} kernels missing from the build: {sorted(want - have)}"


def check_op(name, expected):
    """The op's schema is `expected`, and it has CUDA and Meta kernels."""
    op = getattr(torch.ops.flash3, name).default
    assert str(op._schema) == expected, f"schema differs:\n  got      {op._schema}\n  expected {expected}"
    for key in ("CUDA", "Meta"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key), f"{name}: no {key} kernel"


check_op("fwd_sm90", ("flash3::fwd_sm90(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor(b!) lse, "
            "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, int max_seqlen_q, "
            "int max_seqlen_k, float softmax_scale, int window_left, int window_right, "
            "float softcap, Tensor? sinks=None, Tensor? alibi_slopes=None, Tensor? seqused_q=None, "
            "int attention_chunk=0) -> ()"))
# The one kernel pick (host/kernel_pick.h) as Python asks it.
check_pick = json.loads(torch.ops.flash3.pick_kernel("fwd", "bfloat16", 128, 128, 128 ** -0.5))
print(f"extension-check: pick_kernel(fwd, bf16, 128) = {check_pick}")
assert check_pick == {"kernel": [128, 128]}, check_pick
chunk_pick = json.loads(torch.ops.flash3.pick_kernel("fwd", "bfloat16", 128, 128, 128 ** -0.5, 8192))
assert chunk_pick == {"kernel": [128, 128]}, chunk_pick
# Every 16-bit forward kernel takes a chunk (d 256 on its chunk tile): the chunk changes no pick
# (this build has no d 256 kernel: the same reason with it or without).
big_chunk = json.loads(torch.ops.flash3.pick_kernel("fwd", "bfloat16", 256, 256, 256 ** -0.5, 64))
big = json.loads(torch.ops.flash3.pick_kernel("fwd", "bfloat16", 256, 256, 256 ** -0.5))
assert big_chunk == big and "attention_chunk" not in big_chunk.get("reason", ""), (big_chunk, big)

# The Meta kernel: shapes only, no device; what torch.compile traces through.
b, s, h, d = 2, 64, 4, 128
q = torch.empty(b, s, h, d, dtype=torch.bfloat16, device="meta")
out = torch.empty_like(q)
lse = torch.empty(b, h, s, dtype=torch.float32, device="meta")
torch.ops.flash3.fwd_sm90(q, q, q, out, lse, None, None, None, s, s, d ** -0.5, -1, 0, 0.0)
sk = torch.empty(h, dtype=torch.float32, device="meta")  # attention sinks (one logit per query head)
torch.ops.flash3.fwd_sm90(q, q, q, out, lse, None, None, None, s, s, d ** -0.5, -1, 0, 0.0, sk)
al = torch.empty(b, h, dtype=torch.float32, device="meta")  # ALiBi slopes (batch, head)
torch.ops.flash3.fwd_sm90(q, q, q, out, lse, None, None, None, s, s, d ** -0.5, -1, 0, 0.0,
                          alibi_slopes=al)

# No GPU here: a CPU call must fail cleanly (no CPU kernel), not crash.
try:
    c = torch.zeros(1, 8, 1, 128, dtype=torch.bfloat16)
    torch.ops.flash3.fwd_sm90(c, c, c, c.clone(), torch.zeros(1, 1, 8), None, None, None, 8, 8,
                              1.0, -1, -1, 0.0)
    raise AssertionError("a CPU call to fwd_sm90 did not raise")
except (NotImplementedError, RuntimeError) as e:
    print(f"extension-check: CPU call refused as expected ({type(e).__name__})")

# The fused KV-cache append: schema, CUDA and Meta kernels, a Meta call.
check_op("append_kv_sm90", ("flash3::append_kv_sm90(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, "
            "Tensor v, Tensor cache_seqlens, Tensor? page_table, Tensor? rotary_cos, "
            "Tensor? rotary_sin, bool rotary_interleaved, bool q_per_token, Tensor(c!) q_out, "
            "Tensor? k_descale=None, Tensor? v_descale=None, Tensor? rotary_seqlens=None, "
            "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k_new=None, bool descale_per_batch=False) -> ()"))
kc = torch.empty(b, 256, 2, d, dtype=torch.bfloat16, device="meta")
kn = torch.empty(b, 1, 2, d, dtype=torch.bfloat16, device="meta")
lens = torch.empty(b, dtype=torch.int32, device="meta")
torch.ops.flash3.append_kv_sm90(q, kc, kc.clone(), kn, kn, lens, None, None, None, False, True, q)
kc8 = torch.empty(b, 256, 2, d, dtype=torch.float8_e4m3fn, device="meta")  # an FP8 cache
ds8 = torch.empty(b, 2, dtype=torch.float32, device="meta")
torch.ops.flash3.append_kv_sm90(q, kc8, kc8.clone(), kn, kn, lens, None, None, None, False, True, q, ds8, ds8)
cu1 = torch.empty(b + 1, dtype=torch.int32, device="meta")  # FA3's packed q and new keys
torch.ops.flash3.append_kv_sm90(q[:, 0], kc, kc.clone(), kn[:, 0], kn[:, 0], lens, None, None, None, False, True,
                                q[:, 0], cu_seqlens_q=cu1, cu_seqlens_k_new=cu1)
kn8 = torch.empty(b, 1, 2, d, dtype=torch.float8_e4m3fn, device="meta")  # FA3's: e4m3 keys copied
torch.ops.flash3.append_kv_sm90(q, kc8, kc8.clone(), kn8, kn8, lens, None, None, None, False, True, q,
                                descale_per_batch=True)

# The fused FP8 rotate-and-quantize: schema, CUDA and Meta kernels, a Meta call per layout.
check_op("quantize_fp8_sm90", ("flash3::quantize_fp8_sm90(Tensor x, Tensor? signs, Tensor? mean, "
            "Tensor? channel_descale, int block_size, int layout, Tensor(a!) out, "
            "Tensor(b!) descale) -> ()"))
xq = torch.empty(b, 100, 2, d, dtype=torch.bfloat16, device="meta")
sg = torch.empty(d, dtype=torch.float32, device="meta")
pm = torch.empty(b, 2, d, dtype=torch.float32, device="meta")
x8 = torch.empty(b, 100, 2, d, dtype=torch.float8_e4m3fn, device="meta")
dq = torch.empty(b, 2, 1, dtype=torch.float32, device="meta")
torch.ops.flash3.quantize_fp8_sm90(xq, sg, pm, None, 128, 0, x8, dq)
v8 = torch.empty(b, 2, d, 112, dtype=torch.float8_e4m3fn, device="meta")
torch.ops.flash3.quantize_fp8_sm90(xq, None, None, pm, 128, 1, v8, dq)

# The FP8 attention forward: schema, CUDA and Meta kernels, a Meta call; kernel_info lists its
# kernels apart ("fwd_fp8", empty in this bf16-only build).
check_op("fwd_fp8_sm90", ("flash3::fwd_fp8_sm90(Tensor q, Tensor k, Tensor vt, Tensor(a!) out, Tensor(b!) lse, "
            "Tensor q_descale, Tensor k_descale, Tensor v_descale, Tensor? v_channel_descale, "
            "int q_block, int kv_block, float softmax_scale, int window_left, "
            "int window_right, float softcap, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
            "int max_seqlen_q=0, int max_seqlen_k=0, Tensor? seqused_q=None, Tensor? seqused_k=None, "
            "int attention_chunk=0, bool fast_accum=False) -> ()"))
assert "fwd_fp8" in info, info
q8 = torch.empty(b, 100, 2, d, dtype=torch.float8_e4m3fn, device="meta")
vt = torch.empty(b, 2, d, 112, dtype=torch.float8_e4m3fn, device="meta")
o8 = torch.empty(b, 100, 2, d, dtype=torch.bfloat16, device="meta")
l8 = torch.empty(b, 2, 100, dtype=torch.float32, device="meta")
torch.ops.flash3.fwd_fp8_sm90(q8, q8, vt, o8, l8, dq, dq, dq, None, 128, 128, d ** -0.5, -1, 0, 0.0)
cu = torch.zeros(b + 1, dtype=torch.int32, device="meta")  # varlen: packed q/k, Vt (h_k, d_v, columns)
torch.ops.flash3.fwd_fp8_sm90(q8[0], q8[0], vt[0], o8[0], l8[0], dq, dq, dq, None, 128, 128, d ** -0.5,
                              -1, 0, 0.0, cu, cu, 100, 100)
used = torch.zeros(b, dtype=torch.int32, device="meta")  # FA3's seqused_q/k and attention_chunk
torch.ops.flash3.fwd_fp8_sm90(q8[0], q8[0], vt[0], o8[0], l8[0], dq, dq, dq, None, 128, 128, d ** -0.5,
                              -1, 0, 0.0, cu, cu, 100, 100, used, used, 48)
torch.ops.flash3.fwd_fp8_sm90(q8, q8, vt, o8, l8, dq, dq, dq[:, :, :1], None, 128, 128, d ** -0.5, -1, 0, 0.0,
                              fast_accum=True)  # fast accumulation: v's descale (b, h_k, 1)
# The backward: schema, CUDA and Meta kernels, a Meta call batched and packed.
check_op("bwd_sm90", ("flash3::bwd_sm90(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                      "Tensor? dlse, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor? cu_seqlens_q, "
                      "Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, float softmax_scale, "
                      "int window_left, int window_right, float softcap, bool deterministic, "
                      "Tensor? sinks=None, Tensor(d!)? dsinks=None, Tensor? alibi_slopes=None, "
                      "Tensor? seqused_q=None, int attention_chunk=0) -> ()"))
assert "bwd" in info, info
g = [torch.empty_like(q) for _ in range(3)]
torch.ops.flash3.bwd_sm90(q, q, q, q, out, lse, lse, *g, None, None, s, s, d ** -0.5, -1, 0, 0.0, True)
sk = torch.empty(q.shape[2], dtype=torch.float32, device="meta")  # with sinks: d_sink into dsinks
torch.ops.flash3.bwd_sm90(q, q, q, q, out, lse, lse, *g, None, None, s, s, d ** -0.5, -1, 0, 0.0, True,
                          sk, torch.empty_like(sk))
torch.ops.flash3.bwd_sm90(q, q, q, q, out, lse, lse, *g, None, None, s, s, d ** -0.5, -1, 0, 0.0, True,
                          alibi_slopes=al)
cu = torch.zeros(b + 1, dtype=torch.int32, device="meta")
torch.ops.flash3.bwd_sm90(q[0], q[0], q[0], q[0], out[0], lse[0], None, *(x[0] for x in g), cu, cu, s, s,
                          d ** -0.5, -1, -1, 0.0, False)
torch.ops.flash3.bwd_sm90(q[0], q[0], q[0], q[0], out[0], lse[0], None, *(x[0] for x in g), cu, cu, s, s,
                          d ** -0.5, -1, -1, 0.0, False, seqused_q=cu[:b])
# The decode (KV-cache) attention: schema, CUDA and Meta kernels, a Meta call contiguous and paged
# (16-bit and FP8 caches); kernel_info lists its kernels ("decode", "decode_fp8_cache").
check_op("fwd_kvcache_sm90", ("flash3::fwd_kvcache_sm90(Tensor q, Tensor k_cache, Tensor v_cache, Tensor(a!) out, "
                              "Tensor(b!) lse, Tensor seqused_k, Tensor? page_table, float softmax_scale, "
                              "int window_left, int window_right, float softcap, int num_splits, "
                              "Tensor? k_descale=None, Tensor? v_descale=None, Tensor? sinks=None, "
                              "Tensor? cu_seqlens_q=None, int max_seqlen_q=0, Tensor? alibi_slopes=None, "
                              "Tensor? cache_leftpad=None, bool descale_per_batch=False, Tensor? qv=None, "
                              "int attention_chunk=0) -> ()"))
assert ["bf16", 128, 128] in info["decode"], info
assert ["bf16", 128, 128] in info["decode_fp8_cache"], info
qd = torch.empty(b, 1, 4, d, dtype=torch.bfloat16, device="meta")
cache = torch.empty(b, 300, 2, d, dtype=torch.bfloat16, device="meta")
od, ld = torch.empty_like(qd), torch.empty(b, 4, 1, dtype=torch.float32, device="meta")
used = torch.empty(b, dtype=torch.int32, device="meta")
torch.ops.flash3.fwd_kvcache_sm90(qd, cache, cache, od, ld, used, None, d ** -0.5, -1, 0, 0.0, 0)
pages = torch.empty(7, 16, 2, d, dtype=torch.bfloat16, device="meta")
table = torch.empty(b, 3, dtype=torch.int32, device="meta")
torch.ops.flash3.fwd_kvcache_sm90(qd, pages, pages, od, ld, used, table, d ** -0.5, 8, 0, 30.0, 4)
pages8 = torch.empty(7, 16, 2, d, dtype=torch.float8_e4m3fn, device="meta")  # an FP8 paged cache
pd8 = torch.empty(7, 2, dtype=torch.float32, device="meta")
torch.ops.flash3.fwd_kvcache_sm90(qd, pages8, pages8, od, ld, used, table, d ** -0.5, -1, 0, 0.0, 0,
                                  pd8, pd8)
bd8 = torch.empty(b, 2, dtype=torch.float32, device="meta")  # FA3's per-(batch, kv head) descales
torch.ops.flash3.fwd_kvcache_sm90(qd, pages8, pages8, od, ld, used, table, d ** -0.5, -1, 0, 0.0, 0,
                                  bd8, bd8, descale_per_batch=True)
torch.ops.flash3.fwd_kvcache_sm90(qd, pages, pages, od, ld, used, table, d ** -0.5, -1, 0, 0.0, 3,
                                  sinks=torch.empty(4, dtype=torch.float32, device="meta"))
torch.ops.flash3.fwd_kvcache_sm90(qd, pages, pages, od, ld, used, table, d ** -0.5, -1, 0, 0.0, 3,
                                  alibi_slopes=torch.empty(4, dtype=torch.float32, device="meta"))
torch.ops.flash3.fwd_kvcache_sm90(qd, cache, cache, od, ld, used, None, d ** -0.5, -1, 0, 0.0, 0,
                                  cache_leftpad=torch.empty(b, dtype=torch.int32, device="meta"))
torch.ops.flash3.fwd_kvcache_sm90(qd, cache, cache, od, ld, used, None, d ** -0.5, -1, 0, 0.0, 2,
                                  attention_chunk=64)
# Packed (varlen) queries on the paged cache: q/out (total_q, h, d), lse (h, total_q).
qv = torch.empty(9, 4, d, dtype=torch.bfloat16, device="meta")
cuq = torch.empty(b + 1, dtype=torch.int32, device="meta")
torch.ops.flash3.fwd_kvcache_sm90(qv, pages, pages, torch.empty_like(qv), torch.empty(4, 9, dtype=torch.float32, device="meta"),
                                  used, table, d ** -0.5, -1, 0, 0.0, 2, cu_seqlens_q=cuq, max_seqlen_q=7)
# The CUDA kernels' adapters reach the host layer (csrc/flash3/host/) and raise its refusals as
# TORCH_CHECK does: called straight on the CUDA key with CPU tensors, each op names what is wrong.
ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
c = torch.zeros(1, 8, 1, 128, dtype=torch.bfloat16)
for name, args, msg in [
        ("fwd_sm90", (c, c, c, c, torch.zeros(1, 1, 8), None, None, None, 8, 8, 1.0, -1, -1, 0.0),
         "flash3.fwd_sm90: q must be a CUDA tensor, got cpu"),
        ("bwd_sm90", (c, c, c, c, c, torch.zeros(1, 1, 8), None, c, c, c, None, None, 8, 8, 1.0, -1, -1, 0.0,
                      False), "flash3.bwd_sm90: q must be a CUDA tensor, got cpu"),
        ("quantize_fp8_sm90", (c, None, None, None, 128, 0, c, torch.zeros(1)),
         "flash3.quantize_fp8_sm90: x must be a CUDA tensor")]:
    try:
        getattr(torch.ops.flash3, name).default.redispatch(ks, *args)
        raise AssertionError(f"{name} on CPU tensors did not raise")
    except RuntimeError as e:
        assert str(e).splitlines()[0] == msg, (name, str(e))
print("extension-check: the ops' host-layer refusals raise as RuntimeError with their messages")
print(f"extension-check: torch.cuda.is_available() = {torch.cuda.is_available()}")
EOF
# As a user imports it: `import flash3` alone (flash3 must load torch before its extension).
(cd /tmp && "$PY" -c 'import flash3; assert flash3.has_extension(), "import flash3 did not load flash3._C"; print("extension-check: import flash3 ->", sorted(flash3.kernel_info()["fwd"]))') \
  || die "plain 'import flash3' does not load the extension"
say "OK: flash3._C builds against torch $TORCH_INFO, imports, and registers fwd_sm90 + bwd_sm90 + fwd_fp8_sm90 + fwd_kvcache_sm90 + append_kv_sm90 + quantize_fp8_sm90 + kernel_info + pick_kernel"
