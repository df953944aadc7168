// Strict checks on memory: global/shared bounds and alignment, asynchronous copies still in flight,
// the generic->async proxy fence, and a clean mbarrier + cp.async.bulk + named-barrier pipeline.
// `mem CASE bad|good`; the bad run trips the named check, the good twin none.
#include "common.h"

// global_oob_read: reads element 100 of a 100-float cudaMalloc buffer (one past the end).
__global__ void k_gread(const float* in, float* out, int i) { out[0] = in[i]; }
static void global_oob_read(bool bad) {
  float *in, *out; CK(cudaMalloc(&in, 100 * sizeof(float))); CK(cudaMalloc(&out, sizeof(float)));
  k_gread<<<1, 1>>>(in, out, bad ? 100 : 99);
}

// global_oob_write: writes element -1 of a cudaMalloc buffer (before its start).
__global__ void k_gwrite(float* p, int i) { p[i] = 1.f; }
static void global_oob_write(bool bad) {
  float* p; CK(cudaMalloc(&p, 100 * sizeof(float)));
  k_gwrite<<<1, 1>>>(p, bad ? -1 : 0);
}

// global_misaligned: an 8-byte load at an address 4 mod 8 (PTX: accesses must be naturally aligned).
__global__ void k_gmis(const char* p, int off, unsigned long long* out) {
  out[0] = *reinterpret_cast<const unsigned long long*>(p + off);
}
static void global_misaligned(bool bad) {
  char* p; unsigned long long* o;
  CK(cudaMalloc(&p, 64)); CK(cudaMalloc(&o, 8));
  k_gmis<<<1, 1>>>(p, bad ? 4 : 8, o);
}

// shared_oob: reads dynamic shared word 64 of a launch with 256 bytes of dynamic shared memory.
__global__ void k_soob(int i, int* out) {
  extern __shared__ int dsm[];
  dsm[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = dsm[i];
}
static void shared_oob(bool bad) {
  int* o; CK(cudaMalloc(&o, 64 * sizeof(int)));
  k_soob<<<1, 64, 256>>>(bad ? 64 : 63, o);
}

// shared_misaligned: a 4-byte shared load at offset 2 (PTX: natural alignment required).
__global__ void k_smis(int off, uint32_t* out) {
  __shared__ alignas(16) uint32_t s[8];
  if (threadIdx.x < 8) s[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = ld_shared_u32(reinterpret_cast<char*>(s) + off);
}
static void shared_misaligned(bool bad) {
  uint32_t* o; CK(cudaMalloc(&o, 32 * sizeof(uint32_t)));
  k_smis<<<1, 32>>>(bad ? 2 : 4, o);
}

// async_inflight_load: ld.shared of a buffer right after the cp.async.bulk (global->shared) that
// fills it, before waiting on its mbarrier (PTX: the copy's writes are visible only once the
// mbarrier phase completes). Four 16-byte copies so at least one is surely still in flight.
__global__ void k_ainf_load(const uint32_t* g, uint32_t* out, int bad) {
  __shared__ alignas(128) uint32_t buf[16];
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 1);
  mbar_init_fence();
  mbar_arrive_tx(&bar, 64);
  for (int i = 0; i < 4; ++i) bulk_g2s(&buf[4 * i], g + 4 * i, 16, &bar);
  uint32_t s = 0;
  if (bad)
    for (int i = 0; i < 4; ++i) s += ld_shared_u32(&buf[4 * i]);
  mbar_wait(&bar, 0);
  for (int i = 0; i < 16; ++i) s += ld_shared_u32(&buf[i]);
  out[0] = s;
}
static void async_inflight_load(bool bad) {
  uint32_t *g, *o; CK(cudaMalloc(&g, 64)); CK(cudaMalloc(&o, 4));
  k_ainf_load<<<1, 1>>>(g, o, bad);
}

// async_inflight_store: st.shared to the source of a cp.async.bulk shared->global before
// cp.async.bulk.wait_group.read (PTX: the source may be reused only after the read completes).
__global__ void k_ainf_store(uint32_t* g, int bad) {
  __shared__ alignas(128) uint32_t buf[16];
  for (int i = 0; i < 16; ++i) st_shared_u32(&buf[i], i);
  fence_proxy_async();
  for (int i = 0; i < 4; ++i) bulk_s2g(g + 4 * i, &buf[4 * i], 16);
  bulk_commit();
  if (!bad) bulk_wait_read0();
  for (int i = 0; i < 4; ++i) st_shared_u32(&buf[4 * i], 99);
  bulk_wait0();
}
static void async_inflight_store(bool bad) {
  uint32_t* g; CK(cudaMalloc(&g, 64));
  k_ainf_store<<<1, 1>>>(g, bad);
}

// proxy_fence_bulk: st.shared then a cp.async.bulk shared->global of those bytes with no
// fence.proxy.async in between (PTX: generic-proxy writes are not ordered with async-proxy reads
// without a proxy fence).
__global__ void k_pfence(uint32_t* g, int bad) {
  __shared__ alignas(128) uint32_t buf[16];
  for (int i = 0; i < 16; ++i) st_shared_u32(&buf[i], i);
  if (!bad) fence_proxy_async();
  bulk_s2g(g, buf, 64);
  bulk_commit();
  bulk_wait0();
}
static void proxy_fence_bulk(bool bad) {
  uint32_t* g; CK(cudaMalloc(&g, 64));
  k_pfence<<<1, 1>>>(g, bad);
}

// async_unobserved: warp 1 reads bytes a cp.async.bulk delivered, knowing only through a relaxed
// (volatile) global flag that warp 0 saw the mbarrier phase complete. PTX: the copy's writes become
// visible to a thread through the mbarrier phase it observes (or synchronization with a thread that
// did); a relaxed flag is no such synchronization. The good twin also waits on the mbarrier.
__global__ void k_aunobs(const uint32_t* g, volatile uint32_t* flag, uint32_t* out, int bad) {
  __shared__ alignas(128) uint32_t buf[16];
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_tx(&bar, 64);
    bulk_g2s(buf, g, 64, &bar);
    mbar_wait(&bar, 0);
    *flag = 1;
  } else if (threadIdx.x == 32) {
    while (*flag == 0) {}
    if (!bad) mbar_wait(&bar, 0);
    out[0] = ld_shared_u32(&buf[3]);
  }
}
static void async_unobserved(bool bad) {
  uint32_t *g, *f, *o; CK(cudaMalloc(&g, 64)); CK(cudaMalloc(&f, 4)); CK(cudaMalloc(&o, 4));
  CK(cudaMemset(f, 0, 4));
  k_aunobs<<<1, 64>>>(g, f, o, bad);
}

// async_at_exit: the CTA exits while a cp.async.bulk into its shared memory is in flight (never
// waits on the mbarrier).
__global__ void k_aexit(const uint32_t* g, int bad) {
  __shared__ alignas(128) uint32_t buf[16];
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 1);
  mbar_init_fence();
  mbar_arrive_tx(&bar, 64);
  bulk_g2s(buf, g, 64, &bar);
  if (!bad) mbar_wait(&bar, 0);
}
static void async_at_exit(bool bad) {
  uint32_t* g; CK(cudaMalloc(&g, 64));
  k_aexit<<<1, 1>>>(g, bad);
}

// bulk_copy_size: cp.async.bulk of 40 bytes (PTX: size must be a multiple of 16).
__global__ void k_bulk_size(const uint32_t* g, uint32_t n, uint32_t* out) {
  __shared__ alignas(128) uint32_t buf[16];
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 1);
  mbar_init_fence();
  mbar_arrive_tx(&bar, n);
  bulk_g2s(buf, g, n, &bar);
  mbar_wait(&bar, 0);
  out[0] = buf[0];
}
static void bulk_copy_size(bool bad) {
  uint32_t *g, *o; CK(cudaMalloc(&g, 64)); CK(cudaMalloc(&o, 4));
  k_bulk_size<<<1, 1>>>(g, bad ? 40 : 48, o);
}

// address_space: cvta.to.shared of a global pointer (PTX: cvta.to.shared of a generic address
// that is not in the shared window is undefined).
__global__ void k_cvta(const int* g, uint32_t* out, int bad) {
  __shared__ int s[4];
  s[threadIdx.x] = 1;
  out[threadIdx.x] = (uint32_t)__cvta_generic_to_shared(bad ? (const void*)g : (const void*)&s[threadIdx.x]);
}
static void address_space(bool bad) {
  int* g; uint32_t* o; CK(cudaMalloc(&g, 16)); CK(cudaMalloc(&o, 16));
  k_cvta<<<1, 4>>>(g, o, bad);
}

// ldmatrix_during_store (clean only): ldmatrix reads a tile that a cp.async.bulk shared->global is
// also still reading. Two reads of the same bytes race with nothing: this must trip no check.
__global__ void k_ldm_store(uint32_t* g, uint32_t* out) {
  __shared__ alignas(128) uint16_t tile[64];
  for (int i = threadIdx.x; i < 64; i += 32) tile[i] = (uint16_t)i;
  fence_proxy_async();
  __syncwarp();
  if (threadIdx.x == 0) {   // 32 stores of the tile, so some are surely still reading it at the ldmatrix
    for (int i = 0; i < 32; ++i) bulk_s2g(g + 32 * i, tile, 128);
    bulk_commit();
  }
  uint32_t r;
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r) : "r"(su32(&tile[(threadIdx.x % 8) * 8])) : "memory");
  out[threadIdx.x] = r;
  if (threadIdx.x == 0) bulk_wait0();
}
static void ldmatrix_during_store(bool bad) {
  if (bad) { printf("ldmatrix_during_store has no bad twin\n"); exit(2); }
  uint32_t *g, *o; CK(cudaMalloc(&g, 32 * 128)); CK(cudaMalloc(&o, 128));
  k_ldm_store<<<1, 32>>>(g, o);
}

// pipeline (clean, no bad twin): warp 0 lane 0 produces 8 tiles through a 2-stage ring with
// cp.async.bulk + full/empty mbarriers; warps 1-2 consume, sync on named barrier 1 (64 threads),
// write a result tile, fence.proxy.async, and one thread stores it with cp.async.bulk s2g.
constexpr int kTile = 64, kTiles = 8, kStages = 2;
__global__ void k_pipeline(const float* in, float* out) {
  __shared__ alignas(128) float buf[kStages][kTile];
  __shared__ alignas(128) float obuf[kTile];
  __shared__ alignas(8) uint64_t full[kStages], empty[kStages];
  int tid = threadIdx.x, warp = tid / 32;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) { mbar_init(&full[s], 1); mbar_init(&empty[s], 64); }
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == 0) {
    if (tid == 0)
      for (int t = 0; t < kTiles; ++t) {
        int s = t % kStages, k = t / kStages;
        if (k > 0) mbar_wait(&empty[s], (k - 1) & 1);
        mbar_arrive_tx(&full[s], kTile * 4);
        bulk_g2s(buf[s], in + t * kTile, kTile * 4, &full[s]);
      }
  } else {
    int i = tid - 32;
    for (int t = 0; t < kTiles; ++t) {
      int s = t % kStages, k = t / kStages;
      mbar_wait(&full[s], k & 1);
      float v = buf[s][i] * 2.f + t;
      mbar_arrive(&empty[s]);
      if (i == 0) bulk_wait_read0();          // the previous store has read obuf
      asm volatile("bar.sync 1, 64;" ::: "memory");
      obuf[i] = v;
      fence_proxy_async();                     // make the generic writes visible to the async proxy
      asm volatile("bar.sync 1, 64;" ::: "memory");
      if (i == 0) { bulk_s2g(out + t * kTile, obuf, kTile * 4); bulk_commit(); }
    }
    if (i == 0) bulk_wait0();
  }
}
static void pipeline(bool bad) {
  if (bad) { printf("pipeline has no bad twin\n"); exit(2); }
  const int n = kTile * kTiles;
  float h[n], r[n];
  for (int i = 0; i < n; ++i) h[i] = (float)(i % kTile) + 1000.f * (i / kTile);
  float *in, *out; CK(cudaMalloc(&in, sizeof h)); CK(cudaMalloc(&out, sizeof h));
  CK(cudaMemcpy(in, h, sizeof h, cudaMemcpyHostToDevice));
  CK(cudaMemset(out, 0, sizeof h));
  k_pipeline<<<1, 96>>>(in, out);
  CK(cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i)
    if (r[i] != h[i] * 2.f + i / kTile) { printf("pipeline: out[%d] = %g, expected %g\n", i, r[i], h[i] * 2.f + i / kTile); exit(1); }
}

// async_waw: four cp.async.bulk (global->shared) into the same 16 bytes, all in flight at once, from
// sources holding different values, completing on one mbarrier phase the thread then waits for.
// PTX orders none of these writes after another (no causality order between them, so their
// coherence order is free): each byte may end up holding any source's value. The bad run reads the
// bytes (reported); the good twin stores over them first (a write ordered after every copy: the
// bytes are defined again) and reads its own values. Issuing the overlapping copies is itself no
// error: CUTLASS 63's L2 prefetcher keeps several TMA loads in flight into one scratch stage it
// never reads. Run with --seed 2 (copies land as late as possible) so all four are in flight.
__global__ void k_awaw(const uint32_t* g, uint32_t* out, int bad) {
  __shared__ alignas(128) uint32_t buf[4];
  __shared__ alignas(8) uint64_t bar;
  mbar_init(&bar, 1);
  mbar_init_fence();
  mbar_arrive_tx(&bar, 64);
  for (int i = 0; i < 4; ++i) bulk_g2s(buf, g + 4 * i, 16, &bar);
  mbar_wait(&bar, 0);
  if (!bad)
    for (int i = 0; i < 4; ++i) st_shared_u32(&buf[i], 7);
  uint32_t s = 0;
  for (int i = 0; i < 4; ++i) s += ld_shared_u32(&buf[i]);
  out[0] = s;
}
static void async_waw(bool bad) {
  uint32_t h[16], *g, *o;
  for (int i = 0; i < 16; ++i) h[i] = i;
  CK(cudaMalloc(&g, sizeof h)); CK(cudaMalloc(&o, 4));
  CK(cudaMemcpy(g, h, sizeof h, cudaMemcpyHostToDevice));
  k_awaw<<<1, 1>>>(g, o, bad);
  uint32_t r = 0;
  CK(cudaMemcpy(&r, o, 4, cudaMemcpyDeviceToHost));
  if (!bad && r != 28) { printf("async_waw: sum %u, expected 28\n", r); exit(1); }
}

CASES({"global_oob_read", global_oob_read}, {"global_oob_write", global_oob_write},
      {"global_misaligned", global_misaligned}, {"shared_oob", shared_oob}, {"shared_misaligned", shared_misaligned},
      {"async_inflight_load", async_inflight_load}, {"async_unobserved", async_unobserved}, {"async_inflight_store", async_inflight_store},
      {"proxy_fence_bulk", proxy_fence_bulk}, {"async_at_exit", async_at_exit}, {"bulk_copy_size", bulk_copy_size},
      {"address_space", address_space}, {"ldmatrix_during_store", ldmatrix_during_store}, {"pipeline", pipeline},
      {"async_waw", async_waw})
