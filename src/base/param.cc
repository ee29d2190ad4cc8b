#include "base/param.h"

#include <cstdint>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

#include "base/debug.h"

namespace mk {
namespace {

const ParamInfo kTable[] = {
#define MK_PARAM(id, type, env, def, doc) {env, #type, def, doc},
#include "base/params.def"
#undef MK_PARAM
};
constexpr int kN = static_cast<int>(ParamId::kCount);

struct Cache {
  std::mutex mu;
  bool loaded[kN] = {};
  int64_t ival[kN] = {};
  std::string sval[kN];
};
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

void loadLocked(Cache& c, int i) {
  if (c.loaded[i]) return;
  const ParamInfo& p = kTable[i];
  const char* env = getenv(p.env);
  c.sval[i] = env ? env : p.defaultValue;
  char* end = nullptr;
  errno = 0;
  c.ival[i] = strtoll(p.defaultValue, nullptr, 0);
  if (env) {
    if (std::string(p.type) == "INT") {
      long long v = strtoll(env, &end, 0);
      if (errno != 0 || end == env || *end != '\0') {
        MK_WARN("Invalid value '%s' for %s, using default %s", env, p.env, p.defaultValue);
        c.sval[i] = p.defaultValue;
      } else {
        c.ival[i] = v;
      }
    }
    MK_INFO(kEnv, "%s set by environment to %s", p.env, env);
  }
  c.loaded[i] = true;
}

}  // namespace

const ParamInfo& paramInfo(ParamId id) {
  return kTable[static_cast<int>(id)];
}

int64_t paramInt(ParamId id) {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  loadLocked(c, static_cast<int>(id));
  return c.ival[static_cast<int>(id)];
}

const char* paramStr(ParamId id) {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  loadLocked(c, static_cast<int>(id));
  return c.sval[static_cast<int>(id)].c_str();  // stable until paramReset()
}

void paramReset() {
  Cache& c = cache();
  std::lock_guard<std::mutex> g(c.mu);
  for (int i = 0; i < kN; i++) c.loaded[i] = false;
}

}  // namespace mk
