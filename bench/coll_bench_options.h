// Command-line options of coll_bench (see usage()).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace collbench {

struct Options {
  int device = 0;
  int ranks = 4;
  std::string realNccl;  // --real-nccl or MK_REAL_NCCL; empty: nvidia.nccl, then libnccl.so.2
  bool useReal = true;
  size_t minBytes = 8;
  size_t maxBytes = size_t(256) << 20;
  size_t bigBytes = size_t(256) << 20;
  int stepFactor = 2;
  int iters = 0;  // 0: by size
  int warmup = 5;
  int latIters = 2000;
  int hostCalls = 10000;
  std::string colls = "allreduce,allgather,reducescatter,broadcast,reduce";
  std::string out;
  int timeoutS = 1200;
  // (b) buffers: 0 cudaMalloc, 1 ncclMemAlloc + ncclCommRegister, 2 + windows, 3 ncclMemAlloc
  // alone (tells the allocation's share of a difference from the registration's)
  int reg = 0;
  bool single = true, shared = true, sweep = true;
};

inline void usage(const char* argv0) {
  printf(
      "usage: %s [options]\n"
      "  --real-nccl PATH    real libnccl.so.2 for (a) (default: $MK_REAL_NCCL, else PyTorch's\n"
      "                      nvidia.nccl package, else the loader's libnccl.so.2);\n"
      "                      --no-real-nccl skips it\n"
      "  --device D          GPU (default 0)           --ranks N   ranks sharing it (default 4)\n"
      "  -b/-e/-f SIZE       sweep min/max bytes and factor (default 8, 256M, 2)\n"
      "  --big-bytes SIZE    AllReduce size compared with the HBM bound (default 256M)\n"
      "  -n ITERS -w WARMUP  timed/warm-up iterations per sweep size (default: by size / 5)\n"
      "  --lat-iters N       latency samples in (a) (default 2000)\n"
      "  --host-calls N      calls timed for the host cost in (a) (default 10000)\n"
      "  --colls LIST        sweep collectives (default allreduce,allgather,reducescatter,\n"
      "                      broadcast,reduce)\n"
      "  --skip LIST         any of single,shared,sweep\n"
      "  --reg R             (b) buffers as nccl-tests -R: 0 cudaMalloc (default), 1 ncclMemAlloc\n"
      "                      + ncclCommRegister, 2 ncclMemAlloc + ncclCommWindowRegister\n"
      "                      (NCCL_WIN_COLL_SYMMETRIC); rows then use the zero-copy paths;\n"
      "                      3 ncclMemAlloc, not registered (a diagnostic)\n"
      "  --out FILE          JSON output (default <source>/bench/results/coll_<date>_<time>.json)\n"
      "  --timeout S         watchdog for the whole run (default 1200)\n",
      argv0);
}

inline size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = strtod(s, &end);
  switch (end && *end ? *end : ' ') {
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024.0 * 1024;
      break;
    case 'K':
    case 'k':
      v *= 1024.0;
      break;
    default:
      break;
  }
  return static_cast<size_t>(v);
}

inline bool parseArgs(int argc, char** argv, Options* o) {
  if (const char* e = getenv("MK_REAL_NCCL")) o->realNccl = e;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "coll_bench: %s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      exit(0);
    } else if (a == "--real-nccl") {
      o->realNccl = next();
    } else if (a == "--no-real-nccl") {
      o->useReal = false;
    } else if (a == "--device") {
      o->device = atoi(next());
    } else if (a == "--ranks") {
      o->ranks = atoi(next());
    } else if (a == "-b" || a == "--min-bytes") {
      o->minBytes = parseSize(next());
    } else if (a == "-e" || a == "--max-bytes") {
      o->maxBytes = parseSize(next());
    } else if (a == "-f" || a == "--step-factor") {
      o->stepFactor = atoi(next());
    } else if (a == "--big-bytes") {
      o->bigBytes = parseSize(next());
    } else if (a == "-n" || a == "--iters") {
      o->iters = atoi(next());
    } else if (a == "-w" || a == "--warmup") {
      o->warmup = atoi(next());
    } else if (a == "--lat-iters") {
      o->latIters = atoi(next());
    } else if (a == "--host-calls") {
      o->hostCalls = atoi(next());
    } else if (a == "--colls") {
      o->colls = next();
    } else if (a == "--skip") {
      std::string s = next();
      o->single = s.find("single") == std::string::npos;
      o->shared = s.find("shared") == std::string::npos;
      o->sweep = s.find("sweep") == std::string::npos;
    } else if (a == "--out") {
      o->out = next();
    } else if (a == "--timeout") {
      o->timeoutS = atoi(next());
    } else if (a == "--reg") {
      o->reg = atoi(next());
      if (o->reg < 0 || o->reg > 3) {
        fprintf(stderr, "coll_bench: --reg must be 0, 1, 2 or 3\n");
        exit(2);
      }
    } else {
      fprintf(stderr, "coll_bench: unknown option %s\n", a.c_str());
      usage(argv[0]);
      return false;
    }
  }
  if (o->ranks < 1 || o->stepFactor < 2 || o->minBytes < 4 || o->maxBytes < o->minBytes ||
      o->latIters < 1 || o->hostCalls < 1 || o->bigBytes < 4) {
    fprintf(stderr, "coll_bench: invalid option values\n");
    return false;
  }
  return true;
}

}  // namespace collbench
