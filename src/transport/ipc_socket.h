// Unix-domain datagram sockets for passing file descriptors (SCM_RIGHTS) between the
// processes of one host: cuMem POSIX-fd handles of peer memory travel this way.
//
// Each endpoint binds one SOCK_DGRAM socket to an abstract name (no file in the file
// system, gone when the socket closes). Names are built from the rank and a random 64-bit
// nonce (ipcSocketName), so two comms, or two runs, never collide. A message is
// a small header (magic, comm hash, sender rank, tag), an optional payload of at most
// kIpcMaxPayload bytes and at most one fd. Messages from one sender arrive in order;
// messages that arrive before they are asked for (another sender, another tag) are kept
// (with their fd) until ipcSocketRecv asks for them or the socket closes.
//
// Every operation is bounded: it gives up with ncclRemoteError after timeoutMs (the peer
// never bound its socket, never sent, or its queue stays full), and with
// ncclInternalError as soon as *abortFlag becomes nonzero (polled every few ms).
// A send that finds the receiver's queue full keeps draining its own socket while it
// retries, so ranks that all send before they receive cannot deadlock.
//
// One IpcSocket is used by one thread at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <nccl.h>
#include <vector>

namespace mk {

constexpr size_t kIpcMaxPayload = 512;
constexpr size_t kIpcNameLen = 96;  // < sizeof(sockaddr_un::sun_path) - 1

struct IpcMessage {
  int src = -1;
  uint32_t tag = 0;
  int fd = -1;  // owned until handed out
  std::vector<char> data;
};

struct IpcSocket {
  int fd = -1;
  char name[kIpcNameLen] = {};
  int rank = -1;
  uint64_t hash = 0;
  const uint32_t* abortFlag = nullptr;  // may be null
  int64_t timeoutMs = 0;
  std::deque<IpcMessage> pending;  // received, not yet asked for
};

// A fresh random 64-bit value (getrandom, else /dev/urandom, else clock ^ pid).
uint64_t ipcSocketNonce();
// Writes the abstract name "mkernel-<rank>-<nonce>" into out[kIpcNameLen]. Never the comm
// hash: abstract names are public (/proc/net/unix) and anyone in the network namespace may
// send to them, so the hash in each message is what proves the sender belongs to the comm.
void ipcSocketName(char* out, int rank, uint64_t nonce);

// Binds a socket to `name` (abstract; at most kIpcNameLen-1 characters). `rank` and
// `hash` go into every message this socket sends and are checked on receipt (messages
// of another hash are dropped). timeoutMs <= 0 selects MKERNEL_BOOTSTRAP_TIMEOUT_S.
// ncclSystemError when the name is taken.
ncclResult_t ipcSocketInit(IpcSocket* s, const char* name, int rank, uint64_t hash,
                           const uint32_t* abortFlag, int64_t timeoutMs);
// Sends `size` bytes (<= kIpcMaxPayload) and, if fd >= 0, a duplicate of fd (the caller
// keeps and closes its own fd) to the socket bound to peerName.
ncclResult_t ipcSocketSend(IpcSocket* s, const char* peerName, uint32_t tag, int fd,
                           const void* data, size_t size);
// Waits for the message (srcRank, tag). Its payload must be exactly `size` bytes. If fd is
// non-null, *fd receives the passed descriptor (close-on-exec; -1 if none was sent) and
// the caller owns it; otherwise a passed descriptor is closed.
ncclResult_t ipcSocketRecv(IpcSocket* s, int srcRank, uint32_t tag, int* fd, void* data,
                           size_t size);
// Closes the socket and every descriptor still pending. Idempotent.
ncclResult_t ipcSocketClose(IpcSocket* s);

}  // namespace mk
