#include "base/param.h"

#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "base/debug.h"

namespace mk {
namespace {

const ParamInfo kTable[] = {
#define MK_PARAM(id, type, env, def, lo, hi, doc) {env, #type, def, lo, hi, doc},
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

enum class Parse { kOk, kNotANumber, kTooSmall, kTooLarge };

// Decimal, or hexadecimal with 0x; blanks around it are allowed. Not strtoll's base 0: a
// leading zero would silently make "010" octal 8. Overflow is reported as out of range (its
// sign is known), so the caller clamps instead of falling back to the default.
Parse parseInt(const char* s, int64_t* out) {
  while (isspace((unsigned char)*s)) s++;
  const char* p = s;
  if (*p == '+' || *p == '-') p++;
  int base = 10;
  if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) base = 16;
  // strtoll would take "0x" alone as 0, or skip blanks after a sign.
  if (!(base == 16 ? isxdigit((unsigned char)p[2]) : isdigit((unsigned char)*p)))
    return Parse::kNotANumber;
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(s, &end, base);
  const char* rest = end;
  while (isspace((unsigned char)*rest)) rest++;
  if (end == s || *rest != '\0') return Parse::kNotANumber;
  if (errno == ERANGE) return v < 0 ? Parse::kTooSmall : Parse::kTooLarge;
  *out = v;
  return Parse::kOk;
}

void loadLocked(Cache& c, int i) {
  if (c.loaded[i]) return;
  const ParamInfo& p = kTable[i];
  const char* env = getenv(p.env);
  c.sval[i] = env ? env : p.defaultValue;
  c.ival[i] = strtoll(p.defaultValue, nullptr, 10);
  if (env) MK_INFO(kEnv, "%s set by environment to %s", p.env, env);
  if (env && strcmp(p.type, "INT") == 0) {
    int64_t v = 0;
    Parse r = parseInt(env, &v);
    if (r == Parse::kOk && v < p.min) r = Parse::kTooSmall;
    if (r == Parse::kOk && v > p.max) r = Parse::kTooLarge;
    if (r == Parse::kNotANumber) {
      MK_WARN("Invalid value '%s' for %s (not an integer), using the default %s", env, p.env,
              p.defaultValue);
    } else if (r != Parse::kOk) {
      v = r == Parse::kTooSmall ? p.min : p.max;
      MK_WARN("%s=%s is out of range [%" PRId64 ", %" PRId64 "], using %" PRId64, p.env, env, p.min,
              p.max, v);
    }
    if (r != Parse::kNotANumber) c.ival[i] = v;
    c.sval[i] = std::to_string(c.ival[i]);
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
