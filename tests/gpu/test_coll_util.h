// Helpers of the collective GPU suite (tests/gpu/test_coll_*.cc): cached cliques of ranks
// sharing GPU 0 (one process, one thread driving every rank with ncclGroupStart/End like
// nccl-tests), dtype encoding without CUDA calls, inputs, references and checks.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include <nccl.h>
#include <string>
#include <vector>

namespace colltest {

// ---- ranks ---------------------------------------------------------------------------
struct Clique {
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  bool ok = false;
  std::string why;  // why it is not ok
};
// n ranks on GPU 0 created with ncclCommInitAll and a repeated device list; cached until
// the end of the run (or until a test breaks it).
Clique& clique(int n);
// Aborts and forgets a clique after a failure (the next clique(n) creates a fresh one).
void dropClique(int n);
// Waits (polling, bounded) for every rank's stream; checks async errors. On failure
// returns false with a message and drops the clique.
bool syncClique(Clique& c, double timeoutS, std::string* why);

// ---- dtypes --------------------------------------------------------------------------
struct DtInfo {
  ncclDataType_t dt;
  const char* name;
  size_t size;
  bool isFloat;
  bool isSigned;               // integers
  int expBits, manBits, bias;  // small float formats (0 for float/double)
  double u;                    // unit roundoff
  double minSub;               // smallest positive subnormal
};
const DtInfo& dtInfo(ncclDataType_t dt);
extern const ncclDataType_t kAllTypes[12];
// Element value of bits (floats), exact.
double decodeFloat(ncclDataType_t dt, uint64_t bits);
// Bits of a value that is exactly representable (asserts otherwise).
uint64_t encodeExact(ncclDataType_t dt, double v);
int64_t signExtend(uint64_t bits, size_t size);

// ---- ops -------------------------------------------------------------------------------
enum class Op { kSum, kProd, kMax, kMin, kAvg, kPreMulDev, kPreMulHost };
const char* opName(Op op);
extern const Op kAllOps[7];
// The built-in NCCL operation of op (ncclSum for kSum and the PreMulSum kinds).
ncclRedOp_t builtinOp(Op op);

// Host buffer of raw elements.
struct HostBuf {
  size_t size = 0;  // element size
  std::vector<uint8_t> bytes;
  uint64_t get(size_t i) const;
  void set(size_t i, uint64_t bits);
  size_t count() const { return size ? bytes.size() / size : 0; }
};
// Random elements: floats in a range suited to op (products near 1), integers of any value.
void fillRandom(HostBuf& b, ncclDataType_t dt, Op op, size_t count, uint64_t seed);
// PreMulSum scalar bits for a test seed (exactly representable).
uint64_t scalarFor(ncclDataType_t dt, uint64_t seed);

// Reference reduction of element i over inputs[r][base + i] for r in 0..n-1, compared with
// got.get(i) for i < count. Returns "" or a description of the first mismatches.
std::string checkReduction(ncclDataType_t dt, Op op, const std::vector<const HostBuf*>& in,
                           size_t base, const HostBuf& got, size_t count, uint64_t scalar);
// The same with a PreMulSum scalar per rank (scalars[r]: rank r's own scalar).
std::string checkReduction(ncclDataType_t dt, Op op, const std::vector<const HostBuf*>& in,
                           size_t base, const HostBuf& got, size_t count,
                           const std::vector<uint64_t>& scalars);
// Byte comparison of got[gotOff .. +bytes) with want[wantOff ..).
std::string checkBytes(const HostBuf& got, size_t gotOff, const HostBuf& want, size_t wantOff,
                       size_t bytes, const char* what);

// ---- device buffers ----------------------------------------------------------------------
struct DevBuf {
  void* base = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t b);
  ~DevBuf();
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : base(o.base), bytes(o.bytes) { o.base = nullptr; }
  char* at(size_t off) const { return (char*)base + off; }
};
void upload(void* dst, const HostBuf& h, size_t offElems, size_t count);
void download(HostBuf& h, const void* src, size_t count, size_t elemSize);

// Sets MKERNEL_ALGO (and re-reads parameters) for the lifetime of the object.
// nullptr or "": automatic choice.
struct AlgoScope {
  explicit AlgoScope(const char* algo);
  ~AlgoScope();
  bool hadOld = false;
  std::string oldValue;
};

std::string sizeName(size_t count);

// ---- one collective on a clique, checked (test_coll_reduce.cc, test_coll_copy.cc) -------
enum class RColl { kAllReduce, kReduce, kReduceScatter };
struct RedParam {
  RColl coll;
  ncclDataType_t dt;
  Op op;
  size_t count;
  int n;
  bool inplace;
  int root;
  const char* algo;  // nullptr: automatic
  int offset;        // elements added to the user pointers (alignment)
};
std::string paramName(const RedParam& p);
void runReduction(const RedParam& p);  // gtest assertions

enum class CColl { kBroadcast, kAllGather, kAlltoAll, kGather, kScatter, kBcast, kAllToAll };
struct CopyParam {
  CColl coll;
  ncclDataType_t dt;
  size_t count;
  int n;
  bool inplace;
  int root;
  int sendOff, recvOff;  // bytes added to the user pointers
};
std::string paramName(const CopyParam& p);
void runCopy(const CopyParam& p);

}  // namespace colltest
