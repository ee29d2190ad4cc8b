// Environment parameters, declared once in base/params.def.
#pragma once
#include <cstdint>

namespace mk {

enum class ParamId : int {
#define MK_PARAM(id, type, env, def, lo, hi, doc) id,
#include "base/params.def"
#undef MK_PARAM
  kCount
};

struct ParamInfo {
  const char* env;
  const char* type;  // "INT" or "STR"
  const char* defaultValue;
  int64_t min, max;  // INT: the accepted range, bounds included
  const char* meaning;
};

const ParamInfo& paramInfo(ParamId id);
// Value from the environment (logged at INFO the first time it is read when set), else the
// default. An INT is a decimal or 0x-hexadecimal number, blanks around it allowed: text that
// is not one falls back to the default, a number outside [min, max] (overflow included) is
// clamped to the nearer bound; both with a warning naming the variable and the value used.
int64_t paramInt(ParamId id);
const char* paramStr(ParamId id);  // never null; "" when unset and no default
// Forget cached values (tests that change the environment).
void paramReset();

// Saturating arithmetic for deadlines and budgets derived from parameters: "now + timeout"
// must not wrap into the past (a deadline that expired before it began) or the future.
inline int64_t saturatingAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? INT64_MAX : INT64_MIN;
  return r;
}
inline int64_t saturatingMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return (a > 0) == (b > 0) ? INT64_MAX : INT64_MIN;
  return r;
}

}  // namespace mk

#define MK_PARAM_INT(id) ::mk::paramInt(::mk::ParamId::id)
#define MK_PARAM_STR(id) ::mk::paramStr(::mk::ParamId::id)
