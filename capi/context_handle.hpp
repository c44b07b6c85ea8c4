// The opaque swiftkv_ctx handle of the ABI: the core's Context behind the C name. Every capi/
// file that takes a context includes this one definition.
#pragma once

#include <utility>

#include "core/context/context.hpp"
#include "swiftkv/swiftkv.h"

struct swiftkv_ctx {
  explicit swiftkv_ctx(swiftkv::ContextConfig c) : core(std::move(c)) {}
  swiftkv::Context core;
};
