// Loader for external NCCL net plugins (NCCL_NET_PLUGIN): dlopen the library, take the
// newest ncclNetPlugin_vN it exports (v11 .. v8), and adapt that version's function table
// to the internal Net interface. The differences handled here:
//   v8:  int sizes in isend/irecv (messages over 2 GiB are refused), no vProps/limits;
//   v9:  size_t sizes;  v10: profiler callback in init, per-connection config in connect,
//   profiler handles in isend/irecv;  v11: a per-communicator context from init() passed
//   to listen/connect, finalize(ctx) on unload.
#include <cstdint>
#include <memory>
#include <dlfcn.h>

#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/checks.h"
#include "mkernel/net_plugin/net_plugin.h"
#include "transport/net.h"

namespace mk {
namespace {

void pluginLogger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                  const char* fmt, ...) {
  int lvl = (int)level;
  uint64_t subsys = flags ? (uint64_t)flags : (uint64_t)kNet;
  if (lvl != kLogWarn && !logEnabled(lvl, subsys)) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  logMessage(lvl, subsys, file ? file : "plugin", line, "%s", buf);
}

ncclResult_t pluginProfiler(void** eHandle, int type, void* phandle, int64_t pluginId,
                            void* extData) {
  if (eHandle) *eHandle = nullptr;  // no profiler attached: events are dropped
  return ncclSuccess;
}

// A plugin request plus the number of sizes its test() reports.
struct PReq {
  void* inner;
  int n;
};

template <typename Props>
void fillCommon(const Props& s, NetProperties* p) {
  p->name = s.name ? s.name : "";
  p->pciPath = s.pciPath ? s.pciPath : "";
  p->guid = s.guid;
  p->ptrSupport = s.ptrSupport;
  p->regIsGlobal = s.regIsGlobal != 0;
  p->speedMbps = s.speed;
  p->port = s.port;
  p->latencyUs = s.latency;
  p->maxComms = s.maxComms;
  p->maxRecvs = s.maxRecvs;
}
template <typename Props>
void fillLimits(const Props& s, NetProperties* p) {
  p->forceFlush = s.forceFlush != 0;
  p->maxP2pBytes = s.maxP2pBytes;
  p->maxCollBytes = s.maxCollBytes;
}

class PluginNet : public Net {
 public:
  PluginNet(void* dl, int version, void* table, const std::string& path)
      : dl_(dl), version_(version), path_(path) {
    t8_ = static_cast<ncclNet_v8_t*>(table);
    t9_ = static_cast<ncclNet_v9_t*>(table);
    t10_ = static_cast<ncclNet_v10_t*>(table);
    t11_ = static_cast<ncclNet_v11_t*>(table);
    name_ = std::string("plugin:") + (t8_->name ? t8_->name : "?") + "/v" + std::to_string(version);
  }
  ~PluginNet() override {
    if (version_ == 11 && inited_ && t11_->finalize) t11_->finalize(ctx_);
    // Plugins may keep threads until every comm is closed; our callers close all comms
    // before dropping the backend, so unloading is safe here.
    if (dl_) dlclose(dl_);
  }

  ncclResult_t init() {
    ncclResult_t res;
    switch (version_) {
      case 8:
        res = t8_->init(pluginLogger);
        break;
      case 9:
        res = t9_->init(pluginLogger);
        break;
      case 10:
        res = t10_->init(pluginLogger, pluginProfiler);
        break;
      default: {
        ncclNetCommConfig_v11_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
        res = t11_->init(&ctx_, /*commId=*/0, &cfg, pluginLogger, pluginProfiler);
      }
    }
    if (res != ncclSuccess) {
      MK_WARN("net plugin %s: init failed (%d)", path_.c_str(), (int)res);
      return res;
    }
    inited_ = true;
    return ncclSuccess;
  }

  const char* name() const override { return name_.c_str(); }
  ncclResult_t devices(int* ndev) override { return t8_->devices(ndev); }

  ncclResult_t getProperties(int dev, NetProperties* p) override {
    *p = NetProperties();
    switch (version_) {
      case 8: {
        ncclNetProperties_v8_t s;
        memset(&s, 0, sizeof(s));
        NCCLCHECK(t8_->getProperties(dev, &s));
        fillCommon(s, p);
        p->maxP2pBytes = p->maxCollBytes = INT_MAX;  // v8 sizes are int
        break;
      }
      case 9: {
        ncclNetProperties_v9_t s;
        memset(&s, 0, sizeof(s));
        NCCLCHECK(t9_->getProperties(dev, &s));
        fillCommon(s, p);
        fillLimits(s, p);
        break;
      }
      case 10: {
        ncclNetProperties_v10_t s;
        memset(&s, 0, sizeof(s));
        NCCLCHECK(t10_->getProperties(dev, &s));
        fillCommon(s, p);
        fillLimits(s, p);
        break;
      }
      default: {
        ncclNetProperties_v11_t s;
        memset(&s, 0, sizeof(s));
        NCCLCHECK(t11_->getProperties(dev, &s));
        fillCommon(s, p);
        fillLimits(s, p);
      }
    }
    if (p->maxRecvs > kNetMaxRecvs) p->maxRecvs = kNetMaxRecvs;
    return ncclSuccess;
  }

  ncclResult_t listen(int dev, void* handle, void** listenComm) override {
    if (version_ == 11) return t11_->listen(ctx_, dev, handle, listenComm);
    return t8_->listen(dev, handle, listenComm);  // same slot and signature in v8..v10
  }

  ncclResult_t connect(int dev, void* h, void** sendComm) override {
    ncclNetDeviceHandle_v8_t* devComm = nullptr;  // NULL: no device offload requested
    switch (version_) {
      case 8:
        return t8_->connect(dev, h, sendComm, &devComm);
      case 9:
        return t9_->connect(dev, h, sendComm, &devComm);
      case 10: {
        ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
        return t10_->connect(dev, &cfg, h, sendComm, &devComm);
      }
      default:
        return t11_->connect(ctx_, dev, h, sendComm, &devComm);
    }
  }

  ncclResult_t accept(void* listenComm, void** recvComm) override {
    ncclNetDeviceHandle_v8_t* devComm = nullptr;
    return t8_->accept(listenComm, recvComm, &devComm);
  }

  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) override {
    return t8_->regMr(comm, data, size, type, mhandle);
  }
  ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle) override {
    if (!t8_->regMrDmaBuf) {
      MK_WARN("net plugin %s has no regMrDmaBuf", path_.c_str());
      return ncclInvalidUsage;
    }
    return t8_->regMrDmaBuf(comm, data, size, type, offset, fd, mhandle);
  }
  ncclResult_t deregMr(void* comm, void* mhandle) override { return t8_->deregMr(comm, mhandle); }

  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) override {
    void* inner = nullptr;
    *request = nullptr;
    switch (version_) {
      case 8:
        MK_ARGCHECK(size <= (size_t)INT_MAX, "net plugin v8: message of %zu bytes over 2 GiB",
                    size);
        NCCLCHECK(t8_->isend(sendComm, data, (int)size, tag, mhandle, &inner));
        break;
      case 9:
        NCCLCHECK(t9_->isend(sendComm, data, size, tag, mhandle, &inner));
        break;
      case 10:
        NCCLCHECK(t10_->isend(sendComm, data, size, tag, mhandle, nullptr, &inner));
        break;
      default:
        NCCLCHECK(t11_->isend(sendComm, data, size, tag, mhandle, nullptr, &inner));
    }
    if (inner) *request = new PReq{inner, 1};
    return ncclSuccess;
  }

  ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override {
    MK_ARGCHECK(n >= 1 && n <= kNetMaxRecvs, "net plugin: irecv of %d buffers", n);
    void* inner = nullptr;
    *request = nullptr;
    void* ph[kNetMaxRecvs] = {};
    switch (version_) {
      case 8: {
        int isz[kNetMaxRecvs];
        for (int i = 0; i < n; i++) {
          MK_ARGCHECK(sizes[i] <= (size_t)INT_MAX, "net plugin v8: receive over 2 GiB");
          isz[i] = (int)sizes[i];
        }
        NCCLCHECK(t8_->irecv(recvComm, n, data, isz, tags, mhandles, &inner));
        break;
      }
      case 9:
        NCCLCHECK(t9_->irecv(recvComm, n, data, sizes, tags, mhandles, &inner));
        break;
      case 10:
        NCCLCHECK(t10_->irecv(recvComm, n, data, sizes, tags, mhandles, ph, &inner));
        break;
      default:
        NCCLCHECK(t11_->irecv(recvComm, n, data, sizes, tags, mhandles, ph, &inner));
    }
    if (inner) *request = new PReq{inner, n};
    return ncclSuccess;
  }

  ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                      void** request) override {
    void* inner = nullptr;
    *request = nullptr;
    NCCLCHECK(t8_->iflush(recvComm, n, data, sizes, mhandles, &inner));
    if (inner) *request = new PReq{inner, 1};
    return ncclSuccess;
  }

  ncclResult_t test(void* request, int* done, size_t* sizes) override {
    PReq* r = static_cast<PReq*>(request);
    int isz[kNetMaxRecvs] = {};
    ncclResult_t res = t8_->test(r->inner, done, isz);
    if (res != ncclSuccess) {
      delete r;  // a failed request is over (net.h): nobody tests it again
      return res;
    }
    if (*done) {
      if (sizes)
        for (int i = 0; i < r->n; i++) sizes[i] = (size_t)(isz[i] < 0 ? 0 : isz[i]);
      delete r;
    }
    return ncclSuccess;
  }

  ncclResult_t closeSend(void* c) override { return t8_->closeSend(c); }
  ncclResult_t closeRecv(void* c) override { return t8_->closeRecv(c); }
  ncclResult_t closeListen(void* c) override { return t8_->closeListen(c); }

 private:
  void* dl_;
  int version_;
  std::string path_;
  std::string name_;
  // One table, read through the struct of its version; the members shared by v8..v10
  // sit at the same offsets, v11 differs in listen/connect/init only.
  ncclNet_v8_t* t8_;
  ncclNet_v9_t* t9_;
  ncclNet_v10_t* t10_;
  ncclNet_v11_t* t11_;
  void* ctx_ = nullptr;
  bool inited_ = false;
};

}  // namespace

ncclResult_t netLoadPluginVersion(const char* nameOrPath, int version, std::unique_ptr<Net>* out) {
  MK_ARGCHECK(nameOrPath && nameOrPath[0], "net plugin: empty NCCL_NET_PLUGIN");
  std::string s(nameOrPath);
  bool isFile =
      s.find('/') != std::string::npos || (s.size() > 3 && s.compare(s.size() - 3, 3, ".so") == 0);
  // As NCCL: a bare name means libnccl-net-<name>.so, else the value is taken as the
  // library's own name or path.
  std::string lib = isFile ? s : "libnccl-net-" + s + ".so";
  void* dl = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl && !isFile) {
    std::string first = dlerror();
    dl = dlopen(s.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl)
      lib = s;
    else
      MK_INFO(kNet, "net plugin: dlopen(%s) failed: %s", lib.c_str(), first.c_str());
  }
  if (!dl) {
    MK_WARN("net plugin not available: dlopen(%s) failed: %s", lib.c_str(), dlerror());
    return ncclSystemError;
  }
  static const struct {
    int version;
    const char* sym;
  } kSyms[] = {{11, "ncclNetPlugin_v11"},
               {10, "ncclNetPlugin_v10"},
               {9, "ncclNetPlugin_v9"},
               {8, "ncclNetPlugin_v8"}};
  for (const auto& k : kSyms) {
    if (version != 0 && k.version != version) continue;
    void* table = dlsym(dl, k.sym);
    if (!table) continue;
    auto* net = new PluginNet(dl, k.version, table, lib);
    ncclResult_t res = net->init();
    if (res != ncclSuccess) {
      delete net;  // also dlcloses
      return res;
    }
    MK_INFO(kNet, "net plugin %s: using %s", lib.c_str(), k.sym);
    out->reset(net);
    return ncclSuccess;
  }
  if (version != 0)
    MK_WARN("net plugin %s does not export ncclNetPlugin_v%d", lib.c_str(), version);
  else
    MK_WARN("net plugin %s exports no ncclNetPlugin_v11..v8 symbol (too old or not a net plugin)",
            lib.c_str());
  dlclose(dl);
  return ncclSystemError;
}

ncclResult_t netLoadPlugin(const char* nameOrPath, std::unique_ptr<Net>* out) {
  return netLoadPluginVersion(nameOrPath, 0, out);
}

}  // namespace mk
