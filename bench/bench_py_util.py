"""Launcher and report helpers shared by the Python benchmarks (attn_bench.py, moe_bench.py).

Pure Python: the launcher runs before torch or CUDA is touched, and without torch at all."""

import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class LaunchError(Exception):
  pass


def log(msg):
  print(msg, flush=True)


def commit():
  """MK_BENCH_COMMIT, else the repository's COMMIT_SNAP, else git's HEAD, else 'unknown'."""
  if os.environ.get("MK_BENCH_COMMIT"):
    return os.environ["MK_BENCH_COMMIT"]
  snap = os.path.join(REPO, "COMMIT_SNAP")
  if os.path.isfile(snap):
    with open(snap) as f:
      return f.readline().strip() + " (COMMIT_SNAP)"
  try:
    c = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                       timeout=20)
    return c.stdout.strip() or "unknown"
  except (OSError, subprocess.TimeoutExpired):
    return "unknown"


def mps_answers(env):
  try:
    r = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", env=env,
                       capture_output=True, text=True, timeout=20)
    return r.returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def worker_argv(argv):
  """argv with --nproc spelled --ranks (see launch)."""
  out = []
  for x in argv:
    if x == "--nproc":
      x = "--ranks"
    elif x.startswith("--nproc="):
      x = "--ranks=" + x[len("--nproc="):]
    out.append(x)
  return out


# Where the workers leave their exit status for the launcher (see worker_status).
STATUS_ENV = "MK_BENCH_STATUS_FILE"


def worker_status(rank, rc):
  """The exit status a worker returns. Under launch() (distributed) rank 0 writes rc to the
  launcher's status file and every worker exits 0: torchrun turns any non-zero exit into a
  "ChildFailedError" with tracebacks and exit 1, which would lose "3: targets missed" and
  read as a crash. Without the file (a plain run) rc itself."""
  path = os.environ.get(STATUS_ENV)
  if not path:
    return rc
  if rank == 0:
    with open(path, "w") as f:
      f.write("%d\n" % rc)
  return 0


def read_status(path, launcher_rc):
  """The workers' status from `path` when the launcher succeeded and rank 0 wrote one; else
  the launcher's own (a worker that crashed, or no file)."""
  if launcher_rc != 0:
    return launcher_rc
  try:
    with open(path) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return launcher_rc


def start_mps(tool, env):
  """Starts an MPS daemon in a fresh directory unless one answers to env. Returns (the
  CUDA_MPS_* variables the workers need, the daemon's env for stop_mps, or None when none was
  started). LaunchError when it does not start."""
  if mps_answers(env):
    return {}, None
  d = tempfile.mkdtemp(prefix="mk-%s-mps." % tool.replace("_", "-"))
  mps = dict(CUDA_MPS_PIPE_DIRECTORY=d + "/pipe", CUDA_MPS_LOG_DIRECTORY=d + "/log")
  os.makedirs(d + "/pipe")
  os.makedirs(d + "/log")
  denv = dict(env, **mps)
  if subprocess.run(["nvidia-cuda-mps-control", "-d"], env=denv).returncode != 0:
    raise LaunchError("could not start the MPS daemon (log %s/log)" % d)
  log("%s: started an MPS daemon (CUDA_MPS_PIPE_DIRECTORY=%s/pipe)" % (tool, d))
  return mps, denv


def stop_mps(tool, denv):
  if denv is not None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=denv, text=True)
    log("%s: stopped the MPS daemon" % tool)


def run_workers(tool, script, argv, env, distributed, nproc, nproc_flag, timeout=None):
  """Runs `script argv` once: under torchrun with nproc ranks when distributed, else as one
  rank-0 process. Returns (exit status, note): the workers' status (see worker_status); with
  a timeout, the whole process group is killed after it (status 124, note says so)."""
  # torchrun parses every option of the worker's command line too, abbreviations included:
  # "--nproc" is then an ambiguous prefix of its --nproc-per-node / --nproc_per_node (torch
  # 2.11). The workers take the same count as --ranks.
  me = [os.path.abspath(script)] + worker_argv(argv)
  status = None
  if distributed:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "%s=%d" % (nproc_flag, nproc)] + me
    fd, status = tempfile.mkstemp(prefix="mk-%s-status." % tool.replace("_", "-"))
    os.close(fd)
    env[STATUS_ENV] = status
  else:
    cmd = [sys.executable] + me
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(29500 + os.getpid() % 1000))
  log("%s: %s" % (tool, " ".join(shlex.quote(x) for x in cmd)))
  try:
    if timeout is None:
      rc, note = subprocess.run(cmd, env=env).returncode, None
    else:
      rc, note = run_bounded(cmd, env, timeout)
    return (read_status(status, rc) if status else rc), note
  finally:
    if status:
      os.unlink(status)


def run_bounded(cmd, env, timeout):
  """(exit status, note) of cmd in its own process group, killed whole (torchrun and its
  workers) once `timeout` seconds have passed: a hung NCCL initialisation must not hold the
  GPU and the rest of the benchmark."""
  import signal
  p = subprocess.Popen(cmd, env=env, start_new_session=True)
  try:
    return p.wait(timeout=timeout), None
  except subprocess.TimeoutExpired:
    return 124, "killed after %.0f s (--budget + %d s)" % (timeout, SIDE_TIMEOUT_MARGIN_S)
  finally:
    if p.poll() is None:
      for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
        try:
          os.killpg(p.pid, sig)
          p.wait(timeout=grace)
          break
        except ProcessLookupError:
          break
        except subprocess.TimeoutExpired:
          continue


def launch(tool, script, argv, env, distributed, nproc, mps, nproc_flag="--nproc_per_node"):
  """Runs `script argv` as the worker(s): under torchrun with nproc ranks when distributed, else
  as one rank-0 process; with mps, an MPS daemon is started first unless one answers, and
  stopped after. env: the workers' environment. Returns their exit status; LaunchError when
  the daemon does not start."""
  denv = None
  if distributed and mps:
    vars_, denv = start_mps(tool, env)
    env.update(vars_)
  try:
    return run_workers(tool, script, argv, env, distributed, nproc, nproc_flag)[0]
  finally:
    stop_mps(tool, denv)


# ---------------------------------------------------------------------------------------------
# --nodes N: torch on the real NCCL, every rank its own host, against mkernel's virtual nodes
# ---------------------------------------------------------------------------------------------
# The real NCCL refuses two ranks of one host on one GPU; as separate hosts (NCCL_HOSTID) over
# sockets on lo it runs them (bench/net_vs_nccl.sh does the same for the C drivers).
HOSTID_PREFIX_ENV = "MK_BENCH_HOSTID_PREFIX"
HOSTID_PREFIX = "mkbench-host-"
TORCH_SIDE_NCCL = dict(NCCL_NET="Socket", NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1",
                       NCCL_NVLS_ENABLE="0")
# mkernel's socket backend on lo too; MKERNEL_EMULATE_NODES is set per run.
MKERNEL_SIDE_NCCL = dict(NCCL_SOCKET_IFNAME="lo", NCCL_NVLS_ENABLE="0")
# Gone from both sides: a host id or net choice of the caller would change what is measured.
SIDE_UNSET = ("NCCL_HOSTID", "NCCL_NET", "NCCL_NET_PLUGIN", HOSTID_PREFIX_ENV)
# The variables recorded in each side's meta.
SIDE_REPORT_KEYS = ("LD_PRELOAD", "MKERNEL_EMULATE_NODES", "MKERNEL_NET", "NCCL_NET",
                    "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NVLS_ENABLE", HOSTID_PREFIX_ENV,
                    "CUDA_MPS_PIPE_DIRECTORY", "MKERNEL_MOE_NODE_DEDUP")
SIDES = ("torch", "mkernel")
SIDE_TIMEOUT_MARGIN_S = 180  # the torch side may run --budget seconds plus this


def nodes_problem(nproc, nodes):
  """Why --nproc/--nodes cannot run ('' when they can)."""
  if nodes < 1:
    return "--nodes %d: at least 1" % nodes
  if nodes > 1 and nproc % nodes:
    return "--nodes %d: --nproc %d is not a multiple of it (ranks per node = nproc / nodes)" % (
        nodes, nproc)
  return ""


def side_problem(side, nodes, side_out, torch_from):
  """Why the internal side options (set by launch_nodes) do not fit together ('' if they do)."""
  if not side:
    return "--side-out/--torch-from need --side" if side_out or torch_from else ""
  if nodes < 2:
    return "--side %s: only with --nodes >= 2" % side
  if side == "torch" and not side_out:
    return "--side torch needs --side-out FILE"
  if side == "mkernel" and not torch_from:
    return "--side mkernel needs --torch-from FILE"
  return ""


def hostid(prefix, rank):
  """The NCCL_HOSTID of a torch-side rank: one host per rank."""
  return "%s%d" % (prefix, rank)


def apply_hostid(env=None):
  """Sets NCCL_HOSTID from the launcher's prefix and RANK (torchrun sets no per-rank variable
  of ours). Must run before the first NCCL communicator: NCCL hashes the host id at init.
  Returns the id set, or None without a prefix (every other mode)."""
  env = os.environ if env is None else env
  prefix = env.get(HOSTID_PREFIX_ENV)
  if not prefix:
    return None
  env["NCCL_HOSTID"] = hostid(prefix, int(env["RANK"]))
  return env["NCCL_HOSTID"]


def side_env(base, side, nodes, prefix=HOSTID_PREFIX):
  """The workers' environment of one side. torch: no LD_PRELOAD, no MKERNEL_*, nothing naming
  libmkernel (torch's own NCCL), sockets on lo, the host-id prefix (apply_hostid). mkernel: the base
  environment's LD_PRELOAD (libmkernel) with MKERNEL_EMULATE_NODES=nodes."""
  env = {k: v for k, v in base.items() if k not in SIDE_UNSET}
  if side == "torch":
    env = {k: v for k, v in env.items() if k != "LD_PRELOAD" and not k.startswith("MKERNEL_")
           and "libmkernel" not in v}
    env.update(TORCH_SIDE_NCCL)
    env[HOSTID_PREFIX_ENV] = prefix
  elif side == "mkernel":
    env.update(MKERNEL_SIDE_NCCL)
    env["MKERNEL_EMULATE_NODES"] = str(nodes)
  else:
    raise ValueError("side %r" % side)
  return env


def side_argv(argv, side, path):
  return list(argv) + ["--side", side, "--side-out" if side == "torch" else "--torch-from", path]


def torch_side_outcome(text, rc, note=None):
  """What the mkernel side reads from the torch side's file: its JSON (meta, rows) with the
  exit status, or {"failed": reason} when it wrote nothing usable."""
  how = "exited with status %d" % rc if note is None else note
  try:
    d = json.loads(text)
    if not isinstance(d, dict) or not isinstance(d.get("rows"), list):
      raise ValueError("no rows")
  except ValueError:
    return dict(failed="torch side %s and wrote no results (its output is above)" % how,
                status=rc)
  d["status"] = rc
  if rc != 0:
    d["note"] = "torch side %s" % how
  return d


def load_torch_side(path):
  """(meta, rows, reason): reason is None when the torch side ran and wrote rows (its rows may
  still carry errors), else why there are no torch columns."""
  try:
    with open(path) as f:
      d = json.load(f)
  except (OSError, ValueError) as e:
    return {}, [], "torch side's results unreadable (%s)" % e
  if "failed" in d:
    return d, [], d["failed"]
  meta = dict(d.get("meta", {}), status=d.get("status"))
  if "note" in d:
    meta["note"] = d["note"]
  return meta, d.get("rows", []), None


def merge_torch_rows(rows, torch_rows, key, is_torch, expected, reason=None):
  """Puts the torch side's variants into this side's rows, matched by key(row); rows without
  a torch counterpart get every name in `expected` as an error naming why. Torch variants
  this side timed itself are dropped: the table's torch baseline is the real NCCL's. Returns
  the number of (not skipped) rows left without torch timings."""
  by_key = {key(r): r for r in torch_rows}
  missing = 0
  for r in rows:
    if "skipped" in r:
      continue
    v = r.setdefault("variants", {})
    for name in [x for x in v if is_torch(x)]:
      if "error" in v[name]:  # the check's reference failed on this side: kept, renamed
        r.setdefault("reference_errors", {})[name] = v[name]["error"]
      del v[name]
    t = by_key.get(key(r))
    why = reason
    if why is None and t is None:
      why = "the torch side has no result for this shape"
    elif why is None and "skipped" in t:
      why = "the torch side skipped it: " + t["skipped"]
    if why is not None:
      missing += 1
      v.update({x: {"error": "torch side (real NCCL): " + why} for x in expected})
      continue
    got = {x: dict(m, side="torch") for x, m in t.get("variants", {}).items() if is_torch(x)}
    if not any("ms" in m for m in got.values()):
      missing += 1
    v.update(got)
    if t.get("spot"):
      r["torch_side_spot"] = t["spot"]
  return missing


def mkernel_mapped(maps_text=None):
  """True when a libmkernel is mapped into this process (/proc/self/maps)."""
  if maps_text is None:
    try:
      with open("/proc/self/maps") as f:
        maps_text = f.read()
    except OSError:
      return None
  return any("libmkernel" in os.path.basename(line.split()[-1])
             for line in maps_text.splitlines() if len(line.split()) >= 6)


def side_facts(side, nodes):
  """What decided how this side's collectives ran. Collective: every rank calls it (it
  gathers every rank's NCCL_HOSTID and whether libmkernel is mapped)."""
  import torch
  import torch.distributed as dist
  mine = dict(hostid=os.environ.get("NCCL_HOSTID", ""), libmkernel_mapped=mkernel_mapped())
  every = [None] * dist.get_world_size()
  dist.all_gather_object(every, mine)
  try:
    nv = ".".join(str(x) for x in torch.cuda.nccl.version())
  except Exception as e:  # noqa: BLE001 - recorded
    nv = "unknown (%s: %s)" % (type(e).__name__, e)
  return dict(side=side, nodes=nodes, nccl_version=nv,
              env={k: os.environ.get(k, "") for k in SIDE_REPORT_KEYS},
              hostids=[p["hostid"] for p in every],
              libmkernel_mapped=[p["libmkernel_mapped"] for p in every])


def write_torch_side(path, meta, rows):
  with open(path, "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  log("torch side: wrote %d row(s) to %s" % (len(rows), path))


def apply_torch_side(a, bench, rows, meta, row_key, is_torch, torch_names, set_ratios):
  """The mkernel side of --nodes: the torch columns of `rows` from the torch side's file
  (a.torch_from), the ratios recomputed, both sides' facts in `meta`. Returns how many rows
  lack torch timings."""
  tmeta, trows, why = load_torch_side(a.torch_from)
  missing = merge_torch_rows(rows, trows, row_key, is_torch, torch_names, why)
  for r in rows:
    if "variants" in r:
      set_ratios(r)
  meta["nodes"] = dict(count=a.nodes, mkernel_side=bench.facts,
                       torch_side=dict(tmeta, reason=why) if why else tmeta)
  meta["nodes_header"] = nodes_header(a.nodes, bench.world, tmeta, bench.facts, why)
  return missing


def nodes_header(nodes, nranks, torch_meta, mk_facts, reason):
  """Markdown lines naming which side is which."""
  t = torch_meta.get("side_facts", {})
  tl = ("torch on its own NCCL %s (no LD_PRELOAD; libmkernel mapped: %s), every rank its own "
        "host (NCCL_HOSTID %s), NCCL_NET=Socket over lo, run before the mkernel side" % (
            t.get("nccl_version", "?"), t.get("libmkernel_mapped", "?"),
            ", ".join(t.get("hostids", [])) or "?"))
  if any(t.get("libmkernel_mapped") or []):
    tl += "; NOT THE REAL NCCL: libmkernel was mapped in a torch-side rank"
  if reason:
    tl += "; NO TORCH TIMINGS: " + reason
  elif torch_meta.get("note"):
    tl += "; " + torch_meta["note"]
  return ["- layout: %d (virtual) nodes of %d rank(s), one process per rank" % (
      nodes, nranks // nodes),
          "- mkernel columns: libmkernel preloaded (%s), MKERNEL_EMULATE_NODES=%s; torch "
          "reference for the checks on mkernel's NCCL %s" % (
              mk_facts["env"]["LD_PRELOAD"] or "NOT preloaded",
              mk_facts["env"]["MKERNEL_EMULATE_NODES"], mk_facts["nccl_version"]),
          "- torch columns: " + tl]


def launch_nodes(tool, script, argv, env, nproc, nodes, mps, nproc_flag="--nproc_per_node",
                 torch_timeout=None, mkernel_envs=({},)):
  """--nodes N: torchrun runs under one MPS daemon. First the torch side (side_env "torch":
  the real NCCL, every rank a host) writes its rows to a file; then the mkernel side
  (MKERNEL_EMULATE_NODES=N) runs mkernel's variants and reads torch's timings from that file,
  once per entry of mkernel_envs (variables added to that run's environment: one torch side
  serves several mkernel configurations). A failed torch side leaves the mkernel side running
  (its torch columns name the reason) and makes the status 1. Returns the exit status (the
  worst run's, worst_status)."""
  denv = None
  fd, path = tempfile.mkstemp(prefix="mk-%s-torch-side." % tool.replace("_", "-"),
                              suffix=".json")
  os.close(fd)
  try:
    if mps:  # the daemon without LD_PRELOAD: it serves the torch side as well
      vars_, denv = start_mps(tool, side_env(env, "torch", nodes))
      env = dict(env, **vars_)
    trc, note = run_workers(tool + " torch side", script, side_argv(argv, "torch", path),
                            side_env(env, "torch", nodes), True, nproc, nproc_flag,
                            timeout=torch_timeout)
    with open(path) as f:
      text = f.read()
    outcome = torch_side_outcome(text, trc, note)
    with open(path, "w") as f:
      json.dump(outcome, f)
    if trc != 0:
      log("%s: %s" % (tool, outcome.get("failed") or outcome.get("note")))
    mrcs = []
    for extra in mkernel_envs:
      label = " ".join("%s=%s" % kv for kv in sorted(extra.items()))
      mrcs.append(run_workers(tool + " mkernel side" + (" (%s)" % label if label else ""),
                              script, side_argv(argv, "mkernel", path),
                              dict(side_env(env, "mkernel", nodes), **extra), True, nproc,
                              nproc_flag)[0])
      if label:
        log("%s: mkernel side (%s): exit status %d" % (tool, label, mrcs[-1]))
    return combine_status(trc, worst_status(mrcs))
  finally:
    os.unlink(path)
    stop_mps(tool, denv)


def worst_status(codes):
  """One status for several runs: the first failure other than 3 (targets missed), else 3 if
  any run missed a target, else 0."""
  bad = [c for c in codes if c not in (0, 3)]
  return bad[0] if bad else 3 if 3 in codes else 0


def combine_status(torch_rc, mkernel_rc):
  """The launcher's status over both sides: a failed torch side is a failure (1) unless the
  mkernel side has a worse one to report."""
  if torch_rc != 0 and mkernel_rc in (0, 3):
    return 1
  return mkernel_rc


def command_line(argv):
  return " ".join(shlex.quote(x) for x in [sys.argv[0]] + argv)


def write_results(tool, out_dir, mode, now, meta, rows, md):
  """<out_dir>/<tool>_<mode>_<date>.json (meta and rows) and .md; prints the markdown."""
  os.makedirs(out_dir, exist_ok=True)
  base = os.path.join(out_dir, "%s_%s_%s" % (tool, mode, now.strftime("%Y%m%d-%H%M%S")))
  with open(base + ".json", "w") as f:
    json.dump(dict(meta, results=rows), f, indent=1)
  with open(base + ".md", "w") as f:
    f.write(md)
  log("\n" + md)
  log("%s: wrote %s.json and .md" % (tool, base))


def dispatch(argv, parse_args, launch, worker, child):
  """A bench's entry: the launcher in the user's process, the worker under torchrun (RANK set)
  or when the launcher runs it as its one rank (env `child` = 1)."""
  a = parse_args(argv)
  if os.environ.get(child) != "1" and "RANK" not in os.environ:
    return launch(a, argv)
  return worker(a, argv)


def finish_worker(bench, a, report):
  """A worker's end: the sides' facts (--nodes; every rank, it gathers), rank 0's report (its
  exit status) shared with every rank, the process group closed, and the status for the
  launcher (worker_status)."""
  import torch
  import torch.distributed as dist
  if a.side:
    bench.facts = side_facts(a.side, a.nodes)
  t = torch.tensor([report() if bench.rank == 0 else 0], device=bench.device)
  dist.broadcast(t, 0)
  dist.destroy_process_group()
  return worker_status(bench.rank, int(t.item()))


def init_rank(dtype_name):
  """A torchrun worker's setup: (rank, world, device, dtype); the local GPU made current and
  the nccl process group created. torch is imported here, so the launcher never needs it."""
  import datetime
  import torch
  import torch.distributed as dist
  apply_hostid()  # the torch side of --nodes: before the process group's communicator
  rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
  local = int(os.environ.get("LOCAL_RANK", rank))
  device = torch.device("cuda", local % torch.cuda.device_count())
  torch.cuda.set_device(device)
  dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=300))
  dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
  return rank, world, device, dtype


def import_mkernel(describe):
  """(mkernel module, None, library path), or (None, describe(exception), None): the torch
  side of a benchmark still runs without mkernel."""
  sys.path.insert(0, os.path.join(REPO, "python"))
  try:
    import mkernel
    return mkernel, None, mkernel.library_path()
  except Exception as e:  # noqa: BLE001 - recorded, torch still runs
    return None, describe(e), None
