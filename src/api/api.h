// Exporting the NCCL C API the way libnccl does: the implementation is pncclX, and
// ncclX is a weak alias of it, so profilers that interpose ncclX can call pncclX.
// Everything else in the library is hidden (-fvisibility=hidden and src/mkernel.map).
#pragma once
#include <thread>
#include <nccl.h>

#include "base/guard.h"  // apiGuard: no C++ exception crosses the C ABI

#define MK_EXPORT __attribute__((visibility("default")))

#define MK_API(ret, func, ...)                                                        \
  extern "C" MK_EXPORT ret p##func(__VA_ARGS__);                                      \
  extern "C" MK_EXPORT __attribute__((weak, alias("p" #func))) ret func(__VA_ARGS__); \
  extern "C" MK_EXPORT ret p##func(__VA_ARGS__)
