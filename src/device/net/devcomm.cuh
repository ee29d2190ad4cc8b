// The device communication API: one set of calls for every peer of a comm, whatever node
// it is on. Kernels receive a NetDev by value (netDevView, transport/net_state.h).
//
//   put(d, src, peer, dst_offset, bytes)                  copy to the peer's window
//   put_signal(d, src, peer, dst_offset, bytes, slot, v)  ... then update its signal slot
//   signal(d, peer, slot, v)                              signal after every earlier put
//   wait_signal(d, slot, v[, from])                       until my slot >= v
//   wait_signal_from(d, slot, v, writer)                  the same, writer the slot's only one
//   quiet(d)                                              source buffers reusable
//   recv_ptr(d, from, offset)                             where `from`'s puts landed here
//   send_ptr(d, offset)                                   zero-copy source area
//
// Routing. A peer of this (virtual) node is reached with direct stores: vectorised copies
// into its P2P window (mapped through peer memory), then fence + st.release.sys (or
// red.release.sys for adds) on its signal word; .gpu scope for a set signal to a peer on my
// own GPU (NetDev::localSameDev), whose waits then acquire at .gpu too. Any other peer is reached
// through the proxy: the call becomes fixed-size commands in the GPU->CPU ring (proxy_ring.cuh; a
// full ring is back-pressure, bounded and abortable), the proxy sends the data and writes the
// peer's signal word only after the data landed (proxy.h).
//
// Sources. put copies from any device-readable `src`. For a remote peer the data must sit
// in the proxy's registered source window: a src inside send_ptr()'s area is sent as is
// (zero-copy: do not overwrite it before quiet()); any other src is staged, chunk by chunk,
// through staging slots that are reused once the proxy has sent their data.
//
// Destinations. dst_offset addresses the peer's window of d.windowBytes bytes. Puts from
// local peers and from remote peers land in different memories (P2P window, proxy receive
// window), so a receiver reads `from`'s data at recv_ptr(d, from, offset).
//
// Signals. 64-bit words, monotonic, never reset: use increasing values (sequence numbers)
// with kSignalSet, or kSignalAdd. wait_signal sees the sum of the word local peers write
// and the word the proxy writes, so a "set" slot must have a single writer.
// Ordering: put_signal and signal to a peer make every earlier put of the calling group
// to that peer visible before the signal. Puts to one peer whose destinations overlap must
// be separated by a signal the writer waits on (as the channel protocol's acks do): the
// proxy may land a later chunked put before an earlier small one carried in a header.
//
// Scope. Every call is made by a whole group with the same arguments: Block (default:
// every thread of the CTA), Warp (all 32 lanes) or Thread. put* copy with every thread
// of the group; rings, signals and waits are done by its first thread. Every call returns
// false on failure (bad arguments, timeout, abort, the proxy stopped): the first failure
// of the comm is recorded (host-mapped record, turned into ncclCommGetAsyncError's error
// with a message naming the peer) and the kernel should return; later calls fail fast.
// Waits poll the abort flag and the proxy's ring abort and end at MKERNEL_TIMEOUT_MS.
#pragma once
#include <cstdint>
#include <type_traits>

#include "device/rt/wait.cuh"
#include "transport/net_state.h"
#include "transport/proxy_ring.cuh"

namespace mk {
namespace dev {
namespace net {

// ---- groups ----------------------------------------------------------------------------
struct Block {
  static __device__ __forceinline__ uint32_t rank() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  }
  static __device__ __forceinline__ uint32_t size() { return blockDim.x * blockDim.y * blockDim.z; }
  static __device__ __forceinline__ void sync() { __syncthreads(); }
  static __device__ __forceinline__ bool any(bool p) { return __syncthreads_or(p) != 0; }
  static __device__ __forceinline__ uint64_t bcast(uint64_t v) {
    __shared__ uint64_t box;
    __syncthreads();  // earlier readers of box are done
    if (rank() == 0) box = v;
    __syncthreads();
    return box;
  }
};
struct Warp {
  static __device__ __forceinline__ uint32_t rank() { return ptx::laneId(); }
  static __device__ __forceinline__ uint32_t size() { return 32; }
  static __device__ __forceinline__ void sync() { __syncwarp(); }
  static __device__ __forceinline__ bool any(bool p) {
    bool r = __any_sync(0xffffffffu, p) != 0;
    __syncwarp();  // memory ordering for the lanes' reads after the call
    return r;
  }
  static __device__ __forceinline__ uint64_t bcast(uint64_t v) {
    return __shfl_sync(0xffffffffu, (unsigned long long)v, 0);
  }
};
struct Thread {
  static __device__ __forceinline__ uint32_t rank() { return 0; }
  static __device__ __forceinline__ uint32_t size() { return 1; }
  static __device__ __forceinline__ void sync() {}
  static __device__ __forceinline__ bool any(bool p) { return p; }
  static __device__ __forceinline__ uint64_t bcast(uint64_t v) { return v; }
};

// ---- internals ---------------------------------------------------------------------------
namespace detail {

// Group copy: 16-byte vectors (4 in flight per thread) when src and dst are co-aligned,
// bytes otherwise.
template <class G>
__device__ __forceinline__ void copy(char* dst, const char* src, uint64_t n) {
  const uint64_t t = G::rank(), nt = G::size();
  uint64_t done = 0;
  if ((((uintptr_t)dst ^ (uintptr_t)src) & 15) == 0) {
    uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > n) head = n;
    for (uint64_t i = t; i < head; i += nt) dst[i] = src[i];
    const uint64_t nv = (n - head) / 16;
    const int4* s4 = reinterpret_cast<const int4*>(src + head);
    int4* d4 = reinterpret_cast<int4*>(dst + head);
    uint64_t i = t;
    for (; i + 3 * nt < nv; i += 4 * nt) {
      int4 a = s4[i], b = s4[i + nt], c = s4[i + 2 * nt], e = s4[i + 3 * nt];
      d4[i] = a, d4[i + nt] = b, d4[i + 2 * nt] = c, d4[i + 3 * nt] = e;
    }
    for (; i < nv; i += nt) d4[i] = s4[i];
    done = head + nv * 16;
  }
  for (uint64_t i = done + t; i < n; i += nt) dst[i] = src[i];
}

// Records the comm's first error (rt/wait.cuh) and fails. kErrPeerFailed: the net layer
// already failed, its record stands.
static __device__ __noinline__ bool fail(const NetDev& d, uint32_t kind, int peer, int op, int slot,
                                         int what, uint64_t seq, uint64_t waitedNs) {
  if (kind != rt::kErrPeerFailed)
    rt::recordErrorRaw(d.w.hdr, d.w.err, kind, d.w.rank, op, peer, (int)blockIdx.x, slot, what, 0,
                       seq, waitedNs);
  return false;
}

// Bounded-wait step: rt::Spin (abort flag, earlier failure, deadline) plus the proxy's ring
// abort, set when the proxy stops on an error or on netAbort: waiting longer is useless.
struct NetSpin {
  rt::Spin s;
  __device__ __forceinline__ uint32_t check(const NetDev& d) {
    uint32_t kind = s.check(d.w);
    if (kind == rt::kErrNone && (s.n % rt::kSpinCheck) == 0 &&
        ptx::ldVolatile32(d.ring.abort) != 0u)
      kind = rt::kErrProxy;
    return kind;
  }
};

// One command into the proxy ring (a full ring is back-pressure: a bounded wait).
__device__ __forceinline__ bool push(const NetDev& d, const ProxyCmd& cmd, int op, uint64_t seq) {
  uint64_t waited = 0;
  const uint32_t kind = proxyRingPush(d.ring, cmd, d.w, &waited);
  if (kind == rt::kErrNone) return true;
  return fail(d, kind, (int)cmd.peer, op, (int)cmd.slot, rt::kWaitRing, seq, waited);
}
// An inline put of 9..kProxyInlineExtMax bytes: header + continuation slots (proxy_ring.cuh).
__device__ __forceinline__ bool pushInline(const NetDev& d, const ProxyCmd& cmd,
                                           const uint64_t* words, int op, uint64_t seq) {
  uint64_t waited = 0;
  const uint32_t kind = proxyRingPushInline(d.ring, cmd, words, d.w, &waited);
  if (kind == rt::kErrNone) return true;
  return fail(d, kind, (int)cmd.peer, op, (int)cmd.slot, rt::kWaitRing, seq, waited);
}

__device__ __forceinline__ bool checkPut(const NetDev& d, int peer, uint64_t dstOff, uint64_t bytes,
                                         bool sig, uint32_t slot, int op) {
  bool ok = peer >= 0 && peer < d.nRanks && dstOff <= d.windowBytes &&
            bytes <= d.windowBytes - dstOff && (!sig || slot < d.nSignals);
  if (ok) return true;
  // Argument records carry dst_offset in seq and the byte count in waitedNs.
  return fail(d, rt::kErrArgs, peer, op, (int)slot, rt::kWaitNone, dstOff, bytes);
}

// Until the proxy's done counter reaches `need` (one thread), bounded by `sp`; then the
// device copy of done (proxyRingDoneSeen) is raised to what was read. Callers check the copy
// first: most waits end there without a read across PCIe.
__device__ __forceinline__ bool waitRingDone(const NetDev& d, uint64_t need, NetSpin& sp, int peer,
                                             int op, int what) {
  uint64_t done;
  while ((done = proxyRingDone(d.ring)) < need) {
    uint32_t kind = sp.check(d);
    if (kind) return fail(d, kind, peer, op, -1, what, need, sp.s.waited());
  }
  proxyRingNoteDone(d.ring, done);
  return true;
}

// Takes staging slot index idx (monotonic) once the command that used the same slot one
// lap earlier has been sent by the proxy. Single thread.
__device__ __forceinline__ bool stageAcquire(const NetDev& d, int peer, int op, uint64_t* idx) {
  uint64_t i = atomicAdd(reinterpret_cast<unsigned long long*>(d.stageNext), 1ull);
  uint32_t s = (uint32_t)(i % d.stageSlots);
  uint64_t lap = i / d.stageSlots;
  if (lap > 0) {
    NetSpin sp;
    // The previous occupant publishes (lap it used + 1) after pushing its command ...
    while (ptx::ldAcquireGpu(d.stagePub + s) < lap) {
      uint32_t kind = sp.check(d);
      if (kind) return fail(d, kind, peer, op, -1, rt::kWaitStage, i, sp.s.waited());
    }
    // ... with the ring tail read after the push, an upper bound of its ticket + 1. The
    // device copy of done usually says so already (it is a lap of slots old).
    uint64_t need = ptx::ldVolatile64(d.stageTicket + s);
    if (!proxyRingDoneSeen(d.ring, need) && !waitRingDone(d, need, sp, peer, op, rt::kWaitStage))
      return false;
  }
  *idx = i;
  return true;
}

__device__ __forceinline__ void stagePublish(const NetDev& d, uint64_t idx) {
  uint32_t s = (uint32_t)(idx % d.stageSlots);
  *(volatile uint64_t*)(d.stageTicket + s) = ptx::ldVolatile64(d.ring.tail);
  ptx::stReleaseGpu(d.stagePub + s, idx / d.stageSlots + 1);
}

// wait_signal_from's loop: until other + *word >= value (one thread). gpu: the writer runs
// on my GPU (its release was .gpu scoped; so may the acquire be).
__device__ __forceinline__ bool waitOne(const NetDev& d, const uint64_t* word, uint64_t other,
                                        uint64_t value, uint32_t slot, int writer, bool gpu) {
  NetSpin sp;
  while (other + (gpu ? ptx::ldAcquireGpu(word) : ptx::ldAcquireSys(word)) < value) {
    uint32_t kind = sp.check(d);
    if (kind)
      return fail(d, kind, writer, rt::kOpWaitSignal, (int)slot, rt::kWaitSignal, value,
                  sp.s.waited());
  }
  return true;
}

// The peer's signal word in its P2P window.
__device__ __forceinline__ uint64_t* localSignal(const NetDev& d, int li, uint32_t slot) {
  return static_cast<uint64_t*>(d.localWins[li]) + slot;
}

__device__ __forceinline__ void signalWord(uint64_t* w, uint64_t value, uint32_t op, bool gpu) {
  if (gpu)
    op == kSignalAdd ? ptx::redAddReleaseGpu(w, value) : ptx::stReleaseGpu(w, value);
  else
    op == kSignalAdd ? ptx::redAddReleaseSys(w, value) : ptx::stReleaseSys(w, value);
}

// Local index li shares my GPU (NetDev::localSameDev): the .gpu scope orders what it sees.
__device__ __forceinline__ bool sameDev(const NetDev& d, int li) {
  return li < 64 && ((d.localSameDev >> li) & 1ull) != 0;
}

// The block's gathering area for an inline put of 9..kProxyInlineExtMax bytes (putRemote).
__device__ __forceinline__ uint64_t* inlineWordsBuf() {
  __shared__ uint64_t w[kProxyInlineExtMax / 8];
  return w;
}

// kInl: the caller's kernel carries the small-put path (puts of at most kProxyInlineMax bytes
// carry their data in the command when d.inlineCmd, up to kProxyInlineExtMax bytes in the
// command and its continuation slot when d.inlineCmd == 2): only kernels that move small
// messages take it, the others would pay registers for a branch they never run.
template <class G, bool kInl>
__device__ bool putRemote(const NetDev& d, const char* src, int peer, uint64_t dstOff,
                          uint64_t bytes, bool sig, uint32_t slot, uint64_t value, uint32_t sigOp) {
  const int op = sig ? rt::kOpPutSignal : rt::kOpPut;
  if constexpr (kInl) {
    // 9..64 bytes only for a whole block (the data gathered in shared memory below).
    constexpr bool kExt = std::is_same<G, Block>::value;
    if (d.inlineCmd && bytes <= (kExt && d.inlineCmd >= 2 ? kProxyInlineExtMax : kProxyInlineMax)) {
      // No staging slot and no system fence before the push: the data is in the command
      // (and its continuation slot), which the push's release store publishes. The barrier:
      // the group may have just written src.
      G::sync();
      bool ok = true;
      // Built by every thread, pushed by one (so built once in the code; the spills of the
      // small kernels were measured lowest this way: 0 except fp8 types, see the report).
      const ProxyCmd h =
          proxyCmd((sig ? kProxyPutSignal : kProxyPut) | kProxyInline, sig ? sigOp : 0, peer, 0,
                   dstOff, bytes, sig ? slot : 0, sig ? value : 0);
      if (G::rank() == 0) {
        if (bytes <= kProxyInlineMax) {
          uint64_t v = 0;
          for (uint64_t i = 0; i < bytes; i++) reinterpret_cast<char*>(&v)[i] = src[i];
          ProxyCmd c = h;
          c.srcOff = v;
          ok = push(d, c, op, dstOff);
        }
      }
      if constexpr (kExt) {
        if (bytes > kProxyInlineMax) {
          // One byte per thread into shared memory (src has no alignment promise; 64 byte
          // loads in one thread cost the small kernels registers and spills), then the pusher
          // reads whole words from there. The barrier after the push (G::any) keeps the next
          // put from overwriting the buffer while it is read.
          uint64_t* words = inlineWordsBuf();
          for (uint32_t i = G::rank(); i < kProxyInlineExtMax; i += G::size())
            reinterpret_cast<char*>(words)[i] = i < bytes ? src[i] : (char)0;
          G::sync();
          if (G::rank() == 0) {
            ProxyCmd c = h;
            c.srcOff = words[0];
            ok = pushInline(d, c, words, op, dstOff);
          }
        }
      }
      return !G::any(!ok);
    }
  }
  const uint64_t off0 = (uint64_t)(src - d.sendBase);
  if (src >= d.sendBase && off0 <= d.sendUser && bytes <= d.sendUser - off0) {
    // Zero-copy: the data is in the registered window already (written by this group or
    // by earlier work); make it visible to the proxy before the command is.
    __threadfence_system();
    G::sync();
    bool ok = true;
    if (G::rank() == 0)
      ok = push(d,
                proxyCmd(sig ? kProxyPutSignal : kProxyPut, sig ? sigOp : 0, peer, off0, dstOff,
                         bytes, sig ? slot : 0, sig ? value : 0),
                op, dstOff);
    return !G::any(!ok);
  }
  for (uint64_t off = 0; off < bytes; off += d.stageChunk) {
    const uint64_t n = bytes - off < d.stageChunk ? bytes - off : d.stageChunk;
    const bool last = off + n >= bytes;
    uint64_t idx = 0;
    bool ok = true;
    if (G::rank() == 0) ok = stageAcquire(d, peer, op, &idx);
    idx = G::bcast(ok ? idx : ~0ull);
    if (idx == ~0ull) return false;
    char* buf = d.stage + (idx % d.stageSlots) * d.stageChunk;
    copy<G>(buf, src + off, n);
    __threadfence_system();
    G::sync();
    if (G::rank() == 0) {
      const uint64_t so = (uint64_t)(buf - d.sendBase);
      const bool s = sig && last;
      ok = push(d,
                proxyCmd(s ? kProxyPutSignal : kProxyPut, s ? sigOp : 0, peer, so, dstOff + off, n,
                         s ? slot : 0, s ? value : 0),
                op, dstOff + off);
      if (ok) stagePublish(d, idx);
    }
    if (G::any(!ok)) return false;
  }
  return true;
}

template <class G, bool kInl = false>
__device__ bool putImpl(const NetDev& d, const void* srcv, int peer, uint64_t dstOff,
                        uint64_t bytes, bool sig, uint32_t slot, uint64_t value, uint32_t sigOp) {
  const int op = sig ? rt::kOpPutSignal : rt::kOpPut;
  bool ok = true;
  if (G::rank() == 0) ok = checkPut(d, peer, dstOff, bytes, sig, slot, op);
  if (G::any(!ok)) return false;
  const char* src = static_cast<const char*>(srcv);
  const int li = d.peerLocal[peer];
  if (li < 0) {
    if (bytes > 0) return putRemote<G, kInl>(d, src, peer, dstOff, bytes, sig, slot, value, sigOp);
    if (!sig) return true;
    if (G::rank() == 0)
      ok = push(d, proxyCmd(kProxySignal, sigOp, peer, 0, 0, 0, slot, value), op, value);
    return !G::any(!ok);
  }
  char* dst = static_cast<char*>(d.localWins[li]) + d.localDataOff + dstOff;
  copy<G>(dst, src, bytes);
  if (!sig) return true;
  // Adds stay .sys: an add word may have writers on other GPUs too, and adds of different
  // scopes to one word are not atomic with each other in the memory model.
  const uint32_t sop = sigOp & ~kSignalLazy;
  const bool gpu = sameDev(d, li) && sop != kSignalAdd;
  if (gpu)
    __threadfence();
  else
    __threadfence_system();
  G::sync();
  if (G::rank() == 0) signalWord(localSignal(d, li, slot), value, sop, gpu);
  return true;
}

}  // namespace detail

// ---- the API ---------------------------------------------------------------------------
template <class G = Block>
__device__ __forceinline__ bool put(const NetDev& d, const void* src, int peer, uint64_t dst_offset,
                                    uint64_t bytes) {
  return detail::putImpl<G>(d, src, peer, dst_offset, bytes, false, 0, 0, kSignalSet);
}

// kInl: see putRemote (small puts carried in the command, for kernels of small messages).
template <class G = Block, bool kInl = false>
__device__ __forceinline__ bool put_signal(const NetDev& d, const void* src, int peer,
                                           uint64_t dst_offset, uint64_t bytes, uint32_t slot,
                                           uint64_t value, uint32_t sig_op = kSignalSet) {
  return detail::putImpl<G, kInl>(d, src, peer, dst_offset, bytes, true, slot, value, sig_op);
}

template <class G = Block>
__device__ __forceinline__ bool signal(const NetDev& d, int peer, uint32_t slot, uint64_t value,
                                       uint32_t sig_op = kSignalSet) {
  return detail::putImpl<G>(d, nullptr, peer, 0, 0, true, slot, value, sig_op);
}

// Waits until my signal `slot` >= value. `from` (optional) names the expected writer in
// error messages.
template <class G = Block>
__device__ __forceinline__ bool wait_signal(const NetDev& d, uint32_t slot, uint64_t value,
                                            int from = -1) {
  bool ok = true;
  if (G::rank() == 0) {
    if (slot >= d.nSignals) {
      ok = detail::fail(d, rt::kErrArgs, from, rt::kOpWaitSignal, (int)slot, rt::kWaitNone, value,
                        0);
    } else {
      detail::NetSpin sp;
      while (ptx::ldAcquireSys(d.sigLocal + slot) + ptx::ldAcquireSys(d.sigRemote + slot) < value) {
        uint32_t kind = sp.check(d);
        if (kind) {
          ok = detail::fail(d, kind, from, rt::kOpWaitSignal, (int)slot, rt::kWaitSignal, value,
                            sp.s.waited());
          break;
        }
      }
    }
  }
  return !G::any(!ok);
}

// wait_signal for a slot that only rank `writer` updates, for the comm's lifetime (a
// channel's data and ack slots; not add slots of several ranks). Faster: of the two words
// that make up the slot, the writer's route (P2P stores or the proxy) changes only one; the
// other is read once (it never changes: no ordering to acquire) and only the writer's word
// is polled, a host-mapped word when the writer is remote: one PCIe read per poll instead of
// two serial loads. `writer` also names the peer in error messages.
template <class G = Block>
__device__ __forceinline__ bool wait_signal_from(const NetDev& d, uint32_t slot, uint64_t value,
                                                 int writer) {
  bool ok = true;
  if (G::rank() == 0) {
    if (slot >= d.nSignals || writer < 0 || writer >= d.nRanks) {
      ok = detail::fail(d, rt::kErrArgs, writer, rt::kOpWaitSignal, (int)slot, rt::kWaitNone, value,
                        0);
    } else if (d.peerLocal[writer] >= 0) {
      // peerLocal is symmetric (local ranks agree on P2P mapping): the writer reaches me with
      // P2P stores exactly when I reach it so.
      ok = detail::waitOne(d, d.sigLocal + slot, ptx::ldVolatile64(d.sigRemote + slot), value, slot,
                           writer, detail::sameDev(d, d.peerLocal[writer]));
    } else {
      ok = detail::waitOne(d, d.sigRemote + slot, ptx::ldVolatile64(d.sigLocal + slot), value, slot,
                           writer, false);
    }
  }
  return !G::any(!ok);
}

// Current value of my signal slot (no wait).
__device__ __forceinline__ uint64_t signal_value(const NetDev& d, uint32_t slot) {
  return ptx::ldAcquireSys(d.sigLocal + slot) + ptx::ldAcquireSys(d.sigRemote + slot);
}

// Every put issued so far (by any group of this rank) has left its source: staged and
// zero-copy sources may be overwritten. Local puts are complete and visible. It does not
// mean remote data has landed: put_signal / wait_signal say that.
template <class G = Block>
__device__ __forceinline__ bool quiet(const NetDev& d) {
  __threadfence_system();
  G::sync();
  bool ok = true;
  if (G::rank() == 0) {
    const uint64_t need = ptx::ldVolatile64(d.ring.tail);
    if (!proxyRingDoneSeen(d.ring, need)) {
      detail::NetSpin sp;
      ok = detail::waitRingDone(d, need, sp, -1, rt::kOpQuiet, rt::kWaitQuiet);
    }
  }
  return !G::any(!ok);
}

__device__ __forceinline__ bool is_local(const NetDev& d, int peer) {
  return d.peerLocal[peer] >= 0;
}
// Where puts from rank `from` to dst_offset `offset` of my window landed.
__device__ __forceinline__ char* recv_ptr(const NetDev& d, int from, uint64_t offset) {
  return (d.peerLocal[from] >= 0 ? d.localData : d.recvData) + offset;
}
// Zero-copy source area ([0, d.sendUser) bytes): data written here is put without staging.
__device__ __forceinline__ char* send_ptr(const NetDev& d, uint64_t offset) {
  return d.sendBase + offset;
}

}  // namespace net
}  // namespace dev
}  // namespace mk
