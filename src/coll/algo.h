// Pure host logic of the collectives (no CUDA calls, unit-tested on the CPU): the
// workspace layout, algorithm choice, chunking and the cost model that drives both the
// choice and ncclGroupSimulateEnd.
//
// Everything a peer must agree on (layout, algorithm, chunk sizes, lanes) is a function of
// values that are identical on every rank: workspace bytes, local rank count, element
// count and size, the rank count and MKERNEL_ALGO. The CTA budget (which may differ from
// rank to rank, e.g. 3 ranks on one GPU and 1 on another) never influences it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <nccl.h>

#include "coll/coll.h"
#include "comm/workspace.h"  // WsLayout, kMaxLocalRanks, MK_HD

namespace mk {

constexpr uint64_t kMinChunkBytes = 2048;

// ncclInvalidUsage (with a message) when the workspace cannot hold even 2 slots of 1 KiB
// per pair. A single local rank needs no workspace.
ncclResult_t wsLayoutCompute(uint64_t wsBytes, int nLocal, WsLayout* out);

// CTAs per kernel: default smCount / ranks sharing the GPU; MKERNEL_MIN/MAX_CTAS (env,
// > 0) override ncclConfig_t minCTAs/maxCTAs (> 0), which override the default. Never
// more than smCount, never fewer than 1.
struct CtaBudget {
  int lo, hi;
};
CtaBudget ctaBudget(int smCount, int ranksOnDevice, int cfgMin, int cfgMax, int envMin, int envMax);
inline int ctaGrid(const CtaBudget& b, int work) {
  int g = work < b.hi ? work : b.hi;
  return g < b.lo ? b.lo : (g < 1 ? 1 : g);
}

// kZeroCopy: AllReduce when every rank of the comm lives in this process on one GPU, so each
// rank can read its peers' send buffers and write their receive buffers directly: rank q
// reduces segment q of all inputs and writes it to all outputs (each input byte read once,
// each output byte written once; no staging).
enum class Algo : int {
  kAuto = -1,
  kOneShot = 0,
  kTwoShot = 1,
  kRing = 2,
  kDirect = 3,
  kZeroCopy = 4
};
const char* algoName(Algo a);
// "" -> kAuto; "oneshot", "twoshot", "ring", "zerocopy" (case-insensitive); anything else ->
// kAuto and *ok = false.
Algo parseAlgo(const char* s, bool* ok);

// The cost model (microseconds): launch + per-hop latency + bytes over an effective
// bandwidth. The constants were fitted to AllReduce measurements on one H200 with 2, 4 and 8
// ranks sharing it (bench_coll_bench, 2025-11-29; docs/collectives.md has the numbers):
// there every rank's traffic shares one HBM, so the effective bandwidths fall with the rank
// count, and a step of two-shot costs a little per peer. They are leads for separate GPUs.
struct CostModel {
  double launchUs = 10.0;      // launch, first flag round trip, completion
  double hopUs = 1.1;          // one/two-shot: per peer touched by a step
  double ringHopUs = 3.5;      // ring: one hop (2(n-1) of them on the critical path)
  double oneShotGBs = 150;     // one-shot: (n-1) x bytes leave every rank
  double twoShotGBs = 170;     // two-shot: 2(n-1)/n x bytes, incast on each segment owner
  double twoShotLoss = 0.065;  // bandwidth / (1 + loss * (n - 2))
  double ringGBs = 190;        // ring: 2(n-1)/n x bytes, neighbour traffic only
  double ringLoss = 0.2;
  double directGBs = 150;    // direct copies (broadcast, gathers, p2p)
  double zeroCopyGBs = 780;  // zero-copy AllReduce: 2 x bytes per rank (256 MiB, 4 ranks: 682 us)
};
// Zero-copy AllReduce from this size up (below it one-shot's single flag round wins).
constexpr uint64_t kZeroCopyMinBytes = 256 << 10;
// Zero-copy over registered buffers of ranks in other processes from this size up: each
// call first agrees on the mappings with one or two bootstrap allgathers (tens of us).
constexpr uint64_t kRegZeroCopyMinBytes = 4 << 20;
const CostModel& costModel();
double allReduceUs(Algo a, uint64_t bytes, int nRanks);
// Time of any operation (bytes = count * element size as NCCL counts it).
double collUs(CollType t, Algo a, uint64_t bytes, int nRanks);

// AllReduce algorithm: forced (if not kAuto and nRanks > 1) or the cheapest by the model.
// zeroCopy: the comm allows kZeroCopy (same process, one GPU); forcing kZeroCopy on a comm
// that does not falls back to the automatic choice.
Algo allReduceAlgo(uint64_t bytes, int nRanks, Algo forced, bool zeroCopy = false);

// Chunking of a reduction collective. Elements: counts of the dtype.
struct ReducePlan {
  Algo algo;
  uint64_t segElems;    // two-shot / ReduceScatter segment
  uint64_t chunkElems;  // chunk (per segment for two-shot, RS and ring)
  uint64_t nChunks;     // one-shot/Reduce: chunks; two-shot/RS: chunks per segment; ring: rounds
  int lanes;            // min(ws lanes, nChunks)
};
// type: kAllReduce (count = elements), kReduce (count), kReduceScatter (count = recvcount).
ReducePlan planReduce(CollType type, Algo algo, uint64_t count, size_t esize, int nRanks,
                      const WsLayout& ws);
// Elements per chunk for `total` elements spread over `lanes`: a multiple of 16 bytes,
// at least kMinChunkBytes (when the slot allows it), at most one slot.
uint64_t chunkElemsFor(uint64_t total, size_t esize, int lanes, uint64_t slotBytes);

// Copy engine: chunk size (multiple of 16 bytes, <= slot) for a transfer of `bytes`; the
// sender and the receiver compute the same value from the same byte count.
uint64_t copyChunkBytes(uint64_t bytes, const WsLayout& ws);

}  // namespace mk
