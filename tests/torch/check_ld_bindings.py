"""Parses LD_DEBUG=bindings output and proves every nccl* symbol is bound to libmkernel.

usage: python3 check_ld_bindings.py <log> [<log> ...]

The log holds ld.so lines such as
  12345:  binding file /.../libtorch_cuda.so [0] to /.../libmkernel.so.0 [0]: normal symbol
          `ncclAllReduce' [...]
(possibly filtered to lines containing "nccl"). For every binding of a symbol named nccl*/pnccl*
made by an object other than libnccl/libmkernel themselves, the target must be libmkernel.
Prints the symbols per importing object, every binding to another object as FAIL, and a final
"MK_RESULT ld_bindings PASS|FAIL" line; exit status 0 only on PASS.
"""

import collections
import os
import re
import sys

BIND = re.compile(r"^\s*(\d+):\s+binding file (.+?) \[\d+\] to (.+?) \[\d+\]: "
                  r"(\w+) symbol `([^']+)'")
NEEDED = re.compile(r"^\s*(\d+):\s+file=(\S*libnccl\S*) \[\d+\];\s+needed by (\S+)")


def main(paths):
  good = collections.defaultdict(set)  # importing object -> symbols bound to libmkernel
  bad = collections.defaultdict(set)  # (importer, target) -> symbols
  pids, nccl_loaded_by = set(), set()
  lines = 0
  for path in paths:
    with open(path, "r", errors="replace") as f:
      for line in f:
        lines += 1
        m = NEEDED.match(line)
        if m:
          nccl_loaded_by.add("%s needed by %s" % (os.path.basename(m.group(2)),
                                                  os.path.basename(m.group(3))))
          continue
        m = BIND.match(line)
        if not m:
          continue
        pid, src, dst, _, sym = m.groups()
        if not re.match(r"p?nccl", sym):
          continue
        sbase, dbase = os.path.basename(src), os.path.basename(dst)
        if sbase.startswith(("libnccl", "libmkernel")):
          continue  # the libraries' own internal references
        pids.add(pid)
        if dbase.startswith("libmkernel"):
          good[sbase].add(sym)
        else:
          bad[(sbase, dst)].add(sym)
  print("ld_bindings: %d log line(s), %d process(es) with nccl bindings" % (lines, len(pids)))
  for obj in sorted(good):
    print("  %s imports %d nccl symbol(s), all bound to libmkernel:" % (obj, len(good[obj])))
    syms = sorted(good[obj])
    for i in range(0, len(syms), 6):
      print("    " + " ".join(syms[i:i + 6]))
  for info in sorted(nccl_loaded_by):
    print("  note: %s (still loaded: its symbols must all be shadowed)" % info)
  ok = True
  for (obj, dst), syms in sorted(bad.items()):
    ok = False
    print("FAIL  %s binds %d nccl symbol(s) to %s (not libmkernel): %s" %
          (obj, len(syms), dst, " ".join(sorted(syms))))
  if not good:
    ok = False
    print("FAIL  no nccl symbol binding found in the log (LD_DEBUG not effective, or NCCL linked "
          "statically into the program)")
  elif not any("ncclAllReduce" in s for s in good.values()):
    ok = False
    print("FAIL  ncclAllReduce never bound to libmkernel")
  print("MK_RESULT ld_bindings %s importers=%d bad_bindings=%d" %
        ("PASS" if ok else "FAIL", len(good), sum(len(s) for s in bad.values())))
  return 0 if ok else 1


if __name__ == "__main__":
  if len(sys.argv) < 2:
    print(__doc__)
    sys.exit(2)
  sys.exit(main(sys.argv[1:]))
