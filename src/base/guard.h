// Exception barrier: keeps C++ exceptions (std::bad_alloc, std::system_error from
// std::thread) from crossing the C ABI. fn runs inside a try block; an exception becomes
// ncclSystemError (ncclInternalError for a non-std one) plus a warning naming `api`.
// In base so that any layer that runs code on behalf of an exported call (e.g. the
// collectives' group launch) can guard it without including the API layer.
#pragma once
#include <exception>
#include <new>
#include <nccl.h>

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
