#!/usr/bin/env bash
# Session 32, call D: what calls A and B left unrun of the README's GPU tests, without MPS
# (every suite but those that completed there: the parameterised suites after the cut, the
# GemmColl suites that met the broken MPS server, and the two suites that failed under MPS
# and call C did not run again), with the new FusedGemmCollSplit test (split
# pairs' fused calls in flight at once, grids counting the parent comm's ranks); the demo; how
# many hardware queues a process's streams get (queue_probe.cu) without and with MPS; the
# demo under MPS with NCCL_DEBUG=WARN (the init's queue warning).
set -u
source scripts/gpu_call.sh
gc_init D
GC_BUILD_S=240 gc_build /tmp/bd "gpu/*.cc;gpu/*.cu" mk_gpu_tests mkernel mkernel_demo
gc_run rest 330 190 30 0 "^\[  (PASSED|FAILED)|^\[  FAILED  \] [A-Z]|tests? ran" \
  /tmp/bd/tests/mk_gpu_tests --gtest_filter="-Algos/CollReduce.*:CollFault.*:CollP2pApi.*:CollProcs.*:CollSimulate.*:CollStress.*:CollThreadWait.*:CollThreads.*:CollWindow.*:CommInitAgreed.*:CommLifecycle.*:DevComm.*:DevCommProcs.*:FusedExample.*:FusedMatrixAbort.*:FusedMatrixGraph.*:FusedMatrixGroup.*:FusedMatrixProcsKill.*:FusedMatrixRandom.*:FusedMatrixThreadPerRankAbort.*:FusedMatrixVnodesGraph.*:FusedXnodeAbort.*:FusedXnodeChoice.*:FusedXnodeProcs.*:FusedXnodeRandom.*:GemmCorrectness.*:GemmDynamic.*:GemmFused.*:GemmGrouped.*:GemmHooks.*:GemmSmall.*:GemmStreamK.*:HierKill.*:Huge/CollCopy.*:Huge/CollReduce.*:Large/CollCopy.*:Large/CollReduce.*:MoeDispatchAbort.*:MoeDispatchArgs.*:MoeDispatchGraph.*:MoeDispatchOverflow.*:MoeFfnArgs.*:MoeFfnBadId.*:MoeFfnFusedAbort.*:MoeFfnFusedBadId.*:MoeFfnFusedGraph.*:MoeFfnFusedLate.*:MoeFfnFusedMixed.*:MoeFfnFusedOverflow.*:MoeFfnFusedSplit.*:MoeFfnGraph.*:MoeFfnOverflow.*:MoeFusedAbort.*:MoeFusedGraph.*:MoeFusedOverflow.*:MoeFusedSplit.*:MoeProcs.*:MoeProcsFused.*:MoeProcsGraph.*:MoeProcsOverflow.*:MoeVnodes.*:MoeVnodesOverflow.*:Ops/CollReduce.*:PeerMemAlloc.*:PeerMemInitErrors.*:PeerMemProcs.*:PeerMemRegisterErrors.*:PeerMemThreadsCycles.*:PeerMemVirtualNodes.*:Ranks/CollGraph.*:Ranks/CollGroup.*:Ranks/CollP2pPairs.*:RingAttnArgs.*:RingAttnSingleLong.*:RingAttnVnodes.*:RingAttnXnodeAbort.*:RingAttnXnodeProcs.*:ScratchPool.*:Shapes/HierAllReduce.*:Shapes/HierInline64.*:Shapes/HierOps.*:Sizes/CollP2pRing.*:Small/CollCopy.*:Unaligned/CollCopy.*:Unaligned/CollReduce.*:Zero/CollReduce.*"
gzip -f $GC_L/rest.log
gc_run demo 350 20 5 0 "." /tmp/bd/examples/mkernel_demo 4
P=bench/results/session32-2026-12-04/queue_probe.cu
nvcc -O2 -arch=sm_90 $P -o /tmp/qp > $GC_L/probe_build.log 2>&1 && echo "probe built"
gc_run probe 365 10 3 0 "." /tmp/qp 16
CUDA_DEVICE_MAX_CONNECTIONS=4 gc_run probe4 375 10 3 0 "." /tmp/qp 16
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps/log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
timeout 30 nvidia-cuda-mps-control -d && echo "MPS started"
gc_run probe_mps 390 10 3 0 "." /tmp/qp 16
CUDA_DEVICE_MAX_CONNECTIONS=32 gc_run probe_mps32 400 10 3 0 "." /tmp/qp 16
NCCL_DEBUG=WARN gc_run demo_mps 430 30 5 0 "queue|MPS|timed out|rc=|FAIL|error" \
  /tmp/bd/examples/mkernel_demo 4
echo quit | nvidia-cuda-mps-control
gc_tar
