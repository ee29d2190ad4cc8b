// Kernel arguments of the collective kernels, shared by the host (enqueue) and the
// device code (src/device/). Plain data only: every field is fixed at enqueue time, so a
// launch captured in a CUDA graph replays correctly; everything that must change from one
// call to the next (channel sequence numbers) lives in device memory (DevState) and is
// advanced by the kernels themselves.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>

#include "coll/algo.h"
#include "comm/comm_dev.h"  // CommDev (kernels' view of the comm)

namespace mk {

constexpr int kCollThreads = 512;  // threads per CTA of every collective kernel
constexpr int kZcMaxMapped = 32;   // local ranks of the zero-copy path over registered buffers

// Kernels record their CollType as the ErrOp of an error record.
static_assert(rt::kOpAllReduce == (int)CollType::kAllReduce &&
                  rt::kOpScatter == (int)CollType::kScatter &&
                  rt::kOpSend == (int)CollType::kSend && rt::kOpRecv == (int)CollType::kRecv,
              "rt::ErrOp follows CollType");

// Reductions.
enum RedKind : int { kRedSum = 0, kRedProd = 1, kRedMax = 2, kRedMin = 3 };

// The reduction kernels are instantiated in one translation unit per dtype family
// (src/device/reduce_{int,float,lowp}.cu, compiled in parallel); this routes a dtype there.
enum DtFamily : int { kFamInt = 0, kFamFloat = 1, kFamLowp = 2, kFamNone = 3 };
MK_HD constexpr int dtFamily(int dtype) {
  return dtype == ncclInt8 || dtype == ncclUint8 || dtype == ncclInt32 || dtype == ncclUint32 ||
                 dtype == ncclInt64 || dtype == ncclUint64
             ? kFamInt
         : dtype == ncclFloat32 || dtype == ncclFloat64 ? kFamFloat
         : dtype == ncclFloat16 || dtype == ncclBfloat16 || dtype == ncclFloat8e4m3 ||
                 dtype == ncclFloat8e5m2
             ? kFamLowp
             : kFamNone;
}

// How a zero-copy kernel finds its peers' buffers (coll/zc_plan.h decides, device/zc.cuh
// resolves): kZcRaw: the pointers the in-process peers publish in their ZcSlot (one
// process, one GPU); kZcMapped: send/recv below hold every local rank's buffer mapped here
// (the registered-buffer exchange); kZcWindow: send/recv hold every local rank's window
// base mapped here, and each peer publishes its window key and offset.
enum ZcMode : int { kZcRaw = 0, kZcMapped = 1, kZcWindow = 2 };
struct ZcBufs {
  int mode;  // ZcMode
  int pad;
  // kZcWindow: this rank's window key (id + 1; 0: the buffer is not used remotely) and its
  // offset in the window; every peer's key must be the same.
  uint64_t sendKey, sendOff, recvKey, recvOff;
  uint64_t send[kZcMaxMapped];  // by local index
  uint64_t recv[kZcMaxMapped];
};

struct ReduceArgs {
  CommDev c;
  int coll;   // CollType (kAllReduce, kReduce, kReduceScatter)
  int algo;   // Algo (kOneShot, kTwoShot, kRing for AllReduce; kDirect otherwise)
  int red;    // RedKind
  int dtype;  // ncclDataType_t
  const void* send;
  void* recv;
  uint64_t count;       // elements reduced in total (AllReduce/Reduce), or segment (RS)
  uint64_t segElems;    // two-shot / ReduceScatter segment size (elements)
  uint64_t chunkElems;  // elements per chunk (per segment chunk for ring/two-shot)
  uint64_t nChunks;  // chunks (one-shot, Reduce), chunks per segment (two-shot, RS), rounds (ring)
  int lanes;         // lanes with work: min(ws.lanes, nChunks)
  int root;          // local index of the root (Reduce)
  int postDiv;       // ncclAvg: divide by this after the sum (0: no division)
  int premul;        // PreMulSum: multiply every input by the scalar
  int scalarOnDevice;  // the scalar is read from scalarPtr at run time
  const void* scalarPtr;
  uint64_t scalarBits;  // host-immediate scalar (dtype-sized bytes)
  // Zero-copy (algo kZeroCopy): where the peers' buffers are. AllReduce: rank q reduces
  // segment q into every output; ReduceScatter: rank q reduces its own block; Reduce: the
  // root reduces everything (only the send buffers are significant on every rank).
  ZcBufs zc;
};

// Zero-copy copies (Broadcast, AllGather, AlltoAll, Gather, Scatter; coll/zc_plan.h): each
// rank copies straight between its own and its peers' buffers after a handshake through
// the ZcSlot of every workspace (comm/workspace.h). AllGather and AlltoAll: every rank pulls
// into its own receive buffer; Gather: the root pulls; Broadcast and Scatter: the root
// pushes into the peers' receive buffers.
struct ZcCopyArgs {
  CommDev c;
  int coll;        // CollType
  int root;        // local index of the root (rooted collectives), -1 otherwise
  uint64_t bytes;  // count * element size: one block
  const void* send;
  void* recv;
  ZcBufs zc;
};

// Copies (Broadcast, AllGather, AlltoAll, Gather, Scatter, Send/Recv): a list of
// point-to-point transfers executed by a polling engine, so that any set of sends and
// receives between any ranks progresses without deadlock.
enum CopyDir : int { kDirSend = 0, kDirRecv = 1, kDirLocal = 2 };
struct CopyOp {
  const void* src;  // send: user source; local: source
  void* dst;        // recv: user destination; local: destination
  uint64_t bytes;
  uint64_t chunkBytes;  // identical on both ends (function of bytes and the layout)
  uint32_t nChunks;
  int16_t peer;  // local index (send/recv)
  int16_t dir;   // CopyDir
};
// One stream = (peer, direction, lane): an in-order sequence of chunks.
inline uint32_t packStream(int peer, int dir, int lane) {
  return ((uint32_t)peer << 16) | ((uint32_t)dir << 8) | (uint32_t)lane;
}

// Device-sized blocks of an AlltoAll (CollArgs::sized; off: every op moves its planned bytes),
// with the ranks the copy kernel's local indices stand for.
struct CopyUnits {
  SizedUnits s;
  int16_t meRank;                  // my rank (the local copy's block)
  int16_t rankOf[kMaxLocalRanks];  // rank of each local index
};

template <int MaxOps, int MaxStreams>
struct CopyArgsT {
  CommDev c;
  int coll;  // CollType, for error messages
  int nOps;
  int nStreams;
  int pad;
  CopyUnits u;
  CopyOp ops[MaxOps];
  uint32_t streams[MaxStreams];
};
constexpr int kCopySmallOps = 16, kCopySmallStreams = 128;
constexpr int kCopyLargeOps = 512, kCopyLargeStreams = 1024;
using CopyArgsSmall = CopyArgsT<kCopySmallOps, kCopySmallStreams>;
using CopyArgsLarge = CopyArgsT<kCopyLargeOps, kCopyLargeStreams>;
static_assert(sizeof(CopyArgsLarge) < 32000, "kernel parameters must stay below 32 KiB");

// Launchers (src/device/*.cu). They return the launch error; no synchronisation.
cudaError_t launchReduceKernel(const ReduceArgs& a, int grid, cudaStream_t s);
cudaError_t launchReduceInt(const ReduceArgs& a, int grid, cudaStream_t s);
cudaError_t launchReduceFloat(const ReduceArgs& a, int grid, cudaStream_t s);
cudaError_t launchReduceLowp(const ReduceArgs& a, int grid, cudaStream_t s);
cudaError_t launchOneRankCopy(void* dst, const void* src, uint64_t bytes, int grid, cudaStream_t s);
cudaError_t launchCopySmall(const CopyArgsSmall& a, int grid, size_t smem, cudaStream_t s);
cudaError_t launchCopyLarge(const CopyArgsLarge& a, int grid, size_t smem, cudaStream_t s);
cudaError_t launchZcCopy(const ZcCopyArgs& a, int grid, cudaStream_t s);

}  // namespace mk
