// Operations of comms spanning (virtual) nodes. AllReduce on nodes of equal size is the
// hierarchical kernel below; everything else (and AllReduce on uneven nodes) runs on the
// channel engine of hier_xfer.h.
//
// Hierarchical AllReduce across (virtual) nodes: intra-node reduce-scatter, rail exchange
// between ranks of equal local index on every node, intra-node all-gather. One CTA per
// rank, every transfer through the device communication API (device/net/devcomm.cuh).
//
// Per chunk with sequence number s (device-resident, advanced by the kernel):
//   1. local rank l owns segment l of the chunk; every rank puts its input segment j to
//      local rank j (window area RS, slot kHierSigRS + sender); the owner reduces the nL
//      inputs in local-rank order into recvbuff (the node's partial). PreMulSum (a scalar
//      per rank): a segment leaves pre-scaled by its sender's scalar (staged in the
//      sender's recvbuff), the owner scales only its own input, rounded the same way;
//   2. it puts the partial to local rank l of every other node (area RAIL, slot
//      kHierSigRail + sender's node) and combines the nN partials in node order, so every
//      rail member computes the same bits; ncclAvg divides once, at the end;
//   3. it puts the result to every local peer (area AG, slot kHierSigAG + sender), which
//      copy it into their recvbuff;
//   4. it acknowledges chunk s to every rank that wrote into its window (slots kHierSigAckL
//      / kHierSigAckN).
// Every area has kHierBanks banks; chunk s uses bank s % kHierBanks, and nobody writes chunk
// s into a window before its owner's ack >= s - kHierBanks. With one bank a writer waited for
// the ack of the chunk just sent: every chunk, and every small call, paid a second one-way
// trip (the ack) before the next could leave.
#pragma once
#include <cstdint>
#include <nccl.h>
#include <string>
#include <vector>

#include "coll/algo.h"  // MK_HD
#include "coll/coll.h"
#include "coll/hier_xfer.h"
#include "transport/net_state.h"

struct ncclComm;

namespace mk {

constexpr int kHierMaxLocal = 32;
constexpr int kHierMaxNodes = 128;
constexpr uint64_t kHierBanks = 2;
// Signal slots of the hierarchical collectives (a private range of kNetSignals).
constexpr uint32_t kHierSigBase = 2048;
constexpr uint32_t kHierSigSeq = kHierSigBase;  // my own sequence word (only I write it)
constexpr uint32_t kHierSigRS = kHierSigBase + 1;
constexpr uint32_t kHierSigAG = kHierSigRS + kHierMaxLocal;
constexpr uint32_t kHierSigAckL = kHierSigAG + kHierMaxLocal;
constexpr uint32_t kHierSigRail = kHierSigAckL + kHierMaxLocal;
constexpr uint32_t kHierSigAckN = kHierSigRail + kHierMaxNodes;
// My own word too: how many chunks my last AllReduce call had (the small kernel skips its
// slot acquires after a one-chunk call; hier_allreduce.cu says why that is safe).
constexpr uint32_t kHierSigPrevChunks = kHierSigAckN + kHierMaxNodes;
constexpr uint32_t kHierSigEnd = kHierSigPrevChunks + 1;
static_assert(kHierSigEnd <= kNetSignals, "hierarchical signal slots exceed kNetSignals");
static_assert(kHierSigEnd <= kXSigData, "AllReduce and channel signal slots overlap");

// Kernel arguments (by value).
struct HierArgs {
  NetDev d;
  const void* send;
  void* recv;
  uint64_t count;       // elements
  uint64_t stride;      // bytes of one segment area in the window (multiple of 256)
  uint64_t chunkElems;  // elements per chunk (nLocal * stride / esize, or less)
  uint64_t nChunks;
  int dtype;
  int red;      // RedKind
  int postDiv;  // ncclAvg: divide by this at the end (0: none)
  int premul;   // PreMulSum: multiply my own raw input by my scalar (before it is combined
                // or sent)
  int scalarOnDevice;
  const void* scalarPtr;
  uint64_t scalarBits;
  int node, nNodes, local, nLocal;
  int16_t localPeer[kHierMaxLocal];  // rank of local index j on my node
  int16_t railPeer[kHierMaxNodes];   // rank of my local index on node b
};

// ---- pure host logic (unit-tested) -------------------------------------------------------
// Empty string when a comm of these nodes can run every operation through the inter-node
// paths, else the reason. nodeSizes[b] = ranks of node b.
std::string hierTopoProblem(int nNodes, const int* nodeSizes);
// True when the rail-aligned (hierarchical) forms apply: every node has the same number of
// ranks, within the hierarchical AllReduce's limits.
bool hierEvenNodes(int nNodes, const int* nodeSizes);
// Bytes of one segment area (the AllReduce gets the first half of the net window; the
// channel engine the second): windowBytes split in kHierBanks * (2*nLocal + nNodes) areas,
// rounded down to 256; 0 when smaller than one element.
uint64_t hierStride(uint64_t windowBytes, int nLocal, int nNodes, size_t esize);
// Segment j of a chunk of n elements (nLocal segments, 16-byte multiples where possible): the
// planner and the hierarchical AllReduce kernel cut chunks with this one rule.
MK_HD inline void hierSegment(uint64_t n, int nLocal, size_t esize, int j, uint64_t* off,
                              uint64_t* len) {
  uint64_t seg = (n + (uint64_t)nLocal - 1) / (uint64_t)nLocal;
  const uint64_t q = esize < 16 ? 16 / esize : 1;  // elements per 16 bytes
  seg = (seg + q - 1) / q * q;
  const uint64_t o = seg * (uint64_t)j < n ? seg * (uint64_t)j : n;
  const uint64_t e = o + seg < n ? o + seg : n;
  *off = o;
  *len = e - o;
}
// Window offsets of the areas (sender index i).
MK_HD inline uint64_t hierRsOff(uint64_t stride, int nLocal, int i) {
  (void)nLocal;
  return stride * (uint64_t)i;
}
MK_HD inline uint64_t hierAgOff(uint64_t stride, int nLocal, int i) {
  return stride * (uint64_t)(nLocal + i);
}
MK_HD inline uint64_t hierRailOff(uint64_t stride, int nLocal, int b) {
  return stride * (uint64_t)(2 * nLocal + b);
}
// Start of the bank of chunk s (add it to the offsets above).
MK_HD inline uint64_t hierBankOff(uint64_t stride, int nLocal, int nNodes, uint64_t s) {
  return stride * (uint64_t)(2 * nLocal + nNodes) * (s % kHierBanks);
}

// ---- comm-level --------------------------------------------------------------------------
// One kernel launch of an inter-node comm (what enqueue.cc issues, in order).
struct HierLaunch {
  enum Kind : int { kAllReduce, kChannels } kind = kAllReduce;
  HierArgs ar;  // kAllReduce: the hierarchical AllReduce
  HierXArgs x;  // kChannels: one launch of the channel engine
};
// Plans every operation one comm issues in one call or group (collectives in issue order,
// then its sends/receives) into launches. ncclInvalidUsage with a message for what has no
// inter-node implementation; nothing is issued then.
ncclResult_t hierPlanWork(ncclComm* comm, const std::vector<const CollArgs*>& colls,
                          const std::vector<CollArgs>& p2p, std::vector<HierLaunch>* out);
// Issues one launch on stream s.
ncclResult_t hierRun(ncclComm* comm, HierLaunch& l, cudaStream_t s);
// ncclSuccess when operations may run on this inter-node comm; otherwise ncclInvalidUsage
// with a message.
ncclResult_t hierUsable(ncclComm* comm, const char* api);
// Plans one inter-node AllReduce. *empty: count 0, nothing to launch.
ncclResult_t hierPlan(ncclComm* comm, const CollArgs& a, HierArgs* out, bool* empty);
// Launcher (src/device/hier_allreduce.cu).
cudaError_t launchHierAllReduce(const HierArgs& a, cudaStream_t s);
// Launcher of the channel engine (src/device/hier_xfer.cu).
cudaError_t launchHierX(const HierXArgs& a, cudaStream_t s);
// Channel-engine launches of one collective (not AllReduce on even nodes) or of a group's
// sends and receives (hier_launch.cc).
ncclResult_t hierPlanXColl(ncclComm* comm, const CollArgs& a, std::vector<HierLaunch>* out);
ncclResult_t hierPlanXP2p(ncclComm* comm, const std::vector<CollArgs>& p2p,
                          std::vector<HierLaunch>* out);
// Reduction fields of a resolved op (ncclAvg divides by nRanks at the end).
void hierRedFields(const RedOpInfo& info, int nRanks, int* red, int* postDiv, int* premul,
                   int* scalarOnDevice, const void** scalarPtr, uint64_t* scalarBits);

}  // namespace mk
