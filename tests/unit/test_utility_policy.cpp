// AdaptCache's placement policy on hand-computed cases (docs/codecs.md works them through), its
// invariants on random instances, bad input, and the built-in quality from reconstruction error.
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/attention/half_float.hpp"
#include "core/codec/utility_policy.hpp"
#include "core/common/error.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

namespace cd = swiftkv::codec;

const cd::CodecParams kRaw{cd::Codec::raw};
const cd::CodecParams kKivi4{cd::Codec::kivi, 4, 32};

// alpha 10; host 1000 bytes/s, disk 100 bytes/s.
//  A: reused 10 times, recompute 5 s, raw 100 bytes or kivi 25 bytes at quality 0.95.
//  B: reused once, recompute 50 s, raw 90 bytes or kivi 80 bytes at quality 0.5.
// In the host both start raw (A: 10 (10 - 0.1) = 99 beats 10 (9.5 - 0.025) = 94.75; B: 9.91
// beats 4.92): 190 bytes. B's cheapest action is moving down raw (9.91 -> 9.1: 0.81 over 90 bytes,
// 0.009 per byte), A's is compressing (99 -> 94.75: 4.25 over 75 bytes, 0.057). With room for
// 100 the first is enough; with room for 80 A is compressed too.
std::vector<cd::ChunkChoice> a_and_b() {
  return {{10, 5, {{kRaw, 100, 1.0}, {kKivi4, 25, 0.95}}},
          {1, 50, {{kRaw, 90, 1.0}, {kKivi4, 80, 0.5}}}};
}

void hot_compressible_stays_compressed_cold_goes_down_raw(void **) {
  const auto chunks = a_and_b();
  {
    const cd::TierCapacity tiers[] = {{100, 1000}, {1000, 100}};
    const cd::PolicyResult r = cd::place_chunks(chunks, tiers, 10);
    assert_int_equal(r.placements[0].tier, 0);
    assert_int_equal(r.placements[0].option, 0);  // room once B left: A stays raw
    assert_int_equal(r.placements[1].tier, 1);
    assert_int_equal(r.placements[1].option, 0);
    assert_true(std::fabs(r.used_bytes[0] - 100) < 1e-9 && std::fabs(r.used_bytes[1] - 90) < 1e-9);
    assert_true(std::fabs(r.utility - (99 + 9.1)) < 1e-9);
  }
  {
    const cd::TierCapacity tiers[] = {{80, 1000}, {1000, 100}};
    const cd::PolicyResult r = cd::place_chunks(chunks, tiers, 10);
    assert_int_equal(r.placements[0].tier, 0);
    assert_int_equal(r.placements[0].option, 1);  // the hot chunk in host memory, compressed
    assert_int_equal(r.placements[1].tier, 1);
    assert_int_equal(r.placements[1].option, 0);  // the cold one on disk, raw
    assert_true(std::fabs(r.used_bytes[0] - 25) < 1e-9);
    assert_true(std::fabs(r.utility - (94.75 + 9.1)) < 1e-9);
  }
}

void room_for_all_changes_nothing(void **) {
  const auto chunks = a_and_b();
  const cd::TierCapacity tiers[] = {{1000, 1000}, {1000, 100}};
  const cd::PolicyResult r = cd::place_chunks(chunks, tiers, 10);
  for (const cd::Placement &p : r.placements) {
    assert_int_equal(p.tier, 0);
    assert_int_equal(p.option, 0);
  }
  assert_true(std::fabs(r.used_bytes[0] - 190) < 1e-9 && r.used_bytes[1] == 0);
}

// A chunk cheaper to recompute than to keep anywhere is dropped once room is needed: keeping it
// in host memory is worth 1 (10 - 0.5) = 9.5, dropping it 1 (10 - 0) = 10.
void cheap_to_recompute_is_dropped(void **) {
  const std::vector<cd::ChunkChoice> chunks = {{1, 0, {{kRaw, 500, 1.0}}}};
  const cd::TierCapacity tiers[] = {{100, 1000}, {1000, 100}};
  const cd::PolicyResult r = cd::place_chunks(chunks, tiers, 10);
  assert_int_equal(r.placements[0].tier, -1);
  assert_int_equal(r.placements[0].option, -1);
  assert_true(r.used_bytes[0] == 0 && r.used_bytes[1] == 0);
  assert_true(std::fabs(r.utility - 10) < 1e-9);
}

// On random instances: no tier over its capacity, the bytes and the utility add up, and the
// result is the same every time.
void random_instances_keep_the_invariants(void **) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int round = 0; round < 50; ++round) {
    std::vector<cd::ChunkChoice> chunks(200);
    for (cd::ChunkChoice &c : chunks) {
      c.freq = u(rng) * 20;
      c.recompute_s = u(rng) * 10;
      const double raw = 50 + u(rng) * 100;
      c.options = {{kRaw, raw, 1.0},
                   {kKivi4, raw * (0.2 + 0.3 * u(rng)), 0.8 + 0.2 * u(rng)},
                   {{cd::Codec::kivi, 2, 32}, raw * 0.15, 0.5 + 0.4 * u(rng)}};
    }
    const cd::TierCapacity tiers[] = {{2000 + u(rng) * 4000, 1000}, {4000 + u(rng) * 8000, 100}};
    const double alpha = 1 + u(rng) * 10;
    const cd::PolicyResult r = cd::place_chunks(chunks, tiers, alpha);
    std::vector<double> used(2, 0.0);
    double total = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const cd::Placement &p = r.placements[i];
      if (p.tier < 0) {
        total += cd::dropped_utility(chunks[i], alpha);
        continue;
      }
      used[static_cast<size_t>(p.tier)] += chunks[i].options[static_cast<size_t>(p.option)].bytes;
      total += cd::utility(chunks[i], chunks[i].options[static_cast<size_t>(p.option)],
                           tiers[p.tier], alpha);
    }
    for (size_t t = 0; t < 2; ++t) {
      assert_true(std::fabs(used[t] - r.used_bytes[t]) < 1e-6);
      assert_true(r.used_bytes[t] <= tiers[t].capacity_bytes + 1e-9);
    }
    assert_true(std::fabs(total - r.utility) < 1e-6 * (1 + std::fabs(total)));
    const cd::PolicyResult again = cd::place_chunks(chunks, tiers, alpha);
    for (size_t i = 0; i < chunks.size(); ++i) {
      assert_int_equal(again.placements[i].tier, r.placements[i].tier);
      assert_int_equal(again.placements[i].option, r.placements[i].option);
    }
  }
}

template <class F>
swiftkv_status status_of(F &&f) {
  try {
    f();
  } catch (const swiftkv::Error &e) {
    return e.status();
  }
  return SWIFTKV_OK;
}

void bad_input_is_einval(void **) {
  const auto good = a_and_b();
  const cd::TierCapacity tiers[] = {{100, 1000}};
  auto run = [&](std::vector<cd::ChunkChoice> c, std::vector<cd::TierCapacity> t, double alpha) {
    return status_of([&] { cd::place_chunks(c, t, alpha); });
  };
  const std::vector<cd::TierCapacity> ts(std::begin(tiers), std::end(tiers));
  assert_int_equal(run(good, ts, 10), SWIFTKV_OK);
  assert_int_equal(run(good, {}, 10), SWIFTKV_EINVAL);
  assert_int_equal(run(good, {{100, 0}}, 10), SWIFTKV_EINVAL);
  assert_int_equal(run(good, {{-1, 10}}, 10), SWIFTKV_EINVAL);
  assert_int_equal(run(good, ts, -1), SWIFTKV_EINVAL);
  assert_int_equal(run(good, ts, NAN), SWIFTKV_EINVAL);
  auto bad = good;
  bad[1].options.clear();
  assert_int_equal(run(bad, ts, 10), SWIFTKV_EINVAL);
  bad = good;
  bad[0].options[1].quality = 1.5;
  assert_int_equal(run(bad, ts, 10), SWIFTKV_EINVAL);
  bad = good;
  bad[0].options[0].bytes = 0;
  assert_int_equal(run(bad, ts, 10), SWIFTKV_EINVAL);
  bad = good;
  bad[0].freq = -1;
  assert_int_equal(run(bad, ts, 10), SWIFTKV_EINVAL);
}

// The online choice on entry, on A and B in host memory (alpha 10, 1000 bytes/s). At price 0
// both stay raw; A's compression loses 4.25 for 75 bytes (0.0567 per byte), so it is taken at a
// price of 0.1 (A: raw 99 - 10 = 89 < kivi 94.75 - 2.5 = 92.25) and not at 0.05 (94 > 93.5);
// B's loses 4.99 for 10 bytes and stays raw at 0.1 (9.91 - 9 = 0.91 > 4.92 - 8 = -3.08).
void entry_choice_prices_bytes(void **) {
  const auto chunks = a_and_b();
  const cd::TierCapacity host{0, 1000};
  assert_int_equal(cd::entry_choice(chunks[0], host, 10, 0), 0);
  assert_int_equal(cd::entry_choice(chunks[1], host, 10, 0), 0);
  assert_int_equal(cd::entry_choice(chunks[0], host, 10, 0.05), 0);
  assert_int_equal(cd::entry_choice(chunks[0], host, 10, 0.1), 1);
  assert_int_equal(cd::entry_choice(chunks[1], host, 10, 0.1), 0);
  // Alpha 0: quality is worth nothing, the smaller option always wins.
  assert_int_equal(cd::entry_choice(chunks[1], host, 0, 0), 1);
  // A tie goes to the smaller option: at alpha 1 and 1024 bytes/s, raw 128 bytes is worth
  // 1 - 0.125 and 64 bytes at quality 0.9375 is worth 0.9375 - 0.0625 (exact in binary).
  const cd::ChunkChoice tie{1, 0, {{kRaw, 128, 1.0}, {kKivi4, 64, 0.9375}}};
  assert_int_equal(cd::entry_choice(tie, cd::TierCapacity{0, 1024}, 1, 0), 1);
  auto status = [&](double alpha, double price) {
    return status_of([&] { cd::entry_choice(chunks[0], host, alpha, price); });
  };
  assert_int_equal(status(10, -1), SWIFTKV_EINVAL);
  assert_int_equal(status(10, NAN), SWIFTKV_EINVAL);
  assert_int_equal(status(10, INFINITY), SWIFTKV_EINVAL);
  assert_int_equal(status(-1, 0), SWIFTKV_EINVAL);
}

// The built-in quality: 1 for lossless codecs, falling with the bits for KIVI.
void reconstruction_quality_falls_with_the_bits(void **) {
  const cd::ChunkShape s{2, 64, 2, 64, SWIFTKV_DTYPE_F16};
  std::vector<std::byte> raw(s.bytes());
  std::mt19937_64 rng(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (uint64_t i = 0; i < s.elements(); ++i) {
    const uint16_t v =
        swiftkv::float_to_half(n(rng) + 0.5f * std::sin(0.1f * static_cast<float>(i % 64)));
    std::memcpy(&raw[i * 2], &v, 2);
  }
  assert_true(cd::reconstruction_quality(s, kRaw, raw) == 1.0);
  const double q8 = cd::reconstruction_quality(s, {cd::Codec::kivi, 8, 32}, raw);
  const double q4 = cd::reconstruction_quality(s, {cd::Codec::kivi, 4, 32}, raw);
  const double q2 = cd::reconstruction_quality(s, {cd::Codec::kivi, 2, 32}, raw);
  const double f8 = cd::reconstruction_quality(s, {cd::Codec::fp8}, raw);
  print_message("quality: kivi-8 %.4f, kivi-4 %.4f, kivi-2 %.4f, fp8 %.4f\n", q8, q4, q2, f8);
  assert_true(q8 < 1.0 && q8 > q4 && q4 > q2 && q2 > 0.0);
  assert_true(f8 > q4 && f8 < 1.0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(hot_compressible_stays_compressed_cold_goes_down_raw),
      cmocka_unit_test(room_for_all_changes_nothing),
      cmocka_unit_test(cheap_to_recompute_is_dropped),
      cmocka_unit_test(random_instances_keep_the_invariants),
      cmocka_unit_test(bad_input_is_einval),
      cmocka_unit_test(entry_choice_prices_bytes),
      cmocka_unit_test(reconstruction_quality_falls_with_the_bits),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
