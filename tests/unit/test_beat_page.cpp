// The beat page (core/coord/beat_page.hpp): beats and answers survive the trip through a second
// mapping of the same memfd word for word, up to 240 leases on a narrow page or with a lender
// that reads narrow pages only, up to 1024 on a wide page its lender accepted wide; a half being
// written, a count past what was mapped and a page the lender cannot trust are refused; the page
// is sealed so that nobody can resize it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/coord/beat_page.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

namespace co = swiftkv::coord;
using swiftkv::UniqueFd;

// The lender's view of a borrower's page: the same memfd, mapped again (kBeatPageBytes at most:
// as a lender of a version before wide pages).
co::BeatPage lender_view(const co::BeatPage &page, size_t max_bytes = co::kWideBeatPageBytes) {
  std::string why;
  co::BeatPage l =
      co::BeatPage::adopt(UniqueFd(::fcntl(page.fd(), F_DUPFD_CLOEXEC, 0)), &why, max_bytes);
  assert_true(static_cast<bool>(l));
  assert_true(why.empty());
  return l;
}

void beats_and_answers_cross_mappings(void **) {
  co::BeatPage b = co::BeatPage::create();
  co::BeatPage l = lender_view(b);
  co::Beat beat;
  assert_false(l.read_beat(&beat));  // nothing written yet
  assert_false(b.accepted());
  l.accept();
  assert_true(b.accepted());

  const uint64_t s1 = b.write_beat({5, 9, 1ull << 40});
  assert_int_equal(s1, 2);
  assert_true(l.read_beat(&beat));
  assert_int_equal(beat.seq, 2);
  assert_int_equal(beat.leases.size(), 3);
  assert_int_equal(beat.leases[2], 1ull << 40);
  const uint64_t s2 = b.write_beat({});
  assert_int_equal(s2, 4);
  assert_true(l.read_beat(&beat));
  assert_int_equal(beat.seq, 4);
  assert_int_equal(beat.leases.size(), 0);

  co::BeatAnswer a;
  assert_false(b.read_answer(&a));
  l.write_answer(co::BeatAnswer{4, {{5, 123, false}, {9, 1ull << 62, true}, {11, ~0ull, false}}});
  assert_true(b.read_answer(&a));
  assert_int_equal(a.echo, 4);
  assert_int_equal(a.leases.size(), 3);
  assert_int_equal(a.leases[0].lease, 5);
  assert_int_equal(a.leases[0].remaining_ns, 123);
  assert_false(a.leases[0].reclaim);
  assert_int_equal(a.leases[1].remaining_ns, 1ull << 62);
  assert_true(a.leases[1].reclaim);
  // A time left past 2^63 - 1 is clamped, never read as a reclaim.
  assert_int_equal(a.leases[2].remaining_ns, (1ull << 63) - 1);
  assert_false(a.leases[2].reclaim);
}

// A reader that says what it read last gets false for it, and what it holds is left as it was:
// the lender reads a beat, the borrower an answer, only when one is new.
void only_new_beats_and_answers_are_read(void **) {
  co::BeatPage b = co::BeatPage::create();
  co::BeatPage l = lender_view(b);
  l.accept();
  const uint64_t s1 = b.write_beat({3, 4});
  co::Beat beat{7, {1}};
  assert_false(l.read_beat(&beat, s1));
  assert_int_equal(beat.seq, 7);
  assert_int_equal(beat.leases.size(), 1);
  assert_true(l.read_beat(&beat, s1 - 1));
  assert_int_equal(beat.seq, s1);
  assert_int_equal(beat.leases.size(), 2);
  const uint64_t s2 = b.write_beat({3, 4, 5});
  assert_true(l.read_beat(&beat, s1));
  assert_int_equal(beat.seq, s2);
  assert_int_equal(beat.leases.size(), 3);
  assert_false(l.read_beat(&beat, s2));

  l.write_answer(co::BeatAnswer{s1, {{3, 10, false}, {4, 20, true}}});
  co::BeatAnswer a{99, {{1, 1, false}}};
  assert_false(b.read_answer(&a, s1));
  assert_int_equal(a.leases.size(), 1);
  assert_int_equal(a.leases[0].lease, 1);
  assert_false(b.read_answer(&a, s2));  // an answer to an older beat than one applied
  assert_true(b.read_answer(&a, s1 - 1));
  assert_int_equal(a.echo, s1);
  assert_int_equal(a.leases.size(), 2);
  assert_int_equal(a.leases[1].remaining_ns, 20);
  assert_true(a.leases[1].reclaim);
}

std::vector<uint64_t> ids_from(uint64_t first, size_t n) {
  std::vector<uint64_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = first + i;
  return ids;
}

// Writes a beat of `n` ids and its answer, and checks how many of each came through: `names`,
// each id in its place.
void round_trip(co::BeatPage &b, co::BeatPage &l, size_t n, size_t names) {
  const std::vector<uint64_t> ids = ids_from(1000, n);
  const uint64_t seq = b.write_beat(ids);
  co::Beat beat;
  assert_true(l.read_beat(&beat));
  assert_int_equal(beat.seq, seq);
  assert_int_equal(beat.leases.size(), names);
  for (size_t i = 0; i < names; ++i) assert_int_equal(beat.leases[i], 1000 + i);
  co::BeatAnswer a{seq, {}};
  for (uint64_t id : ids) a.leases.push_back(co::LeaseState{id, id * 3, id % 7 == 0});
  l.write_answer(a);
  co::BeatAnswer got;
  assert_true(b.read_answer(&got));
  assert_int_equal(got.echo, seq);
  assert_int_equal(got.leases.size(), names);
  for (size_t i = 0; i < names; ++i) {
    assert_int_equal(got.leases[i].lease, 1000 + i);
    assert_int_equal(got.leases[i].remaining_ns, (1000 + i) * 3);
    assert_int_equal(got.leases[i].reclaim, (1000 + i) % 7 == 0);
  }
}

// A wide page names kBeatLeases until its lender accepts it wide, then kWideBeatLeases: the ids
// and answers past the narrow page's lie in the wide page's rest, each in its place.
void the_most_a_beat_names(void **) {
  co::BeatPage b = co::BeatPage::create();
  co::BeatPage l = lender_view(b);
  assert_int_equal(b.capacity(), co::kBeatLeases);
  round_trip(b, l, co::kBeatLeases + 5, co::kBeatLeases);
  l.accept();
  assert_true(b.accepted());
  assert_int_equal(b.capacity(), co::kWideBeatLeases);
  assert_int_equal(l.capacity(), co::kWideBeatLeases);
  round_trip(b, l, co::kBeatLeases, co::kBeatLeases);
  round_trip(b, l, co::kBeatLeases + 1, co::kBeatLeases + 1);
  round_trip(b, l, co::kWideBeatLeases, co::kWideBeatLeases);
  round_trip(b, l, co::kWideBeatLeases + 9, co::kWideBeatLeases);
  round_trip(b, l, 3, 3);
}

// Versions before wide pages on either side: a narrow page (an earlier borrower's) with a lender
// that maps wide pages, and a wide page with a lender that maps the narrow page only. Either is
// accepted and names kBeatLeases, never more (the earlier lender sets no wide word).
void narrow_pages_and_narrow_lenders(void **) {
  {
    co::BeatPage b = co::BeatPage::create(co::kBeatPageBytes);
    struct stat st {};
    assert_int_equal(::fstat(b.fd(), &st), 0);
    assert_int_equal(st.st_size, co::kBeatPageBytes);
    co::BeatPage l = lender_view(b);
    l.accept();
    assert_true(b.accepted());
    assert_int_equal(b.capacity(), co::kBeatLeases);
    assert_int_equal(l.capacity(), co::kBeatLeases);
    round_trip(b, l, co::kBeatLeases + 5, co::kBeatLeases);
  }
  {
    co::BeatPage b = co::BeatPage::create();
    co::BeatPage l = lender_view(b, co::kBeatPageBytes);
    l.accept();
    assert_true(b.accepted());
    assert_int_equal(b.capacity(), co::kBeatLeases);
    round_trip(b, l, co::kBeatLeases + 5, co::kBeatLeases);
    round_trip(b, l, 7, 7);
  }
}

// A writer that stopped mid-write leaves its half odd: nothing is read from it, and the next
// whole write is read again.
void a_half_being_written_is_not_read(void **) {
  co::BeatPage b = co::BeatPage::create();
  co::BeatPage l = lender_view(b);
  b.write_beat({1});
  l.write_answer(co::BeatAnswer{2, {{1, 10, false}}});
  b.tear_beat_for_test();
  l.tear_answer_for_test();
  co::Beat beat;
  co::BeatAnswer a;
  assert_false(l.read_beat(&beat));
  assert_false(b.read_answer(&a));
  b.write_beat({1, 2});
  l.write_answer(co::BeatAnswer{4, {}});
  assert_true(l.read_beat(&beat));
  assert_int_equal(beat.leases.size(), 2);
  assert_true(b.read_answer(&a));
  assert_int_equal(a.echo, 4);
}

// The words as a hostile borrower could write them: a count past what the reader mapped is
// refused (past kWideBeatLeases on a wide mapping, past kBeatLeases on a narrow one, whatever
// the page's wide word says).
void a_count_past_the_page_is_refused(void **) {
  co::BeatPage b = co::BeatPage::create();
  co::BeatPage l = lender_view(b);
  co::BeatPage narrow = lender_view(b, co::kBeatPageBytes);
  l.accept();
  b.write_beat({1});
  auto *w = static_cast<uint64_t *>(
      ::mmap(nullptr, co::kWideBeatPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd(), 0));
  assert_true(w != MAP_FAILED);
  co::Beat beat;
  w[9] = co::kBeatLeases + 1;  // the beat's count
  assert_true(l.read_beat(&beat));
  assert_false(narrow.read_beat(&beat));
  w[9] = co::kWideBeatLeases + 1;
  assert_false(l.read_beat(&beat));
  w[9] = ~0ull;
  assert_false(l.read_beat(&beat));
  w[515] = co::kWideBeatLeases + 1;  // the answer's count
  l.tear_answer_for_test();
  co::BeatAnswer a;
  assert_false(b.read_answer(&a));
  ::munmap(w, co::kWideBeatPageBytes);
}

void untrusted_pages_are_refused(void **) {
  std::string why;
  // Not a memfd.
  int p[2];
  assert_int_equal(::pipe2(p, O_CLOEXEC), 0);
  ::close(p[1]);
  assert_false(static_cast<bool>(co::BeatPage::adopt(UniqueFd(p[0]), &why)));
  assert_string_equal(why.c_str(), "the beat page is not a memfd");
  // A memfd the borrower could still shrink under the lender.
  UniqueFd open(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  assert_int_equal(::ftruncate(open.get(), co::kBeatPageBytes), 0);
  assert_false(static_cast<bool>(co::BeatPage::adopt(std::move(open), &why)));
  assert_string_equal(why.c_str(), "the beat page is not sealed against shrinking");
  // Sealed, but too small.
  UniqueFd small(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  assert_int_equal(::ftruncate(small.get(), 4096), 0);
  assert_int_equal(::fcntl(small.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  assert_false(static_cast<bool>(co::BeatPage::adopt(std::move(small), &why)));
  assert_string_equal(why.c_str(), "the beat page is smaller than 8192 bytes");
  // Sealed and whole, but not a beat page.
  UniqueFd blank(::memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  assert_int_equal(::ftruncate(blank.get(), co::kBeatPageBytes), 0);
  assert_int_equal(::fcntl(blank.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
  assert_false(static_cast<bool>(co::BeatPage::adopt(std::move(blank), &why)));
  assert_string_equal(why.c_str(), "the beat page does not start with its magic");
}

// The borrower's own page cannot be shrunk or grown by anyone holding its fd.
void the_page_is_sealed(void **) {
  co::BeatPage b = co::BeatPage::create();
  assert_int_not_equal(::ftruncate(b.fd(), 0), 0);
  assert_int_not_equal(::ftruncate(b.fd(), co::kBeatPageBytes), 0);
  assert_int_not_equal(::ftruncate(b.fd(), 2 * co::kWideBeatPageBytes), 0);
  assert_int_not_equal(::fcntl(b.fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);  // F_SEAL_SEAL
}

// Beats and answers written as fast as they go while the other side reads: every read is whole
// (its ids are the ones written under that sequence number), on both sides of the narrow page's
// end.
void concurrent_reads_are_whole(void **) {
  co::BeatPage b = co::BeatPage::create();
  co::BeatPage l = lender_view(b);
  l.accept();
  std::thread writer([&] {
    for (uint64_t k = 1; k <= 20000; ++k) {
      const uint64_t n = k % 50 + (k % 2) * co::kBeatLeases;
      std::vector<uint64_t> ids(n);
      for (uint64_t i = 0; i < n; ++i) ids[i] = k * 1000 + i;
      b.write_beat(ids);
    }
  });
  uint64_t whole = 0, last = 0;
  co::Beat beat;
  while (last < 40000) {
    if (!l.read_beat(&beat)) continue;
    const uint64_t k = beat.seq / 2;
    assert_true(beat.seq >= last);
    assert_int_equal(beat.leases.size(), k % 50 + (k % 2) * co::kBeatLeases);
    for (size_t i = 0; i < beat.leases.size(); ++i) assert_int_equal(beat.leases[i], k * 1000 + i);
    last = beat.seq;
    ++whole;
  }
  writer.join();
  assert_true(whole >= 1);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(beats_and_answers_cross_mappings),
      cmocka_unit_test(only_new_beats_and_answers_are_read),
      cmocka_unit_test(the_most_a_beat_names),
      cmocka_unit_test(narrow_pages_and_narrow_lenders),
      cmocka_unit_test(a_half_being_written_is_not_read),
      cmocka_unit_test(a_count_past_the_page_is_refused),
      cmocka_unit_test(untrusted_pages_are_refused),
      cmocka_unit_test(the_page_is_sealed),
      cmocka_unit_test(concurrent_reads_are_whole),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
