// The opaque swiftkv_elastic handle: the region and what it took from its context. A borrower in
// the same process may hold the region too (swiftkv_borrow), so the region is shared; ending the
// handle ends every lease, and the memory goes once the last holder lets go.
#pragma once

#include <cstdint>
#include <memory>

#include "capi/capi_guard.hpp"
#include "capi/fork_generation.hpp"
#include "core/context/context.hpp"
#include "core/coord/coordinator.hpp"
#include "core/elastic/elastic_region.hpp"

struct swiftkv_elastic {
  swiftkv::Context *ctx = nullptr;
  swiftkv::coord::Coordinator *coord = nullptr;  // the context's
  uint64_t host_reserved = 0;
  std::shared_ptr<swiftkv::ElasticRegion> region;
  const swiftkv::capi::ProcessOwner owner = swiftkv::capi::this_process();

  ~swiftkv_elastic() {
    if (region) coord->withdraw(region.get());
    if (region) region->end_all_leases();
    region.reset();  // the memory first (unless a borrower still maps it), then its budget
    if (host_reserved != 0) ctx->release_host(host_reserved);
  }
};

namespace swiftkv::capi {

// The check every entry point makes of a region: EINVAL if NULL, ESTATE in a fork of the process
// that made it.
inline void require(const swiftkv_elastic *e, const char *arg) {
  require(static_cast<const void *>(e), arg);
  if (!owned_here(e->owner)) fail_forked(e->owner, arg);
}

}  // namespace swiftkv::capi
