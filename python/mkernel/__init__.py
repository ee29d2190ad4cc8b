"""mkernel's fused GEMM + collective calls for PyTorch (ctypes over libmkernel.so).

    LD_PRELOAD=/path/to/libmkernel.so torchrun --nproc-per-node=4 train.py

    import mkernel
    y = mkernel.gemm_all_reduce(x, w)          # sum_r x_r @ w_r^T on every rank
    y = mkernel.all_gather_gemm(x_shard, w)    # all_gather(x) @ w^T
    y = mkernel.gemm_reduce_scatter(x, w)      # reduce_scatter(x_r @ w_r^T)
    y = mkernel.moe_ffn(x, topk_idx, topk_weights, w1, w2, max_rows=R)   # expert-parallel MoE
    o = mkernel.ring_attention(q, k, v, causal=True, layout="zigzag")   # context parallelism

The communicator is the one of the torch ProcessGroupNCCL of `group` (default: the world group),
which mkernel created because the process runs with libmkernel preloaded; no second communicator
is created. libmkernel is $MKERNEL_LIB, else the preloaded copy, else find_library('mkernel').
"""

from ._lib import MkernelError
from .attention import ring_attention, seq_positions, zigzag_merge, zigzag_split
from .fused import all_gather_gemm, gemm_all_reduce, gemm_reduce_scatter
from .moe import (MoeDispatchResult, MoeFfnBuffers, moe_dispatch_gemm, moe_ffn, moe_ffn_buffers,
                  moe_max_rows, moe_release_buffers)

__version__ = "0.1.0"
__all__ = ["MkernelError", "gemm_all_reduce", "all_gather_gemm", "gemm_reduce_scatter",
           "moe_dispatch_gemm", "moe_ffn", "moe_ffn_buffers", "moe_max_rows", "moe_release_buffers",
           "MoeDispatchResult", "MoeFfnBuffers", "ring_attention", "zigzag_split", "zigzag_merge",
           "seq_positions", "library_path"]


def library_path():
  """Path of the libmkernel in use (loads it on first use)."""
  from ._lib import library
  return library().path
