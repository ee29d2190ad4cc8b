"""Context-parallel attention on torch tensors (ncclRingAttention), and the helpers that split a
sequence over the ranks the way the call expects it.

Every rank of `group` holds one slice of a sequence of nranks * S_local positions:
q [B, S_local, Hq, D] and k, v [B, S_local, Hkv, D] (bf16/fp16, contiguous CUDA tensors on the
group's device; Hq a multiple of Hkv: grouped-query attention, query head h reads key/value head
h // (Hq/Hkv); D 64, 128 or 256). Each rank gets the attention of its queries over the keys and
values of every rank:
    out[b, s, h] = sum_j softmax_j(scale * q[b, s, h] . k[b, j, h // g]) v[b, j, h // g]
over the whole sequence, or with causal=True over the keys at global positions <= the query's.

Which positions a rank holds (layout):
    'contiguous'  rank r holds positions [r*S_local, (r+1)*S_local)
    'zigzag'      S_local even, C = S_local/2: rank r holds chunk r (positions [r*C, (r+1)*C))
                  in its first C rows and chunk 2n-1-r in its last C rows, which spreads causal
                  work evenly; zigzag_split builds these slices from a full sequence.
Without causal the layout changes nothing.

The call is a collective over `group` (every rank calls it, in the same order as its other
collectives there), runs on torch.cuda.current_stream() with the communicator of the group's
ProcessGroupNCCL (mkernel's: the process runs with LD_PRELOAD=libmkernel.so), never
synchronises the host and can be captured in a CUDA graph after one eager call on the group.
No autograd.
"""

from . import _attention, _lib, _plan, _torch

__all__ = ["ring_attention", "zigzag_split", "zigzag_merge", "seq_positions"]


def ring_attention(q, k, v, causal=False, scale=None, layout="contiguous", group=None,
                   algo="auto", comm_sms=-1, return_lse=False, out=None, lse=None):
  """Attention of this rank's queries over the whole sequence held by the group's ranks.

  q [B, S_local, Hq, D], k and v [B, S_local, Hkv, D] (see the module doc for the layouts).
  causal: keys at global positions <= the query's only. scale: softmax scale, default
  1/sqrt(D). layout: 'contiguous' or 'zigzag' (every rank must pass the same). algo: 'auto',
  'fused' (the ring kernel) or 'sequential' (all-gather of k and v, then the attention
  kernel). comm_sms: -1 (automatic) or >= 1, the CTAs that communicate (fused path).

  out: a [B, S_local, Hq, D] tensor of q's dtype to write into (else allocated). lse: a
  [B, Hq, S_local] float32 tensor to write the log-sum-exp into (else allocated when
  return_lse). Products accumulate in fp32, the probabilities are rounded to q's dtype before
  the product with v (as flash attention does), out is rounded once; lse is the natural log of
  each row's softmax denominator, log(sum_j exp(scale * q . k_j)).

  Returns out, or (out, lse) when return_lse.
  """
  import torch
  # Checks that need no process group first, so that a wrong call fails the same way
  # everywhere; then the group's size for the rules that depend on it.
  _attention.plan(q, k, v, 1, causal, scale, layout, algo, comm_sms, out, lse)
  g, rank, size = _torch.group_rank_size(group)
  p = _attention.plan(q, k, v, size, causal, scale, layout, algo, comm_sms, out, lse)
  lib = _lib.library()
  lib.require(_attention.C_API)
  comm = _torch.comm_of_group(lib, g, rank, size, p.device)
  if out is None:
    out = torch.empty(p.out_shape, dtype=q.dtype, device=p.device)
  if lse is None and return_lse:
    lse = torch.empty(p.lse_shape, dtype=torch.float32, device=p.device)
  stream = torch.cuda.current_stream(p.device).cuda_stream
  _attention.invoke(lib, p, q, k, v, out, lse, comm, stream)
  return (out, lse) if return_lse else out


def _dim(op, x, dim):
  if not _plan._is_tensor(x):
    raise TypeError("mkernel.%s: expected a torch.Tensor, got %s" % (op, type(x).__name__))
  nd = len(x.shape)
  if not isinstance(dim, int) or isinstance(dim, bool) or not -nd <= dim < nd:
    raise ValueError("mkernel.%s: dim=%r out of range for a %d-D tensor" % (op, dim, nd))
  return dim % nd


def zigzag_split(x_full, rank, nranks, dim=1):
  """The zigzag slice of `rank` of a full sequence: x_full's `dim` (default 1, the sequence of
  [B, S, H, D]) is cut into 2*nranks chunks of C = S/(2*nranks) positions; the result (a new
  contiguous tensor, on x_full's device) is chunk `rank` followed by chunk 2*nranks-1-rank.

      q_local = mkernel.zigzag_split(q_full, rank, nranks)        # [B, 2C, H, D]
      out = mkernel.ring_attention(q_local, k_local, v_local, causal=True, layout="zigzag")

  Works on any tensor (CPU too); S must be a multiple of 2*nranks.
  """
  import torch
  op = "zigzag_split"
  d = _dim(op, x_full, dim)
  c = _attention.zigzag_chunk_size(op, int(x_full.shape[d]), nranks)
  if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < nranks:
    raise ValueError("mkernel.%s: rank=%r must be in [0, nranks=%d)" % (op, rank, nranks))
  last = 2 * nranks - 1 - rank
  return torch.cat([x_full.narrow(d, rank * c, c), x_full.narrow(d, last * c, c)], dim=d)


def zigzag_merge(slices, dim=1):
  """The inverse of zigzag_split: the full sequence from the slices of ranks 0..n-1 (a list, in
  rank order, all of one shape with an even length along `dim`). E.g. the full output from the
  ranks' ring_attention outputs (dim=1), or the full lse from theirs ([B, H, S]: dim=2)."""
  import torch
  op = "zigzag_merge"
  if not isinstance(slices, (list, tuple)) or not slices:
    raise TypeError("mkernel.%s: expected a non-empty list of tensors (one per rank, in rank "
                    "order)" % op)
  d = _dim(op, slices[0], dim)
  shape = tuple(slices[0].shape)
  for r, s in enumerate(slices):
    _dim(op, s, dim)
    if tuple(s.shape) != shape:
      raise ValueError("mkernel.%s: slice %d has shape %s but slice 0 has %s" %
                       (op, r, tuple(s.shape), shape))
  if shape[d] % 2:
    raise ValueError("mkernel.%s: the slices have %d positions along dim %d; zigzag slices "
                     "hold two chunks (an even count)" % (op, shape[d], d))
  c, n = shape[d] // 2, len(slices)
  chunks = [None] * (2 * n)
  for r, s in enumerate(slices):
    chunks[r] = s.narrow(d, 0, c)
    chunks[2 * n - 1 - r] = s.narrow(d, c, c)
  return torch.cat(chunks, dim=d)


def seq_positions(rank, nranks, seq_local, layout="contiguous", device=None):
  """Global positions (int64 tensor [seq_local]) of the rows `rank` holds in `layout`: what
  the causal mask compares."""
  import torch
  return torch.tensor(_attention.positions(rank, nranks, seq_local, layout), dtype=torch.int64,
                      device=device)
