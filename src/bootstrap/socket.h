// TCP sockets for the bootstrap and the socket net backend.
//
// Every fd is non-blocking and close-on-exec; blocking calls are built from poll() in slices of
// kSocketPollSliceMs so that each one (a) ends by its deadline and (b) notices the abort flag
// quickly. Errors: the peer went away or did not answer in time -> ncclRemoteError (the message
// names the peer address); local failures -> ncclSystemError; abort -> ncclInternalError with
// "aborted" in the message. Sends use MSG_NOSIGNAL so a dead peer never raises SIGPIPE.
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

#include <nccl.h>

namespace mk {

// How often blocking calls wake up to look at the abort flag.
constexpr int kSocketPollSliceMs = 20;

union SocketAddress {
  sockaddr sa;
  sockaddr_in sin;
  sockaddr_in6 sin6;
};

// Long enough for "[ipv6%ifname]:port".
constexpr size_t kSocketAddrStrLen = 80;

// Parses "a.b.c.d:port", "[ipv6]:port", "[fe80::1%eth0]:port" or "hostname:port".
// IPv6 literals need brackets (as in NCCL): without them the port is ambiguous.
ncclResult_t socketAddressFromString(const char* str, SocketAddress* out);
// "a.b.c.d:port" or "[ipv6]:port"; always NUL-terminated; returns buf for use in printf.
const char* socketAddressToString(const SocketAddress* addr, char* buf, size_t len);
socklen_t socketAddressLen(const SocketAddress* addr);
int socketAddressPort(const SocketAddress* addr);
void socketAddressSetPort(SocketAddress* addr, int port);
bool socketAddressEqual(const SocketAddress* a, const SocketAddress* b);  // family, ip, port

// Fixed-size, byte-order-independent form of an address, for ids and wire messages.
struct SocketWireAddress {
  uint8_t bytes[24];
};
void socketAddressToWire(const SocketAddress* addr, SocketWireAddress* out);
// Rejects unknown families (ncclInvalidArgument, logged at INFO only: the bytes may come from
// the network, the caller decides how loud to be).
ncclResult_t socketAddressFromWire(const SocketWireAddress* in, SocketAddress* out);

// Milliseconds of CLOCK_MONOTONIC.
int64_t socketClockMs();
// ncclInternalError ("<what> aborted") when *abortFlag is non-zero.
ncclResult_t socketCheckAbort(const uint32_t* abortFlag, const char* what);

struct Socket {
  int fd = -1;
  SocketAddress addr{};                 // listen: bound address; otherwise: the peer
  const uint32_t* abortFlag = nullptr;  // may be null
  // A second flag honoured like abortFlag (may be null): a split that talks through its parent's
  // connections must also stop when the child is aborted.
  const uint32_t* abortFlag2 = nullptr;
  int64_t timeoutMs = 0;  // bound of each blocking call; <= 0: none (avoid)
};

// Sets the abort flag (abortFlag2: none) and per-call timeout; does not open anything.
void socketInit(Socket* s, const uint32_t* abortFlag, int64_t timeoutMs);
// Binds (port 0: any free port; SO_REUSEADDR so a fixed port can be re-bound while old
// connections sit in TIME_WAIT) and listens. s->addr becomes the bound address.
ncclResult_t socketListen(Socket* s, const SocketAddress* local);
// Connects to `remote`. ECONNREFUSED (nobody listening yet), ETIMEDOUT and friends are retried
// until the deadline when retryRefused; otherwise refused fails at once (used for peers that are
// known to have been listening, so a refusal means they are gone).
ncclResult_t socketConnect(Socket* s, const SocketAddress* remote, bool retryRefused = true);
// Waits up to the listener's timeout for a connection; `out` inherits abortFlag and timeout.
ncclResult_t socketAccept(Socket* listener, Socket* out);
// Non-blocking accept: *accepted false when none is pending.
ncclResult_t socketTryAccept(Socket* listener, Socket* out, bool* accepted);
// Exactly `size` bytes, bounded by the socket's timeout for the whole transfer.
ncclResult_t socketSend(Socket* s, const void* data, size_t size);
ncclResult_t socketRecv(Socket* s, void* data, size_t size);

enum class SocketOp { kSend, kRecv };
// One non-blocking step: moves what the kernel accepts now and advances *offset (up to size).
// Peer closed or reset -> ncclRemoteError. Building block for progress engines (net backend,
// bootstrap receiver thread) that multiplex many sockets with their own poll().
ncclResult_t socketProgress(Socket* s, SocketOp op, void* data, size_t size, size_t* offset);
// Like socketProgress(kRecv) but a clean EOF at a message boundary (*offset == 0) is reported
// through *closed instead of as an error.
ncclResult_t socketProgressRecv(Socket* s, void* data, size_t size, size_t* offset, bool* closed);
// Waits until `events` (POLLIN/POLLOUT) are ready or deadlineMs (socketClockMs() time) passes;
// *ready false on timeout. Polls the abort flag.
ncclResult_t socketPoll(Socket* s, short events, int64_t deadlineMs, bool* ready);
void socketClose(Socket* s);

// Raises the soft RLIMIT_NOFILE to the hard limit (the root holds one fd per rank).
void socketRaiseFdLimit();

}  // namespace mk
