#include "comm/comm_dev.h"

#include <cstdint>

#include "base/param.h"

namespace mk {

uint64_t devTimeoutNs() {
  int64_t ms = MK_PARAM_INT(TimeoutMs);
  if (ms <= 0 || ms > (int64_t)1e12) return ~0ull >> 1;  // no overflow in clock arithmetic
  return (uint64_t)ms * 1000000ull;
}

}  // namespace mk
