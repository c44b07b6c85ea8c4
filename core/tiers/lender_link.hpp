// A lender as the borrower's peer tier sees it: an elastic region in this process, or one in
// another process reached through the coordinator. Both keep the same lease rules: a lease is
// read only while valid(), renewed until given back, and released once nothing reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/elastic/elastic_region.hpp"
#include "core/geometry/model_geometry.hpp"
#include "core/transport/ucx_transport.hpp"

namespace swiftkv {

// A lease as the borrower uses it: `chunks` borrower chunks from `data`, one after another. A
// remote lease (another node's memory, reached over UCX) is not mapped here: `data` is null and
// its bytes move through LenderLink::transfer, at the same offsets.
struct LeaseGrant {
  uint64_t lease_id = 0;
  std::byte *data = nullptr;
  int32_t device = -1;  // -1: host memory
  uint64_t chunks = 0;
  bool remote = false;
};

struct LinkLeaseState {
  bool reclaim = false;      // the lender asked for it back: evacuate, then release
  bool lost = false;         // expired or gone: its bytes may already be the lender's again
  uint64_t renew_at_ns = 0;  // on the link's clock: when the lease next needs renewing
};

// Thread-safe: every call may come from any thread.
class LenderLink {
 public:
  virtual ~LenderLink() = default;
  // EINVAL when the lender's lent memory does not lay chunks out as `sizes` does.
  virtual void check_geometry(const GeometrySizes &sizes) const = 0;
  // A new lease of up to max_units lending units. ENOMEM when nothing is free.
  virtual LeaseGrant lend(uint64_t max_units) = 0;
  // Keeps the lease alive (in-process: renews now; remote: the heartbeat does) and reports it.
  virtual LinkLeaseState renew(uint64_t lease_id) = 0;
  // renew() for several leases of this lender at once (one lock on its side).
  virtual std::vector<LinkLeaseState> renew_many(std::span<const uint64_t> lease_ids);
  // The clock renew_at_ns is on.
  virtual uint64_t clock_now() const = 0;
  // Equal for two links to the same lender, so that a borrower keeps one link per lender.
  virtual const void *identity() const noexcept = 0;
  // Asks to have `wake` called (with the lender's locks held: it must only signal) whenever a
  // lease of this lender is asked back or ended; until the link is destroyed. A remote lender
  // is watched by the coordinator instead.
  virtual void watch_reclaims(std::function<void()> /*wake*/) {}
  // Whether the lease's bytes are still the borrower's: held, within its lease, lender alive.
  virtual bool valid(uint64_t lease_id) const noexcept = 0;
  // Gives the lease back; nothing reads or writes it any more.
  virtual void release(uint64_t lease_id) noexcept = 0;
  // Moves bytes of remote leases of this lender: every op (a get or put at an offset of the
  // lease its `range` names, by lease id) as one batch, one wait. EINVAL: an op outside its
  // lease, or an unknown lease; EPEER / ETIMEDOUT: the lender failed or stopped answering, and
  // none of the batch's bytes may be trusted. EINTERNAL for a lender mapped here.
  virtual void transfer(std::span<const transport::RangeOp> ops);
  // For messages: which lender this is.
  virtual std::string describe() const = 0;
};

// The lender is an elastic region of this process.
std::shared_ptr<LenderLink> local_lender(std::shared_ptr<ElasticRegion> region);

}  // namespace swiftkv
