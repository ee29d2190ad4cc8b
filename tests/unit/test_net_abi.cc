// Pins the NCCL net-plugin ABI layouts (LP64): a plugin built against NCCL's headers and
// a libnccl loading our plugin both depend on these exact offsets.
#include <memory>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <unistd.h>
#include <string>

#include "base/debug.h"
#include "mkernel/net_plugin/net_plugin.h"
#include "transport/net.h"

#define FN_SLOT(T, f) (offsetof(T, f) / sizeof(void*))

static_assert(sizeof(void*) == 8, "LP64 layouts below");
static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32, "device handle");
static_assert(offsetof(ncclNetDeviceHandle_v8_t, handle) == 8, "device handle");
static_assert(offsetof(ncclNetDeviceHandle_v8_t, needsProxyProgress) == 24, "device handle");

static_assert(sizeof(ncclNetProperties_v8_t) == 64, "v8 props");
static_assert(offsetof(ncclNetProperties_v8_t, guid) == 16, "v8 props");
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "v8 props");
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40, "v8 props");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 props");

static_assert(offsetof(ncclNetProperties_v9_t, forceFlush) == 32, "v9 props");
static_assert(offsetof(ncclNetProperties_v9_t, vProps) == 64, "v9 props");
static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 props");
static_assert(sizeof(ncclNetProperties_v9_t) == 104, "v9 props");
static_assert(sizeof(ncclNetProperties_v10_t) == 104, "v10 props");
static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96, "v10 props");
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 props");
static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 props");
static_assert(sizeof(ncclNetVDeviceProps_v11_t) == 20, "vProps");
static_assert(sizeof(ncclNetAttr_v11_t) == 44, "net attr");

static_assert(sizeof(ncclNet_v8_t) == 19 * 8, "v8 table");
static_assert(FN_SLOT(ncclNet_v8_t, isend) == 10, "v8 table");
static_assert(FN_SLOT(ncclNet_v8_t, test) == 13, "v8 table");
static_assert(FN_SLOT(ncclNet_v8_t, irecvConsumed) == 18, "v8 table");
static_assert(sizeof(ncclNet_v9_t) == 20 * 8, "v9 table");
static_assert(FN_SLOT(ncclNet_v9_t, makeVDevice) == 19, "v9 table");
static_assert(sizeof(ncclNet_v10_t) == 20 * 8, "v10 table");
static_assert(sizeof(ncclNet_v11_t) == 22 * 8, "v11 table");
static_assert(FN_SLOT(ncclNet_v11_t, finalize) == 20, "v11 table");
static_assert(FN_SLOT(ncclNet_v11_t, setNetAttr) == 21, "v11 table");
// The loader reads v8..v10 tables through the v8 view for the shared members.
static_assert(offsetof(ncclNet_v8_t, accept) == offsetof(ncclNet_v11_t, accept), "shared slot");
static_assert(offsetof(ncclNet_v8_t, test) == offsetof(ncclNet_v11_t, test), "shared slot");
static_assert(offsetof(ncclNet_v8_t, closeListen) == offsetof(ncclNet_v10_t, closeListen),
              "shared slot");

TEST(NetAbi, HandleFitsAndConstants) {
  EXPECT_EQ(NCCL_NET_HANDLE_MAXSIZE, 128);
  EXPECT_EQ(NCCL_PTR_HOST, 1);
  EXPECT_EQ(NCCL_PTR_CUDA, 2);
  EXPECT_EQ(NCCL_PTR_DMABUF, 4);
  EXPECT_EQ(mk::kNetHandleSize, 128);
}

TEST(NetPluginLoader, MissingLibraryIsACleanError) {
  std::unique_ptr<mk::Net> net;
  EXPECT_EQ(mk::netLoadPlugin("does-not-exist-xyz", &net), ncclSystemError);
  EXPECT_EQ(net, nullptr);
  EXPECT_NE(std::string(mk::lastError()).find("libnccl-net-does-not-exist-xyz.so"),
            std::string::npos)
      << mk::lastError();
  EXPECT_EQ(mk::netLoadPlugin("/nonexistent/dir/libfoo.so", &net), ncclSystemError);
}

TEST(NetPluginLoader, LibraryWithoutNetSymbolsIsRejected) {
  std::unique_ptr<mk::Net> net;
  // libm is a real shared library with no ncclNetPlugin_* symbol.
  EXPECT_EQ(mk::netLoadPlugin("libm.so.6", &net), ncclSystemError);
  EXPECT_NE(std::string(mk::lastError()).find("ncclNetPlugin"), std::string::npos)
      << mk::lastError();
}

TEST(NetPluginLoader, OurPluginExportsEveryVersion) {
  std::string path = std::string(MK_BUILD_DIR) + "/plugin/libnccl-net-mkernel.so";
  if (access(path.c_str(), R_OK) != 0) GTEST_SKIP() << path << " not built";
  // The plugin reads these when it is loaded (it has its own parameter cache).
  struct Env {
    Env() { setenv("NCCL_SOCKET_IFNAME", "lo", 1), setenv("MKERNEL_NET", "socket", 1); }
    ~Env() { unsetenv("NCCL_SOCKET_IFNAME"), unsetenv("MKERNEL_NET"); }
  } env;
  for (int v = 8; v <= 11; v++) {
    std::unique_ptr<mk::Net> net;
    ASSERT_EQ(mk::netLoadPluginVersion(path.c_str(), v, &net), ncclSuccess)
        << "v" << v << ": " << mk::lastError();
    EXPECT_NE(std::string(net->name()).find("/v" + std::to_string(v)), std::string::npos)
        << net->name();
    int ndev = 0;
    EXPECT_EQ(net->devices(&ndev), ncclSuccess);
    EXPECT_GE(ndev, 1);
  }
  std::unique_ptr<mk::Net> newest;
  ASSERT_EQ(mk::netLoadPlugin(path.c_str(), &newest), ncclSuccess);
  EXPECT_NE(std::string(newest->name()).find("/v11"), std::string::npos) << newest->name();
}
