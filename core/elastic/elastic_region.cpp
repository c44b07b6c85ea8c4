// The elastic region's bookkeeping: per-unit states, free runs, leases, the ScaleDown window and
// per-granule reference counts that decide which physical memory stays committed.
#include "core/elastic/elastic_region.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "core/common/checked_math.hpp"
#include "core/common/clock.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {

constexpr size_t kExpiredIdsKept = 4096;

std::string unit_text(uint64_t blocks, uint64_t chunks) {
  return std::to_string(blocks) + " lender blocks" +
         (chunks ? " = " + std::to_string(chunks) + " borrower chunks" : std::string());
}

void require_units(uint64_t blocks, uint64_t unit_blocks, uint64_t unit_chunks, const char *field) {
  if (blocks % unit_blocks != 0) {
    const uint64_t below = blocks / unit_blocks * unit_blocks;
    fail_invalid(std::string("config->") + field + " (" + std::to_string(blocks) +
                 ") is not a whole number of lending units (" +
                 unit_text(unit_blocks, unit_chunks) + "); " + std::to_string(below) + " or " +
                 std::to_string(below + unit_blocks) + " would be");
  }
}

}  // namespace

ElasticRegion::Layout ElasticRegion::checked_layout(const ElasticConfig &c) {
  Layout l;
  l.lender = geometry_sizes(c.lender, "config->lender");
  l.unit_blocks = 1;
  l.unit_chunks = 0;
  if (c.borrower) {
    l.borrower = geometry_sizes(*c.borrower, "config->borrower");
    const LendUnit u = lend_unit(*l.borrower, l.lender);
    l.unit_blocks = u.lender_blocks;
    l.unit_chunks = u.borrower_chunks;
  }
  if (c.capacity_blocks == 0) fail_invalid("config->capacity_blocks is 0");
  require_units(c.capacity_blocks, l.unit_blocks, l.unit_chunks, "capacity_blocks");
  require_units(c.owned_blocks, l.unit_blocks, l.unit_chunks, "owned_blocks");
  if (c.owned_blocks > c.capacity_blocks) {
    fail_invalid("config->owned_blocks (" + std::to_string(c.owned_blocks) +
                 ") exceeds config->capacity_blocks (" + std::to_string(c.capacity_blocks) + ")");
  }
  if (c.window_ns == 0) fail_invalid("config->window_ms is 0; the ScaleDown window must be > 0");
  if (c.lease_ns == 0) fail_invalid("config->lease_ms is 0; a lease must last > 0");
  if (c.reclaim_deadline_ns == 0) {
    fail_invalid("config->reclaim_deadline_ms is 0; a borrower needs time to give a lease back");
  }
  // A unit's bytes must fit too: lending computes offsets from them.
  (void)checked_mul(l.unit_blocks, l.lender.full_block_bytes, "bytes of one lending unit");
  l.bytes = checked_mul(c.capacity_blocks, l.lender.full_block_bytes,
                        "region bytes (capacity_blocks * bytes of one full block)");
  return l;
}

uint64_t ElasticRegion::required_bytes(const ElasticConfig &c) { return checked_layout(c).bytes; }

ElasticRegion::ElasticRegion(const ElasticConfig &config, std::shared_ptr<MemoryRegion> memory)
    : ElasticRegion(config, checked_layout(config), std::move(memory)) {}

ElasticRegion::ElasticRegion(const ElasticConfig &config, const Layout &layout,
                             std::shared_ptr<MemoryRegion> memory)
    : lender_(config.lender),
      borrower_(config.borrower),
      lender_sizes_(layout.lender),
      borrower_sizes_(layout.borrower),
      unit_blocks_(layout.unit_blocks),
      unit_chunks_(layout.unit_chunks),
      unit_bytes_(unit_blocks_ * lender_sizes_.full_block_bytes),
      capacity_units_(config.capacity_blocks / unit_blocks_),
      window_ns_(config.window_ns),
      lease_ns_(config.lease_ns),
      reclaim_deadline_ns_(config.reclaim_deadline_ns),
      keep_committed_(config.keep_committed),
      clock_(config.clock ? config.clock : std::function<uint64_t()>(monotonic_ns)),
      memory_(std::move(memory)),
      granule_(memory_ ? memory_->commit_granule() : 0) {
  if (!memory_ || memory_->size() < layout.bytes) {
    fail(SWIFTKV_EINTERNAL,
         "elastic region memory is smaller than its " + std::to_string(layout.bytes) + " bytes");
  }
  std::lock_guard lock(mu_);
  state_.assign(capacity_units_, UnitState::free);
  unit_lease_.assign(capacity_units_, 0);
  if (granule_ != 0) granule_refs_.assign(ceil_div(memory_->size(), granule_), 0);
  free_units_ = capacity_units_;
  add_free_locked(0, capacity_units_);
  grow_locked(config.owned_blocks / unit_blocks_);
  // Reclaim requests in the first grow are impossible: nothing was lent yet.
}

uint64_t ElasticRegion::now() const { return clock_(); }

ScaleStep ElasticRegion::scale_step_locked() const noexcept {
  // Without a borrower there are no chunks to report; Algorithm 1 still needs a non-zero MEU_m.
  return ScaleStep{owned_units_ * unit_blocks_, lender_.block_tokens, unit_blocks_,
                   std::max<uint64_t>(unit_chunks_, 1)};
}

ElasticDelta ElasticRegion::delta(uint64_t units, bool waiting) const noexcept {
  return ElasticDelta{units * unit_blocks_, units * unit_chunks_, waiting};
}

ElasticDelta ElasticRegion::scale_for_request(uint64_t request_tokens) {
  std::lock_guard lock(mu_);
  const uint64_t t = now();
  expire_leases_locked(t);
  const uint64_t units = scale_up(scale_step_locked(), request_tokens).lender_blocks / unit_blocks_;
  ElasticDelta d{};
  if (units > 0) {
    d = grow_locked(units);
    ++counters_.scale_ups;
  }
  // Recorded only once the request fits, so a refused request leaves no trace.
  while (!window_.empty() && window_.back().second <= request_tokens) window_.pop_back();
  window_.emplace_back(t, request_tokens);
  d.waiting = !reclaiming_.empty();
  return d;
}

uint64_t ElasticRegion::max_request_in_window_locked(uint64_t t) {
  const uint64_t horizon = t > window_ns_ ? t - window_ns_ : 0;
  while (!window_.empty() && window_.front().first < horizon) window_.pop_front();
  return window_.empty() ? 0 : window_.front().second;
}

ElasticDelta ElasticRegion::tick(uint64_t in_use_blocks) {
  std::lock_guard lock(mu_);
  if (in_use_blocks > capacity_units_ * unit_blocks_) {
    fail_invalid("in_use_blocks (" + std::to_string(in_use_blocks) + ") exceeds the capacity of " +
                 std::to_string(capacity_units_ * unit_blocks_) + " blocks");
  }
  const uint64_t t = now();
  expire_leases_locked(t);
  uint64_t units =
      scale_down(scale_step_locked(), max_request_in_window_locked(t)).lender_blocks / unit_blocks_;
  // Never take blocks the engine still holds live KV in, whatever the window says.
  const uint64_t floor_units = ceil_div(in_use_blocks, unit_blocks_);
  units = std::min(units, owned_units_ > floor_units ? owned_units_ - floor_units : 0);
  ElasticDelta d{};
  if (units > 0) {
    d = shrink_locked(units);
    ++counters_.scale_downs;
  }
  d.waiting = !reclaiming_.empty();
  return d;
}

ElasticDelta ElasticRegion::resize(uint64_t owned_blocks) {
  std::lock_guard lock(mu_);
  if (owned_blocks % unit_blocks_ != 0 || owned_blocks > capacity_units_ * unit_blocks_) {
    fail_invalid("owned_blocks (" + std::to_string(owned_blocks) +
                 ") must be a whole number of lending units of " + std::to_string(unit_blocks_) +
                 " blocks, at most the capacity of " +
                 std::to_string(capacity_units_ * unit_blocks_));
  }
  expire_leases_locked(now());
  const uint64_t units = owned_blocks / unit_blocks_;
  ElasticDelta d{};
  if (units > owned_units_) {
    d = grow_locked(units - owned_units_);
    ++counters_.scale_ups;
  } else if (units < owned_units_) {
    d = shrink_locked(owned_units_ - units);
    ++counters_.scale_downs;
  }
  d.waiting = !reclaiming_.empty();
  return d;
}

ElasticDelta ElasticRegion::grow_locked(uint64_t units) {
  if (units > capacity_units_ - owned_units_) {
    fail(SWIFTKV_ENOMEM,
         "the region would grow to " + std::to_string((owned_units_ + units) * unit_blocks_) +
             " blocks but its capacity is " + std::to_string(capacity_units_ * unit_blocks_));
  }
  const uint64_t end = owned_units_ + units;
  // Commit the memory of every free unit first; if that fails nothing has changed.
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (uint64_t u = owned_units_; u < end;) {
    if (state_[u] != UnitState::free) {
      ++u;
      continue;
    }
    const uint64_t first = u;
    while (u < end && state_[u] == UnitState::free) ++u;
    runs.emplace_back(first, u - first);
  }
  size_t done = 0;
  try {
    for (; done < runs.size(); ++done) acquire_memory_locked(runs[done].first, runs[done].second);
  } catch (...) {
    for (size_t i = 0; i < done; ++i) release_memory_locked(runs[i].first, runs[i].second);
    throw;
  }
  for (const auto &[first, n] : runs) {
    remove_free_locked(first, n);
    for (uint64_t u = first; u < first + n; ++u) state_[u] = UnitState::owned;
    free_units_ -= n;
  }
  bool asked = false;
  const uint64_t t = now();
  for (uint64_t u = owned_units_; u < end; ++u) {
    if (state_[u] != UnitState::lent) continue;
    state_[u] = UnitState::reclaiming;
    reclaiming_.insert(u);
    --lent_units_;
    Lease &l = leases_.at(unit_lease_[u]);
    if (!l.reclaim_requested) {
      ask_back_locked(l, t);
      asked = true;
    }
  }
  owned_units_ = end;
  if (asked) notify_reclaim_locked();
  return delta(units, !reclaiming_.empty());
}

ElasticDelta ElasticRegion::shrink_locked(uint64_t units) {
  const uint64_t first = owned_units_ - units;
  for (uint64_t u = first; u < owned_units_;) {
    if (state_[u] == UnitState::reclaiming) {
      // The lender no longer needs it: the lease keeps it, still asked back.
      state_[u] = UnitState::lent;
      reclaiming_.erase(u);
      ++lent_units_;
      ++u;
      continue;
    }
    const uint64_t run = u;
    while (u < owned_units_ && state_[u] == UnitState::owned) state_[u++] = UnitState::free;
    release_memory_locked(run, u - run);
    add_free_locked(run, u - run);
    free_units_ += u - run;
  }
  owned_units_ = first;
  return delta(units, !reclaiming_.empty());
}

template <class Fn>
void ElasticRegion::for_each_unheld_run_locked(uint64_t first_unit, uint64_t units, Fn fn) const {
  const uint64_t begin = first_unit * unit_bytes_ / granule_;
  const uint64_t end = ceil_div((first_unit + units) * unit_bytes_, granule_);
  for (uint64_t g = begin; g < end;) {
    if (granule_refs_[g] != 0) {
      ++g;
      continue;
    }
    const uint64_t run = g;
    while (g < end && granule_refs_[g] == 0) ++g;
    const uint64_t off = run * granule_;
    fn(off, std::min((g - run) * granule_, memory_->size() - off));
  }
}

void ElasticRegion::count_granules_locked(uint64_t first_unit, uint64_t units, int32_t delta) {
  for (uint64_t u = first_unit; u < first_unit + units; ++u) {
    const uint64_t g1 = ceil_div((u + 1) * unit_bytes_, granule_);
    for (uint64_t g = u * unit_bytes_ / granule_; g < g1; ++g) {
      granule_refs_[g] = static_cast<uint32_t>(static_cast<int64_t>(granule_refs_[g]) + delta);
    }
  }
}

void ElasticRegion::acquire_memory_locked(uint64_t first_unit, uint64_t units) {
  if (granule_ == 0 || units == 0) return;
  // Commit the granules nobody holds, in runs; undo them if a later run fails.
  std::vector<std::pair<uint64_t, uint64_t>> committed;
  try {
    for_each_unheld_run_locked(first_unit, units, [&](uint64_t off, uint64_t len) {
      memory_->commit(off, len);
      committed.emplace_back(off, len);
    });
  } catch (...) {
    for (const auto &[off, len] : committed) memory_->decommit(off, len);
    throw;
  }
  count_granules_locked(first_unit, units, +1);
}

void ElasticRegion::release_memory_locked(uint64_t first_unit, uint64_t units) noexcept {
  if (granule_ == 0 || units == 0) return;
  count_granules_locked(first_unit, units, -1);
  if (keep_committed_) return;
  for_each_unheld_run_locked(first_unit, units,
                             [&](uint64_t off, uint64_t len) { memory_->decommit(off, len); });
}

void ElasticRegion::add_free_locked(uint64_t first, uint64_t n) {
  if (n == 0) return;
  auto next = free_runs_.lower_bound(first);
  if (next != free_runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      first = prev->first;
      n += prev->second;
      free_runs_.erase(prev);
    }
  }
  if (next != free_runs_.end() && first + n == next->first) {
    n += next->second;
    free_runs_.erase(next);
  }
  free_runs_.emplace(first, n);
}

void ElasticRegion::remove_free_locked(uint64_t first, uint64_t n) {
  auto it = free_runs_.upper_bound(first);
  if (it == free_runs_.begin())
    fail(SWIFTKV_EINTERNAL, "free run missing for unit " + std::to_string(first));
  --it;
  const uint64_t run_first = it->first;
  const uint64_t run_n = it->second;
  if (first + n > run_first + run_n) {
    fail(SWIFTKV_EINTERNAL,
         "units [" + std::to_string(first) + ", +" + std::to_string(n) + ") are not one free run");
  }
  free_runs_.erase(it);
  if (first > run_first) free_runs_.emplace(run_first, first - run_first);
  if (first + n < run_first + run_n) free_runs_.emplace(first + n, run_first + run_n - first - n);
}

Lease ElasticRegion::lend(uint64_t max_units) {
  if (!borrower_sizes_) {
    fail(SWIFTKV_ESTATE, "the region was created without a borrower; it lends nothing");
  }
  if (max_units == 0) fail_invalid("max_units is 0");
  std::lock_guard lock(mu_);
  const uint64_t t = now();
  expire_leases_locked(t);
  if (free_runs_.empty()) {
    fail(SWIFTKV_ENOMEM, "no free lending unit: " + std::to_string(owned_units_ * unit_blocks_) +
                             " blocks owned and " + std::to_string(lent_units_ * unit_blocks_) +
                             " lent of " + std::to_string(capacity_units_ * unit_blocks_));
  }
  // The highest free units: growth of the owned part reaches them last.
  const auto top = std::prev(free_runs_.end());
  const uint64_t n = std::min(max_units, top->second);
  const uint64_t first = top->first + top->second - n;
  acquire_memory_locked(first, n);
  remove_free_locked(first, n);
  const uint64_t id = next_lease_id_++;
  for (uint64_t u = first; u < first + n; ++u) {
    state_[u] = UnitState::lent;
    unit_lease_[u] = id;
  }
  free_units_ -= n;
  lent_units_ += n;
  const Lease l{id, first, n, t + lease_ns_, false, UINT64_MAX};
  leases_.emplace(id, l);
  deadlines_.emplace(l.expires_ns, id);
  ++counters_.leases_granted;
  return l;
}

std::map<uint64_t, Lease>::iterator ElasticRegion::find_lease_locked(uint64_t id,
                                                                     const char *what) {
  const auto it = leases_.find(id);
  if (it != leases_.end()) return it;
  if (std::find(expired_ids_.begin(), expired_ids_.end(), id) != expired_ids_.end()) {
    fail(SWIFTKV_ETIMEDOUT, std::string(what) + ": lease " + std::to_string(id) +
                                " expired; its memory went back to the lender");
  }
  fail(SWIFTKV_ENOTFOUND, std::string(what) + ": lease " + std::to_string(id) +
                              " is not held (never lent, or already released)");
}

void ElasticRegion::set_expiry_locked(Lease &l, uint64_t expires_ns) {
  // The lease's entry moves rather than being freed and made again (a borrower's beat renews
  // all its leases at once), and goes in from the end: a renewal's deadline, now plus the
  // lease's length, is nearly always the latest, found there without a search.
  auto entry = deadlines_.extract({l.expires_ns, l.id});
  l.expires_ns = expires_ns;
  if (entry.empty()) {
    deadlines_.emplace(expires_ns, l.id);
    return;
  }
  entry.value() = {expires_ns, l.id};
  deadlines_.insert(deadlines_.end(), std::move(entry));
}

void ElasticRegion::ask_back_locked(Lease &l, uint64_t t) {
  l.reclaim_requested = true;
  l.reclaim_by_ns = t > UINT64_MAX - reclaim_deadline_ns_ ? UINT64_MAX : t + reclaim_deadline_ns_;
  asked_.insert(l.id);
  ++counters_.reclaims_requested;
}

void ElasticRegion::renew_locked(Lease &l, uint64_t t) {
  // A lease asked back is renewed up to its reclaim deadline only; what was granted stays.
  const uint64_t want = std::min(t + lease_ns_, l.reclaim_by_ns);
  if (want > l.expires_ns) set_expiry_locked(l, want);
}

void ElasticRegion::renew(uint64_t lease_id) {
  std::lock_guard lock(mu_);
  const uint64_t t = now();
  expire_leases_locked(t);
  renew_locked(find_lease_locked(lease_id, "renew")->second, t);
}

std::vector<ElasticRegion::Renewal> ElasticRegion::renew_many(const uint64_t *lease_ids, size_t n) {
  std::vector<Renewal> out(n);
  std::lock_guard lock(mu_);
  const uint64_t t = now();
  expire_leases_locked(t);
  for (size_t i = 0; i < n; ++i) {
    const auto it = leases_.find(lease_ids[i]);
    if (it == leases_.end()) continue;
    renew_locked(it->second, t);
    out[i] = Renewal{true, it->second.reclaim_requested, it->second.expires_ns};
  }
  return out;
}

void ElasticRegion::release(uint64_t lease_id) {
  std::lock_guard lock(mu_);
  expire_leases_locked(now());
  end_lease_locked(find_lease_locked(lease_id, "release"));
}

void ElasticRegion::reclaim(uint64_t lease_id) {
  std::lock_guard lock(mu_);
  const uint64_t t = now();
  expire_leases_locked(t);
  bool asked = false;
  auto ask = [&](Lease &l) {
    if (!l.reclaim_requested) {
      ask_back_locked(l, t);
      asked = true;
    }
  };
  if (lease_id == kAllLeases) {
    for (auto &[id, l] : leases_) ask(l);
  } else {
    ask(find_lease_locked(lease_id, "reclaim")->second);
  }
  if (asked) notify_reclaim_locked();
}

void ElasticRegion::notify_reclaim_locked() const {
  if (on_reclaim_) on_reclaim_();
  for (const auto &[token, fn] : watchers_) fn();
}

uint64_t ElasticRegion::add_reclaim_watcher(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  const uint64_t token = next_watcher_++;
  watchers_.emplace(token, std::move(fn));
  return token;
}

void ElasticRegion::remove_reclaim_watcher(uint64_t token) noexcept {
  std::lock_guard lock(mu_);
  watchers_.erase(token);
}

bool ElasticRegion::wait_reclaims(uint64_t timeout_ns) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
  for (;;) {
    expire_leases_locked(now());  // an expired lease comes back too
    if (asked_.empty()) return true;
    const auto now_real = std::chrono::steady_clock::now();
    if (now_real >= deadline) return false;
    // Woken when a lease asked back ends; one that ends by expiry on the region's clock is seen
    // at the next wake-up, at most a millisecond later.
    reclaimed_cv_.wait_until(lock, std::min(deadline, now_real + std::chrono::milliseconds(1)));
  }
}

RegionExport ElasticRegion::export_range(uint64_t offset, uint64_t size) const {
  std::lock_guard lock(mu_);
  return memory_->export_range(offset, size);
}

void ElasticRegion::set_reclaim_listener(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  on_reclaim_ = std::move(fn);
}

void ElasticRegion::end_all_leases() {
  std::lock_guard lock(mu_);
  const bool any = !leases_.empty();
  for (auto &[id, l] : leases_) set_expiry_locked(l, 0);
  expire_leases_locked(0);
  if (any) notify_reclaim_locked();
}

void ElasticRegion::end_lease_locked(std::map<uint64_t, Lease>::iterator it) {
  const Lease l = it->second;
  deadlines_.erase({l.expires_ns, l.id});
  if (l.reclaim_requested) {
    asked_.erase(l.id);
    reclaimed_cv_.notify_all();
  }
  for (uint64_t u = l.first_unit; u < l.first_unit + l.units;) {
    unit_lease_[u] = 0;
    if (state_[u] == UnitState::reclaiming) {
      state_[u] = UnitState::owned;  // committed already: it was lent
      reclaiming_.erase(u);
      ++u;
      continue;
    }
    if (state_[u] != UnitState::lent) {
      fail(SWIFTKV_EINTERNAL, "lease " + std::to_string(l.id) + " holds unit " + std::to_string(u) +
                                  ", which is neither lent nor reclaiming");
    }
    const uint64_t run = u;
    while (u < l.first_unit + l.units && state_[u] == UnitState::lent) {
      unit_lease_[u] = 0;
      state_[u++] = UnitState::free;
    }
    release_memory_locked(run, u - run);
    add_free_locked(run, u - run);
    lent_units_ -= u - run;
    free_units_ += u - run;
  }
  leases_.erase(it);
}

void ElasticRegion::expire_leases_locked(uint64_t t) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= t) {
    const uint64_t id = deadlines_.begin()->second;
    expired_ids_.push_back(id);
    if (expired_ids_.size() > kExpiredIdsKept) expired_ids_.pop_front();
    ++counters_.leases_expired;
    end_lease_locked(leases_.find(id));
  }
}

Lease ElasticRegion::lease(uint64_t lease_id) {
  std::lock_guard lock(mu_);
  expire_leases_locked(now());
  return find_lease_locked(lease_id, "lease")->second;
}

std::vector<uint64_t> ElasticRegion::pending_reclaims() {
  std::lock_guard lock(mu_);
  expire_leases_locked(now());
  return std::vector<uint64_t>(asked_.begin(), asked_.end());
}

ElasticStats ElasticRegion::stats() {
  std::lock_guard lock(mu_);
  expire_leases_locked(now());
  ElasticStats s = counters_;
  s.capacity_blocks = capacity_units_ * unit_blocks_;
  s.owned_blocks = owned_units_ * unit_blocks_;
  s.ready_blocks = (reclaiming_.empty() ? owned_units_ : *reclaiming_.begin()) * unit_blocks_;
  s.reclaiming_blocks = reclaiming_.size() * unit_blocks_;
  s.lent_blocks = lent_units_ * unit_blocks_;
  s.free_blocks = free_units_ * unit_blocks_;
  s.unit_lender_blocks = unit_blocks_;
  s.unit_borrower_chunks = unit_chunks_;
  s.leases = leases_.size();
  s.region_bytes = memory_->size();
  s.committed_bytes = memory_->committed_bytes();
  return s;
}

void ElasticRegion::check_invariants() const {
  std::lock_guard lock(mu_);
  auto broken = [](const std::string &what) { fail(SWIFTKV_EINTERNAL, "invariant: " + what); };
  uint64_t n_free = 0, n_lent = 0, n_owned = 0, n_reclaiming = 0;
  std::vector<uint32_t> refs(granule_refs_.size(), 0);
  for (uint64_t u = 0; u < capacity_units_; ++u) {
    const UnitState s = state_[u];
    const bool below = u < owned_units_;
    if (below != (s == UnitState::owned || s == UnitState::reclaiming)) {
      broken("unit " + std::to_string(u) + " is on the wrong side of the owned boundary");
    }
    const bool held = s == UnitState::lent || s == UnitState::reclaiming;
    if (held != (unit_lease_[u] != 0)) broken("unit " + std::to_string(u) + " lease id");
    if (held) {
      const auto it = leases_.find(unit_lease_[u]);
      if (it == leases_.end()) broken("unit " + std::to_string(u) + " names a missing lease");
      const Lease &l = it->second;
      if (u < l.first_unit || u >= l.first_unit + l.units) broken("unit outside its lease");
      if (s == UnitState::reclaiming && !l.reclaim_requested) broken("reclaim flag not set");
    }
    n_free += s == UnitState::free;
    n_lent += s == UnitState::lent;
    n_owned += s == UnitState::owned;
    n_reclaiming += s == UnitState::reclaiming;
    if (granule_ != 0 && s != UnitState::free) {
      const uint64_t g1 = ceil_div((u + 1) * unit_bytes_, granule_);
      for (uint64_t g = u * unit_bytes_ / granule_; g < g1; ++g) ++refs[g];
    }
  }
  if (n_free != free_units_ || n_lent != lent_units_ || n_reclaiming != reclaiming_.size()) {
    broken("unit counts");
  }
  if (n_owned + n_reclaiming != owned_units_) broken("owned count");
  if (n_free + n_lent + n_owned + n_reclaiming != capacity_units_) broken("units sum");
  uint64_t in_runs = 0;
  uint64_t prev_end = 0;
  bool first_run = true;
  for (const auto &[first, n] : free_runs_) {
    if (n == 0) broken("empty free run");
    if (!first_run && first <= prev_end) broken("free runs overlap or touch");
    for (uint64_t u = first; u < first + n; ++u) {
      if (state_[u] != UnitState::free) broken("free run holds a unit that is not free");
    }
    in_runs += n;
    prev_end = first + n;
    first_run = false;
  }
  if (in_runs != free_units_) broken("free runs miss free units");
  uint64_t leased = 0;
  for (const auto &[id, l] : leases_) {
    if (id != l.id || l.units == 0) broken("lease record");
    for (uint64_t u = l.first_unit; u < l.first_unit + l.units; ++u) {
      if (unit_lease_[u] != id) broken("lease " + std::to_string(id) + " lost a unit");
    }
    leased += l.units;
  }
  if (leased != n_lent + n_reclaiming) broken("leased units");
  if (deadlines_.size() != leases_.size()) broken("one deadline per lease");
  uint64_t asked = 0;
  for (const auto &[id, l] : leases_) asked += l.reclaim_requested;
  if (asked != asked_.size()) broken("leases asked back");
  for (const auto &[expires, id] : deadlines_) {
    const auto it = leases_.find(id);
    if (it == leases_.end() || it->second.expires_ns != expires) broken("lease deadline");
  }
  if (refs != granule_refs_) broken("granule reference counts");
}

}  // namespace swiftkv
