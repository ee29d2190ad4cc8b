// The NCCL entry points coll_bench measures, as a table of function pointers, so one code path
// drives either mkernel (linked in statically: the table holds &ncclX) or the real libnccl
// (dlopen'ed with RTLD_LOCAL | RTLD_DEEPBIND, so it binds to its own symbols and never to the
// mkernel copies linked into this executable; functions looked up with dlsym).
#pragma once

#include <dlfcn.h>
#include <nccl.h>

#include <string>
#include <type_traits>

namespace collbench {

struct NcclApi {
  std::string name;  // "mkernel" or "nccl"
  std::string path;  // library file ("" for the linked-in mkernel)
  void* handle = nullptr;
  ncclResult_t (*getVersion)(int*) = nullptr;
  ncclResult_t (*getUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*commInitAll)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  const char* (*getErrorString)(ncclResult_t) = nullptr;
  const char* (*getLastError)(ncclComm_t) = nullptr;

  const char* errorString(ncclResult_t r) const {
    return getErrorString ? getErrorString(r) : "unknown error";
  }
  const char* lastError() const {
    const char* s = getLastError ? getLastError(nullptr) : nullptr;
    return s ? s : "";
  }
};

// mkernel's own implementation, linked into this executable (mkernel_static).
inline NcclApi mkernelApi() {
  NcclApi a;
  a.name = "mkernel";
  a.getVersion = &ncclGetVersion;
  a.getUniqueId = &ncclGetUniqueId;
  a.commInitRank = &ncclCommInitRank;
  a.commInitAll = &ncclCommInitAll;
  a.commDestroy = &ncclCommDestroy;
  a.allReduce = &ncclAllReduce;
  a.allGather = &ncclAllGather;
  a.reduceScatter = &ncclReduceScatter;
  a.broadcast = &ncclBroadcast;
  a.reduce = &ncclReduce;
  a.groupStart = &ncclGroupStart;
  a.groupEnd = &ncclGroupEnd;
  a.getErrorString = &ncclGetErrorString;
  a.getLastError = &ncclGetLastError;
  return a;
}

// The real NCCL from `path` (or the loader's search path when path is "libnccl.so.2").
// Returns false with *err set when the library or a required symbol is missing.
inline bool loadRealNccl(const std::string& path, NcclApi* a, std::string* err) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    const char* e = dlerror();
    *err = "dlopen(" + path + ") failed: " + (e ? e : "?");
    return false;
  }
  a->name = "nccl";
  a->handle = h;
  Dl_info info;
  void* probe = dlsym(h, "ncclGetVersion");
  a->path =
      (probe != nullptr && dladdr(probe, &info) != 0 && info.dli_fname) ? info.dli_fname : path;
  bool ok = true;
  auto need = [&](auto& fn, const char* sym, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, sym));
    if (fn == nullptr && required) {
      *err += std::string(err->empty() ? "" : ", ") + "missing symbol " + sym;
      ok = false;
    }
  };
  need(a->getVersion, "ncclGetVersion", true);
  need(a->getUniqueId, "ncclGetUniqueId", true);
  need(a->commInitRank, "ncclCommInitRank", true);
  need(a->commInitAll, "ncclCommInitAll", false);
  need(a->commDestroy, "ncclCommDestroy", true);
  need(a->allReduce, "ncclAllReduce", true);
  need(a->allGather, "ncclAllGather", false);
  need(a->reduceScatter, "ncclReduceScatter", false);
  need(a->broadcast, "ncclBroadcast", false);
  need(a->reduce, "ncclReduce", false);
  need(a->groupStart, "ncclGroupStart", false);
  need(a->groupEnd, "ncclGroupEnd", false);
  need(a->getErrorString, "ncclGetErrorString", true);
  need(a->getLastError, "ncclGetLastError", false);
  if (ok && a->path.find("mkernel") != std::string::npos) {
    *err = path + " resolves to mkernel itself (" + a->path + "), not the real NCCL";
    ok = false;
  }
  return ok;
}

}  // namespace collbench
