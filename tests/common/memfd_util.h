// memfd helpers for the fd-passing tests (unit and multi-process).
#pragma once
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace mktest {

// A memfd holding `content` (-1 on failure).
inline int makeMemfd(const std::string& content) {
  int fd = memfd_create("mk-ipc-test", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (write(fd, content.data(), content.size()) != (ssize_t)content.size()) {
    close(fd);
    return -1;
  }
  return fd;
}

// Everything readable from fd, from offset 0.
inline std::string readAll(int fd) {
  std::string out;
  char buf[4096];
  off_t off = 0;
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof(buf), off);
    if (n <= 0) break;
    out.append(buf, n);
    off += n;
  }
  return out;
}

}  // namespace mktest
