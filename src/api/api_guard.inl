#pragma once
#include <exception>
#include <new>

#include "base/debug.h"

namespace mk {
template <typename F>
ncclResult_t apiGuard(const char* api, F&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    MK_WARN("%s: out of host memory", api);
    return ncclSystemError;
  } catch (const std::exception& e) {
    MK_WARN("%s: %s", api, e.what());
    return ncclSystemError;
  } catch (...) {
    MK_WARN("%s: unknown exception", api);
    return ncclInternalError;
  }
}
}  // namespace mk
