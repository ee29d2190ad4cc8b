# External dependencies. libibverbs is only needed for its headers: it is dlopen'd
# at runtime so that the library loads on machines without rdma-core.

# nccl.h: NCCL_HOME first, then the CUDA include folder.
find_path(MK_NCCL_INCLUDE_DIR nccl.h
  HINTS $ENV{NCCL_HOME}/include ${NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS}
  NO_DEFAULT_PATH)
find_path(MK_NCCL_INCLUDE_DIR nccl.h)
if(NOT MK_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "nccl.h not found: set NCCL_HOME to an NCCL install, or put nccl.h in the CUDA include folder (${CUDAToolkit_INCLUDE_DIRS})")
endif()
file(STRINGS ${MK_NCCL_INCLUDE_DIR}/nccl.h MK_NCCL_VERSION_LINE REGEX "^#define NCCL_VERSION_CODE")
message(STATUS "nccl.h: ${MK_NCCL_INCLUDE_DIR} (${MK_NCCL_VERSION_LINE})")

find_path(MK_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
if(NOT MK_IBVERBS_INCLUDE_DIR)
  message(FATAL_ERROR "infiniband/verbs.h not found: install rdma-core headers (apt-get install libibverbs-dev)")
endif()

find_path(MK_HWLOC_INCLUDE_DIR hwloc.h)
find_library(MK_HWLOC_LIBRARY hwloc)
if(NOT MK_HWLOC_INCLUDE_DIR OR NOT MK_HWLOC_LIBRARY)
  message(FATAL_ERROR "hwloc not found: apt-get install libhwloc-dev")
endif()

find_package(Threads REQUIRED)
if(MK_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
