// The comm role of the fused GEMM + ReduceScatter and GEMM + AllReduce on a comm spanning
// (virtual) nodes (the xnode layout; chunk geometry, window slots, signal slots and values in
// xnode.h). Part of
// fused_kernels.cuh (included there, inside namespace mk::fused, after GcParams, GcVec and
// xnode_role.cuh; not a header of its own).
//
// The compute CTAs store this rank's partial P tile by tile in the output type (rounded once,
// as the in-node fused path and the sequential path's GEMM do) and release tileFlags[tile];
// their schedule starts on the tile rows of rank me + 1 and ends on this rank's own, so the
// first sends can start early. The comm CTAs (grsCtas):
//  - Send CTA i: rounds t = 1 + i, 1 + i + nSend, ...: owner me + t, its chunks in order:
//    wait for the chunk's tiles (this rank's GEMM), for the ack that frees its slot, then
//    put_signal into the owner's area of this rank. Then waits for each owner's kGxDone (no
//    peer reads P any more, and this call's data has left every window).
//  - Receive CTA k: credits every source it serves, then rounds t = 1 + k, ...: source
//    me - t, chunk by chunk: wait for its data signal, copy the slot into the staging buffer
//    (stage[src][chunk]), release stageFlags[src][chunk], ack lazily when the sender needs
//    the slot again. The last receive CTA sends kGxDone to every source. Receivers never wait
//    for the reducers (the staging buffer holds every chunk), so the AllGather's deadlock
//    argument (pairwise rounds, sends and receives in distinct CTAs) holds unchanged.
//  - Reduce CTA r: chunks r, r + nRed, ... of this rank's: waits for its own tiles and every
//    source's staged chunk, then sums the n partials IN RANK ORDER in fp32 (the in-node fused
//    path's order and rounding: the same bits on every run), adds the bias once, rounds to
//    the output type and stores this rank's rows into Cshard.
// AllReduce: the owner stores its reduced rows into C and releases redFlags[chunk]; every
// stream from s to d goes on, after d's partial chunks, with s's reduced rows (arChunks chunks
// of whole rows of C, the same slots and counts continued), which d's receive CTA copies into
// its C. So each element is reduced once, by its owner, and copied elsewhere: the same bits
// on every rank. Send and receive CTAs take every round's first part (partials) before any
// round's second part: the first parts then finish whatever the second parts wait for (a
// sender's second part waits for its own reduce, which needs every source's first part), and
// the second parts are the AllGather's protocol (pairwise rounds).
// Every wait is bounded and abortable (device API waits and rt::waitGe in the operator's wait
// context) and names the peer waited for.
#pragma once

// Thread 0 waits for flags[0 .. count) >= seq (written by this rank's CTAs); the verdict is
// the whole CTA's. A timeout names `peer` (the rank whose data the flags stand for).
__device__ __forceinline__ bool grsWaitFlags(const GcParams& p, const uint64_t* flags,
                                             int32_t count, uint64_t seq, int peer, int32_t id) {
  int ok = 1;
  if (threadIdx.x == 0)
    for (int32_t i = 0; i < count && ok; ++i)
      ok = rt::waitGe(p.w, flags + i, seq,
                      rt::ErrSite{p.w.op, peer, (int32_t)blockIdx.x, id, rt::kWaitData, 0},
                      rt::kScopeGpu)
               ? 1
               : 0;
  return __syncthreads_and(threadIdx.x == 0 ? ok : 1) != 0;
}

__device__ __forceinline__ void grsSend(const GcParams& p, int32_t i, int32_t nSend, uint64_t seq) {
  const NetDev& d = p.net;
  const int n = p.n, me = p.me;
  const uint8_t* P = static_cast<const uint8_t*>(p.P);
  for (int t = 1 + i; t < n; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    const int64_t chunks = grsChunks(dst, p.rowsPerRank, gemm::kTileM, p.grsRowChunks);
    uint64_t acked = 0;  // the highest ack value this CTA has waited for (this destination)
    for (int64_t j = 0; j < chunks; ++j) {
      int32_t mBlk, nBlk0, tiles;
      grsChunk(dst, j, p.rowsPerRank, gemm::kTileM, p.grsRowChunks, p.grsChunkTiles, p.g.tilesN,
               &mBlk, &nBlk0, &tiles);
      const int32_t id0 = mBlk * p.g.tilesN + nBlk0;
      if (!grsWaitFlags(p, p.tileFlags + id0, tiles, seq, me, id0)) return;
      if (!gxPutChunk(d, P + (int64_t)id0 * p.grsTileBytes, dst, me, seq, j, p.gxSlots, p.gxArea,
                      p.gxChunkBytes, (uint64_t)tiles * p.grsTileBytes, &acked))
        return;
    }
  }
  // AllReduce, every round's second part: this rank's reduced rows, once the reduce chunks
  // covering them are stored (redFlags, this rank's reduce CTAs).
  const int64_t rowBytes = (int64_t)p.N * (p.grsTileBytes / (gemm::kTileM * gemm::kTileN));
  const int32_t lo = me * p.rowsPerRank, first = grsFirstRow(me, p.rowsPerRank, gemm::kTileM);
  const uint8_t* C = static_cast<const uint8_t*>(p.C);
  for (int t = 1 + i; t < n && p.grsArChunks > 0; t += nSend) {
    const int dst = gxSendPeer(me, t, n);
    const int64_t c1 = grsChunks(dst, p.rowsPerRank, gemm::kTileM, p.grsRowChunks);
    uint64_t acked = 0;
    for (int32_t a = 0, x = 0; x < p.grsArChunks; ++x, a += p.grsArRows) {
      const int32_t rows = min(p.grsArRows, p.rowsPerRank - a);
      const int32_t tr0 = (lo + a) / gemm::kTileM, tr1 = (lo + a + rows - 1) / gemm::kTileM;
      const int64_t k0 = (int64_t)(tr0 - first) * p.grsRowChunks;
      if (!grsWaitFlags(p, p.redFlags + k0, (tr1 - tr0 + 1) * p.grsRowChunks, seq, me, (int32_t)k0))
        return;
      if (!gxPutChunk(d, C + (int64_t)(lo + a) * rowBytes, dst, me, seq, c1 + x, p.gxSlots,
                      p.gxArea, p.gxChunkBytes, (uint64_t)rows * rowBytes, &acked))
        return;
    }
  }
  gxSendEnd(d, me, n, i, nSend, seq);
}

__device__ __forceinline__ void grsRecv(const GcParams& p, int32_t k, int32_t nRecv, uint64_t seq) {
  namespace dn = dev::net;
  const NetDev& d = p.net;
  const int n = p.n, me = p.me;
  const int64_t chunks = p.gxChunks;             // this rank's (grsChunks(me))
  const int64_t total = chunks + p.grsArChunks;  // chunks of each source's stream
  uint8_t* stage = static_cast<uint8_t*>(p.G);
  // Credit for call seq: from now on the sources' chunks may land in this rank's window.
  if (!gxCredit(d, me, n, k, nRecv, seq)) return;
  for (int t = 1 + k; t < n; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    for (int64_t j = 0; j < chunks; ++j) {
      int32_t mBlk, nBlk0, tiles;
      grsChunk(me, j, p.rowsPerRank, gemm::kTileM, p.grsRowChunks, p.grsChunkTiles, p.g.tilesN,
               &mBlk, &nBlk0, &tiles);
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src)) return;
      const uint64_t off = gxSlotOff(p.gxArea, p.gxChunkBytes, p.gxSlots, src, j);
      dn::detail::copy<dn::Block>(
          reinterpret_cast<char*>(stage + ((int64_t)src * chunks + j) * p.gxChunkBytes),
          dn::recv_ptr(d, src, off), (uint64_t)tiles * p.grsTileBytes);
      __threadfence();
      __syncthreads();  // every thread's part is stored, and the slot read
      if (threadIdx.x == 0) ptx::stReleaseGpu(p.rowFlags + (int64_t)src * chunks + j, seq);
      if (!gxAckChunk(d, src, me, seq, j, p.gxSlots, total)) return;
    }
  }
  // AllReduce, every round's second part: each source's reduced rows into C.
  const int64_t rowBytes = (int64_t)p.N * (p.grsTileBytes / (gemm::kTileM * gemm::kTileN));
  uint8_t* C = static_cast<uint8_t*>(p.C);
  for (int t = 1 + k; t < n && p.grsArChunks > 0; t += nRecv) {
    const int src = gxRecvPeer(me, t, n);
    for (int32_t a = 0, x = 0; x < p.grsArChunks; ++x, a += p.grsArRows) {
      const int32_t rows = min(p.grsArRows, p.rowsPerRank - a);
      const int64_t j = chunks + x;
      if (!dn::wait_signal_from(d, kGxSigData + src, gxValue(seq, (uint32_t)j + 1), src)) return;
      dn::detail::copy<dn::Block>(
          reinterpret_cast<char*>(C + ((int64_t)src * p.rowsPerRank + a) * rowBytes),
          dn::recv_ptr(d, src, gxSlotOff(p.gxArea, p.gxChunkBytes, p.gxSlots, src, j)),
          (uint64_t)rows * rowBytes);
      __syncthreads();  // the slot read by every thread before it is acked
      if (!gxAckChunk(d, src, me, seq, j, p.gxSlots, total)) return;
    }
  }
  // The last receive CTA: every chunk of every source consumed; the sources may end.
  gxReceiveEnd(d, p.recvDone, nRecv, me, n, seq);
}

template <typename T>
__device__ void grsReduce(const GcParams& p, int32_t r, int32_t nRed, uint64_t seq) {
  using V = GcVec<T>;
  const int n = p.n, me = p.me;
  const int64_t chunks = p.gxChunks;
  const uint8_t* P = static_cast<const uint8_t*>(p.P);
  const uint8_t* stage = static_cast<const uint8_t*>(p.G);
  const T* bias = static_cast<const T*>(p.bias);
  T* C = static_cast<T*>(p.C);
  const int32_t lo = me * p.rowsPerRank, hi = lo + p.rowsPerRank;  // this rank's rows
  const int32_t cRow0 = p.kind == 0 ? 0 : lo;  // AllReduce: C is [M, N]; else the shard
  for (int64_t j = r; j < chunks; j += nRed) {
    int32_t mBlk, nBlk0, tiles;
    grsChunk(me, j, p.rowsPerRank, gemm::kTileM, p.grsRowChunks, p.grsChunkTiles, p.g.tilesN, &mBlk,
             &nBlk0, &tiles);
    const int32_t id0 = mBlk * p.g.tilesN + nBlk0;
    if (!grsWaitFlags(p, p.tileFlags + id0, tiles, seq, me, id0)) return;
    for (int q = 0; q < n; ++q)
      if (q != me && !grsWaitFlags(p, p.rowFlags + (int64_t)q * chunks + j, 1, seq, q, (int32_t)j))
        return;
    const int32_t m0 = mBlk * gemm::kTileM;
    const int32_t r0 = max(lo, m0) - m0, r1 = min(hi, min(m0 + gemm::kTileM, p.M)) - m0;
    for (int32_t tt = 0; tt < tiles; ++tt) {
      const int32_t n0 = (nBlk0 + tt) * gemm::kTileN;
      const int32_t vecs = min(gemm::kTileN, p.N - n0) / V::kN;  // host rule: whole vectors
      for (int32_t e = threadIdx.x; e < (r1 - r0) * vecs; e += blockDim.x) {
        const int32_t row = r0 + e / vecs, v = e % vecs;
        const int64_t at = ((int64_t)tt * p.grsTileBytes) +
                           ((int64_t)row * gemm::kTileN + v * V::kN) * (int64_t)sizeof(T);
        float acc[V::kN];
#pragma unroll
        for (int x = 0; x < V::kN; ++x) acc[x] = 0.f;
        for (int q = 0; q < n; ++q) {
          const uint8_t* base = q == me ? P + (int64_t)id0 * p.grsTileBytes
                                        : stage + ((int64_t)q * chunks + j) * p.gxChunkBytes;
          V::add(acc, *reinterpret_cast<const uint4*>(base + at));
        }
        if (bias != nullptr) {
#pragma unroll
          for (int x = 0; x < V::kN; ++x) acc[x] += toF(bias[n0 + v * V::kN + x]);
        }
        *reinterpret_cast<uint4*>(C + (int64_t)(m0 + row - cRow0) * p.N + n0 + v * V::kN) =
            V::pack(acc);
      }
    }
    // Every thread's rows stored before the chunk's flag (AllReduce: the send CTAs put the
    // rows to the other ranks once it is set).
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ptx::stReleaseGpu(p.redFlags + j, seq);
  }
}

template <typename T>
__device__ __forceinline__ void grsRole(const GcParams& p, int32_t idx, int32_t nIdx) {
  const uint64_t seq = gcSeq(p);
  int nSend, nRecv;
  grsCtas(nIdx, p.n, &nSend, &nRecv);
  if (idx < nSend) {
    grsSend(p, idx, nSend, seq);
  } else if (idx < nSend + nRecv) {
    grsRecv(p, idx - nSend, nRecv, seq);
  } else {
    grsReduce<T>(p, idx - nSend - nRecv, nIdx - nSend - nRecv, seq);
  }
  __syncthreads();
}
