// What every engine's and operator's host-side check (canImplement, *Check) shares: the
// refusal with a reason, and the alignment rule of TMA operands.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace mk {

// Returns false and, when `why` is not null, the message (printf format, up to two integer
// arguments). `why` names the rule; the caller decides how to log it.
inline bool refuse(std::string* why, const char* fmt, long long a = 0, long long b = 0) {
  if (why != nullptr) {
    char buf[256];
    snprintf(buf, sizeof(buf), fmt, a, b);
    *why = buf;
  }
  return false;
}

// TMA bases (and bulk copies) need 16-byte aligned addresses.
inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// [a, a+na) and [b, b+nb) share a byte (empty or null ranges share none). Written with
// differences: the sum a + na of a high address and a size near 2^64 would wrap around.
inline bool overlaps(const void* a, uint64_t na, const void* b, uint64_t nb) {
  if (a == nullptr || b == nullptr || na == 0 || nb == 0) return false;
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x >= y ? x - y < nb : y - x < na;
}

}  // namespace mk
