"""The torch side of bench/moe_bench.py and its arithmetic (CPU-checkable: bench/test_moe_bench.py).

A plain torch expert-parallel MoE layer (all_to_all_single + grouped GEMMs), a direct per-token
computation of the same layer, the comparison of outputs, the FLOP counts, the rows mkernel's
AllToAll path needs (max_rows) and a memory estimate. Nothing here touches the GPU by itself:
the tensors decide the device, the exchange is passed in (dist.all_to_all_single, or the
self-test's threads).
"""

import math

ROW_ALIGN = 128  # NCCL_MOE_ROW_ALIGN: experts' row blocks in the packed layout
MAX_EXPERTS, MAX_TOPK, MAX_LOCAL = 1024, 16, 256  # include/mkernel/fused.h, grouped GEMM groups


def shape_problem(shape, nranks):
  """Why mkernel cannot run this shape on nranks ranks ('' when it can)."""
  H, I, E, k, T = shape
  if E % nranks:
    return "E=%d is not a multiple of %d ranks" % (E, nranks)
  if E // nranks > MAX_LOCAL or E > MAX_EXPERTS:
    return "E=%d: at most %d experts, %d per rank" % (E, MAX_EXPERTS, MAX_LOCAL)
  if k > MAX_TOPK or k > E:
    return "k=%d: at most %d and at most E" % (k, MAX_TOPK)
  return ""


def ffn_flops(T, k, H, I):
  return 2.0 * T * k * H * 2 * I + 2.0 * T * k * I * H


def dispatch_flops(T, k, H, N):
  return 2.0 * T * k * H * N


def pad_rows(v):
  return (v + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN


def tight_rows(expert_counts, nranks):
  """The most rows (padding included) a rank receives: expert_counts[e] routed slots of every
  rank together go to global expert e, owned by rank e // (E / nranks), each local expert's
  block padded to ROW_ALIGN. The AllToAll path also needs every pair's rows to fit, which this
  bounds (a pair's rows are part of the receiver's)."""
  L = len(expert_counts) // nranks
  spans = [sum(pad_rows(c) for c in expert_counts[r * L:(r + 1) * L]) for r in range(nranks)]
  return max(ROW_ALIGN, max(spans))


def choose_max_rows(policy, tight, T, k, L, nranks):
  if policy == "tight":
    return tight
  if policy == "bound":  # mkernel.moe_max_rows
    return max(ROW_ALIGN, pad_rows(nranks * T * k + L * (ROW_ALIGN - 1)))
  return pad_rows(int(math.ceil(tight * policy)))


def mem_estimate(mode, path, nranks, max_rows, H, I, k, T, L, esize, node_dedup=False):
  """Bytes one rank needs: (always, mkernel's per-call scratch). Rough, for skipping shapes
  that cannot fit; the graph variant holds a second copy of the scratch. node_dedup: the
  AllToAll path's per-node dedup runs (MKERNEL_MOE_NODE_DEDUP=1 on equal nodes of >= 2
  ranks), whose fan buffers double the pair buffers."""
  ffn, N = mode == "ffn", 2 * I
  R, S = max_rows, T * k
  weights = L * N * H * esize + (L * H * I * esize if ffn else 0)
  inputs = T * H * esize + T * k * 8
  if ffn:
    mk_bufs = R * (H * esize + N * esize + I * esize + H * 4) + T * H * esize
  else:
    mk_bufs = R * (H * esize + N * esize + 16)
  scratch = 8 * S + 64 * nranks * (L + 2)
  if path == "alltoall":  # pair buffers of max_rows rows, sent and received (fused/ops/moe/a2a.cu)
    rows = 2 * nranks * R * (H * esize + 16 * k)  # a row and its k metadata entries
    scratch += rows * (2 if node_dedup else 1) + (2 * nranks * R * H * 4 if ffn else 0)
  # torch: rows sent, received, grouped, GEMM outputs; ffn: back, slot buffer, fp32 sums
  tmp = 3 * S * H * esize + S * N * esize
  if ffn:
    tmp += S * (I * esize * 2 + 3 * H * esize) + 2 * S * H * 4
  return weights + inputs + mk_bufs + tmp, scratch


def mkernel_path(peers):
  """peers: (host, CUDA device, pid) of every rank. The clique kernels need every rank in one
  process on one GPU (fused/core/clique_block.cc, cliqueEligible); else the AllToAll path."""
  return "clique" if len(set(peers)) <= 1 else "alltoall"


PATH_NOTE = {
    "clique": "clique kernels (every rank in one process on one GPU; fused/ops/moe/dispatch.cu, "
              "ffn.cu)",
    "alltoall": "AllToAll path (ranks in separate processes; fused/ops/moe/a2a.cu): per-pair "
                "buffers of max_rows rows, nranks * max_rows rows moved per rank and call; "
                "algo fused on one node: the fused kernels, rows landing in the ranks' windows "
                "(fused/ops/moe/fused_moe.cu, fused_ffn.cu)",
}


def seed_of(*parts):
  h = 1469598103934665603
  for p in parts:
    h = ((h ^ (int(p) & 0xffffffffffffffff)) * 1099511628211) & 0xffffffffffffffff
  return h & 0x7fffffff


# ---------------------------------------------------------------------------------------------
# The torch layer and the direct per-token reference (CPU or CUDA tensors)
# ---------------------------------------------------------------------------------------------
try:
  import torch
  import torch.nn.functional as F
except ImportError:  # the arithmetic above works without torch
  torch = F = None


def make_routing(T, E, k, gen, device, hot=False):
  """topk_idx [T, k] int32 (k distinct experts per token), topk_weights [T, k] fp32 (softmax)."""
  scores = torch.randn((T, E), generator=gen, device=device)
  if hot:
    scores[:, 0] += 2.0
  top = scores.topk(k, dim=1)
  return top.indices.to(torch.int32).contiguous(), torch.softmax(top.values, dim=1).contiguous()


def generator(device, seed):
  g = torch.Generator(device=device)
  g.manual_seed(seed)
  return g


def expert_weights(seed, e, H, I, dtype, device, ffn=True):
  """Global expert e's w1 [2I, H] (gate rows, then up) and w2 [H, I] (None unless ffn), the same
  on any rank that draws them."""
  w1 = torch.randn((2 * I, H), generator=generator(device, seed_of(seed, e, 1)), device=device)
  w1 = (w1 * H**-0.5).to(dtype)
  if not ffn:
    return w1, None
  w2 = torch.randn((H, I), generator=generator(device, seed_of(seed, e, 2)), device=device)
  return w1, (w2 * I**-0.5).to(dtype)


def gemm_loop(a, w, per_expert, offs):
  """Rows of expert e (per_expert[e] of them, in expert order) times w[e]^T; w [L, N, K]."""
  out = a.new_empty((a.shape[0], w.shape[1]))
  s = 0
  for e, c in enumerate(per_expert):
    if c:
      torch.mm(a[s:s + c], w[e].t(), out=out[s:s + c])
      s += c
  return out


def gemm_grouped(a, w, per_expert, offs):
  if a.shape[0] == 0:
    return a.new_empty((0, w.shape[1]))
  return torch._grouped_mm(a, w.transpose(1, 2), offs=offs)


class Routed:
  """What torch_dispatch_rows leaves for the GEMMs and the way back."""
  __slots__ = ("slots", "send", "recv", "perm", "xe", "per_expert", "offs")


def torch_dispatch_rows(x, idx, L, nranks, a2a):
  """Sends every routed slot's token row to the rank owning its expert (rank e // L) and groups
  the rows a rank receives by local expert; inside an expert: source rank, token, slot (the
  order of mkernel's packed layout). a2a has the signature of dist.all_to_all_single."""
  T, k = idx.shape
  H, E, dev = x.shape[1], L * nranks, x.device
  key = idx.reshape(-1).long()
  key = torch.where(key >= 0, key, torch.full_like(key, E))  # -1 slots sort last, not sent
  order = torch.sort(key, stable=True).indices
  cnt = torch.zeros(E + 1, dtype=torch.int64, device=dev)
  cnt.scatter_add_(0, key, torch.ones_like(key))  # not bincount: that syncs on CUDA
  send_cnt = cnt[:E].contiguous()
  recv_cnt = torch.empty_like(send_cnt)
  a2a(recv_cnt, send_cnt, None, None)
  # torch's one host synchronisation: all_to_all_single takes its split sizes on the host.
  both = torch.cat([send_cnt, recv_cnt]).tolist()
  sc, rc = both[:E], both[E:]
  r = Routed()
  r.send = [sum(sc[d * L:(d + 1) * L]) for d in range(nranks)]
  r.recv = [sum(rc[s * L:(s + 1) * L]) for s in range(nranks)]
  S, R = sum(r.send), sum(r.recv)
  r.slots = order[:S]
  xr = x.new_empty((R, H))
  a2a(xr, x.index_select(0, r.slots // k), r.recv, r.send)
  # Arrived by source, inside a source by local expert: a stable sort by local expert.
  le = torch.arange(L, device=dev).repeat(nranks).repeat_interleave(recv_cnt, output_size=R)
  r.perm = torch.sort(le, stable=True).indices
  r.xe = xr.index_select(0, r.perm)
  r.per_expert = [sum(rc[s * L + e] for s in range(nranks)) for e in range(L)]
  r.offs = recv_cnt.view(nranks, L).sum(0).cumsum(0).to(torch.int32)
  return r


def torch_dispatch(x, idx, w1, nranks, a2a, gemm):
  """(rows grouped by local expert, their products with w1 [L, N, H], rows per expert)."""
  r = torch_dispatch_rows(x, idx, w1.shape[0], nranks, a2a)
  return r.xe, gemm(r.xe, w1, r.per_expert, r.offs), r.per_expert


def torch_moe_ffn(x, idx, wts, w1, w2, nranks, a2a, gemm, out_dtype=None):
  """y[t] = sum_j wts[t, j] * w2_e (silu(gate) * up), (gate, up) = w1_e x_t, e = idx[t, j];
  w1 [L, 2I, H], w2 [L, H, I] (this rank's experts, stacked nn.Linear weights)."""
  T, k = idx.shape
  H, I = x.shape[1], w2.shape[2]
  r = torch_dispatch_rows(x, idx, w1.shape[0], nranks, a2a)
  h = gemm(r.xe, w1, r.per_expert, r.offs)
  act = F.silu(h[:, :I]) * h[:, I:]
  o = gemm(act, w2, r.per_expert, r.offs)
  ob = torch.empty_like(o)
  ob[r.perm] = o  # back to the order of arrival
  back = x.new_empty((r.slots.shape[0], H))
  a2a(back, ob, r.send, r.recv)
  buf = x.new_zeros((T * k, H))
  buf[r.slots] = back
  y = (buf.view(T, k, H).float() * wts.unsqueeze(2)).sum(1)
  return y.to(out_dtype or x.dtype)


def direct_moe_ffn(x, idx, wts, weights_of, tokens):
  """fp32, token by token: the rows `tokens` of the layer's output. weights_of(e) -> (w1, w2)
  of global expert e."""
  H = x.shape[1]
  y = torch.zeros((len(tokens), H), dtype=torch.float32, device=x.device)
  uses = {}
  ids, ws = idx[tokens].tolist(), wts[tokens].float()
  for i, row in enumerate(ids):
    for j, e in enumerate(row):
      if e >= 0:
        uses.setdefault(e, []).append((i, j))
  for e in sorted(uses):
    w1, w2 = (w.float() for w in weights_of(e))
    I = w2.shape[1]
    for i, j in uses[e]:
      h = w1 @ x[tokens[i]].float()
      y[i] += ws[i, j] * (w2 @ (F.silu(h[:I]) * h[I:]))
  return y


def compare(got, ref):
  """Relative L2 error over all elements and the worst token's, max |difference|, finite."""
  g, r = got.double(), ref.double()
  d = g - r
  if g.numel() == 0:
    return dict(rel_l2=0.0, worst_token=0.0, max_abs=0.0, finite=True)
  tok = d.norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)
  return dict(rel_l2=float(d.norm() / r.norm().clamp_min(1e-30)), worst_token=float(tok.max()),
              max_abs=float(d.abs().max()), finite=bool(torch.isfinite(g).all()))


def judge(c, tol, token_tol):
  return c["finite"] and c["rel_l2"] <= tol and c["worst_token"] <= token_tol


def merge_compare(c, reduce_max):
  """Worst over ranks: reduce_max(list of floats) -> list."""
  v = reduce_max([c["rel_l2"], c["worst_token"], c["max_abs"], 0.0 if c["finite"] else 1.0])
  return dict(rel_l2=v[0], worst_token=v[1], max_abs=v[2], finite=v[3] == 0.0)


def cross_node_rows(idx, E, nranks, nodes, rank, mode, max_rows):
  """Token rows that `rank` sends to other (virtual) nodes in one dispatch of mkernel's
  AllToAll path: the model of fused/ops/moe/moe_node.h (moeSourceCounts, moeCrossNodeRows).
  idx: this rank's routing, T lists of k expert ids (-1 or out of range: not sent); nodes of
  nranks / nodes consecutive ranks (MKERNEL_EMULATE_NODES). A pair whose slots exceed max_rows
  overflows and sends nothing. Mode 0 (MKERNEL_MOE_NODE_DEDUP=0): each token once per remote
  rank that owns one of its experts. Mode 1: once per remote node, through the rail gateway,
  unless the node's tokens exceed max_rows (spill: that node is served per rank as in mode 0);
  mode 1 needs nodes of >= 2 ranks (2..128 nodes, 2..32 ranks each), else mode 0 runs."""
  epr, nl = E // nranks, nranks // nodes
  rail = mode == 1 and 2 <= nodes <= 128 and 2 <= nl <= 32 and nl * nodes == nranks
  slots = [0] * nranks
  for tok in idx:
    for e in tok:
      if 0 <= e < E:
        slots[e // epr] += 1
  toks, node_toks = [0] * nranks, [0] * nodes
  for tok in idx:
    dsts = {e // epr for e in tok if 0 <= e < E and slots[e // epr] <= max_rows}
    for d in dsts:
      toks[d] += 1
    for b in {d // nl for d in dsts}:
      node_toks[b] += 1
  rows = 0
  for b in range(nodes):
    if b == rank // nl:
      continue
    if rail and node_toks[b] <= max_rows:
      rows += node_toks[b]
    else:
      rows += sum(toks[b * nl:(b + 1) * nl])
  return rows
