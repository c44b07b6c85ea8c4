// The in-process lender: the region's own lease calls, under its lock.
#include "core/tiers/lender_link.hpp"

#include "core/common/error.hpp"

namespace swiftkv {

namespace {

class LocalLender final : public LenderLink {
 public:
  explicit LocalLender(std::shared_ptr<ElasticRegion> r) : region_(std::move(r)) {}
  ~LocalLender() override {
    if (watcher_ != 0) region_->remove_reclaim_watcher(watcher_);
  }
  LocalLender(const LocalLender &) = delete;
  LocalLender &operator=(const LocalLender &) = delete;

  void check_geometry(const GeometrySizes &sizes) const override {
    const auto &b = region_->borrower_sizes();
    if (!b || b->layer_chunk_bytes != sizes.layer_chunk_bytes ||
        b->full_chunk_bytes != sizes.full_chunk_bytes) {
      fail_invalid(
          "the lender's borrower geometry is not the model's: its lent memory would not "
          "hold this model's chunks; create the region with this model as its borrower");
    }
  }

  LeaseGrant lend(uint64_t max_units) override {
    const Lease l = region_->lend(max_units);
    LeaseGrant g;
    g.lease_id = l.id;
    g.data = region_->memory().data() + region_->lease_offset(l);
    g.device = region_->memory().device();
    g.chunks = l.units * region_->unit_chunks();
    return g;
  }

  LinkLeaseState renew(uint64_t lease_id) override { return renew_many({&lease_id, 1})[0]; }

  std::vector<LinkLeaseState> renew_many(std::span<const uint64_t> ids) override {
    const std::vector<ElasticRegion::Renewal> r = region_->renew_many(ids.data(), ids.size());
    std::vector<LinkLeaseState> out(r.size());
    const uint64_t lease = region_->lease_ns();
    for (size_t i = 0; i < r.size(); ++i) {
      // Not held (expired or never ours): the lender may reuse the bytes. Held: renewed again
      // once a third of the lease has passed.
      out[i] = r[i].held ? LinkLeaseState{r[i].reclaim, false, r[i].expires_ns - lease + lease / 3}
                         : LinkLeaseState{false, true, 0};
    }
    return out;
  }

  uint64_t clock_now() const override { return region_->clock_now(); }
  const void *identity() const noexcept override { return region_.get(); }

  void watch_reclaims(std::function<void()> wake) override {
    if (watcher_ != 0) region_->remove_reclaim_watcher(watcher_);
    watcher_ = region_->add_reclaim_watcher(std::move(wake));
  }

  bool valid(uint64_t lease_id) const noexcept override {
    try {
      region_->lease(lease_id);  // throws once expired or gone
      return true;
    } catch (...) {
      return false;
    }
  }

  void release(uint64_t lease_id) noexcept override {
    try {
      region_->release(lease_id);
    } catch (...) {
      // Already expired or taken back: nothing left to give.
    }
  }

  std::string describe() const override { return "an elastic region of this process"; }

 private:
  std::shared_ptr<ElasticRegion> region_;
  uint64_t watcher_ = 0;
};

}  // namespace

std::vector<LinkLeaseState> LenderLink::renew_many(std::span<const uint64_t> lease_ids) {
  std::vector<LinkLeaseState> out;
  out.reserve(lease_ids.size());
  for (uint64_t id : lease_ids) out.push_back(renew(id));
  return out;
}

void LenderLink::transfer(std::span<const transport::RangeOp>) {
  fail(SWIFTKV_EINTERNAL,
       "the leases of " + describe() + " are mapped in this process: copied, not transferred");
}

std::shared_ptr<LenderLink> local_lender(std::shared_ptr<ElasticRegion> region) {
  return std::make_shared<LocalLender>(std::move(region));
}

}  // namespace swiftkv
