/* A C program built against an installed mkernel (find_package or pkg-config). It checks
   that the headers and the library it links and loads belong together and come from the
   install prefix. Usage: mk_consumer <expected library folder> */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mkernel/nccl_extra.h>
#include <mkernel/version.h>
#include <nccl.h>

#if defined(__has_include)
#if __has_include(<mkernel/fused.h>)
#include <mkernel/fused.h>
#define MK_HAVE_FUSED 1
#endif
#endif

#ifndef MK_PACKAGE_VERSION
#error "MK_PACKAGE_VERSION (the version the package manager reports) must be defined"
#endif

static int failures = 0;
#define EXPECT(cond, ...)                  \
  do {                                     \
    if (!(cond)) {                         \
      fprintf(stderr, "FAIL %s: ", #cond); \
      fprintf(stderr, __VA_ARGS__);        \
      fprintf(stderr, "\n");               \
      failures++;                          \
    }                                      \
  } while (0)

/* The library that really provides ncclGetVersion at run time must be the installed one,
   not a build tree or a system libnccl. */
static void checkLoadedFrom(const char* libdir) {
  Dl_info info;
  char want[PATH_MAX], got[PATH_MAX];
  if (!dladdr((void*)&ncclGetVersion, &info) || !info.dli_fname) {
    EXPECT(0, "dladdr(ncclGetVersion) failed");
    return;
  }
  EXPECT(realpath(libdir, want) != NULL, "realpath(%s)", libdir);
  EXPECT(realpath(info.dli_fname, got) != NULL, "realpath(%s)", info.dli_fname);
  size_t n = strlen(want);
  EXPECT(strncmp(got, want, n) == 0 && got[n] == '/', "ncclGetVersion comes from %s, not from %s",
         got, want);
  EXPECT(strstr(got, "libmkernel.so") != NULL, "ncclGetVersion comes from %s", got);
  printf("ncclGetVersion from %s\n", got);
}

#ifdef MK_HAVE_FUSED
/* The fused entry points link from C, the config initializer compiles as C, and a refused
   call (checked before any CUDA call, so no GPU is needed) says ncclInvalidArgument. */
static void checkFused(void) {
  ncclResult_t (*const fns[])(const void*, const void*, void*, size_t, size_t, size_t,
                              ncclDataType_t, const ncclFusedConfig_t*, ncclComm_t,
                              cudaStream_t) = {ncclGemmAllReduce, pncclGemmAllReduce,
                                               ncclGemmReduceScatter, pncclGemmReduceScatter};
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) EXPECT(fns[i] != NULL, "entry %zu", i);
  ncclResult_t (*volatile allGather)(const void*, const void*, void*, void*, size_t, size_t, size_t,
                                     ncclDataType_t, const ncclFusedConfig_t*, ncclComm_t,
                                     cudaStream_t) = ncclAllGatherGemm;
  EXPECT(allGather != NULL, "ncclAllGatherGemm");
  allGather = pncclAllGatherGemm;
  EXPECT(allGather != NULL, "pncclAllGatherGemm");
  ncclFusedConfig_t cfg = NCCL_FUSED_CONFIG_INITIALIZER;
  EXPECT(cfg.size == sizeof(ncclFusedConfig_t), "config initializer size %zu", cfg.size);
  /* No GPU needed: without a communicator (and with M = N = K = 0) the calls are refused
     before any CUDA call. */
  ncclResult_t rc = ncclGemmAllReduce(NULL, NULL, NULL, 0, 0, 0, ncclBfloat16, &cfg, NULL, NULL);
  EXPECT(rc == ncclInvalidArgument, "ncclGemmAllReduce(comm NULL) returned %d", (int)rc);
  const char* msg = ncclGetLastError(NULL);
  EXPECT(msg != NULL && msg[0] != '\0', "no message for the refused fused call");
  rc = ncclGemmReduceScatter(NULL, NULL, NULL, 0, 0, 0, ncclFloat16, NULL, NULL, NULL);
  EXPECT(rc == ncclInvalidArgument, "ncclGemmReduceScatter(comm NULL) returned %d", (int)rc);
  rc = allGather(NULL, NULL, NULL, NULL, 0, 0, 0, ncclBfloat16, NULL, NULL, NULL);
  EXPECT(rc == ncclInvalidArgument, "pncclAllGatherGemm(comm NULL) returned %d", (int)rc);
  printf("fused API: entry points linked, invalid calls refused\n");
}
#endif

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <expected library folder>\n", argv[0]);
    return 2;
  }
  checkLoadedFrom(argv[1]);

  int version = -1;
  ncclResult_t rc = ncclGetVersion(&version);
  EXPECT(rc == ncclSuccess, "ncclGetVersion returned %d", (int)rc);
  EXPECT(version == NCCL_VERSION_CODE, "library built for NCCL %d, header says %d", version,
         NCCL_VERSION_CODE);
  rc = ncclGetVersion(NULL);
  EXPECT(rc == ncclInvalidArgument, "ncclGetVersion(NULL) returned %d", (int)rc);
  const char* msg = ncclGetLastError(NULL);
  EXPECT(msg != NULL && msg[0] != '\0', "no last-error message after an invalid argument");
  EXPECT(strcmp(MKERNEL_VERSION_STRING, MK_PACKAGE_VERSION) == 0,
         "mkernel/version.h says %s, the package says %s", MKERNEL_VERSION_STRING,
         MK_PACKAGE_VERSION);
  /* An mkernel-only spelling from nccl_extra.h links too. */
  rc = ncclAllToAll(NULL, NULL, 1, ncclFloat, NULL, NULL);
  EXPECT(rc != ncclSuccess, "ncclAllToAll on a NULL comm succeeded");

#ifdef MK_HAVE_FUSED
  checkFused();
#else
  printf("note: <mkernel/fused.h> is not installed yet; fused-API checks skipped\n");
#endif

  printf("NCCL_VERSION_CODE %d, mkernel %s: %s\n", version, MKERNEL_VERSION_STRING,
         failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
