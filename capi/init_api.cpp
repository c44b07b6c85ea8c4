// swiftkv_<struct>_init: each versioned struct's INIT macro as a function, so that bindings in
// languages that cannot expand C macros take their defaults from the library, the one owner of
// them, instead of copying the numbers.
#include "swiftkv/swiftkv.h"

// A NULL out is nothing to fill: these functions have no status to report it with.
#define SWIFTKV_DEFINE_INIT(TYPE, MACRO)    \
  SWIFTKV_API void TYPE##_init(TYPE *out) { \
    if (out != nullptr) *out = TYPE MACRO;  \
  }

SWIFTKV_DEFINE_INIT(swiftkv_model_desc, SWIFTKV_MODEL_DESC_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_capacity_plan, SWIFTKV_CAPACITY_PLAN_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_ctx_config, SWIFTKV_CTX_CONFIG_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_elastic_config, SWIFTKV_ELASTIC_CONFIG_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_layer_view, SWIFTKV_LAYER_VIEW_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_lease, SWIFTKV_LEASE_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_elastic_stats, SWIFTKV_ELASTIC_STATS_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_model_config, SWIFTKV_MODEL_CONFIG_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_lookup_result, SWIFTKV_LOOKUP_RESULT_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_stats, SWIFTKV_STATS_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_codec_params, SWIFTKV_CODEC_PARAMS_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_compression_config, SWIFTKV_COMPRESSION_CONFIG_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_compression_method, SWIFTKV_COMPRESSION_METHOD_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_codec_stats, SWIFTKV_CODEC_STATS_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_coord_stats, SWIFTKV_COORD_STATS_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_pool_desc, SWIFTKV_POOL_DESC_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_request_desc, SWIFTKV_REQUEST_DESC_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_request_info, SWIFTKV_REQUEST_INFO_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_attention_desc, SWIFTKV_ATTENTION_DESC_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_attention_plan, SWIFTKV_ATTENTION_PLAN_INIT)
SWIFTKV_DEFINE_INIT(swiftkv_attention_args, SWIFTKV_ATTENTION_ARGS_INIT)
