// One rank of a multi-process communicator test: init from a hex-encoded unique id,
// check the comm, split it in two, destroy everything. Exit status 0 on success.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <nccl.h>

#define CHECK(cmd)                                                                     \
  do {                                                                                 \
    ncclResult_t r_ = (cmd);                                                           \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "worker: %s -> %d (%s)\n", #cmd, r_, ncclGetLastError(nullptr)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 4 || strlen(argv[1]) != 2 * NCCL_UNIQUE_ID_BYTES) {
    fprintf(stderr, "usage: mk_comm_worker <id-hex> <nranks> <rank>\n");
    return 2;
  }
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v;
    sscanf(argv[1] + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  int n = atoi(argv[2]), rank = atoi(argv[3]);
  cudaSetDevice(0);
  ncclComm_t comm, half;
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  int r, c;
  CHECK(ncclCommUserRank(comm, &r));
  CHECK(ncclCommCount(comm, &c));
  if (r != rank || c != n) return 3;
  CHECK(ncclCommSplit(comm, rank % 2, rank, &half, nullptr));
  CHECK(ncclCommCount(half, &c));
  if (c != (n + 1 - rank % 2) / 2) return 4;
  CHECK(ncclCommDestroy(half));
  CHECK(ncclCommDestroy(comm));
  return 0;
}
