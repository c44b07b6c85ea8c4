// The library's defaults as the core's option structs start from them: read from the public
// header's *_INIT macros, the one place each default is written (the C API and every binding
// take theirs from the same macros through swiftkv_<struct>_init). Changing a default is one
// edit in swiftkv.h.
#pragma once

#include <cstdint>

#include "swiftkv/swiftkv.h"

namespace swiftkv::defaults {

inline constexpr swiftkv_ctx_config kCtx = SWIFTKV_CTX_CONFIG_INIT;
inline constexpr swiftkv_model_desc kModel = SWIFTKV_MODEL_DESC_INIT;
inline constexpr swiftkv_elastic_config kElastic = SWIFTKV_ELASTIC_CONFIG_INIT;

inline constexpr uint64_t ns_of_ms(uint64_t ms) { return ms * 1'000'000; }

}  // namespace swiftkv::defaults
