# External dependencies. libibverbs is only needed for its headers: it is dlopen'd
# at runtime so that the library loads on machines without rdma-core.

# nccl.h: the shim exports every host function of the header it is built against, and the
# code uses declarations that appeared in NCCL 2.28.9 (the device-API handle types). The
# first header found at that version or newer wins, in this order: NCCL_HOME, the CUDA
# include folder, PyTorch's nvidia-nccl package (what a preloaded torch really loads),
# then the system folders. An older header (Ubuntu's libnccl-dev 2.28.3, say) is skipped
# with a message, so a machine that has both builds against the right one.
set(MK_NCCL_MIN_VERSION 22809)
set(_mk_nccl_candidates $ENV{NCCL_HOME}/include ${NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})
find_program(MK_PYTHON3 NAMES python3 python)
if(MK_PYTHON3)
  execute_process(
    COMMAND ${MK_PYTHON3} -c "import importlib.util as u; s=u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s else '')"
    OUTPUT_VARIABLE _mk_py_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET TIMEOUT 30)
  if(_mk_py_nccl)
    list(APPEND _mk_nccl_candidates ${_mk_py_nccl}/include)
  endif()
endif()
list(APPEND _mk_nccl_candidates /usr/local/include /usr/include)
set(_mk_nccl_seen "")
unset(MK_NCCL_INCLUDE_DIR)
unset(MK_NCCL_INCLUDE_DIR CACHE)
foreach(dir ${_mk_nccl_candidates})
  if(NOT dir OR NOT EXISTS ${dir}/nccl.h)
    continue()
  endif()
  file(STRINGS ${dir}/nccl.h _mk_code REGEX "^#define NCCL_VERSION_CODE")
  string(REGEX MATCH "[0-9]+" _mk_code "${_mk_code}")
  if(NOT _mk_code)
    set(_mk_code 0)
  endif()
  if(_mk_code GREATER_EQUAL MK_NCCL_MIN_VERSION AND EXISTS ${dir}/nccl_device.h)
    set(MK_NCCL_INCLUDE_DIR ${dir})
    set(MK_NCCL_VERSION_CODE ${_mk_code})
    break()
  endif()
  list(APPEND _mk_nccl_seen "${dir}/nccl.h (NCCL_VERSION_CODE ${_mk_code})")
  message(STATUS "nccl.h: skipping ${dir}/nccl.h (version code ${_mk_code}, need >= ${MK_NCCL_MIN_VERSION} with nccl_device.h)")
endforeach()
if(NOT MK_NCCL_INCLUDE_DIR)
  string(REPLACE ";" ", " _mk_nccl_seen "${_mk_nccl_seen}")
  message(FATAL_ERROR "mkernel needs nccl.h and nccl_device.h of NCCL 2.28.9 or newer "
    "(NCCL_VERSION_CODE >= ${MK_NCCL_MIN_VERSION}). Found only: ${_mk_nccl_seen}. "
    "Set NCCL_HOME to an NCCL install (its include/ folder), put the headers in the CUDA "
    "include folder, or install PyTorch's nvidia-nccl package (pip install nvidia-nccl-cu13), "
    "whose include/ folder is found automatically.")
endif()
message(STATUS "nccl.h: ${MK_NCCL_INCLUDE_DIR} (NCCL_VERSION_CODE ${MK_NCCL_VERSION_CODE})")

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
