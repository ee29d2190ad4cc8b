// mkernel's own version; the NCCL API version is the one of the nccl.h it is built against.
#pragma once
#include <nccl.h>

#define MKERNEL_MAJOR 0
#define MKERNEL_MINOR 1
#define MKERNEL_PATCH 0
#define MKERNEL_VERSION_STRING "0.1.0"
