// Spellings of NCCL entry points that some frameworks use and that libnccl does not
// declare in nccl.h. They follow NCCL's conventions (pncclX aliases included).
#pragma once
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

// Same as ncclAlltoAll: count elements sent to (and received from) every rank.
ncclResult_t ncclAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

// Variable all-to-all (MSCCL/RCCL spelling): rank r sends sendcounts[p] elements starting at
// sendbuff + sdispls[p] to rank p and receives recvcounts[p] elements from p at
// recvbuff + rdispls[p]. Counts and displacements are in elements; arrays are host memory.
ncclResult_t ncclAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                           void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                            void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
