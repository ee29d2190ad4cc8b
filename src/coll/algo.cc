#include "coll/algo.h"

#include <cstdint>
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "base/checks.h"

namespace mk {

namespace {
uint64_t roundUp(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}
uint64_t divUp(uint64_t x, uint64_t a) {
  return (x + a - 1) / a;
}
}  // namespace

ncclResult_t wsLayoutCompute(uint64_t wsBytes, int nLocal, WsLayout* out) {
  WsLayout w{};
  if (nLocal <= 1) {
    // No peers: nothing lives in the workspace; slotBytes only bounds chunk sizes.
    w.nLocal = 1;
    w.lanes = kMaxLanes;
    w.slots = 2;
    w.p2pLanes = 1;
    w.slotBytes = 1 << 20;
    *out = w;
    return ncclSuccess;
  }
  MK_ARGCHECK(nLocal <= kMaxLocalRanks,
              "collectives: %d ranks in one node, at most %d are supported", nLocal,
              kMaxLocalRanks);
  // Preferred shapes first: many lanes (CTA parallelism) and 4 slots per lane (pipelining
  // within a lane); a small workspace trades them for slots of a useful size.
  static const int kShapes[][2] = {{16, 4}, {8, 4}, {16, 2}, {8, 2}, {4, 4},
                                   {4, 2},  {2, 4}, {2, 2},  {1, 2}};
  const uint64_t kGoodSlot = 32 << 10, kMinSlot = 1 << 10;
  bool found = false;
  for (const auto& s : kShapes) {
    uint64_t flags = (uint64_t)nLocal * s[0] * s[1];
    uint64_t flagBytes = roundUp(8 * flags, 4096);
    uint64_t hdr = 2 * flagBytes;
    if (wsBytes <= hdr + kWsZcBytes) continue;
    uint64_t slot = (wsBytes - hdr - kWsZcBytes) / flags;
    slot = slot >= 8192 ? slot / 4096 * 4096 : slot / 256 * 256;
    bool last = s[0] == 1;
    if (slot >= kGoodSlot || (last && slot >= kMinSlot)) {
      w.lanes = s[0];
      w.slots = s[1];
      w.slotBytes = slot;
      w.readyOff = 0;
      w.consumedOff = flagBytes;
      w.dataOff = hdr;
      w.zcOff = hdr + slot * flags;  // slot is a multiple of 256: so is zcOff
      w.totalBytes = w.zcOff + kWsZcBytes;
      found = true;
      break;
    }
  }
  if (!found) {
    MK_WARN(
        "collectives: a workspace of %llu bytes (MKERNEL_WORKSPACE_BYTES) is too small for %d "
        "local ranks (needs at least 2 slots of 1 KiB per rank pair)",
        (unsigned long long)wsBytes, nLocal);
    return ncclInvalidUsage;
  }
  w.nLocal = nLocal;
  // The copy engine runs one stream per (peer, direction, lane): keep them <= 1024.
  w.p2pLanes = std::min(w.lanes, std::max(1, 512 / (nLocal - 1)));
  *out = w;
  return ncclSuccess;
}

CtaBudget ctaBudget(int smCount, int ranksOnDevice, int cfgMin, int cfgMax, int envMin,
                    int envMax) {
  int sm = std::max(1, smCount);
  int hi = std::max(1, sm / std::max(1, ranksOnDevice));
  if (envMax > 0)
    hi = envMax;
  else if (cfgMax > 0)
    hi = cfgMax;
  int lo = envMin > 0 ? envMin : (cfgMin > 0 ? cfgMin : 1);
  hi = std::min(hi, sm);
  lo = std::min(std::max(lo, 1), sm);
  if (lo > hi) hi = lo;
  return {lo, hi};
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kOneShot:
      return "oneshot";
    case Algo::kTwoShot:
      return "twoshot";
    case Algo::kRing:
      return "ring";
    case Algo::kDirect:
      return "direct";
    case Algo::kZeroCopy:
      return "zerocopy";
    default:
      return "auto";
  }
}

Algo parseAlgo(const char* s, bool* ok) {
  *ok = true;
  if (s == nullptr || *s == '\0') return Algo::kAuto;
  std::string v(s);
  for (auto& ch : v) ch = (char)tolower((unsigned char)ch);
  if (v == "oneshot" || v == "one-shot" || v == "one_shot") return Algo::kOneShot;
  if (v == "twoshot" || v == "two-shot" || v == "two_shot") return Algo::kTwoShot;
  if (v == "ring") return Algo::kRing;
  if (v == "zerocopy" || v == "zero-copy" || v == "zero_copy") return Algo::kZeroCopy;
  if (v == "auto") return Algo::kAuto;
  *ok = false;
  return Algo::kAuto;
}

const CostModel& costModel() {
  static const CostModel m;
  return m;
}

double allReduceUs(Algo a, uint64_t bytes, int n) {
  const CostModel& m = costModel();
  double b = (double)bytes;  // 1 GB/s = 1e3 bytes per microsecond
  if (n <= 1) return m.launchUs + b / (m.directGBs * 1e3);
  const double bw2 = m.twoShotGBs / (1 + m.twoShotLoss * (n - 2)) * 1e3;
  const double bw3 = m.ringGBs / (1 + m.ringLoss * (n - 2)) * 1e3;
  switch (a) {
    case Algo::kOneShot:
      return m.launchUs + m.hopUs + (n - 1) * b / (m.oneShotGBs * 1e3);
    case Algo::kTwoShot:
      return m.launchUs + 2.0 * (n - 1) * m.hopUs + 2.0 * (n - 1) / n * b / bw2;
    case Algo::kRing:
      return m.launchUs + 2.0 * (n - 1) * m.ringHopUs + 2.0 * (n - 1) / n * b / bw3;
    case Algo::kZeroCopy:  // two flag rounds (pointers in, segments done) and 2 x bytes
      return m.launchUs + 2.0 * m.hopUs + 2.0 * b / (m.zeroCopyGBs * 1e3);
    default:
      return allReduceUs(allReduceAlgo(bytes, n, Algo::kAuto), bytes, n);
  }
}

double collUs(CollType t, Algo a, uint64_t bytes, int n) {
  const CostModel& m = costModel();
  double b = (double)bytes;
  double bw = m.directGBs * 1e3;  // bytes per us
  if (t == CollType::kAllReduce) return allReduceUs(a, bytes, n);
  if (n <= 1) return m.launchUs + b / bw;
  // Zero-copy (zc_plan.h): every rank pulls its block of every input (ReduceScatter) or every
  // input (AllGather) straight from the peers' buffers. At the zero-copy AllReduce's rate, 2 x n
  // blocks fits the H200 (4 ranks, session 26: the 8192^2 bf16 ReduceScatter in 0.30-0.36 ms, this
  // model 0.35; session 21: the AllGather at 0.46-0.77 of the staged time, this model 0.51).
  if (a == Algo::kZeroCopy && (t == CollType::kReduceScatter || t == CollType::kAllGather))
    return m.launchUs + 2.0 * m.hopUs + 2.0 * n * b / (m.zeroCopyGBs * 1e3);
  switch (t) {
    case CollType::kBroadcast:  // the root pushes to n-1 peers
    case CollType::kScatter:
    case CollType::kGather:
    case CollType::kReduce:
      return m.launchUs + m.hopUs + (n - 1) * b / bw;
    case CollType::kAllGather:  // each rank pushes its block to n-1 peers
    case CollType::kAlltoAll:
    case CollType::kReduceScatter:
      return m.launchUs + m.hopUs + (n - 1) * b / bw;
    case CollType::kSend:
    case CollType::kRecv:
      return m.hopUs + b / bw;
    default:
      return m.launchUs;
  }
}

Algo allReduceAlgo(uint64_t bytes, int n, Algo forced, bool zeroCopy) {
  if (n <= 1) return Algo::kOneShot;
  if (forced == Algo::kOneShot || forced == Algo::kTwoShot || forced == Algo::kRing) return forced;
  if (zeroCopy && (forced == Algo::kZeroCopy || bytes >= kZeroCopyMinBytes)) return Algo::kZeroCopy;
  Algo best = Algo::kOneShot;
  double t = allReduceUs(Algo::kOneShot, bytes, n);
  for (Algo a : {Algo::kTwoShot, Algo::kRing}) {
    double u = allReduceUs(a, bytes, n);
    if (u < t) {
      t = u;
      best = a;
    }
  }
  return best;
}

uint64_t chunkElemsFor(uint64_t total, size_t esize, int lanes, uint64_t slotBytes) {
  uint64_t align = esize >= 16 ? 1 : 16 / esize;
  uint64_t maxE = slotBytes / 16 * 16 / esize;
  if (maxE < align) maxE = align;
  uint64_t minE = std::max<uint64_t>(align, kMinChunkBytes / esize);
  uint64_t want = roundUp(std::max<uint64_t>(1, divUp(total, std::max(1, lanes))), align);
  uint64_t ce = std::max(want, minE);
  return std::min(ce, maxE);
}

ReducePlan planReduce(CollType type, Algo algo, uint64_t count, size_t esize, int n,
                      const WsLayout& ws) {
  ReducePlan p{};
  p.algo = type == CollType::kAllReduce || algo == Algo::kZeroCopy ? algo : Algo::kDirect;
  uint64_t align = esize >= 16 ? 1 : 16 / esize;
  if (count == 0) return p;
  switch (type) {
    case CollType::kAllReduce:
      if (p.algo == Algo::kTwoShot) {
        p.segElems = roundUp(divUp(count, n), align);
        p.chunkElems = chunkElemsFor(p.segElems, esize, ws.lanes, ws.slotBytes);
        p.nChunks = divUp(p.segElems, p.chunkElems);
      } else if (p.algo == Algo::kZeroCopy) {
        // Rank q owns segment q; nChunks = 1 only marks "not empty".
        p.segElems = roundUp(divUp(count, n), align);
        p.chunkElems = p.segElems;
        p.nChunks = 1;
      } else if (p.algo == Algo::kRing) {
        p.segElems = 0;
        p.chunkElems = chunkElemsFor(divUp(count, n), esize, ws.lanes, ws.slotBytes);
        p.nChunks = divUp(count, p.chunkElems * n);
      } else {
        p.algo = Algo::kOneShot;
        p.segElems = count;
        p.chunkElems = chunkElemsFor(count, esize, ws.lanes, ws.slotBytes);
        p.nChunks = divUp(count, p.chunkElems);
      }
      break;
    case CollType::kReduceScatter:
    case CollType::kReduce:
      if (p.algo == Algo::kZeroCopy) {  // one pass over my block (RS) or everything (root)
        p.segElems = p.chunkElems = count;
        p.nChunks = 1;
        break;
      }
      p.segElems = count;
      p.chunkElems = chunkElemsFor(count, esize, ws.lanes, ws.slotBytes);
      p.nChunks = divUp(count, p.chunkElems);
      break;
    default:  // not a reduction: planned as Reduce
      p.segElems = count;
      p.chunkElems = chunkElemsFor(count, esize, ws.lanes, ws.slotBytes);
      p.nChunks = divUp(count, p.chunkElems);
      break;
  }
  p.lanes = (int)std::min<uint64_t>(ws.lanes, p.nChunks);
  return p;
}

uint64_t copyChunkBytes(uint64_t bytes, const WsLayout& ws) {
  uint64_t maxB = std::max<uint64_t>(16, ws.slotBytes / 16 * 16);
  uint64_t want = roundUp(std::max<uint64_t>(1, divUp(bytes, std::max(1, ws.p2pLanes))), 16);
  return std::min(std::max(want, kMinChunkBytes), maxB);
}

}  // namespace mk
