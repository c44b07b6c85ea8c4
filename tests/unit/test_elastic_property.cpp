// Property test of the elastic region's core: random sequences of scale-up, scale-down, lend,
// renew, release, reclaim and clock moves, with every invariant, the lender's bytes and the
// borrowers' bytes checked after every step.
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "core/common/error.hpp"
#include "core/elastic/elastic_region.hpp"
#include "core/memory/host_region.hpp"

// After the core headers: CMocka defines a macro named fail.
extern "C" {
#include <cmocka.h>
}

namespace {

using swiftkv::ElasticRegion;

// The lender of test_elastic.c: 4 KiB blocks; the borrower's 6 KiB chunks make a 12 KiB unit
// of 3 blocks, exactly 3 pages, so committed bytes are exact.
swiftkv::ModelGeometry lender_geometry() { return {4, 2, 8, 16, 32, SWIFTKV_DTYPE_F16, -1}; }
swiftkv::ModelGeometry borrower_geometry() { return {3, 1, 16, 16, 32, SWIFTKV_DTYPE_F16, -1}; }

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kUnitBlocks = 3;
constexpr uint64_t kCapacity = 60;

struct HeldLease {
  swiftkv::Lease lease;
  uint8_t fill;
};

struct Model {
  uint64_t now = 1'000'000'000;
  std::vector<int> lender_fill = std::vector<int>(kCapacity, -1);  // -1: not the lender's
  std::map<uint64_t, HeldLease> leases;
};

void fill_block(std::byte *base, uint64_t b, uint8_t v) {
  std::memset(base + b * kBlock, v, kBlock);
}

bool block_is(const std::byte *base, uint64_t b, uint8_t v) {
  std::byte want[kBlock];
  std::memset(want, v, kBlock);
  return std::memcmp(base + b * kBlock, want, kBlock) == 0;
}

// Runs `fn` and accepts only OK or one of the statuses the step may legitimately end in.
template <class Fn>
void allow(Fn fn, std::initializer_list<swiftkv_status> ok) {
  try {
    fn();
  } catch (const swiftkv::Error &e) {
    for (swiftkv_status s : ok) {
      if (e.status() == s) return;
    }
    fail_msg("unexpected %s: %s", swiftkv_status_string(e.status()), e.what());
  }
}

void check(ElasticRegion &r, Model &m, std::byte *base) {
  r.check_invariants();
  const swiftkv::ElasticStats s = r.stats();
  assert_int_equal(s.owned_blocks + s.lent_blocks + s.free_blocks, kCapacity);
  assert_int_equal(s.owned_blocks % kUnitBlocks, 0);
  assert_int_equal(s.lent_blocks % kUnitBlocks, 0);
  assert_true(s.ready_blocks <= s.owned_blocks);
  assert_int_equal(s.committed_bytes, (s.owned_blocks + s.lent_blocks) * kBlock);
  // Leases the region dropped must have expired; the rest are as the model holds them.
  std::vector<bool> taken(kCapacity, false);
  for (auto it = m.leases.begin(); it != m.leases.end();) {
    bool held = true;
    try {
      const swiftkv::Lease now = r.lease(it->first);
      assert_int_equal(now.first_unit, it->second.lease.first_unit);
      assert_int_equal(now.units, it->second.lease.units);
    } catch (const swiftkv::Error &) {
      held = false;
    }
    if (!held) {
      assert_true(it->second.lease.expires_ns <= m.now);
      it = m.leases.erase(it);
      continue;
    }
    const swiftkv::Lease &l = it->second.lease;
    for (uint64_t b = l.first_unit * kUnitBlocks; b < (l.first_unit + l.units) * kUnitBlocks; ++b) {
      assert_false(taken[b]);  // nothing lent twice
      taken[b] = true;
      assert_true(block_is(base, b, it->second.fill));  // the borrower's bytes stay
    }
    ++it;
  }
  assert_int_equal(s.leases, m.leases.size());
  // The lender's bytes in blocks it kept are untouched; blocks it newly got are filled now.
  for (uint64_t b = 0; b < kCapacity; ++b) {
    if (b >= s.ready_blocks) {
      m.lender_fill[b] = -1;
      continue;
    }
    assert_false(taken[b]);
    if (m.lender_fill[b] >= 0) {
      assert_true(block_is(base, b, static_cast<uint8_t>(m.lender_fill[b])));
    } else {
      m.lender_fill[b] = static_cast<int>((b * 31 + m.now / 1000) % 200) + 1;
      fill_block(base, b, static_cast<uint8_t>(m.lender_fill[b]));
    }
  }
}

void run_seed(uint32_t seed, int steps) {
  std::mt19937_64 rng(seed);
  Model m;
  swiftkv::ElasticConfig c;
  c.lender = lender_geometry();
  c.borrower = borrower_geometry();
  c.capacity_blocks = kCapacity;
  c.owned_blocks = 3 * (rng() % 5);
  c.window_ns = 1'000'000'000;
  c.lease_ns = 700'000'000;
  c.clock = [&m] { return m.now; };
  swiftkv::HostRegionOptions o;
  o.size = ElasticRegion::required_bytes(c);
  ElasticRegion r(c, swiftkv::create_host_region(o));
  std::byte *base = r.memory().data();
  check(r, m, base);
  for (int step = 0; step < steps; ++step) {
    switch (rng() % 8) {
      case 0:
      case 1:
        allow([&] { (void)r.scale_for_request(rng() % (kCapacity * 16 + 64)); }, {SWIFTKV_ENOMEM});
        break;
      case 2: {
        const uint64_t ready = r.stats().ready_blocks;
        (void)r.tick(ready == 0 ? 0 : rng() % (ready + 1));
        break;
      }
      case 3:
        allow(
            [&] {
              const swiftkv::Lease l = r.lend(1 + rng() % 4);
              const auto fill = static_cast<uint8_t>(200 + l.id % 50);
              for (uint64_t b = l.first_unit * kUnitBlocks;
                   b < (l.first_unit + l.units) * kUnitBlocks; ++b) {
                fill_block(base, b, fill);
              }
              m.leases.emplace(l.id, HeldLease{l, fill});
            },
            {SWIFTKV_ENOMEM});
        break;
      case 4:  // the borrower answers reclaim requests, usually
        for (uint64_t id : r.pending_reclaims()) {
          if (rng() % 4 != 0) {
            r.release(id);
            m.leases.erase(id);
          }
        }
        break;
      case 5:
        if (!m.leases.empty()) {
          auto it = std::next(m.leases.begin(), static_cast<long>(rng() % m.leases.size()));
          const uint64_t id = it->first;
          if (rng() % 2) {
            allow(
                [&] {
                  r.renew(id);
                  it->second.lease.expires_ns = m.now + c.lease_ns;
                },
                {SWIFTKV_ETIMEDOUT});
          } else {
            allow([&] { r.release(id); }, {SWIFTKV_ETIMEDOUT});
            m.leases.erase(it);
          }
        }
        break;
      case 6:
        if (!m.leases.empty()) {
          allow(
              [&] {
                r.reclaim(rng() % 3 == 0 ? ElasticRegion::kAllLeases : m.leases.begin()->first);
              },
              {SWIFTKV_ETIMEDOUT, SWIFTKV_ENOTFOUND});
        }
        break;
      case 7: m.now += rng() % 400'000'000; break;
    }
    check(r, m, base);
  }
}

void test_random_sequences(void **) {
  for (uint32_t seed = 1; seed <= 24; ++seed) run_seed(seed, 1500);
}

// Capacity and boundary stay put when the memory commit fails: a region whose pages cannot be
// allocated is simulated by a backend that refuses every commit.
class RefusingMemory final : public swiftkv::MemoryRegion {
 public:
  explicit RefusingMemory(uint64_t size) : bytes_(size) {}
  std::byte *data() const noexcept override { return const_cast<std::byte *>(bytes_.data()); }
  uint64_t size() const noexcept override { return bytes_.size(); }
  swiftkv::MemoryKind kind() const noexcept override { return swiftkv::MemoryKind::host_memfd; }
  int32_t device() const noexcept override { return -1; }
  void adopt(const swiftkv::RegionExport &) override {}
  uint64_t commit_granule() const noexcept override { return 4096; }
  void commit(uint64_t, uint64_t) override {
    if (refuse) throw swiftkv::Error(SWIFTKV_ENOMEM, "refused by the test");
  }
  void decommit(uint64_t, uint64_t) noexcept override {}
  uint64_t committed_bytes() const noexcept override { return 0; }
  swiftkv::RegionExport export_range(uint64_t, uint64_t) const override { return {}; }
  bool refuse = false;

 private:
  std::vector<std::byte> bytes_;
};

void test_failed_commit_changes_nothing(void **) {
  swiftkv::ElasticConfig c;
  c.lender = lender_geometry();
  c.borrower = borrower_geometry();
  c.capacity_blocks = kCapacity;
  c.owned_blocks = 6;
  auto mem = std::make_shared<RefusingMemory>(kCapacity * kBlock);
  ElasticRegion r(c, mem);
  mem->refuse = true;
  const swiftkv::ElasticStats before = r.stats();
  allow([&] { (void)r.scale_for_request(20 * 16); }, {SWIFTKV_ENOMEM});
  allow([&] { (void)r.lend(2); }, {SWIFTKV_ENOMEM});
  r.check_invariants();
  const swiftkv::ElasticStats after = r.stats();
  assert_memory_equal(&before, &after, sizeof before);
  mem->refuse = false;
  assert_int_equal(r.scale_for_request(20 * 16).lender_blocks, 15);
  r.check_invariants();
}

// Many leases, renewed at random times: at every step exactly those past their deadline are
// gone (counted as expired, their units free), in deadline order, and a renewal moves a lease's
// place. 2048 one-unit leases.
void test_lease_expiry_order_under_many_leases(void **) {
  uint64_t now = 1'000'000'000;
  swiftkv::ElasticConfig c;
  c.lender = lender_geometry();
  c.borrower = borrower_geometry();
  c.capacity_blocks = 2048 * kUnitBlocks;
  c.owned_blocks = 0;
  c.lease_ns = 1'000'000;
  c.clock = [&now] { return now; };
  swiftkv::HostRegionOptions o;
  o.size = ElasticRegion::required_bytes(c);
  ElasticRegion r(c, swiftkv::create_host_region(o));
  std::map<uint64_t, uint64_t> deadline;  // lease id -> expiry, the reference
  std::mt19937_64 rng(9);
  uint64_t expired = 0;
  for (int step = 0; step < 20000; ++step) {
    const uint64_t op = rng() % 8;
    if (op < 3) {
      try {
        const swiftkv::Lease l = r.lend(1);
        deadline[l.id] = l.expires_ns;
      } catch (const swiftkv::Error &e) {
        assert_int_equal(e.status(), SWIFTKV_ENOMEM);
      }
    } else if (op < 6 && !deadline.empty()) {
      auto it = deadline.begin();
      std::advance(it, static_cast<long>(rng() % deadline.size()));
      if (rng() % 2 == 0) {
        r.renew(it->first);
        it->second = now + c.lease_ns;
      } else {
        std::vector<uint64_t> ids{it->first, 999'999'999};
        const auto st = r.renew_many(ids.data(), ids.size());
        assert_true(st[0].held && st[0].expires_ns == now + c.lease_ns);
        assert_false(st[1].held);
        it->second = now + c.lease_ns;
      }
    } else {
      now += rng() % 300'000;
      for (auto it = deadline.begin(); it != deadline.end();) {
        if (it->second <= now) {
          ++expired;
          it = deadline.erase(it);
        } else {
          ++it;
        }
      }
    }
    const swiftkv::ElasticStats s = r.stats();
    assert_int_equal(s.leases, deadline.size());
    assert_int_equal(s.leases_expired, expired);
    assert_int_equal(s.lent_blocks, deadline.size() * kUnitBlocks);
    if (step % 1000 == 0) {
      r.check_invariants();
      for (const auto &[id, exp] : deadline) assert_int_equal(r.lease(id).expires_ns, exp);
    }
  }
  assert_true(expired > 1000);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_sequences),
      cmocka_unit_test(test_failed_commit_changes_nothing),
      cmocka_unit_test(test_lease_expiry_order_under_many_leases),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
