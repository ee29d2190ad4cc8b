// The clique block of the fused GEMM + collective kernels (fused/core/clique_block.h).
#include "fused/ops/gemm_coll/clique.h"

#include "base/checks.h"
#include "comm/comm.h"
#include "fused/core/clique_block.h"

namespace mk {
namespace fused {

ncclResult_t gcCliqueGet(ncclComm* comm, GcClique** q, uint64_t** flags) {
  if (!cliqueEligible(comm, kGcMaxLocal)) return ncclInvalidUsage;
  const size_t bytes = sizeof(GcClique) + 3ull * comm->nRanks * kGcMaxTiles * sizeof(uint64_t);
  void* p = nullptr;
  NCCLCHECK(cliqueBlockGet(comm, kCliqueGemmColl, bytes, &p));
  *q = static_cast<GcClique*>(p);
  *flags = reinterpret_cast<uint64_t*>(static_cast<char*>(p) + sizeof(GcClique));
  return ncclSuccess;
}

}  // namespace fused
}  // namespace mk
