// The reduce role of the in-node fused GEMM + AllReduce / ReduceScatter (the clique and
// processes layouts), with its tail. Part of fused_kernels.cuh (included there, inside
// namespace mk::fused, after GcParams, gcOwner and GcVec; not a header of its own).
//
#pragma once

// ---- reduce role (GEMM + AllReduce / ReduceScatter) ---------------------------------------
//
// Data moves with the copy engine in large operations. The GEMM stores each rank's partials
// tile by tile ([tilesM][tilesN][128][256], gemm::GemmArgs::dTiled), so a chunk of `rows`
// rows of one tile is one contiguous block per rank: one bulk load per rank lands it in
// shared memory, the CTA sums the ranks in rank order (the same bits on every rank), adds the
// bias and rounds, and one 2-D tensor store per destination writes the rows to every rank's C
// (AllReduce) or to the shard owners (ReduceScatter; the tensor bounds clip the rows of other
// shards). Each rank publishes the tensor map of its C in its clique slot. Register copies held
// a comm CTA at ~12 GB/s and per-row bulk copies (512-byte operations) at ~9 GB/s on the H200
// (8192x8192x1024 AllReduce, 4 ranks sharing the GPU); so does this path (12-17 GB/s), which
// is the per-SM rate of the stand-alone collective too. A ring of S stages: the loads of
// chunks i+1 .. i+S-1 fly while chunk i is summed; a chunk that starts a tile is loaded ahead
// only once that tile's flags are set, so landed chunks never wait behind a future tile.

// Shared memory of the reduce role: kGcReduceHead bytes of mbarriers (one per stage) and the
// C map staging, then a ring of `stages` stages, each R rows of every rank's partial tile and
// R rows of the result (the tensor stores' source). A stage's output block is rewritten only
// `stages` chunks after its store was issued, so the wait for that store's reads never stalls
// behind loads queued after it (the copy engine may serve one CTA's operations in order:
// with a shared pair of output blocks a comm CTA moved ~16 GB/s).
constexpr int32_t kGcReduceHead = 256;
constexpr int32_t kGcMaxStages = 8;
struct GcReducePlan {
  int32_t rows = 1, stages = 0;
  // Largest power-of-two row count that still leaves 4 stages, then as many stages as fit.
  __host__ __device__ GcReducePlan(int32_t n, int32_t elemBytes, int32_t smemBytes) {
    const int32_t rowBytes = gemm::kTileN * elemBytes, room = smemBytes - kGcReduceHead - 128;
    rows = gemm::kTileM;
    while (rows > 1 && 4 * (n + 1) * rows * rowBytes > room) rows >>= 1;
    stages = room / ((n + 1) * rows * rowBytes);
    if (stages > kGcMaxStages) stages = kGcMaxStages;
  }
};

// At most `pending` of this thread's bulk groups still reading shared memory.
__device__ __forceinline__ void gcBulkWaitRead(int32_t pending) {
  switch (pending) {
    case 0:
      ptx::bulkWaitRead<0>();
      break;
    case 1:
      ptx::bulkWaitRead<1>();
      break;
    case 2:
      ptx::bulkWaitRead<2>();
      break;
    case 3:
      ptx::bulkWaitRead<3>();
      break;
    case 4:
      ptx::bulkWaitRead<4>();
      break;
    case 5:
      ptx::bulkWaitRead<5>();
      break;
    case 6:
      ptx::bulkWaitRead<6>();
      break;
    default:
      ptx::bulkWaitRead<7>();
      break;
  }
}

// One chunk: rows r0 .. r0 + rows - 1 of tile (mBlk, nBlk).
struct GcChunk {
  int32_t mBlk, nBlk, r0, rows;
  __device__ int32_t tileId(const GcParams& p) const { return mBlk * p.g.tilesN + nBlk; }
};

// The owned tiles of the tail (GcParams::tailTiles): schedule positions first, first + n, ...
// below the tile count.
struct GcTail {
  int64_t first;
  int32_t owned;
  __device__ explicit GcTail(const GcParams& p) {
    const int64_t tiles = (int64_t)p.g.tilesM * p.g.tilesN, tail0 = tiles - p.tailTiles;
    first = tail0 + ((p.me - tail0) % p.n + p.n) % p.n;
    owned = first < tiles ? (int32_t)((tiles - 1 - first) / p.n + 1) : 0;
  }
};

// Whether every rank has published tile `id` of this call (no wait).
__device__ __forceinline__ bool gcTileReady(const GcParams& p, int32_t id, uint64_t seq) {
  for (int q = 0; q < p.n; ++q)
    if (rt::ldAcquire(gcDone(p, q) + id, gcScope(p)) < seq) return false;
  return true;
}

// ---- helpers: the reduce inside the compute CTAs (GcParams::helpers) -----------------------
//
// On one GPU shared by the ranks the GEMM is compute-bound on every SM, so a comm CTA costs
// the GEMM a whole SM (~1/33 of a rank's GEMM with 4 ranks on 132 SMs) while moving only
// ~10-15 GB/s: two or three of them cost more than the stand-alone collective they hide. The
// reduce needs far less than an SM's bandwidth while the GEMM runs (a rank's 256 MiB over a
// 6 ms GEMM at 8192^3: ~1.3 GB/s per SM), so with helpers on, the idle warps 1-3 of every
// compute CTA's producer warpgroup (gemm::gemmCta's side job, 40 registers a thread) reduce
// owned tiles while warp 0 feeds the GEMM. They take whole tiles from the rank's tail counter
// (every tile is in the tail then), one at a time and together (gcHelperLoop), with register
// loads and stores: one 16-byte vector a thread, summed in rank order as gcSumChunk does (the
// same bits whoever reduces a tile). Once its CTA's GEMM tiles are done the CTA stops claiming
// for its helpers: its tail (gcReduceRole with all 384 threads and bulk copies) takes the rest.

// The helpers of a CTA: warps 1-3 of its producer warpgroup.
constexpr int32_t kGcHelperWarps = 3;
constexpr int32_t kGcHelperThreads = 32 * kGcHelperWarps;
// Rows of a tile per L2 prefetch (gcHelperPrefetch).
constexpr int32_t kGcPrefetchRows = 16;

// With every rank on this GPU (GcParams::gpuFlags), the helpers first ask the copy engine to
// bring the whole claimed tile of every rank's partials into L2, one kGcPrefetchRows-row range
// per thread: a helper thread has one 16-byte load per rank in flight (40 registers), so a
// load's latency sets its rate, and an L2 hit's is a fraction of HBM's under the GEMM's
// traffic. The prefetch holds no register or shared memory after it is issued; a tile is
// n x 64 KiB (bf16), ~256 KiB per CTA in L2 at 4 ranks. Issued apart from the sums, at the
// tile's start: a prefetch window kept inside the sum loop (session 25's first version) cost
// the loop registers and spilled. MKERNEL_FUSED_DEBUG bit 5 turns it off.
template <typename T>
__device__ __forceinline__ void gcHelperPrefetch(const GcParams& p, int32_t mBlk, int32_t nBlk,
                                                 const T* const* parts, int32_t t) {
  constexpr int32_t kSteps = gemm::kTileM / kGcPrefetchRows;
  if (!p.gpuFlags || (p.debug & 32) || t >= p.n * kSteps) return;
  const int32_t q = t % p.n, r0 = (t / p.n) * kGcPrefetchRows;
  const int32_t rows = min(gemm::kTileM, p.M - mBlk * gemm::kTileM);
  if (r0 >= rows) return;
  // Partial tiles are whole kTileM x kTileN blocks ([tilesM][tilesN][128][256]): a range of
  // rows is contiguous.
  const int64_t at = (int64_t)(mBlk * p.g.tilesN + nBlk) * gemm::kTileM * gemm::kTileN;
  ptx::bulkPrefetchL2(parts[q] + at + (int64_t)r0 * gemm::kTileN,
                      (uint32_t)(min(kGcPrefetchRows, rows - r0) * gemm::kTileN * sizeof(T)));
}

// One owned tile by the CTA's kGcHelperThreads helper threads (this one is thread `t`): every
// rank's partial rows summed in rank order, plus the bias, into every rank's C (AllReduce) or the
// shard owner's (ReduceScatter).
template <typename T>
__device__ __forceinline__ void gcHelperTile(const GcParams& p, int32_t mBlk, int32_t nBlk,
                                             const T* const* parts, T* const* outs, int32_t t) {
  using V = GcVec<T>;
  const int32_t m0 = mBlk * gemm::kTileM, n0 = nBlk * gemm::kTileN;
  const int32_t rows = min(gemm::kTileM, p.M - m0);
  const int32_t vecs = min(gemm::kTileN, p.N - n0) / V::kN;  // host rule: whole vectors
  const int64_t at = (int64_t)(mBlk * p.g.tilesN + nBlk) * gemm::kTileM * gemm::kTileN;
  const T* bias = static_cast<const T*>(p.bias);
  for (int32_t e = t; e < rows * vecs; e += kGcHelperThreads) {
    const int32_t r = e / vecs, col = (e - r * vecs) * V::kN;
    float acc[V::kN];
#pragma unroll
    for (int j = 0; j < V::kN; ++j) acc[j] = 0.f;
      // Through L2 only: the partials are read once, and the next call rewrites them.
#pragma unroll 4
    for (int q = 0; q < p.n; ++q)
      V::add(acc, __ldcg(reinterpret_cast<const uint4*>(parts[q] + at + r * gemm::kTileN + col)));
    if (bias != nullptr) {
#pragma unroll
      for (int j = 0; j < V::kN; ++j) acc[j] += toF(bias[n0 + col + j]);
    }
    const uint4 v = V::pack(acc);
    const int32_t row = m0 + r;
    if (p.kind == 0) {
      for (int q = 0; q < p.n; ++q)
        *reinterpret_cast<uint4*>(outs[q] + (int64_t)row * p.N + n0 + col) = v;
    } else {
      const int32_t d = min(p.n - 1, row / p.rowsPerRank);
      *reinterpret_cast<uint4*>(outs[d] + (int64_t)(row - d * p.rowsPerRank) * p.N + n0 + col) = v;
    }
  }
}

// A helper's claims in tailLog: no CTA's tag (grids stay far below 0xffff CTAs), so no CTA's
// final-flag pass releases them again.
constexpr uint64_t kGcHelperTag = 0xffff;

// The claim loop of a CTA's three helper warps. They reduce one tile together and claim it
// only once every rank has stored its partial. Session 24 measured the alternative, a warp a
// tile claimed ahead and waited for (one warp takes ~0.2-0.3 ms over a 128x256 tile): the
// warps held the last waves' tiles when the GEMMs ended, and the kernel ended ~0.3 ms after
// them at 8192^3; claiming ready tiles together, ~0.05-0.15 ms (session 25). So at the end of
// its GEMM a CTA holds at most one tile, and what is unclaimed falls to the CTAs' tails. The
// loop ends with the CTA's GEMM, or on abort / deadline (rt::Spin, as every wait).
static_assert(kGcMaxLocal <= kGcHelperThreads, "gcHelperLoop: one helper thread per rank");
template <typename T>
__device__ __forceinline__ void gcHelperLoop(const GcParams& p, const GcTail& tail, uint64_t seq,
                                             const T* const* parts, T* const* outs,
                                             const volatile int* gemmDone) {
  __shared__ int32_t claimed;
  __shared__ int bad;
  const int32_t t = (int32_t)threadIdx.x - 32;  // 0..95
  const uint64_t tag = (seq << 16) | kGcHelperTag;
  __shared__ int32_t taken;  // tiles claimed so far (the trace's count; shared: no register)
  if (t == 0) taken = 0;     // read by thread 0 alone
  for (;;) {
    if (t == 0) {
      int32_t m = -1;
      rt::Spin spin(512);  // abort, a peer's failure and the deadline end the look too
      while (*gemmDone == 0) {
        const uint32_t next = *reinterpret_cast<volatile uint32_t*>(p.tailClaim);
        if (next >= (uint32_t)tail.owned) break;
        int32_t mb, nb;
        gemm::tileCoords(p.g, (int32_t)(tail.first + (int64_t)p.n * next), &mb, &nb);
        const int32_t id = mb * p.g.tilesN + nb;
        if (gcTileReady(p, id, seq)) {
          // Exactly the tile found ready: ~33 CTAs a rank poll the same one, and an atomicAdd
          // would hand the losers the next tiles, not ready yet, claimed ahead again. A lost
          // race looks again at once (the counter only grows within a call: no ABA).
          if (atomicCAS(p.tailClaim, next, next + 1u) == next) {
            m = (int32_t)next;
            p.tailLog[m] = tag;
            break;
          }
          continue;
        }
        const uint32_t kind = spin.check(p.w);
        if (kind != rt::kErrNone) {
          // Recorded; no claim (m < 0) stops the helpers, and the call fails.
          spin.fail(p.w, kind, rt::ErrSite{p.w.op, -1, (int32_t)blockIdx.x, id, rt::kWaitFlag, 0},
                    seq);
          break;
        }
      }
      claimed = m;
      bad = 0;
      if (m >= 0) {
        ++taken;
      } else if (p.trace != nullptr) {
        p.trace[kGcTraceWords * blockIdx.x + 3] = (uint64_t)taken;
      }
    }
    ptx::namedBarSync(gemm::kBarSide, kGcHelperThreads);
    const int32_t m = claimed;  // rewritten only after the tile's last barrier below
    if (m < 0) return;          // no tile left, the GEMM done, or a failure (recorded)
    int32_t mBlk, nBlk;
    gemm::tileCoords(p.g, (int32_t)(tail.first + (int64_t)p.n * m), &mBlk, &nBlk);
    const int32_t id = mBlk * p.g.tilesN + nBlk;
    // Thread 0 alone saw the flags: thread q acquires rank q's partial for every helper thread
    // (ready already, so no wait; bounded anyway, a failure is recorded and the call fails).
    if (t < p.n && !rt::waitGe(p.w, gcDone(p, t) + id, seq,
                               rt::ErrSite{p.w.op, t, (int32_t)blockIdx.x, id, rt::kWaitFlag, 0},
                               gcScope(p), 256))
      bad = 1;
    ptx::namedBarSync(gemm::kBarSide, kGcHelperThreads);
    if (bad) return;
    gcHelperPrefetch<T>(p, mBlk, nBlk, parts, t);
    gcHelperTile<T>(p, mBlk, nBlk, parts, outs, t);
    // Every thread's stores visible to every rank, then thread q releases the tile's final flag
    // on rank q (the reduce role's pattern: fence, barrier, release).
    gcFence(p);
    ptx::namedBarSync(gemm::kBarSide, kGcHelperThreads);
    if (t < p.n) gcRelease(p, gcFinal(p, t) + id, seq);
  }
}

// The side job of compute CTA `cta` (warps 1-3 of its producer warpgroup, see above).
// `gemmDone` turns non-zero once the CTA's GEMM tiles are done. A warp releases the final
// flags of each tile it reduced itself, so peers never wait for its CTA's GEMM or tail.
template <typename T>
__device__ void gcHelperRole(const GcParams& p, int32_t cta, const volatile int* gemmDone) {
  __shared__ const T* parts[kGcMaxLocal];
  __shared__ T* outs[kGcMaxLocal];
  __shared__ alignas(128) uint8_t cmapStage[128];
  __shared__ int ok;
  const int32_t warp = threadIdx.x / 32 - 1, lane = threadIdx.x & 31;
  const uint64_t seq = gcSeq(p);
  if (warp == 0) {
    // No comm CTA: this warp publishes the rank's slot (gcReduceRole's publisher otherwise).
    if (cta == 0 && p.split.of(Role::kIntraComm) == 0) gcPublishWarp(p, seq, cmapStage);
    bool mine = true;
    for (int q = lane; q < p.n; q += 32) {
      if (!gcPeerSlot(p, q, seq)) {
        mine = false;
        break;
      }
      parts[q] = static_cast<const T*>(p.q->slot[q].P);
      outs[q] = static_cast<T*>(p.q->slot[q].C);
    }
    const bool all = __all_sync(0xffffffffu, mine);
    if (lane == 0) ok = all ? 1 : 0;
  }
  ptx::namedBarSync(gemm::kBarSide, kGcHelperThreads);
  if (!ok) return;
  const GcTail tail(p);
  gcHelperLoop<T>(p, tail, seq, parts, outs, gemmDone);
}

// The chunks this CTA handles, in the order the compute CTAs produce their tiles, each owned
// tile cut into row chunks. Every thread walks it alike. Before the tail, owned tiles are
// dealt round robin to the comm CTAs (idx < nIdx). In the tail, thread 0 claims the next
// owned tile for the CTA (one atomic per tile) and the CTA's threads learn it through shared
// memory: comm CTAs that fall behind the GEMMs and compute CTAs that finished theirs share
// the last tiles as they become free, so the final waves' reduce is not left to a few comm
// CTAs after the GEMM has ended, whatever their rate. `claim` false walks only the tiles
// before the tail (the final-flag pass; tail tiles are found in tailLog).
struct GcChunkIt : GcChunk {
  int32_t k = -1;  // index of the current tile among this CTA's before the tail (see gcOwner)
  bool inTail = false, valid = false;
  __device__ GcChunkIt() : GcChunk{0, 0, 0, 0} {}
  // O(1) per tile: walking the schedule (a tileCoords per position, every thread) cost a comm
  // CTA ~0.4 ms per pass at 2048 tiles on the H200 and was most of the reduce role's time.
  __device__ bool nextTile(const GcParams& p, int32_t idx, int32_t nIdx, uint64_t seq, bool claim) {
    const int64_t tiles = (int64_t)p.g.tilesM * p.g.tilesN, tail0 = tiles - p.tailTiles;
    int64_t t = -1;
    if (!inTail) {
      const int64_t s = p.me + (int64_t)p.n * (idx + (int64_t)nIdx * (k + 1));
      if (idx < nIdx && s < tail0) {
        ++k;
        t = s;
      } else {
        inTail = true;
      }
    }
    if (t < 0) {
      if (!claim || p.tailTiles == 0) return false;
      __shared__ int32_t claimed;
      const GcTail tail(p);
      __syncthreads();  // every thread has read the previous claim
      if (threadIdx.x == 0) {
        claimed = (int32_t)atomicAdd(p.tailClaim, 1u);
        if (claimed < tail.owned) p.tailLog[claimed] = (seq << 16) | blockIdx.x;
      }
      __syncthreads();
      if (claimed >= tail.owned) return false;
      t = tail.first + (int64_t)p.n * claimed;
    }
    gemm::tileCoords(p.g, (int32_t)t, &mBlk, &nBlk);
    return true;
  }
  // Advances to the next chunk; `valid` false past the last one.
  __device__ void next(const GcParams& p, int32_t idx, int32_t nIdx, uint64_t seq) {
    const int32_t tileRows = min(gemm::kTileM, p.M - mBlk * gemm::kTileM);
    if (valid && r0 + p.chunkRows < tileRows) {
      r0 += p.chunkRows;
    } else {
      valid = nextTile(p, idx, nIdx, seq, true);
      r0 = 0;
    }
    if (valid) rows = min(p.chunkRows, min(gemm::kTileM, p.M - mBlk * gemm::kTileM) - r0);
  }
};

// Thread 0 loads chunk `c` of every rank's partials into `buf`, completing on `bar`. The first
// chunk of a tile first waits for the tile's done flag on every rank. False (error recorded)
// on timeout/abort; nothing is issued then.
template <typename T>
__device__ bool gcLoadChunk(const GcParams& p, const GcChunk& c, const T* const* parts, uint8_t* in,
                            uint64_t* bar, uint64_t seq) {
  const int32_t id = c.tileId(p);
  if (c.r0 == 0) {
    for (int q = 0; q < p.n; ++q) {
      if (!rt::waitGe(p.w, gcDone(p, q) + id, seq,
                      rt::ErrSite{p.w.op, q, (int32_t)blockIdx.x, id, rt::kWaitData, 0},
                      gcScope(p)))
        return false;
    }
    // The flags were acquired through the generic proxy; the partials are read by the copy
    // engine (async proxy).
    ptx::fenceProxyAsync();
  }
  const int32_t rowBytes = gemm::kTileN * (int32_t)sizeof(T);
  const uint32_t bytes = (uint32_t)(c.rows * rowBytes);
  const int64_t at = ((int64_t)id * gemm::kTileM + c.r0) * gemm::kTileN;
  if (p.debug & 2) {
    ptx::mbarArrive(bar);
    return true;
  }
  ptx::mbarArriveExpectTx(bar, bytes * p.n);
  for (int q = 0; q < p.n; ++q)
    ptx::bulkLoad1d(in + q * p.chunkRows * rowBytes, parts[q] + at, bytes, bar);
  return true;
}

// All threads: out rows = bias + sum over ranks (in rank order) of the chunk's input rows.
// Columns past N are left as they are (the tensor stores clip them).
template <typename T>
__device__ void gcSumChunk(const GcParams& p, const GcChunk& c, const uint8_t* in, uint8_t* out) {
  using V = GcVec<T>;
  const int32_t rowBytes = gemm::kTileN * (int32_t)sizeof(T);
  const int32_t block = p.chunkRows * rowBytes;
  const int32_t n0 = c.nBlk * gemm::kTileN;
  const int32_t vecs = min(gemm::kTileN, p.N - n0) / V::kN;  // host rule: whole vectors
  const T* bias = static_cast<const T*>(p.bias);
  for (int32_t e = threadIdx.x; e < c.rows * vecs; e += blockDim.x) {
    const int32_t r = e / vecs, v = e - r * vecs;
    const int32_t byte = r * rowBytes + v * 16;
    float acc[V::kN];
#pragma unroll
    for (int j = 0; j < V::kN; ++j) acc[j] = 0.f;
    for (int q = 0; q < p.n; ++q)
      V::add(acc, *reinterpret_cast<const uint4*>(in + q * block + byte));
    if (bias != nullptr) {
#pragma unroll
      for (int j = 0; j < V::kN; ++j) acc[j] += toF(bias[n0 + v * V::kN + j]);
    }
    *reinterpret_cast<uint4*>(out + byte) = V::pack(acc);
  }
}

// Thread 0 stores the chunk's output rows with one tensor store per destination rank (one
// bulk group per chunk). A ReduceScatter chunk that spans two shards goes row by row with 1-D
// bulk copies instead: a box there would start at a negative row of the second shard (the
// H200 raised an illegal instruction) and could not stop at the shard's edge.
template <typename T>
__device__ void gcStoreChunk(const GcParams& p, const GcChunk& c, const uint8_t* out,
                             T* const* outs) {
  const int32_t n0 = c.nBlk * gemm::kTileN, row0 = c.mBlk * gemm::kTileM + c.r0;
  if (p.kind == 0) {
    for (int q = 0; q < p.n; ++q) ptx::tmaStore2d(&p.q->slot[q].cmap, out, n0, row0);
  } else {
    const int32_t d0 = min(p.n - 1, row0 / p.rowsPerRank);
    const int32_t d1 = min(p.n - 1, (row0 + c.rows - 1) / p.rowsPerRank);
    if (d0 == d1) {
      ptx::tmaStore2d(&p.q->slot[d0].cmap, out, n0, row0 - d0 * p.rowsPerRank);
    } else {
      const int32_t rowBytes = gemm::kTileN * (int32_t)sizeof(T);
      const uint32_t bytes = (uint32_t)(min(gemm::kTileN, p.N - n0) * (int32_t)sizeof(T));
      for (int32_t r = 0; r < c.rows; ++r) {
        const int32_t row = row0 + r, d = min(p.n - 1, row / p.rowsPerRank);
        ptx::bulkStore1d(outs[d] + (int64_t)(row - d * p.rowsPerRank) * p.N + n0,
                         out + r * rowBytes, bytes);
      }
    }
  }
  ptx::bulkCommit();
}

// ---- processes layout (see the header comment) ------------------------------------------

// Thread 0 stores `rows` rows of smem block `src` (tile rows: kTileN columns of T each),
// global rows row0.., column block n0, into this rank's C: AllReduce every row (one tensor
// store, clipped at M); ReduceScatter the rows of this rank's shard only (a tensor store when
// the block lies inside the shard, else row by row, as gcStoreChunk). No commit.
template <typename T>
__device__ void gcStoreOwnRows(const GcParams& p, const uint8_t* src, int32_t n0, int32_t row0,
                               int32_t rows) {
  if (p.kind == 0) {
    ptx::tmaStore2d(&p.cmap, src, n0, row0);
    return;
  }
  const int32_t lo = p.me * p.rowsPerRank, hi = lo + p.rowsPerRank;
  if (row0 >= lo && row0 + p.chunkRows <= hi) {
    ptx::tmaStore2d(&p.cmap, src, n0, row0 - lo);
    return;
  }
  const int32_t rowBytes = gemm::kTileN * (int32_t)sizeof(T);
  const uint32_t bytes = (uint32_t)(min(gemm::kTileN, p.N - n0) * (int32_t)sizeof(T));
  T* C = static_cast<T*>(p.C);
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t row = row0 + r;
    if (row < lo || row >= hi) continue;
    ptx::bulkStore1d(C + (int64_t)(row - lo) * p.N + n0, src + r * rowBytes, bytes);
  }
}

// Thread 0, the owner's store of a reduced chunk: into its data region's F (the tile-by-tile
// layout of the partials: the chunk's rows are one block) for the ranks that pull it, and into
// its own C. One bulk group.
template <typename T>
__device__ void gcStoreChunkProcs(const GcParams& p, const GcChunk& c, const uint8_t* out) {
  const int32_t rowBytes = gemm::kTileN * (int32_t)sizeof(T);
  const int64_t at = ((int64_t)c.tileId(p) * gemm::kTileM + c.r0) * gemm::kTileN;
  T* F = reinterpret_cast<T*>(p.peerData[p.me] + p.fOff);
  ptx::bulkStore1d(F + at, out, (uint32_t)(c.rows * rowBytes));
  gcStoreOwnRows<T>(p, out, c.nBlk * gemm::kTileN, c.mBlk * gemm::kTileM + c.r0, c.rows);
  ptx::bulkCommit();
}

// Processes layout, after this CTA's reduced tiles are final: its share of the other owners'
// tiles (schedule positions idx, idx + nIdx, ...). Each waits for its owner's final flag (which
// also says the owner has read this rank's partial) and, where this rank needs the rows
// (AllReduce: all; ReduceScatter: its shard's), thread 0 copies them from the owner's F into
// C through two shared-memory buffers (a load lands while the previous block is stored).
// `bars`: two initialised mbarriers; `bufs`: two blocks of chunkRows tile rows. Every thread
// must call it; false when a wait failed (recorded).
template <typename T>
__device__ bool gcPullRole(const GcParams& p, int32_t idx, int32_t nIdx, uint64_t* bars,
                           uint8_t* bufs, uint64_t seq) {
  __shared__ int pullOk;
  if (threadIdx.x == 0) {
    pullOk = 1;
    const int32_t rowBytes = gemm::kTileN * (int32_t)sizeof(T);
    const int32_t block = p.chunkRows * rowBytes;
    const int32_t numTiles = p.g.tilesM * p.g.tilesN;
    uint32_t phases = 0;  // bit b: the parity buffer b's mbarrier waits for next (no array:
                          // a run-time index would put it in local memory)
    int32_t k = 0;        // blocks loaded so far (buffer k % 2)
    for (int32_t t = idx; t < numTiles; t += nIdx) {
      const int owner = gcOwner(p, t);
      if (owner == p.me) continue;
      int32_t mBlk, nBlk;
      gemm::tileCoords(p.g, t, &mBlk, &nBlk);
      const int32_t id = mBlk * p.g.tilesN + nBlk, m0 = mBlk * gemm::kTileM;
      if (!rt::waitGe(p.w, gcFinal(p, owner) + id, seq,
                      rt::ErrSite{p.w.op, owner, (int32_t)blockIdx.x, id, rt::kWaitData, 0},
                      rt::kScopeSys)) {
        pullOk = 0;
        break;
      }
      int32_t lo = 0, hi = min(gemm::kTileM, p.M - m0);  // tile rows this rank stores
      if (p.kind != 0) {
        lo = max(lo, p.me * p.rowsPerRank - m0);
        hi = min(hi, (p.me + 1) * p.rowsPerRank - m0);
      }
      if (lo >= hi) continue;
      // The flag came through the generic proxy; F is read by the copy engine.
      ptx::fenceProxyAsync();
      const T* F = reinterpret_cast<const T*>(p.peerData[owner] + p.fOff);
      // Blocks start on chunk boundaries of the tile (the owner's tensor-store geometry).
      for (int32_t r0 = lo / p.chunkRows * p.chunkRows; r0 < hi; r0 += p.chunkRows, ++k) {
        const int32_t b = k & 1, rows = min(p.chunkRows, min(gemm::kTileM, p.M - m0) - r0);
        // Buffer b was last read by the store of block k - 2; at most one group (k - 1) may
        // still be reading.
        ptx::bulkWaitRead<1>();
        ptx::mbarArriveExpectTx(&bars[b], (uint32_t)(rows * rowBytes));
        ptx::bulkLoad1d(bufs + b * block, F + ((int64_t)id * gemm::kTileM + r0) * gemm::kTileN,
                        (uint32_t)(rows * rowBytes), &bars[b]);
        ptx::mbarWait(&bars[b], (phases >> b) & 1u);
        phases ^= 1u << b;
        gcStoreOwnRows<T>(p, bufs + b * block, nBlk * gemm::kTileN, m0 + r0, rows);
        ptx::bulkCommit();
      }
    }
    ptx::bulkWait<0>();  // C written before the kernel (and the call) ends
  }
  return __syncthreads_and(threadIdx.x == 0 ? pullOk : 1) != 0;
}

// Comm role of GEMM + AllReduce / ReduceScatter: CTA idx of nIdx comm CTAs (see the section
// comment), or with idx >= nIdx compute CTA idx - nIdx after its GEMM tiles, reducing its share
// of the tail (GcChunkIt).
template <typename T>
__device__ void gcReduceRole(const GcParams& p, int32_t idx, int32_t nIdx, uint8_t* smem) {
  __shared__ const T* parts[kGcMaxLocal];
  __shared__ T* outs[kGcMaxLocal];
  __shared__ int ok;
  const uint64_t seq = gcSeq(p);
  // [0, 128): mbarriers; [128, 256): the C map staging; then the stages (GcReducePlan):
  // stage s = n input blocks, then its output block.
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem) + 127) & ~uintptr_t(127));
  uint64_t* bar = reinterpret_cast<uint64_t*>(base);
  const int32_t block = p.chunkRows * gemm::kTileN * (int32_t)sizeof(T);
  uint8_t* stages = base + kGcReduceHead;
  const int32_t S = p.stages, stageBytes = (p.n + 1) * block;
  // The publisher: comm CTA 0, or with no comm CTA the helpers of compute CTA 0 (gcHelperRole;
  // that CTA's tail comes here as idx 0 too, after the slot was published).
  const bool publisher = idx == 0 && nIdx > 0;
  if (!p.procs && publisher && threadIdx.x < 32) gcPublishWarp(p, seq, base + 128);
  // Processes: two more mbarriers for the pull phase, after the stages' (<= kGcMaxStages).
  uint64_t* pullBars = bar + kGcMaxStages;
  if (threadIdx.x == 0 && p.procs) {
    ok = 1;
    for (int s = 0; s < S; ++s) ptx::mbarInit(&bar[s], 1);
    for (int b = 0; b < 2; ++b) ptx::mbarInit(&pullBars[b], 1);
    ptx::fenceMbarInit();
    // Partials at the start of each rank's data region (mapped here).
    for (int q = 0; q < p.n; ++q) parts[q] = reinterpret_cast<const T*>(p.peerData[q]);
  } else if (threadIdx.x == 0) {
    ok = 1;
    for (int s = 0; s < S; ++s) ptx::mbarInit(&bar[s], 1);
    ptx::fenceMbarInit();
    for (int q = 0; q < p.n && ok; ++q) {
      if (!gcPeerSlot(p, q, seq)) {
        ok = 0;
        break;
      }
      parts[q] = static_cast<const T*>(p.q->slot[q].P);
      outs[q] = static_cast<T*>(p.q->slot[q].C);
      ptx::fenceTensormapAcquire(&p.q->slot[q].cmap);
    }
  }
  // Every decision below that thread 0 alone can make is taken collectively, through the
  // barrier's own reduction (__syncthreads_and of thread 0's verdict): a shared flag read after
  // a barrier could already hold thread 0's next verdict, leaving threads with different
  // control flow (different barrier counts) on an error path.
  const bool t0 = threadIdx.x == 0;
  if (!__syncthreads_and(t0 ? ok : 1)) return;
  // Chunk j lives in stage j % S (mbarrier phase (j / S) & 1); stageChunk[j % S] says which
  // chunk it is (a claimed tail tile cannot be walked to twice).
  __shared__ GcChunk stageChunk[kGcMaxStages];
  GcChunkIt ahead, cand;  // the last chunk loaded; the next one, once found (a claim is kept)
  bool hasCand = false;
  int32_t loaded = 0;   // chunks whose loads were issued
  bool more = true;     // false past the last chunk or after a failed wait
  bool failed = false;  // a wait failed (error recorded): finish what is in flight, no flags
  // Issues the next chunk's loads into its stage (whose previous chunk has been summed). A
  // chunk that starts a tile needs the tile's flags on every rank: `block` waits for them
  // (bounded); otherwise nothing is issued while they are unset, so chunks that have already
  // landed are summed instead of waiting behind a tile the GEMMs have yet to finish.
  auto load = [&](bool block) {
    if (!more) return false;
    if (!hasCand) {
      cand = ahead;
      cand.next(p, idx, nIdx, seq);
      hasCand = true;
    }
    if (!cand.valid) {
      more = false;
      return false;
    }
    int verdict = 1;  // thread 0's: 1 issued, 0 not ready, -1 failed (recorded)
    if (t0) {
      if (!block && cand.r0 == 0 && !gcTileReady(p, cand.tileId(p), seq)) {
        verdict = 0;
      } else {
        verdict = gcLoadChunk<T>(p, cand, parts, stages + (loaded % S) * stageBytes,
                                 &bar[loaded % S], seq)
                      ? 1
                      : -1;
      }
    }
    if (!__syncthreads_or(t0 && verdict != 0)) return false;  // not ready yet
    if (!__syncthreads_and(t0 ? verdict == 1 : 1)) {
      more = false;
      failed = true;
      return false;
    }
    if (t0) stageChunk[loaded % S] = cand;
    ahead = cand;
    hasCand = false;
    ++loaded;
    return true;
  };
  for (int32_t i = 0;; ++i) {
    while (loaded <= i && load(true)) {
    }
    if (loaded <= i) break;  // past the last chunk, or a failed wait
    // Chunks up to i + S - 1 fit (chunk i - 1's stage is free); take those already published.
    while (loaded < i + S && load(false)) {
    }
    uint8_t* st = stages + (i % S) * stageBytes;
    // Thread 0 alone spins on the stage's mbarrier (384 spinning threads would compete with
    // the copy engine's writes for shared memory); the others then pass its completed phase
    // once, which makes the landed data visible to them.
    if (t0) {
      ptx::mbarWait(&bar[i % S], (uint32_t)((i / S) & 1));
      // The stage's output block was last stored by chunk i-S: its reads must be done (one
      // bulk group per chunk; the S-1 later ones may still be in flight).
      gcBulkWaitRead(S - 1);
    }
    __syncthreads();
    ptx::mbarWait(&bar[i % S], (uint32_t)((i / S) & 1));
    const GcChunk cur = stageChunk[i % S];  // rewritten only when chunk i + S is loaded
    if (!(p.debug & 4)) gcSumChunk<T>(p, cur, st, st + p.n * block);
    ptx::fenceProxyAsyncShared();  // generic smem writes -> the copy engine's reads
    __syncthreads();
    if (t0 && !(p.debug & 1)) {
      if (p.procs) {
        gcStoreChunkProcs<T>(p, cur, st + p.n * block);
      } else {
        gcStoreChunk<T>(p, cur, st + p.n * block, outs);
      }
    }
    if (t0 && (p.debug & 1)) ptx::bulkCommit();  // an empty group keeps the read-wait count
  }
  // (A compute CTA's slot holds the end of its GEMM tiles.)
  if (p.trace != nullptr && t0 && idx < nIdx)
    p.trace[kGcTraceWords * blockIdx.x + 1] = ptx::globalTimerNs();
  // Every store complete (not just read) before the flags that announce them.
  if (t0) {
    ptx::bulkWait<0>();
    ptx::fenceProxyAsync();
  }
  __threadfence_system();
  __syncthreads();
  if (failed) return;
  if (p.procs) {
    // My final flag of each tile this CTA reduced: its rows are in my F (and my C), and every
    // rank's partial of it has been read.
    GcChunkIt t;  // (no tail in this layout)
    while (t.nextTile(p, idx, nIdx, seq, false)) {
      if (threadIdx.x == 0) ptx::stReleaseSys(gcFinal(p, p.me) + t.tileId(p), seq);
    }
    __syncthreads();
    // C is complete, and my partials unread, once every other owner's tile is final.
    gcPullRole<T>(p, idx, nIdx, pullBars, stages, seq);
    return;
  }
  // tileFinal on every rank for each tile this CTA reduced: its tiles before the tail, then
  // the tail tiles it claimed (tailLog, written by this CTA's thread 0 before the barriers
  // above).
  GcChunkIt t;
  while (t.nextTile(p, idx, nIdx, seq, false)) {
    for (int q = threadIdx.x; q < p.n; q += blockDim.x)
      gcRelease(p, gcFinal(p, q) + t.tileId(p), seq);
  }
  if (p.tailTiles > 0) {
    const GcTail tail(p);
    const uint64_t mine = (seq << 16) | blockIdx.x;
    for (int32_t m = threadIdx.x; m < tail.owned; m += blockDim.x) {
      // Other CTAs may be writing other entries: a volatile read (never this CTA's tag).
      if (*reinterpret_cast<volatile const uint64_t*>(p.tailLog + m) != mine) continue;
      int32_t mBlk, nBlk;
      gemm::tileCoords(p.g, (int32_t)(tail.first + (int64_t)p.n * m), &mBlk, &nBlk);
      for (int q = 0; q < p.n; ++q) gcRelease(p, gcFinal(p, q) + mBlk * p.g.tilesN + nBlk, seq);
    }
  }
  // A compute CTA's tail ends here: the comm CTAs wait for the final flags (with none, the
  // compute CTAs do).
  if (idx >= nIdx && nIdx > 0) return;
  const int32_t nWait = nIdx > 0 ? nIdx : p.split.of(Role::kCompute);
  // This rank's C is complete, and its partials unread, once every tile's owner finished.
  // Every thread takes a share of the flags: one system-scope acquire costs about 1 us (the
  // clique's are GPU scope now), and thread 0 alone spent ~1 ms on 1024 tiles (2 comm CTAs,
  // 2048 tiles, H200).
  const int32_t numTiles = p.g.tilesM * p.g.tilesN;
  for (int32_t t = idx + nWait * (int32_t)threadIdx.x; t < numTiles;
       t += nWait * (int32_t)blockDim.x) {
    int32_t mBlk, nBlk;
    gemm::tileCoords(p.g, t, &mBlk, &nBlk);
    const int32_t id = mBlk * p.g.tilesN + nBlk, owner = gcOwner(p, t);
    if (!rt::waitGe(p.w, gcFinal(p, p.me) + id, seq,
                    rt::ErrSite{p.w.op, owner, (int32_t)blockIdx.x, id, rt::kWaitData, 0},
                    gcScope(p)))
      break;
  }
  __syncthreads();
}
