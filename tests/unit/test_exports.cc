// The shim must export every host function of the nccl.h it was built against (as ncclX
// and pncclX), or under LD_PRELOAD a missing symbol would bind to the real libnccl with
// our comm handle. The declared list is parsed from the headers, not written by hand.
#include <vector>
#include <dlfcn.h>
#include <fstream>
#include <gtest/gtest.h>
#include <regex>
#include <set>
#include <string>
#include <cstdio>
#include <dirent.h>

namespace {

std::set<std::string> declaredHostFunctions() {
  std::set<std::string> names;
  std::vector<std::string> files = {MK_NCCL_H};
  std::string devDir = std::string(MK_NCCL_INCLUDE_DIR) + "/nccl_device";
  if (DIR* d = opendir(devDir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 2 && n.substr(n.size() - 2) == ".h") files.push_back(devDir + "/" + n);
    }
    closedir(d);
  }
  // nccl.h: "ncclResult_t  ncclX(" at line start; nccl_device: "NCCL_EXTERN_C __host__ T ncclX(".
  std::regex plain(R"(^\s*(?:const\s+)?[A-Za-z_]\w*\s*\*?\s+p?(nccl\w+)\s*\()");
  std::regex host(R"(__host__\s+[A-Za-z_]\w*\s*\*?\s+(nccl\w+)\s*\()");
  for (auto& f : files) {
    std::ifstream in(f);
    EXPECT_TRUE(in.good()) << f;
    std::string line;
    bool isMain = f == MK_NCCL_H;
    while (std::getline(in, line)) {
      std::smatch m;
      if (isMain && std::regex_search(line, m, plain) &&
          line.find("typedef") == std::string::npos && line.find("#define") == std::string::npos)
        names.insert(m[1]);
      if (std::regex_search(line, m, host)) names.insert(m[1]);
    }
  }
  return names;
}

TEST(Exports, EveryDeclaredHostFunctionIsExported) {
  auto names = declaredHostFunctions();
  ASSERT_GT(names.size(), 40u) << "header parse found too few functions";
  ASSERT_TRUE(names.count("ncclAllReduce"));
  ASSERT_TRUE(names.count("ncclDevCommCreate"));
  void* lib = dlopen(MK_LIB_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  for (auto& n : names) {
    EXPECT_NE(dlsym(lib, n.c_str()), nullptr) << "missing export " << n;
    EXPECT_NE(dlsym(lib, ("p" + n).c_str()), nullptr) << "missing export p" << n;
    // ncclX and pncclX are the same function (weak alias), as in libnccl.
    EXPECT_EQ(dlsym(lib, n.c_str()), dlsym(lib, ("p" + n).c_str())) << n;
  }
  for (const char* extra : {"ncclAllToAll", "ncclAllToAllv", "pncclAllToAll", "pncclAllToAllv"})
    EXPECT_NE(dlsym(lib, extra), nullptr) << extra;
  dlclose(lib);
}

TEST(Exports, NothingElseLeaks) {
  std::string cmd = std::string("nm -D --defined-only ") + MK_LIB_PATH;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  int count = 0;
  while (fgets(buf, sizeof(buf), p)) {
    std::string line(buf);
    std::string sym = line.substr(line.rfind(' ') + 1);
    sym.erase(sym.find_last_not_of("\n") + 1);
    char type = line.size() > 17 ? line[17] : '?';
    if (type != 'T' && type != 'W' && type != 'D' && type != 'B' && type != 'V') continue;
    if (sym.rfind("nccl", 0) == 0 || sym.rfind("pnccl", 0) == 0 || sym.rfind("mkernel", 0) == 0)
      count++;
    else if (sym != "_init" && sym != "_fini")
      ADD_FAILURE() << "unexpected exported symbol " << sym;
  }
  pclose(p);
  EXPECT_GT(count, 80);
}

}  // namespace
