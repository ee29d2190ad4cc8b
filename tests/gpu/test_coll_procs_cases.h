// The case lists of the multi-process collective tests (test_coll_procs.cc): which
// operations, dtypes, ops, counts and buffer kinds every child rank runs, identical in all
// children of one run.
#pragma once
#include <nccl.h>

#include <cstddef>
#include <string>
#include <vector>

#include "gpu/test_coll_util.h"

namespace procstest {

using colltest::Op;

constexpr size_t kM3 = (1u << 20) + 3;
constexpr int kRankCounts[4] = {2, 3, 4, 8};

enum class K {
  kAllReduce,
  kReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kAlltoAll,
  kGather,
  kScatter,
  kSendRecv
};
inline const K kRed[3] = {K::kAllReduce, K::kReduce, K::kReduceScatter};
inline const K kCopy[6] = {K::kAllGather, K::kBroadcast, K::kAlltoAll,
                           K::kGather,    K::kScatter,   K::kSendRecv};

// kRegWindow: ncclMemAlloc buffers registered as windows (ncclCommWindowRegister,
// NCCL_WIN_COLL_SYMMETRIC: collective, every rank registers its send then its receive buffer).
enum Reg { kNoReg = 0, kRegCudaMalloc = 1, kRegMemAlloc = 2, kRegWindow = 3 };

struct Case {
  K k;
  ncclDataType_t dt;
  Op op;  // reductions only
  size_t count;
  bool inplace;
  int root;
  const char* algo = nullptr;  // MKERNEL_ALGO for the call (AllReduce), nullptr: automatic
  Reg reg = kNoReg;            // buffers registered with ncclCommRegister (and how allocated)
  int reps = 1;                // calls on the same buffers (fresh inputs each time)
  bool zc = false;             // every call must take the zero-copy path (coll/zc_plan.h)
};

const char* kindName(K k);
bool isRed(K k);
bool rooted(K k);
std::string caseName(const Case& c);
size_t sendElems(const Case& c, int n);  // elements of a rank's send buffer
size_t recvElems(const Case& c, int n);  // elements of a rank's receive buffer
int rankIndex(int n);                    // position of n in kRankCounts (rotates the cases)
std::vector<Case> mainPlan(int n);       // the cases of one N
std::vector<Case> hugePlan();            // 64M floats once (N=4)
std::vector<Case> regPlan();             // registered buffers (zero-copy across processes)
std::vector<Case> winPlan();             // windows: every collective zero-copy (N=4)

}  // namespace procstest
