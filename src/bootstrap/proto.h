// Wire formats of the bootstrap (root rendezvous and rank-to-rank messages). Fixed-size
// structs in host byte order: ranks of one job run the same build on the same architecture, and
// every field is validated on receipt (magic, version, secret, ranges) before it is used.
#pragma once
#include <cstdint>

#include "bootstrap/socket.h"

namespace mk {

// Bounds on what the network can make us allocate or index.
constexpr int kBootstrapMaxRanks = 1 << 22;
constexpr uint64_t kBootstrapMaxMsgBytes = 1ull << 32;
// A connection must present its hello within this time (slow or silent peers are dropped).
// That is the bound without pressure; under a flood, eviction (below) is what keeps up.
constexpr int64_t kBootstrapHelloTimeoutMs = 5000;
// Connections still saying hello at the root: at most this many, and at most a quarter of the
// fd limit (the root lives in a user's process). More wait in the kernel's accept queue.
constexpr int kBootstrapMaxPending = 4096;
// ... and at a rank's listener, which only its peers should ever call.
constexpr int kBootstrapRankMaxPending = 256;
// When the table is full, the oldest connection that has been silent (or stuck inside its
// hello) this long is dropped to make room. A real rank sends its hello right after connect,
// so it is usually complete by the time it is accepted, and never waits this long for it.
constexpr int64_t kBootstrapEvictAgeMs = 100;
// Different (nranks, nIds, root index) claims a root keeps apart while it does not know which
// one is real (only holders of the secret can make claims).
constexpr int kBootstrapMaxClaims = 16;

enum BootstrapMsgType : uint16_t {
  kRootHello = 1,       // rank -> root of its group: "I am rank r, here is my listen address"
  kSuccessorHello = 2,  // first rank of a group -> root of the previous group (nIds > 1)
  kRootReply = 3,       // root -> rank: the listen address of rank+1
  kPeerHello = 4,       // first bytes of every rank-to-rank connection
};

struct RootHello {
  uint32_t magic;
  uint16_t version;
  uint16_t type;  // kRootHello or kSuccessorHello
  uint64_t secret;
  int32_t rank;
  int32_t nranks;
  int32_t nIds;
  int32_t rootIdx;        // which of the ids this root is
  uint64_t payloadBytes;  // must be sizeof(SocketWireAddress): the sender's listen address
};
static_assert(sizeof(RootHello) == 40, "wire layout");

struct RootReply {
  uint32_t magic;
  uint16_t version;
  uint16_t type;  // kRootReply
  int32_t nranks;
  int32_t next;
  SocketWireAddress nextAddr;
};
static_assert(sizeof(RootReply) == 40, "wire layout");

struct PeerHello {
  uint32_t magic;
  uint16_t version;
  uint16_t type;  // kPeerHello
  uint64_t secret;
  uint64_t commHash;  // identity of the communicator (parent and children differ)
  int32_t src;
  int32_t dst;
  int32_t nranks;
  int32_t pad;
};
static_assert(sizeof(PeerHello) == 40, "wire layout");

// Message kinds: user send/recv and each internal protocol get their own key space.
enum BootstrapMsgKind : uint32_t {
  kKindUser = 1,
  kKindAllGather = 2,
  kKindBarrier = 3,
  kKindSplit = 4,
  kKindInitAddrs = 5,
  kKindBye = 6,  // the sender closes cleanly; an EOF without it means the peer failed
  kKindMax = 7,
};

struct MsgHeader {
  uint32_t kind;
  uint32_t sub;  // step of a collective
  uint64_t tag;
  uint64_t size;
};
static_assert(sizeof(MsgHeader) == 24, "wire layout");

// Scalable init (nIds > 1): rank r belongs to the root of id[r * nIds / nranks].
inline int bootstrapRootOfRank(int rank, int nranks, int nIds) {
  return (int)((int64_t)rank * nIds / nranks);
}
// First rank of root g's group (g may be nIds: returns nranks).
inline int bootstrapFirstRankOfRoot(int g, int nranks, int nIds) {
  return (int)(((int64_t)g * nranks + nIds - 1) / nIds);
}

}  // namespace mk
