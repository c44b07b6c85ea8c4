// The in-process lender: the region's own lease calls, under its lock.
#include "core/tiers/lender_link.hpp"

#include "core/common/error.hpp"

namespace swiftkv {

namespace {

class LocalLender final : public LenderLink {
 public:
  explicit LocalLender(std::shared_ptr<ElasticRegion> r) : region_(std::move(r)) {}

  void check_geometry(const GeometrySizes &sizes) const override {
    const auto &b = region_->borrower_sizes();
    if (!b || b->layer_chunk_bytes != sizes.layer_chunk_bytes ||
        b->full_chunk_bytes != sizes.full_chunk_bytes) {
      fail_invalid("the lender's borrower geometry is not the model's: its lent memory would not "
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

  LinkLeaseState renew(uint64_t lease_id) override {
    try {
      region_->renew(lease_id);
      return LinkLeaseState{region_->lease(lease_id).reclaim_requested, false};
    } catch (const Error &) {
      // ETIMEDOUT or ENOTFOUND: the lender may reuse the bytes; nothing there is ours now.
      return LinkLeaseState{false, true};
    }
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
};

}  // namespace

std::shared_ptr<LenderLink> local_lender(std::shared_ptr<ElasticRegion> region) {
  return std::make_shared<LocalLender>(std::move(region));
}

}  // namespace swiftkv
