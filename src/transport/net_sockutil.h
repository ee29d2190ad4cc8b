// Data-path helpers of the socket net backend. Interface selection, addresses and
// connection setup come from the bootstrap socket layer (bootstrap/socket.h, ifaces.h);
// what lives here is specific to long-lived data connections served by helper threads:
// exact transfers that wait without a per-call deadline (a receiver may legitimately not
// read for a long time) but stop on the comm's close flag and notice a vanished peer, and
// the keepalive/user-timeout tuning that bounds how long a dead peer goes unnoticed.
#pragma once
#include <atomic>
#include <cstddef>

#include <nccl.h>

namespace mk {

enum class NetIo { kOk, kClosed, kError, kAborted };
// Exactly len bytes on a non-blocking fd, polling in short slices so that *stop ends the
// wait. A hang-up while sending (the receiver never writes on a data socket) is kClosed.
// *err gets errno (0 for a clean EOF).
NetIo netSendAll(int fd, const void* buf, size_t len, const std::atomic<bool>* stop, int* err);
NetIo netRecvAll(int fd, void* buf, size_t len, const std::atomic<bool>* stop, int* err);
// TCP_NODELAY, keepalive and TCP_USER_TIMEOUT from netTimeoutMs(): a peer host that
// vanishes (link down, power loss) sends no FIN/RST; this turns it into ETIMEDOUT.
ncclResult_t netTuneSocket(int fd);

}  // namespace mk
