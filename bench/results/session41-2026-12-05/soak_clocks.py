#!/usr/bin/env python3
"""Mean SM clock, power and temperature per `bench_gemm_bench --soak` window.

  soak_clocks.py BENCH_LOG SMI_CSV

BENCH_LOG: the bench's output (lines "... soak NAME N calls X TFLOP/s from A to B", A and B in
nvidia-smi's timestamp format); SMI_CSV: `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,
temperature.gpu,clocks_event_reasons.active --format=csv,noheader,nounits -lms 50` run beside
it. Prints one line per window: the samples inside it, their mean SM clock (MHz), power (W),
temperature, and the throttle-reason bit masks seen. The question (session 41): does the engine
run at a lower clock than cuBLAS under load at 8192x8192x1024?
"""
import datetime
import re
import sys

FMT = "%Y/%m/%d %H:%M:%S.%f"


def stamp(s):
  return datetime.datetime.strptime(s.strip(), FMT)


def main(log, csv):
  samples = []
  for line in open(csv):
    f = [x.strip() for x in line.split(",")]
    if len(f) < 4:
      continue
    try:
      samples.append((stamp(f[0]), float(f[1]), float(f[2]), float(f[3]),
                      f[4] if len(f) > 4 else ""))
    except ValueError:
      continue
  pat = re.compile(r"(\d+) x +(\d+) x +(\d+): soak (\S+) (\d+) calls ([\d.]+) TFLOP/s "
                   r"from (\S+ \S+) to (\S+ \S+)")
  for line in open(log):
    m = pat.search(line)
    if not m:
      continue
    t0, t1 = stamp(m.group(7)), stamp(m.group(8))
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
      print("%sx%sx%s %s: no nvidia-smi samples in the window" % (m.group(1), m.group(2),
                                                                  m.group(3), m.group(4)))
      continue
    n = len(inside)
    print("%sx%sx%s %-12s %7.1f TFLOP/s  %3d samples  SM %6.0f MHz  %5.0f W  %3.0f C  reasons %s"
          % (m.group(1), m.group(2), m.group(3), m.group(4), float(m.group(6)), n,
             sum(s[1] for s in inside) / n, sum(s[2] for s in inside) / n,
             sum(s[3] for s in inside) / n, ",".join(sorted({s[4] for s in inside}))))


if __name__ == "__main__":
  if len(sys.argv) != 3:
    sys.exit(__doc__)
  main(sys.argv[1], sys.argv[2])
