// One rank of a multi-process communicator test: init from a hex-encoded unique id,
// check the comm, split it in two, destroy everything. Exit status 0 on success. With
// MK_TEST_EXPECT_REFUSE=<text> set, success is instead an init refused with
// ncclInvalidUsage and a last error that contains <text> (a parameter the ranks disagree on).
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
  const char* refuse = getenv("MK_TEST_EXPECT_REFUSE");
  if (refuse && *refuse) {
    const ncclResult_t res = ncclCommInitRank(&comm, n, id, rank);
    const char* why = ncclGetLastError(nullptr);
    if (res == ncclInvalidUsage && why && strstr(why, refuse)) return 0;
    fprintf(stderr, "worker %d: init -> %d (%s), expected a refusal naming %s\n", rank, res,
            why ? why : "", refuse);
    if (res == ncclSuccess) ncclCommDestroy(comm);
    return 5;
  }
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
