// The staged copies of a layer grouped into 2D runs (core/transfer/copy_runs.hpp): pieces a chunk
// apart in host memory and side by side in staging become one run, whichever order the host
// tier handed their slots out in, once staging follows the host addresses; copies of other
// sizes, out of step, or a pitch past the 2D limit stay apart; and for any set of copies the
// runs, played row by row, copy exactly the bytes the copies do, each copy once.
#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "core/transfer/copy_runs.hpp"

// After the core headers: CMocka defines a macro named fail.
extern "C" {
#include <cmocka.h>
}

namespace {

using swiftkv::CopyRun;
using swiftkv::PieceCopy;

constexpr uint64_t kPiece = 1024, kLayers = 4, kSlot = kPiece * kLayers;  // one chunk's slot

// A host tier's slab of `slots` chunk slots, and a staging buffer.
struct Memory {
  std::vector<std::byte> host, staging;
  explicit Memory(uint64_t slots) : host(slots * kSlot), staging(slots * kPiece) {
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::byte>(i * 7 + i / 251);
  }
};

std::vector<CopyRun> runs_of(const std::vector<PieceCopy> &copies) {
  std::vector<CopyRun> runs;
  std::vector<uint32_t> scratch;
  swiftkv::copy_runs(copies.data(), copies.size(), runs, scratch);
  return runs;
}

// The runs as the copies they make: (dst, src, bytes) of every row.
std::multiset<std::tuple<const std::byte *, const std::byte *, uint64_t>> rows_of(
    const std::vector<CopyRun> &runs) {
  std::multiset<std::tuple<const std::byte *, const std::byte *, uint64_t>> out;
  for (const CopyRun &r : runs) {
    assert_true(r.rows >= 1);
    if (r.rows > 1) {
      assert_true(r.dst_pitch >= r.width && r.src_pitch >= r.width);
      assert_true(r.dst_pitch <= swiftkv::kMaxCopyPitch && r.src_pitch <= swiftkv::kMaxCopyPitch);
    }
    for (uint64_t i = 0; i < r.rows; ++i) {
      out.emplace(r.dst + i * r.dst_pitch, r.src + i * r.src_pitch, r.width);
    }
  }
  return out;
}

// Layer `layer` of the chunks in `slots` (chunk order), staged as staging_by_address lays them
// out: the copies a load makes, and the staging offsets.
std::vector<PieceCopy> load_copies(Memory &m, const std::vector<uint32_t> &slots, uint32_t layer) {
  std::vector<const std::byte *> addresses;
  std::vector<uint64_t> sizes(slots.size(), kPiece), offsets(slots.size());
  for (uint32_t s : slots) addresses.push_back(m.host.data() + s * kSlot);
  const uint64_t total =
      swiftkv::staging_by_address(addresses.data(), sizes.data(), slots.size(), offsets.data());
  assert_int_equal(total, slots.size() * kPiece);
  std::vector<PieceCopy> copies;
  for (size_t i = 0; i < slots.size(); ++i) {
    copies.push_back({m.staging.data() + offsets[i], addresses[i] + layer * kPiece, kPiece});
  }
  return copies;
}

void consecutive_slots_are_one_run_either_way(void **) {
  Memory m(16);
  std::vector<uint32_t> up(16), down(16);
  std::iota(up.begin(), up.end(), 0u);
  std::iota(down.rbegin(), down.rend(), 0u);  // a tier that handed the slots out last first
  for (const auto &slots : {up, down}) {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      const std::vector<CopyRun> runs = runs_of(load_copies(m, slots, layer));
      assert_int_equal(runs.size(), 1);
      assert_int_equal(runs[0].rows, 16);
      assert_int_equal(runs[0].width, kPiece);
      assert_int_equal(runs[0].src_pitch, kSlot);
      assert_int_equal(runs[0].dst_pitch, kPiece);
      assert_ptr_equal(runs[0].src, m.host.data() + layer * kPiece);
      assert_ptr_equal(runs[0].dst, m.staging.data());
    }
  }
}

void gaps_and_other_sizes_split_runs(void **) {
  Memory m(16);
  // Slots 0-3, 5-7 and 9: staging side by side, but the host steps change at the gaps.
  const std::vector<PieceCopy> copies = load_copies(m, {0, 1, 2, 3, 5, 6, 7, 9}, 1);
  std::vector<CopyRun> runs = runs_of(copies);
  assert_int_equal(runs.size(), 3);
  assert_int_equal(runs[0].rows, 4);
  assert_int_equal(runs[1].rows, 3);
  assert_int_equal(runs[2].rows, 1);
  assert_ptr_equal(runs[1].src, m.host.data() + 5 * kSlot + kPiece);
  assert_ptr_equal(runs[1].dst, m.staging.data() + 4 * kPiece);
  // A piece of another size (a chunk of another encoding) in the middle of a run splits it.
  std::vector<PieceCopy> odd = copies;
  odd[1].bytes = kPiece / 2;
  runs = runs_of(odd);
  assert_int_equal(runs.size(), 5);  // 0 | 1 | 2-3 | 5-7 | 9
  assert_int_equal(runs[1].rows, 1);
  assert_int_equal(runs[1].width, kPiece / 2);
  assert_int_equal(runs[2].rows, 2);
}

void a_pitch_past_the_limit_is_not_joined(void **) {
  // Addresses only (never read): two pieces 3 GiB apart, their staging side by side.
  auto *base = reinterpret_cast<std::byte *>(uintptr_t{1} << 40);
  auto *staging = reinterpret_cast<std::byte *>(uintptr_t{1} << 41);
  const uint64_t far = uint64_t{3} << 30;
  std::vector<PieceCopy> copies = {{staging, base, kPiece}, {staging + kPiece, base + far, kPiece}};
  std::vector<CopyRun> runs = runs_of(copies);
  assert_int_equal(runs.size(), 2);
  copies[1].src = base + swiftkv::kMaxCopyPitch;  // at the limit: joined
  runs = runs_of(copies);
  assert_int_equal(runs.size(), 1);
  assert_int_equal(runs[0].src_pitch, swiftkv::kMaxCopyPitch);
  copies[1].src = base + kPiece / 2;  // rows would overlap: apart
  assert_int_equal(runs_of(copies).size(), 2);
}

void staging_follows_addresses_nulls_last(void **) {
  Memory m(4);
  const std::byte *a = m.host.data(), *b = m.host.data() + kSlot;
  const std::vector<const std::byte *> addresses = {b, nullptr, a, nullptr};
  const std::vector<uint64_t> sizes = {100, 40, 1000, 16};
  std::vector<uint64_t> offsets(4);
  const uint64_t total =
      swiftkv::staging_by_address(addresses.data(), sizes.data(), 4, offsets.data());
  // a (1000 -> 1008), then b (100 -> 112), then the nulls in their order: 40 -> 48, 16.
  assert_int_equal(offsets[2], 0);
  assert_int_equal(offsets[0], 1008);
  assert_int_equal(offsets[1], 1120);
  assert_int_equal(offsets[3], 1168);
  assert_int_equal(total, 1184);
}

// Any set of copies: the runs make exactly the copies, and played row by row move the same
// bytes as the copies one by one.
void runs_make_exactly_the_copies(void **) {
  std::mt19937_64 rng(20261126);
  for (int round = 0; round < 300; ++round) {
    const auto slots = static_cast<uint32_t>(1 + rng() % 48);
    Memory m(slots);
    std::vector<uint32_t> order(slots);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), rng);
    // Mostly runs: a few slots swapped or skipped, some pieces of another size.
    std::vector<uint32_t> used;
    std::sort(order.begin(), order.begin() + slots / 2);
    for (uint32_t s : order) {
      if (rng() % 5 != 0) used.push_back(s);
    }
    if (used.empty()) continue;
    std::vector<PieceCopy> copies = load_copies(m, used, static_cast<uint32_t>(rng() % kLayers));
    if (rng() % 3 == 0) copies[rng() % copies.size()].bytes = kPiece / 4;
    std::multiset<std::tuple<const std::byte *, const std::byte *, uint64_t>> want;
    for (const PieceCopy &c : copies) want.emplace(c.dst, c.src, c.bytes);
    const std::vector<CopyRun> runs = runs_of(copies);
    assert_true(rows_of(runs) == want);
    for (size_t i = 1; i < runs.size(); ++i) assert_true(runs[i - 1].src < runs[i].src);
    std::vector<std::byte> expect(m.staging.size()), got(m.staging.size());
    for (const PieceCopy &c : copies) {
      std::memcpy(expect.data() + (c.dst - m.staging.data()), c.src, c.bytes);
    }
    for (const CopyRun &r : runs) {
      for (uint64_t i = 0; i < r.rows; ++i) {
        std::memcpy(got.data() + (r.dst + i * r.dst_pitch - m.staging.data()),
                    r.src + i * r.src_pitch, r.width);
      }
    }
    assert_true(got == expect);
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(consecutive_slots_are_one_run_either_way),
      cmocka_unit_test(gaps_and_other_sizes_split_runs),
      cmocka_unit_test(a_pitch_past_the_limit_is_not_joined),
      cmocka_unit_test(staging_follows_addresses_nulls_last),
      cmocka_unit_test(runs_make_exactly_the_copies),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
