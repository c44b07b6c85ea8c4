// The opaque swiftkv_ctx handle of the ABI: the core's Context, the chunk cache built on it and
// the table of registered models. Every capi/ file that takes a context includes this one
// definition.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "capi/capi_guard.hpp"
#include "capi/fork_generation.hpp"
#include "core/connector/request.hpp"
#include "core/context/context.hpp"
#include "core/coord/coordinator.hpp"
#include "core/geometry/model_geometry.hpp"
#include "core/index/chunk_key.hpp"
#include "core/tiers/chunk_cache.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv::capi {

struct RegisteredModel {
  std::string name;
  ModelGeometry geometry;
  GeometrySizes sizes;
  ChunkKey fingerprint;
  swiftkv_role role;
};

struct RegisteredPool {
  std::shared_ptr<const KvPool> pool;
  uint32_t model;
  ChunkKey fingerprint;
};

// Transfer threads of a context's CPU executor when the config leaves it to the library: one
// less than the cores (an engine computes beside the copies), at least 1, at most 2.
inline unsigned default_transfer_threads() noexcept {
  const unsigned cores = std::thread::hardware_concurrency();
  return cores <= 2 ? 1u : 2u;
}

}  // namespace swiftkv::capi

// The background threads stop first: the cache's (its event callback reads the models) and the
// coordinator's (it calls into the cache). Then members are destroyed in reverse: open requests
// (each waits for its copies), pools, the executor, the models, the cache (remote leases are lost
// with the coordinator), the coordinator's sockets, then the context whose budget the cache's
// memory came from.
struct swiftkv_ctx {
  swiftkv_ctx(swiftkv::ContextConfig c, swiftkv::CacheOptions o, swiftkv::coord::CoordOptions co,
              unsigned transfer_threads)
      : core(std::move(c)),
        attention_table(o.cost.attention_table),
        coord(std::move(co)),
        cache(core, std::move(o)),
        executor(transfer_threads != 0 ? transfer_threads
                                       : swiftkv::capi::default_transfer_threads()) {}
  ~swiftkv_ctx() {
    cache.stop_thread();
    coord.shutdown();
  }
  swiftkv::Context core;
  const std::vector<double> attention_table;  // what get_config hands back
  swiftkv::coord::Coordinator coord;
  swiftkv::ChunkCache cache;
  const swiftkv::capi::ProcessOwner owner = swiftkv::capi::this_process();
  swiftkv_clock_fn clock = nullptr;  // what get_config hands back
  void *clock_user_data = nullptr;

  mutable std::shared_mutex models_mu;  // guards models and next_model
  std::unordered_map<uint32_t, swiftkv::capi::RegisteredModel> models;
  uint32_t next_model = 0;

  swiftkv::CpuExecutor executor;
  mutable std::mutex io_mu;  // guards pools, requests and their id counters
  std::unordered_map<uint32_t, swiftkv::capi::RegisteredPool> pools;
  uint32_t next_pool = 0;
  std::unordered_map<uint64_t, std::shared_ptr<swiftkv::Request>> requests;
  uint64_t next_request = 1;
  uint64_t requests_beginning = 0;    // requests being built by swiftkv_request_begin
  uint32_t max_open_requests = 4096;  // bounds requests plus requests_beginning
  uint32_t write_back_on_close = 1;   // swiftkv_ctx_destroy moves host and peer chunks to disk

  // Ends every open request (each waits for its copies in flight and gives back what it held).
  void finish_requests() {
    std::unordered_map<uint64_t, std::shared_ptr<swiftkv::Request>> open;
    {
      std::lock_guard lock(io_mu);
      open.swap(requests);
    }
    open.clear();
  }
};

namespace swiftkv::capi {

// The check every entry point makes of its context: EINVAL if NULL, ESTATE in a fork of the
// process that made it.
inline void require(const swiftkv_ctx *ctx, const char *arg) {
  require(static_cast<const void *>(ctx), arg);
  if (!owned_here(ctx->owner)) fail_forked(ctx->owner, arg);
}

}  // namespace swiftkv::capi
