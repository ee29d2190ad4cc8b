// Peer memory across processes that share GPU 0: workspaces imported from POSIX fds passed
// over Unix sockets, registered cudaMalloc (CUDA IPC) and ncclMemAlloc (fd) buffers, mixed
// thread+process layouts, virtual nodes, and 100 init/fini cycles with the fd count back to
// its baseline. The ranks run in child processes started with exec (fresh CUDA state:
// fork after CUDA initialisation is not allowed); each child is this binary running only
// PeerMemChild.Run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace pmtest {  // test_peer_mem_util.cc
std::string runChildren(const std::string& mode, int nProcs, int ranksPerProc, int emulateNodes,
                        const std::vector<std::string>& extraEnv);
std::string childMain(const char* spec);
}  // namespace pmtest

namespace {

TEST(PeerMemChild, Run) {
  const char* spec = getenv("MKTEST_PM_CHILD");
  if (!spec) GTEST_SKIP() << "helper of the PeerMemProcs tests (runs only in their children)";
  EXPECT_EQ(pmtest::childMain(spec), "");
}

TEST(PeerMemProcs, Workspace2Procs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("ws", 2, 1, 0, {}), "");
}

TEST(PeerMemProcs, Workspace4Procs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("ws", 4, 1, 0, {}), "");
}

// 2 processes x 2 threads: pointers shared inside a process, fds across.
TEST(PeerMemProcs, WorkspaceMixedThreadsAndProcs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("ws", 2, 2, 0, {}), "");
}

// 4 processes in 2 virtual nodes: only the 2 processes of a node exchange fds.
TEST(PeerMemProcs, WorkspaceVirtualNodes) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("ws", 4, 1, 2, {}), "");
}

TEST(PeerMemProcs, RegisterAndLookup2Procs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("reg", 2, 1, 0, {}), "");
}

TEST(PeerMemProcs, RegisterAndLookup4Procs) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("reg", 4, 1, 0, {}), "");
}

TEST(PeerMemProcs, RegisterAndLookupMixed) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("reg", 2, 2, 0, {}), "");
}

// One process asks for a different MKERNEL_WORKSPACE_BYTES: init fails on every rank
// (agreed through the allgather), with nothing left open.
TEST(PeerMemProcs, MismatchedWorkspaceFailsEverywhere) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("mismatch", 2, 2, 0, {}), "");
}

TEST(PeerMemProcs, HundredInitFiniNoFdLeak) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("cycles", 2, 1, 0, {"MKERNEL_WORKSPACE_BYTES=2097152"}), "");
}

TEST(PeerMemProcs, HundredInitFiniNoFdLeakMixed) {
  MKTEST_REQUIRE_GPU();
  EXPECT_EQ(pmtest::runChildren("cycles", 2, 2, 0, {"MKERNEL_WORKSPACE_BYTES=2097152"}), "");
}

}  // namespace
