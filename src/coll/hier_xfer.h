// Channel engine of the inter-node comms: every operation other than the hierarchical
// AllReduce (hier_allreduce.cu) is a short list of launches, each made of a few "lanes"
// (one CTA each) that run a list of steps through the device communication API.
//
// Channels. Every ordered pair (s -> r) is a FIFO of chunks of at most slotBytes. Its
// area in r's window (second half of the window: the first half belongs to the
// hierarchical AllReduce, so both can be in flight on different ranks at once) has two
// slots; chunk q (1-based, counted over the comm's lifetime) goes to slot q % 2:
//   sender:   wait ACK[r] >= q - 2 (the slot is free), put_signal(.., DATA[s] = q)
//   receiver: wait DATA[s] >= q, read the slot, signal(s, ACK[r] = q)
// DATA/ACK slots have one writer each; the chunk counts of every channel are kept in the
// rank's own signal words (SENT[r], RCVD[s]; only the rank writes them), so calls run back
// to back and CUDA graphs replay without host help.
//
// Steps: send / receive a message of n bytes (ceil(n / slotBytes) chunks), local copy, and
// reduce: per chunk, combine the inputs of list 0 in list order (my own entry reads my
// buffer), round, then optionally combine list 1 in list order (my own entry is that
// partial), divide for ncclAvg, write to memory or send to a peer.
// PreMulSum (every rank has its own scalar): list 0 holds raw inputs, list 1 partials. A
// send flagged kXRawInput carries raw input to a list-0 reducer: each chunk is scaled by
// the sender's scalar (round(x * s), prims.cuh premul1) into a zero-copy scratch slot of
// the channel (send_ptr at the window offset of the slot it lands in: free once the slot
// is, ACK >= q - 2) and put from there; the reducer scales only its own list-0 entry, the
// same way. Partials are never scaled again.
//
// Deadlock freedom (planner rules, checked by hierCheckLaunch):
//  - within a launch a channel endpoint (me -> r, s -> me) belongs to one lane, so a
//    channel's chunks are produced and consumed in plan order;
//  - plain send / receive lanes visit peers in pairwise-exchange rounds (hierRoundOrder):
//    the k-th message between two ranks is in the same round on both;
//  - senders that feed reductions use "interleaved" lanes: chunk position p of every
//    stream (one per peer) before position p + 1, so a reducer that needs chunk p of every
//    input is never starved by a sender blocked on another reducer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "coll/algo.h"  // MK_HD
#include "coll/coll.h"
#include "transport/net_state.h"

namespace mk {

constexpr int kXMaxRanks = 256;
constexpr int kXMaxLanes = 4;
constexpr int kXMaxSteps = 640;
// Signal slots (after the hierarchical AllReduce's range, hier.h: kHierSigEnd = 2402).
constexpr uint32_t kXSigData = 2432;                    // + sender: its chunks landed
constexpr uint32_t kXSigAck = kXSigData + kXMaxRanks;   // + receiver: chunks consumed
constexpr uint32_t kXSigSent = kXSigAck + kXMaxRanks;   // + peer: private chunk count
constexpr uint32_t kXSigRcvd = kXSigSent + kXMaxRanks;  // + peer: private chunk count
constexpr uint32_t kXSigEnd = kXSigRcvd + kXMaxRanks;
static_assert(kXSigEnd <= kNetSignals, "channel signal slots exceed kNetSignals");

enum XKind : uint8_t { kXSend = 0, kXRecv = 1, kXCopy = 2, kXReduce = 3 };
enum XFlag : uint8_t {
  kXHasL2 = 1,
  kXLastOfStream = 2,
  kXRawInput = 4,  // send: raw input of a list-0 reduction (PreMulSum pre-scales it)
  kXSized = 8,     // send / recv / copy of a device-sized AlltoAll: n is the most it moves
                   // (HierXHead::sized)
  kXListOne = 16,  // reduce to memory: combine list 1 alone (partials, never scaled; my own
                   // entry reads p1), then divide for ncclAvg
};

// One step (by value in the kernel arguments).
struct XStep {
  uint64_t p0;    // send: source; recv: destination; copy: source; reduce: output (peer < 0)
  uint64_t p1;    // copy: destination; reduce: my own input
  uint64_t n;     // bytes (send, recv, copy) or elements (reduce)
  uint32_t pos0;  // interleaved lanes: first chunk position of the step in its stream
  int16_t peer;   // send / recv: the peer; reduce: output peer, -1: memory at p0
  uint8_t kind;   // XKind
  uint8_t flags;  // XFlag
};
static_assert(sizeof(XStep) == 32, "XStep layout");

struct XLane {
  uint16_t first, count;  // steps [first, first + count)
  uint8_t interleave;
};

// Kernel arguments (by value, __grid_constant__; well under the 32 KiB parameter limit): the
// fields before the steps.
struct HierXHead {
  NetDev d;
  uint64_t areaBase;   // window offset of the channel areas
  uint64_t areaBytes;  // one sender's area in a window
  uint64_t slotBytes;  // chunk size (multiple of 256)
  const void* scalarPtr;
  uint64_t scalarBits;
  int dtype, red, postDiv, premul, scalarOnDevice;
  int me, nRanks, nLanes, nSteps;
  SizedUnits sized;  // device-sized AlltoAll: the sizes of its kXSized steps
  XLane lanes[kXMaxLanes];
  int16_t listLen[2];
  int16_t list[2][kXMaxRanks];
};
// Steps of the small argument block (HierXArgsSmall below).
constexpr int kXSmallSteps = 32;
template <int MaxSteps>
struct HierXArgsT : HierXHead {
  // The kernel of the small argument block (byte-typed launches of at most kXSmallSteps
  // steps: send/recv, AllGather, Broadcast, AlltoAll, ... of small groups) carries the
  // small-put path (devcomm.cuh putRemote: 8-byte puts in the proxy command); the full one,
  // at its register budget, keeps staging.
  static constexpr bool kSmallPuts = MaxSteps <= kXSmallSteps;
  XStep steps[MaxSteps];
};
// What the planner fills (hier_launch.cc).
using HierXArgs = HierXArgsT<kXMaxSteps>;
static_assert(sizeof(HierXArgs) < 32000, "kernel parameter limit");
// A byte-typed launch of at most kXSmallSteps steps (send/recv, an AlltoAll of up to 15
// peers) passes this copy instead (2.4 KB): the full one is 21.9 KB of parameters on every
// launch.
using HierXArgsSmall = HierXArgsT<kXSmallSteps>;

// ---- pure host planning (unit-tested) ----------------------------------------------------
struct XTopo {
  int nRanks = 0, me = 0;
  std::vector<std::vector<int>> nodeRanks;  // [node][local index] = rank
  int node = 0, local = 0;
  bool even = false;  // every node has the same rank count: rail-aligned forms
};
struct XOp {
  CollType type;
  uint64_t send, recv;  // addresses
  uint64_t count;       // NCCL's count (per rank for AllGather etc.)
  size_t es;            // element size
  int root;             // root, or peer for send / recv
};
struct XPlanLane {
  bool interleave = false;
  std::vector<XStep> steps;
};
struct XPlanLaunch {
  std::vector<XPlanLane> lanes;
  std::vector<int> list[2];  // reduce input lists (ranks)
  bool noPostDiv = false;    // its outputs are partials a later launch combines (and divides)
};

// Members 0..g-1 of a group in pairwise-exchange order for member i: round t pairs i with
// (t - i) mod g, a symmetric relation (i itself once when g is odd or i's round comes up).
std::vector<int> hierRoundOrder(int g, int i);
// Channel geometry of a window; false when a slot would be smaller than 256 bytes.
bool hierChanGeom(uint64_t windowBytes, int nRanks, uint64_t* areaBase, uint64_t* areaBytes,
                  uint64_t* slotBytes);
// Launches of one collective (not AllReduce on even nodes: hier_allreduce.cu) for rank
// t.me; empty steps, lanes and launches are left out. "" or the reason it cannot be done.
std::string hierPlanColl(const XTopo& t, const XOp& op, std::vector<XPlanLaunch>* out);
// One launch for every send / receive of a group (in issue order).
std::string hierPlanP2p(const XTopo& t, const std::vector<XOp>& ops, std::vector<XPlanLaunch>* out);
// Fills pos0 / kXLastOfStream of interleaved lanes for chunks of slotBytes.
void hierAssignPositions(XPlanLaunch* l, uint64_t slotBytes);
// "" when the launch follows the rules above (for rank me), else what is wrong.
std::string hierCheckLaunch(const XPlanLaunch& l, int me);
// Chunks of a message of `bytes`.
MK_HD inline uint64_t hierChunks(uint64_t bytes, uint64_t slotBytes) {
  return (bytes + slotBytes - 1) / slotBytes;
}
// Bytes a step moves on its channels (reduce: elements x es).
MK_HD inline uint64_t hierStepBytes(const XStep& s, size_t es) {
  return s.kind == kXReduce ? s.n * es : s.n;
}

}  // namespace mk
