// Internals of the socket net backend (net_socket.cc: the Net interface; net_socket_io.cc:
// moving frames). Not part of any other layer's interface.
//
// A send/recv comm pair is nconns TCP connections. Connection 0 is the *inline* connection:
// it has no helper thread; whoever calls isend/irecv/test on the comm (the proxy thread)
// writes and reads it with non-blocking calls. Every message of up to kInlineMax bytes
// travels on it, so a small message costs the sender one sendmsg() and the receiver one or
// two recv()s in threads that are running anyway: no helper thread has to be woken and
// scheduled (which, on a CPU held by a spinning thread, e.g. a rank bound to one core,
// takes up to a scheduler slice per hop). Larger messages are cut into chunks striped over
// connections 1..nconns-1, each served by a helper thread on both sides (with nconns == 1
// everything goes inline). Each connection carries whole frames {seq, total, offset, len,
// tag} in seq order; the receiver looks a frame's message up by seq, so which connection a
// frame took does not matter to it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>

#include <nccl.h>

#include "transport/net.h"

namespace mk {
namespace sock {

constexpr uint32_t kFrameMagic = 0x4d4b4652u;
constexpr int kMaxConns = 16;
constexpr int kMaxRequests = 1024;  // outstanding per comm; beyond, isend/irecv say "busy"
constexpr size_t kMinChunk = 128 << 10;
constexpr size_t kMaxChunk = 4 << 20;
// Messages up to this size are one frame on the inline connection.
constexpr size_t kInlineMax = kMinChunk;
// Frames the inline connection reads per progress call (the caller has other work).
constexpr int kInlineFramesPerCall = 64;
// Frames the inline connection writes with one sendmsg (two iovecs each): a proxy batch is
// a header message and one data message per put, and on loopback every sendmsg runs the
// receiver's TCP path too (5-6 us measured on the H200 host), so writing them together
// saves a system call per message after the first.
constexpr int kTxGatherFrames = 16;

// The handshake each connection of a connect() opens with (wire format).
constexpr uint64_t kHelloMagic = 0x6f6c6c65682d6b6dull;  // "mk-hello"
constexpr uint32_t kHelloInline = 1;
struct Hello {
  uint64_t magic;
  uint64_t nonce;  // groups the connections of one connect() at the acceptor
  uint32_t index;
  uint32_t nconns;
  uint32_t flags;  // kHelloInline: connection 0 is the inline connection
  uint32_t reserved;
};

struct Frame {
  uint64_t seq;
  uint64_t total;
  uint64_t offset;
  uint64_t len;
  int32_t tag;
  uint32_t magic;
};

// Both sides derive the chunking from (total, data connections) alone: one chunk up to
// kInlineMax, else chunks striped over the helper connections.
size_t chunkBytes(size_t total, int dataConns);
uint64_t numChunks(size_t total, int dataConns);

struct Comm;

struct Request {
  Comm* comm = nullptr;
  bool isSend = false;
  // send
  std::atomic<uint64_t> chunksLeft{0};
  size_t size = 0;
  // recv (fields guarded by comm->mu, except done)
  int n = 0;
  uint64_t baseSeq = 0;
  void* data[kNetMaxRecvs] = {};
  size_t cap[kNetMaxRecvs] = {};
  int tags[kNetMaxRecvs] = {};
  size_t got[kNetMaxRecvs] = {};
  bool used[kNetMaxRecvs] = {};
  int bound[kNetMaxRecvs] = {};  // message j of this request -> buffer index, -1 unbound
  uint64_t msgChunksLeft[kNetMaxRecvs] = {};
  // Frames of message j its size still allows to bind: a frame bound past them (a corrupt
  // peer) could still be writing into the buffer after the message completed.
  uint64_t msgChunksUnbound[kNetMaxRecvs] = {};
  int msgsLeft = 0;
  std::atomic<bool> done{false};
};

struct Task {
  Request* req;
  uint64_t seq;
  size_t total, offset, len;
  int tag;
  const char* ptr;
  size_t sent = 0;  // inline connection: bytes of frame header + payload written so far
};

struct Conn {
  int fd = -1;
  std::thread thread;  // helper (connections 1..nconns-1)
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;  // send side of a helper connection
};

// Bytes the inline connection reads at once: a frame header with a small payload (a proxy
// batch header with its inline data fits) and often the frames behind it, in one recv().
constexpr size_t kInlineRxBuf = 8 << 10;

// Receive state of the inline connection between progress calls: the frame being received
// and the bytes read ahead of it. Payloads of at least kInlineRxBuf bytes still missing are
// read straight into their receive buffer (no copy through `in`).
struct InlineRx {
  struct Cur {
    Frame f{};
    size_t hdrGot = 0;
    bool bound = false;  // f matched to (req, j, buf)
    Request* req = nullptr;
    int j = 0, buf = 0;
    size_t payGot = 0;
  } cur;
  std::unique_ptr<char[]> in;   // kInlineRxBuf bytes, allocated at the first read
  size_t inPos = 0, inEnd = 0;  // read, not yet consumed: in[inPos, inEnd)
  bool closed = false;          // clean EOF seen (counted in eofs)
  // Net::recvCounts: recv() calls, those that found nothing, frames landed.
  uint64_t calls = 0, empty = 0, frames = 0;
};

struct Comm {
  bool isSend = false;
  std::string peer;
  int nconns = 0;
  // Connection 0 is the inline connection (MKERNEL_SOCKET_INLINE=1, the connector's choice,
  // told to the acceptor in the handshake); else every connection has helper threads and
  // every message is striped over all of them.
  bool inlineConn = true;
  // Send comm, MKERNEL_SOCKET_TX_COALESCE: isend only queues an inline frame; the caller's
  // next test() (or isend with this off) writes every queued frame in one sendmsg.
  bool txDefer = false;
  int dataConns() const { return inlineConn && nconns > 1 ? nconns - 1 : nconns; }
  Conn conns[kMaxConns];
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> error{ncclSuccess};
  std::string errMsg;
  bool errWarned = false;       // a quiet error (peer closed) is logged when first reported
  int eofs = 0;                 // recv: connections that reached a clean EOF
  uint64_t nextSeq = 0;         // send: next message; recv: seqs covered by posted irecvs
  std::deque<Request*> posted;  // recv: requests with messages still to land
  std::unordered_set<Request*> live;
  // Inline connection (lock order: ioMu, then mu). txq: frames not fully written yet.
  std::mutex ioMu;
  std::deque<Task> txq;
  // Net::sendCounts (ioMu): sendmsg() calls on the inline connection, frames fully written.
  uint64_t txCalls = 0, txFrames = 0;
  InlineRx rx;
};

// quiet: the peer closed between messages, which is how every comm ends; it becomes a
// warning only if a request is still waiting (checkError in net_socket.cc).
void setError(Comm* c, ncclResult_t res, const std::string& msg, bool quiet = false);

// Helper threads of connections 1..nconns-1.
void sendThread(Comm* c, Conn* conn);
void recvThread(Comm* c, Conn* conn);

// Moves what it can on the inline connection without blocking: writes queued frames (send
// comm) or reads arrived frames into posted receives (recv comm). Errors go to the comm.
// Returns at once when another thread is progressing the same comm.
void progressInline(Comm* c);

}  // namespace sock
}  // namespace mk
