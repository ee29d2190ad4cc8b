// Environment parameters, declared once in base/params.def.
#pragma once
#include <cstdint>

namespace mk {

enum class ParamId : int {
#define MK_PARAM(id, type, env, def, doc) id,
#include "base/params.def"
#undef MK_PARAM
  kCount
};

struct ParamInfo {
  const char* env;
  const char* type;  // "INT" or "STR"
  const char* defaultValue;
  const char* meaning;
};

const ParamInfo& paramInfo(ParamId id);
// Value from the environment (logged at INFO the first time it is read when set),
// else the default. Integer parse errors fall back to the default with a warning.
int64_t paramInt(ParamId id);
const char* paramStr(ParamId id);  // never null; "" when unset and no default
// Forget cached values (tests that change the environment).
void paramReset();

}  // namespace mk

#define MK_PARAM_INT(id) ::mk::paramInt(::mk::ParamId::id)
#define MK_PARAM_STR(id) ::mk::paramStr(::mk::ParamId::id)
