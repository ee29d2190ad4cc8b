// cuMem (VMM) building blocks of peer memory, and ncclMemAlloc/ncclMemFree.
#define MK_PEER_MEM_INTERNAL 1
#include <map>
#include <vector>
#include <mutex>
#include <unistd.h>

#include "base/checks.h"
#include "base/cudawrap.h"
#include "transport/peer_mem.h"

namespace mk {
namespace pm {

namespace {

size_t roundUp(size_t v, size_t g) {
  return (v + g - 1) / g * g;
}

int devAttr(int dev, CUdevice_attribute attr) {
  if (cudaLibInit() != ncclSuccess) return 0;
  CUdevice cuDev;
  int v = 0;
  if (cu.cuDeviceGet(&cuDev, dev) != CUDA_SUCCESS) return 0;
  if (cu.cuDeviceGetAttribute(&v, attr, cuDev) != CUDA_SUCCESS) return 0;
  return v;
}

CUmemAllocationProp allocProp(int dev, bool exportable) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes =
      exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  // Lets the net transport register the memory for GPUDirect RDMA later (dma-buf).
  if (devAttr(dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED))
    prop.allocFlags.gpuDirectRDMACapable = 1;
  return prop;
}

std::vector<CUmemAccessDesc> accessDescs(const std::vector<int>& devs) {
  std::vector<CUmemAccessDesc> d(devs.size());
  for (size_t i = 0; i < devs.size(); i++) {
    d[i] = {};
    d[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d[i].location.id = devs[i];
    d[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return d;
}

}  // namespace

bool vmmSupported(int dev) {
  return devAttr(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
}
bool fdHandleSupported(int dev) {
  return devAttr(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0;
}

bool canAccessPeer(int dev, int peerDev) {
  if (dev == peerDev) return true;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, dev, peerDev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return can != 0;
}

std::vector<int> accessibleFrom(int dev) {
  std::vector<int> devs{dev};
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return devs;
  }
  for (int d = 0; d < n; d++)
    if (d != dev && canAccessPeer(d, dev)) devs.push_back(d);
  return devs;
}

ncclResult_t enablePeerAccess(int peerDev) {
  int dev = -1;
  CUDACHECK(cudaGetDevice(&dev));
  if (dev == peerDev) return ncclSuccess;
  cudaError_t e = cudaDeviceEnablePeerAccess(peerDev, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return ncclSuccess;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    MK_WARN("cudaDeviceEnablePeerAccess from GPU %d to GPU %d failed: %s", dev, peerDev,
            cudaGetErrorString(e));
    return ncclUnhandledCudaError;
  }
  MK_INFO(kP2p, "enabled P2P access from GPU %d to GPU %d", dev, peerDev);
  return ncclSuccess;
}

ncclResult_t allocGranularity(int dev, bool exportable, size_t* gran) {
  NCCLCHECK(cudaLibInit());
  CUmemAllocationProp prop = allocProp(dev, exportable);
  CUCHECK(cuMemGetAllocationGranularity(gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (*gran == 0) *gran = 2u << 20;
  return ncclSuccess;
}

ncclResult_t mapCreate(int dev, size_t size, bool exportable, const std::vector<int>& accessDevs,
                       bool quiet, Mapping* m) {
  NCCLCHECK(cudaLibInit());
  ncclResult_t res = ncclSuccess;
  CUmemAllocationProp prop = allocProp(dev, exportable);
  size_t gran = 0;
  CUCHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (gran == 0) gran = 2u << 20;
  *m = Mapping{};
  m->kind = Mapping::kCuMem;
  m->dev = dev;
  m->exportable = exportable;
  m->size = roundUp(size ? size : 1, gran);
  CUresult cr = cu.cuMemCreate(&m->handle, m->size, &prop, 0);
  if (cr != CUDA_SUCCESS) {
    if (quiet)
      MK_INFO(kAlloc, "cuMemCreate of %zu bytes on GPU %d (%s handle) failed: %d (%s)", m->size,
              dev, exportable ? "POSIX fd" : "no", (int)cr, cuErrorString(cr));
    else
      MK_WARN("cuMemCreate of %zu bytes on GPU %d (%s handle) failed: %d (%s)", m->size, dev,
              exportable ? "POSIX fd" : "no", (int)cr, cuErrorString(cr));
    *m = Mapping{};
    return ncclUnhandledCudaError;
  }
  m->haveHandle = true;
  {
    CUdeviceptr va = 0;
    CUCHECKGOTO(cuMemAddressReserve(&va, m->size, gran, 0, 0), res, fail);
    m->ptr = reinterpret_cast<void*>(va);
    m->reserved = true;
    CUCHECKGOTO(cuMemMap(va, m->size, 0, m->handle, 0), res, fail);
    m->mapped = true;
    std::vector<CUmemAccessDesc> desc = accessDescs(accessDevs);
    CUCHECKGOTO(cuMemSetAccess(va, m->size, desc.data(), desc.size()), res, fail);
  }
  MK_INFO(kAlloc, "cuMem allocation %p size %zu on GPU %d (%s, %zu devices)", m->ptr, m->size, dev,
          exportable ? "POSIX fd" : "not exportable", accessDevs.size());
  return ncclSuccess;
fail:
  mapRelease(m);
  return res;
}

ncclResult_t setAccess(void* ptr, size_t size, const std::vector<int>& devs) {
  if (devs.empty()) return ncclSuccess;
  NCCLCHECK(cudaLibInit());
  std::vector<CUmemAccessDesc> desc = accessDescs(devs);
  CUCHECK(cuMemSetAccess(reinterpret_cast<CUdeviceptr>(ptr), size, desc.data(), desc.size()));
  return ncclSuccess;
}

ncclResult_t exportFd(CUmemGenericAllocationHandle handle, int* fd) {
  NCCLCHECK(cudaLibInit());
  *fd = -1;
  int out = -1;
  CUCHECK(cuMemExportToShareableHandle(&out, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  *fd = out;
  return ncclSuccess;
}

ncclResult_t mapImportFd(int fd, size_t size, int dev, Mapping* m) {
  NCCLCHECK(cudaLibInit());
  ncclResult_t res = ncclSuccess;
  *m = Mapping{};
  m->kind = Mapping::kCuMem;
  m->size = size;
  {
    CUCHECKGOTO(cuMemImportFromShareableHandle(&m->handle, (void*)(uintptr_t)fd,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                res, fail);
    m->haveHandle = true;
    CUmemAllocationProp prop = {};
    CUCHECKGOTO(cuMemGetAllocationPropertiesFromHandle(&prop, m->handle), res, fail);
    m->dev = prop.location.id;
    size_t gran = 0;
    CUCHECKGOTO(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), res,
                fail);
    if (gran == 0) gran = 2u << 20;
    if (size % gran != 0) {
      MK_WARN("imported allocation size %zu is not a multiple of the granularity %zu", size, gran);
      res = ncclInternalError;
      goto fail;
    }
    CUdeviceptr va = 0;
    CUCHECKGOTO(cuMemAddressReserve(&va, size, gran, 0, 0), res, fail);
    m->ptr = reinterpret_cast<void*>(va);
    m->reserved = true;
    CUCHECKGOTO(cuMemMap(va, size, 0, m->handle, 0), res, fail);
    m->mapped = true;
    std::vector<CUmemAccessDesc> desc = accessDescs({dev});
    CUCHECKGOTO(cuMemSetAccess(va, size, desc.data(), desc.size()), res, fail);
  }
  MK_INFO(kP2p, "imported peer allocation (GPU %d) at %p size %zu for GPU %d", m->dev, m->ptr, size,
          dev);
  return ncclSuccess;
fail:
  mapRelease(m);
  return res;
}

ncclResult_t mapRelease(Mapping* m) {
  ncclResult_t res = ncclSuccess;
  auto note = [&](CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
      MK_WARN("%s of %p (%zu bytes) failed: %d (%s)", what, m->ptr, m->size, (int)r,
              cuErrorString(r));
      if (res == ncclSuccess) res = ncclUnhandledCudaError;
    }
  };
  switch (m->kind) {
    case Mapping::kCuMem:
      if (m->mapped)
        note(cu.cuMemUnmap(reinterpret_cast<CUdeviceptr>(m->ptr), m->size), "cuMemUnmap");
      if (m->haveHandle) note(cu.cuMemRelease(m->handle), "cuMemRelease");
      if (m->reserved)
        note(cu.cuMemAddressFree(reinterpret_cast<CUdeviceptr>(m->ptr), m->size),
             "cuMemAddressFree");
      break;
    case Mapping::kCudaMalloc:
      if (m->ptr) {
        cudaError_t e = cudaFree(m->ptr);
        if (e != cudaSuccess) {
          cudaGetLastError();
          MK_WARN("cudaFree(%p) failed: %s", m->ptr, cudaGetErrorString(e));
          res = ncclUnhandledCudaError;
        }
      }
      break;
    case Mapping::kIpcOpen:
      if (m->ptr) {
        cudaError_t e = cudaIpcCloseMemHandle(m->ptr);
        if (e != cudaSuccess) {
          cudaGetLastError();
          MK_WARN("cudaIpcCloseMemHandle(%p) failed: %s", m->ptr, cudaGetErrorString(e));
          res = ncclUnhandledCudaError;
        }
      }
      break;
    case Mapping::kNone:
      break;
  }
  *m = Mapping{};
  return res;
}

}  // namespace pm

// ---------------------------------------------------------------------------------------
// ncclMemAlloc / ncclMemFree

namespace {
std::mutex gAllocMu;
std::map<uintptr_t, pm::Mapping>& allocs() {
  static auto* m = new std::map<uintptr_t, pm::Mapping>();  // never destroyed (exit order)
  return *m;
}
}  // namespace

ncclResult_t memAlloc(void** ptr, size_t size) {
  MK_ARGCHECK(ptr != nullptr, "ncclMemAlloc: ptr is NULL");
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;
  NCCLCHECK(cudaLibInit());
  int dev = -1;
  CUDACHECK(cudaGetDevice(&dev));
  pm::Mapping m;
  if (!pm::vmmSupported(dev)) {
    MK_INFO(kAlloc, "ncclMemAlloc: GPU %d has no VMM support, using cudaMalloc", dev);
    void* p = nullptr;
    CUDACHECK(cudaMalloc(&p, size));
    m.kind = pm::Mapping::kCudaMalloc;
    m.ptr = p;
    m.size = size;
    m.dev = dev;
  } else {
    std::vector<int> devs = pm::accessibleFrom(dev);
    bool fd = pm::fdHandleSupported(dev);
    ncclResult_t r = pm::mapCreate(dev, size, fd, devs, /*quiet=*/fd, &m);
    if (r != ncclSuccess && fd) {
      MK_INFO(kAlloc, "ncclMemAlloc: retrying without a POSIX-fd handle");
      r = pm::mapCreate(dev, size, false, devs, false, &m);
    }
    if (r != ncclSuccess) {
      MK_WARN("ncclMemAlloc: could not allocate %zu bytes on GPU %d", size, dev);
      return r;
    }
  }
  {
    std::lock_guard<std::mutex> lk(gAllocMu);
    allocs()[reinterpret_cast<uintptr_t>(m.ptr)] = m;
  }
  *ptr = m.ptr;
  MK_INFO(kAlloc, "ncclMemAlloc %p size %zu (mapped %zu) GPU %d", m.ptr, size, m.size, dev);
  return ncclSuccess;
}

ncclResult_t memFree(void* ptr) {
  if (ptr == nullptr) return ncclSuccess;
  pm::Mapping m;
  {
    std::lock_guard<std::mutex> lk(gAllocMu);
    auto it = allocs().find(reinterpret_cast<uintptr_t>(ptr));
    if (it == allocs().end()) {
      MK_WARN("ncclMemFree: %p was not returned by ncclMemAlloc (or was freed already)", ptr);
      return ncclInvalidArgument;
    }
    m = it->second;
    allocs().erase(it);
  }
  pm::DeviceGuard g;
  NCCLCHECK(g.set(m.dev));
  MK_INFO(kAlloc, "ncclMemFree %p size %zu GPU %d", m.ptr, m.size, m.dev);
  return pm::mapRelease(&m);
}

}  // namespace mk
