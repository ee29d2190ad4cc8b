// Internals of a Bootstrap: the listening socket, the receiver thread that drains incoming
// connections into a queue of messages keyed by (peer, kind, tag, sub), and the outgoing
// connections (one per peer, opened on first use, serialised by a mutex).
//
// Connections are one-directional: the connecting side only writes, the accepting side only
// reads. So a close never discards unread data of the other direction (closing a socket with
// unread input sends RST), and a clean shutdown is: send kKindBye, close. An EOF without a bye
// marks the peer as failed, and receives from it fail at once instead of waiting for a timeout.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/proto.h"
#include "bootstrap/socket.h"

namespace mk {

struct BootstrapMsg {
  std::unique_ptr<char[]> data;
  size_t size = 0;
};

struct BootstrapMsgKey {
  int peer;
  uint32_t kind;
  uint64_t tag;
  uint32_t sub;
  bool operator<(const BootstrapMsgKey& o) const {
    return std::tie(peer, kind, tag, sub) < std::tie(o.peer, o.kind, o.tag, o.sub);
  }
};

struct BootstrapOutConn {
  std::mutex mu;
  Socket sock;
  bool failed = false;
};

enum BootstrapPeerState : uint8_t { kPeerOk = 0, kPeerClosed = 1, kPeerFailed = 2 };

}  // namespace mk

struct mk::Bootstrap {
  int rank = -1;
  int nranks = 0;
  uint64_t secret = 0;
  uint64_t commHash = 0;
  const uint32_t* abortFlag = nullptr;
  int64_t timeoutMs = 0;
  Socket listen;
  std::vector<SocketAddress> peers;  // listen address of every rank

  std::mutex outMu;  // guards the `out` vector itself (entries are created on first use)
  std::vector<std::unique_ptr<BootstrapOutConn>> out;

  std::thread rx;
  int wakeFd = -1;  // eventfd: wakes the receiver thread for shutdown
  std::mutex mu;    // guards everything below
  std::condition_variable cv;
  std::map<BootstrapMsgKey, std::deque<BootstrapMsg>> queue;
  std::vector<uint8_t> peerState;  // BootstrapPeerState per rank
  bool rxFailed = false;
  std::atomic<bool> stop{false};

  std::atomic<uint64_t> agSeq{0};       // allgather calls so far
  std::atomic<uint64_t> barrierSeq{0};  // barrier calls so far
};

namespace mk {

// Opens the listening socket (on the bootstrap interface) and starts the receiver thread.
// peers[] is sized but empty; the caller fills it.
ncclResult_t bootstrapCreate(int rank, int nranks, uint64_t secret, uint64_t commHash,
                             const uint32_t* abortFlag, Bootstrap** out);
// extraAbort: a second flag to honour (the child's, when a split talks through its parent).
ncclResult_t bootstrapSendMsg(Bootstrap* b, int peer, uint32_t kind, uint64_t tag, uint32_t sub,
                              const void* data, size_t size, const uint32_t* extraAbort = nullptr);
ncclResult_t bootstrapRecvMsg(Bootstrap* b, int peer, uint32_t kind, uint64_t tag, uint32_t sub,
                              void* data, size_t size, const uint32_t* extraAbort = nullptr);
// Ring allgather over `ranks` (ranks of b; null = all of b's ranks in order), me = index in it.
ncclResult_t bootstrapRingAllGather(Bootstrap* b, const int* ranks, int n, int me, uint32_t kind,
                                    uint64_t tag, void* data, size_t bytesPerRank,
                                    const uint32_t* extraAbort = nullptr);

}  // namespace mk
