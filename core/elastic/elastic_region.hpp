// The lender's elastic region (SwiftCache §3.4-3.5): block-major KV memory with an owned part
// [0, owned) and a tail lent to one borrower in lending units (the chunk-form MEU). Resizes move
// the boundary, never data; reclaiming lent memory is a request the borrower must answer.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "core/common/defaults.hpp"
#include "core/elastic/block_layout.hpp"
#include "core/geometry/elastic_scaling.hpp"
#include "core/geometry/model_geometry.hpp"
#include "core/memory/memory_region.hpp"

namespace swiftkv {

struct ElasticConfig {
  ModelGeometry lender;
  std::optional<ModelGeometry> borrower;  // none: nothing is lent and resizes step by 1 block
  uint64_t capacity_blocks = 0;           // a whole number of lending units
  uint64_t owned_blocks = 0;              // initially owned; a whole number of lending units
  uint64_t window_ns = defaults::ns_of_ms(defaults::kElastic.window_ms);  // ScaleDown's window
  // A lease lives this long unless renewed.
  uint64_t lease_ns = defaults::ns_of_ms(defaults::kElastic.lease_ms);
  // Once a lease is asked back, renewals extend it to at most this long after the asking (never
  // shortening what was granted); then it expires as any lease does, held or not.
  uint64_t reclaim_deadline_ns = defaults::ns_of_ms(defaults::kElastic.reclaim_deadline_ms);
  bool keep_committed = false;      // never return free memory to the system
  std::function<uint64_t()> clock;  // monotonic nanoseconds; empty: CLOCK_MONOTONIC
};

// A lease: `units` lending units from `first_unit`, lent to the borrower until `expires_ns`.
struct Lease {
  uint64_t id = 0;
  uint64_t first_unit = 0;
  uint64_t units = 0;
  uint64_t expires_ns = 0;
  bool reclaim_requested = false;
  uint64_t reclaim_by_ns = UINT64_MAX;  // once asked back: the last expiry a renewal may give
};

struct ElasticStats {
  uint64_t capacity_blocks;
  uint64_t owned_blocks;       // Algorithm 1's N_i: ready + reclaiming
  uint64_t ready_blocks;       // the leading blocks the lender may use now
  uint64_t reclaiming_blocks;  // owned, but a borrower still holds them
  uint64_t lent_blocks;        // held by borrowers beyond the owned part
  uint64_t free_blocks;        // neither owned nor lent
  uint64_t unit_lender_blocks;
  uint64_t unit_borrower_chunks;  // 0 without a borrower
  uint64_t leases;
  uint64_t region_bytes;
  uint64_t committed_bytes;
  uint64_t scale_ups, scale_downs, leases_granted, leases_expired, reclaims_requested;
};

// The blocks one resize moved the boundary by, and the same bytes in borrower chunks.
struct ElasticDelta {
  uint64_t lender_blocks = 0;
  uint64_t borrower_chunks = 0;
  bool waiting = false;  // some owned blocks are still held by a borrower being asked back
};

// Lease expiries are kept in deadline order (deadlines_), so expiring, renewing and releasing a
// lease cost O(log n) whatever the number of leases.
//
// Thread-safe: one mutex (mu_) guards every member but the immutable geometry and memory; each
// call holds it for its whole duration, memory commits included. reclaimed_cv_ is signalled
// under it whenever a lease asked back ends.
class ElasticRegion {
 public:
  // Checks the configuration (EINVAL naming the field) and returns the bytes of memory the
  // region needs: capacity_blocks full blocks.
  static uint64_t required_bytes(const ElasticConfig &config);

  // Validates the configuration (EINVAL naming the field) and commits the owned part.
  ElasticRegion(const ElasticConfig &config, std::shared_ptr<MemoryRegion> memory);
  ElasticRegion(const ElasticRegion &) = delete;
  ElasticRegion &operator=(const ElasticRegion &) = delete;

  // Algorithm 1 ScaleUp for a request; records it for ScaleDown. ENOMEM (nothing changed) when
  // the region cannot grow that far.
  ElasticDelta scale_for_request(uint64_t request_tokens);
  // Expires leases, then Algorithm 1 ScaleDown over the window, never below `in_use_blocks`
  // (the engine's high-water mark: 1 + the highest block holding live KV).
  ElasticDelta tick(uint64_t in_use_blocks);
  // Expires leases, then sets the owned part to `owned_blocks` (whole units, at most the
  // capacity): for a lender that decides itself which of its blocks are idle. Growing asks back
  // the leases on the units it takes; shrinking gives the tail's memory up. Records no request
  // for ScaleDown. EINVAL (nothing changed) for a count that is not whole units or past the
  // capacity; ENOMEM (nothing changed) when memory for the growth cannot be committed.
  ElasticDelta resize(uint64_t owned_blocks);

  // Lends up to `max_units` units, the highest free ones, as one contiguous lease.
  Lease lend(uint64_t max_units);
  void renew(uint64_t lease_id);
  // Renews several leases of one borrower under one lock: for each, whether it is still held,
  // whether it is asked back, and its new expiry.
  struct Renewal {
    bool held = false;
    bool reclaim = false;
    uint64_t expires_ns = 0;
  };
  std::vector<Renewal> renew_many(const uint64_t *lease_ids, size_t n);
  void release(uint64_t lease_id);
  // Asks a lease back (kAllLeases: every lease). The borrower answers by release().
  void reclaim(uint64_t lease_id);
  // Ends every lease now, as if each had expired: for a lender that goes away. A borrower's next
  // renew or lookup of them says ETIMEDOUT.
  void end_all_leases();
  static constexpr uint64_t kAllLeases = UINT64_MAX;
  // Called, with the region's lock held, whenever a lease is newly asked back (by a resize or
  // reclaim()), so a coordinator can tell its borrower at once; it must only signal (no call
  // into the region). Empty: none.
  void set_reclaim_listener(std::function<void()> fn);
  // The same for a borrower in this process, of which there may be several: called when a
  // lease is newly asked back and when end_all_leases() ends them. Returns a token for
  // remove_reclaim_watcher.
  uint64_t add_reclaim_watcher(std::function<void()> fn);
  void remove_reclaim_watcher(uint64_t token) noexcept;
  // Waits until no lease is asked back (each asked back by a resize or reclaim() has been
  // released or has expired), at most timeout_ns of real time. True when none is.
  bool wait_reclaims(uint64_t timeout_ns);

  // The queries expire leases first, so they never report a lease past its expiry.
  Lease lease(uint64_t lease_id);  // ETIMEDOUT / ENOTFOUND for a lease that is not held
  std::vector<uint64_t> pending_reclaims();
  ElasticStats stats();

  const ModelGeometry &lender() const noexcept { return lender_; }
  const std::optional<ModelGeometry> &borrower() const noexcept { return borrower_; }
  uint64_t capacity_units() const noexcept { return capacity_units_; }
  uint64_t lease_ns() const noexcept { return lease_ns_; }
  // The region's clock (lease expiries are on it).
  uint64_t clock_now() const { return now(); }
  // The export of [offset, offset + size) of the memory, under the region's lock so that no
  // resize commits or returns memory meanwhile.
  RegionExport export_range(uint64_t offset, uint64_t size) const;
  uint64_t capacity_blocks() const noexcept { return capacity_units_ * unit_blocks_; }
  const GeometrySizes &lender_sizes() const noexcept { return lender_sizes_; }
  const std::optional<GeometrySizes> &borrower_sizes() const noexcept { return borrower_sizes_; }
  uint64_t unit_blocks() const noexcept { return unit_blocks_; }
  uint64_t unit_chunks() const noexcept { return unit_chunks_; }
  uint64_t unit_bytes() const noexcept { return unit_bytes_; }
  uint64_t lease_offset(const Lease &l) const noexcept { return l.first_unit * unit_bytes_; }
  MemoryRegion &memory() const noexcept { return *memory_; }

  // Checks every bookkeeping invariant; throws Error(SWIFTKV_EINTERNAL) naming the first broken.
  void check_invariants() const;

 private:
  enum class UnitState : uint8_t { free, owned, lent, reclaiming };

  // What a configuration implies, derived and checked once.
  struct Layout {
    GeometrySizes lender;
    std::optional<GeometrySizes> borrower;
    uint64_t unit_blocks;
    uint64_t unit_chunks;
    uint64_t bytes;
  };
  static Layout checked_layout(const ElasticConfig &c);
  ElasticRegion(const ElasticConfig &config, const Layout &layout,
                std::shared_ptr<MemoryRegion> memory);
  ScaleStep scale_step_locked() const noexcept;

  uint64_t now() const;
  void expire_leases_locked(uint64_t now);
  void end_lease_locked(std::map<uint64_t, Lease>::iterator it);
  void set_expiry_locked(Lease &l, uint64_t expires_ns);
  void ask_back_locked(Lease &l, uint64_t t);  // marks it asked back, with its deadline
  void renew_locked(Lease &l, uint64_t t);
  void notify_reclaim_locked() const;
  ElasticDelta grow_locked(uint64_t units);
  ElasticDelta shrink_locked(uint64_t units);
  void acquire_memory_locked(uint64_t first_unit, uint64_t units);
  void release_memory_locked(uint64_t first_unit, uint64_t units) noexcept;
  // Calls fn(offset, size) for each run of granules under the units that no unit holds.
  template <class Fn>
  void for_each_unheld_run_locked(uint64_t first_unit, uint64_t units, Fn fn) const;
  void count_granules_locked(uint64_t first_unit, uint64_t units, int32_t delta);
  void add_free_locked(uint64_t first, uint64_t n);
  void remove_free_locked(uint64_t first, uint64_t n);
  uint64_t max_request_in_window_locked(uint64_t now);
  std::map<uint64_t, Lease>::iterator find_lease_locked(uint64_t id, const char *what);
  ElasticDelta delta(uint64_t units, bool waiting) const noexcept;

  const ModelGeometry lender_;
  const std::optional<ModelGeometry> borrower_;
  const GeometrySizes lender_sizes_;
  const std::optional<GeometrySizes> borrower_sizes_;
  const uint64_t unit_blocks_;  // lender blocks per lending unit
  const uint64_t unit_chunks_;  // borrower chunks per lending unit (0 without a borrower)
  const uint64_t unit_bytes_;
  const uint64_t capacity_units_;
  const uint64_t window_ns_;
  const uint64_t lease_ns_;
  const uint64_t reclaim_deadline_ns_;
  const bool keep_committed_;
  const std::function<uint64_t()> clock_;
  const std::shared_ptr<MemoryRegion> memory_;
  const uint64_t granule_;  // memory_->commit_granule(), 0 when memory is fixed

  mutable std::mutex mu_;
  uint64_t owned_units_ = 0;                // the boundary: units below it are the lender's
  std::vector<UnitState> state_;            // per unit
  std::vector<uint64_t> unit_lease_;        // per unit: lease id, 0 when not lent
  std::map<uint64_t, uint64_t> free_runs_;  // first unit -> length, every free unit once
  std::set<uint64_t> reclaiming_;           // units in state reclaiming
  std::map<uint64_t, Lease> leases_;        // by id
  std::set<std::pair<uint64_t, uint64_t>> deadlines_;  // (expires_ns, id) of every lease
  std::set<uint64_t> asked_;                           // leases asked back, by id
  std::deque<uint64_t> expired_ids_;                   // recent expirations, for a precise status
  std::vector<uint32_t> granule_refs_;                 // per granule: units not free that touch it
  std::deque<std::pair<uint64_t, uint64_t>> window_;   // (time, tokens), tokens decreasing
  uint64_t next_lease_id_ = 1;
  std::function<void()> on_reclaim_;
  std::map<uint64_t, std::function<void()>> watchers_;  // by token
  uint64_t next_watcher_ = 1;
  std::condition_variable reclaimed_cv_;
  uint64_t free_units_ = 0, lent_units_ = 0;
  ElasticStats counters_{};
};

}  // namespace swiftkv
