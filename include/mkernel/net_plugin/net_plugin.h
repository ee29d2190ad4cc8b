// NCCL net-plugin ABI v8..v11, as loaded by src/transport/net_plugin.cc and exported
// by plugin/ (libnccl-net-mkernel.so). A plugin exports `ncclNetPlugin_vN` symbols of
// type ncclNet_vN_t; the loader tries the newest first.
#pragma once
#include "mkernel/net_plugin/net_common.h"
#include "mkernel/net_plugin/net_v10.h"
#include "mkernel/net_plugin/net_v11.h"
#include "mkernel/net_plugin/net_v8.h"
#include "mkernel/net_plugin/net_v9.h"
