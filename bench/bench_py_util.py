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


def launch(tool, script, argv, env, distributed, nproc, mps, nproc_flag="--nproc_per_node"):
  """Runs `script argv` as the worker(s): under torchrun with nproc ranks when distributed, else
  as one rank-0 process; with mps, an MPS daemon is started first unless one answers, and
  stopped after. env: the workers' environment. Returns their exit status; LaunchError when
  the daemon does not start."""
  started = None
  if distributed and mps and not mps_answers(env):
    d = tempfile.mkdtemp(prefix="mk-%s-mps." % tool.replace("_", "-"))
    env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"] = d + "/pipe", d + "/log"
    os.makedirs(d + "/pipe")
    os.makedirs(d + "/log")
    if subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env).returncode != 0:
      raise LaunchError("could not start the MPS daemon (log %s/log)" % d)
    started = env
    log("%s: started an MPS daemon (CUDA_MPS_PIPE_DIRECTORY=%s/pipe)" % (tool, d))
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
    rc = subprocess.run(cmd, env=env).returncode
    return read_status(status, rc) if status else rc
  finally:
    if status:
      os.unlink(status)
    if started is not None:
      subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=started, text=True)
      log("%s: stopped the MPS daemon" % tool)


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


def init_rank(dtype_name):
  """A torchrun worker's setup: (rank, world, device, dtype); the local GPU made current and
  the nccl process group created. torch is imported here, so the launcher never needs it."""
  import datetime
  import torch
  import torch.distributed as dist
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
