#!/usr/bin/env bash
# For the next session, after session 34's next_callA.sh (same build directory, warm machine):
# session 35's fused MoE kernel across (virtual) nodes, written without a GPU. First the new
# MoeVnodesFused suite (threads on virtual nodes, no MPS), then the AllToAll path's vnode suites
# (its rows kernel and its first steps were refactored under them) and the other xnode kernels
# (rxOwnCopier moved into xnode_proto.h, the ack rule into gxAckSent): the GEMM + collective and
# ring attention suites across nodes.
set -u
source scripts/gpu_call.sh
gc_init ND
GC_BUILD_S=330 gc_build /tmp/bn \
  "gpu/test_ring_attention_procs.cu;gpu/test_ring_attention.cu;gpu/test_moe_procs.cu;gpu/test_comm.cc;gpu/test_gemm_fused.cu;gpu/test_moe_vnodes.cu;gpu/test_fused_xnode.cu;gpu/test_ring_attn_xnode.cu" \
  mk_gpu_tests mkernel
gc_tests /tmp/bn 'MoeVnodesFused.*' 280 220
mv "$GC_L/tests.log.gz" "$GC_L/tests_fused.log.gz"
gc_tests /tmp/bn 'MoeVnodes.TwoByTwo:MoeVnodesOverflow.*:MoeProcsGraph.Vnodes2x2:*/FusedXnode.*:FusedXnodeChoice.*:FusedXnodeRandom.*:FusedXnodeAbort.*:*/RingAttnXnode.*:RingAttnXnodeChoice.*:RingAttnXnodeAbort.*' 585 300
gc_tar
