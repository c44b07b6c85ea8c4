// The fd channel's piece queue on its own: a grant's pieces meet their grant whatever order the
// two arrive in (before, after, split around it), and every malformed, forged, surplus or
// excessive packet is refused with a message, its tag forgotten and every fd it carried closed,
// while other tags' pieces stay as they were.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/coord/piece_queue.hpp"
#include "core/coord/wire.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

namespace co = swiftkv::coord;
using Kind = co::PieceQueue::Result::Kind;
using Use = co::PieceQueue::TagUse;

constexpr uint64_t kGranule = 4096;
constexpr uint64_t kRegion = 64 * kGranule;

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

// A packet of `tag` whose pieces are granules `first`, `first + 1`, ... (`n` of them), each with
// an fd of its own (`fds` of them; n unless a test wants a mismatch); the fds' numbers go to
// *numbers for checking later whether they were closed.
co::FdPacket packet(uint64_t tag, uint32_t more, uint64_t first, size_t n,
                    std::vector<int> *numbers, size_t fds = SIZE_MAX) {
  co::PiecePacket pp;
  pp.tag = tag;
  pp.more = more;
  for (size_t i = 0; i < n; ++i) pp.pieces.push_back({(first + i) * kGranule, kGranule, 1});
  co::FdPacket p;
  p.bytes = co::encode_pieces(pp);
  for (size_t i = 0; i < (fds == SIZE_MAX ? n : fds); ++i) {
    p.fds.emplace_back(::eventfd(0, EFD_CLOEXEC));
    if (numbers != nullptr) numbers->push_back(p.fds.back().get());
  }
  return p;
}

const std::function<Use(uint64_t)> kAllWanted = [](uint64_t) { return Use::wanted; };

void expect_error(const co::PieceQueue::Result &r, const char *needle) {
  assert_int_equal(static_cast<int>(r.kind), static_cast<int>(Kind::error));
  if (r.error.find(needle) == std::string::npos) {
    fail_msg("error \"%s\" does not say \"%s\"", r.error.c_str(), needle);
  }
}

void expect_closed(const std::vector<int> &fds) {
  for (int fd : fds) {
    if (is_open(fd)) fail_msg("fd %d was left open", fd);
  }
}

// The pieces, taken, are the granules sent, in order, with the very fds sent.
void expect_taken(co::PieceQueue &q, uint64_t tag, uint64_t first, const std::vector<int> &fds) {
  const std::vector<swiftkv::ExportedPiece> got = q.take(tag);
  assert_int_equal(got.size(), fds.size());
  for (size_t i = 0; i < got.size(); ++i) {
    assert_int_equal(got[i].offset, (first + i) * kGranule);
    assert_int_equal(got[i].fd.get(), fds[i]);
  }
}

void any_order(void **) {
  // Before: both packets, then the grant completes it.
  co::PieceQueue q(kRegion);
  std::vector<int> fds;
  assert_int_equal(static_cast<int>(q.add_packet(packet(5, 1, 0, 3, &fds), kAllWanted).kind),
                   static_cast<int>(Kind::kept));
  assert_int_equal(static_cast<int>(q.add_packet(packet(5, 0, 3, 2, &fds), kAllWanted).kind),
                   static_cast<int>(Kind::kept));  // all in, but nobody asked yet
  assert_int_equal(q.packets(), 2);
  assert_int_equal(q.fds(), 5);
  assert_int_equal(q.bytes(), 5 * kGranule);
  assert_int_equal(static_cast<int>(q.expect(5, 2, 100).kind), static_cast<int>(Kind::complete));
  expect_taken(q, 5, 0, fds);
  assert_true(q.empty());
  assert_int_equal(q.packets() + q.fds() + q.bytes(), 0);

  // After: the grant waits, the last packet completes it.
  fds.clear();
  assert_int_equal(static_cast<int>(q.expect(6, 2, 100).kind), static_cast<int>(Kind::kept));
  assert_int_equal(q.next_deadline_ns(), 100);
  assert_int_equal(static_cast<int>(q.add_packet(packet(6, 1, 8, 1, &fds), kAllWanted).kind),
                   static_cast<int>(Kind::kept));
  assert_int_equal(static_cast<int>(q.add_packet(packet(6, 0, 9, 1, &fds), kAllWanted).kind),
                   static_cast<int>(Kind::complete));
  expect_taken(q, 6, 8, fds);

  // Split around the grant, with another tag interleaved; and a grant of no pieces.
  std::vector<int> a, b;
  q.add_packet(packet(7, 1, 20, 2, &a), kAllWanted);
  q.add_packet(packet(8, 0, 30, 1, &b), kAllWanted);
  assert_int_equal(static_cast<int>(q.expect(7, 2, 100).kind), static_cast<int>(Kind::kept));
  assert_int_equal(static_cast<int>(q.add_packet(packet(7, 0, 22, 1, &a), kAllWanted).kind),
                   static_cast<int>(Kind::complete));
  assert_int_equal(static_cast<int>(q.expect(8, 1, 100).kind), static_cast<int>(Kind::complete));
  assert_int_equal(static_cast<int>(q.expect(9, 0, 100).kind), static_cast<int>(Kind::complete));
  expect_taken(q, 7, 20, a);
  expect_taken(q, 8, 30, b);
  assert_true(q.take(9).empty());
  assert_true(q.empty());

  // The handshake: no count in its message; the first packet's countdown decides.
  fds.clear();
  assert_int_equal(static_cast<int>(q.expect(0, std::nullopt, 100).kind),
                   static_cast<int>(Kind::kept));
  assert_int_equal(static_cast<int>(q.add_packet(packet(0, 1, 0, 1, &fds), kAllWanted).kind),
                   static_cast<int>(Kind::kept));
  assert_int_equal(static_cast<int>(q.add_packet(packet(0, 0, 1, 1, &fds), kAllWanted).kind),
                   static_cast<int>(Kind::complete));
  expect_taken(q, 0, 0, fds);
}

void refusals_close_everything(void **) {
  co::PieceQueue q(kRegion);
  // A bystander tag whose pieces must survive every refusal below.
  std::vector<int> keep;
  q.add_packet(packet(1, 0, 60, 2, &keep), kAllWanted);

  struct Case {
    const char *what;
    std::function<co::PieceQueue::Result(std::vector<int> *)> run;
    const char *needle;
  };
  const auto foreign = [](uint64_t) { return Use::foreign; };
  const Case cases[] = {
      {"foreign", [&](auto *f) { return q.add_packet(packet(99, 0, 0, 1, f), foreign); },
       "never asked for"},
      {"fewer fds", [&](auto *f) { return q.add_packet(packet(2, 0, 0, 2, f, 1), kAllWanted); },
       "2 pieces with 1 fds"},
      {"more fds", [&](auto *f) { return q.add_packet(packet(2, 0, 0, 1, f, 2), kAllWanted); },
       "1 pieces with 2 fds"},
      {"outside", [&](auto *f) { return q.add_packet(packet(2, 0, 63, 2, f), kAllWanted); },
       "outside the region"},
      {"overlap in a packet",
       [&](auto *f) {
         co::FdPacket p = packet(2, 0, 0, 2, f);
         co::PiecePacket pp;
         pp.tag = 2;
         pp.pieces = {{kGranule, kGranule, 1}, {0, kGranule, 1}};  // descending
         p.bytes = co::encode_pieces(pp);
         return q.add_packet(std::move(p), kAllWanted);
       },
       "do not ascend"},
      {"overlap across packets",
       [&](auto *f) {
         q.add_packet(packet(2, 1, 4, 2, f), kAllWanted);
         return q.add_packet(packet(2, 0, 5, 1, f), kAllWanted);
       },
       "do not ascend"},
      {"countdown",
       [&](auto *f) {
         q.add_packet(packet(2, 2, 0, 1, f), kAllWanted);
         return q.add_packet(packet(2, 0, 1, 1, f), kAllWanted);  // 1 should follow, says 0
       },
       "says 0 follow"},
      {"surplus",
       [&](auto *f) {
         q.add_packet(packet(2, 0, 0, 1, f), kAllWanted);
         return q.add_packet(packet(2, 0, 1, 1, f), kAllWanted);
       },
       "surplus"},
      {"grant disagrees",
       [&](auto *f) {
         q.add_packet(packet(2, 1, 0, 1, f), kAllWanted);
         return q.expect(2, 3, 100);
       },
       "naming 3 piece packets where its first packet named 2"},
      {"second grant",
       [&](auto *f) {
         q.add_packet(packet(2, 1, 0, 1, f), kAllWanted);
         q.expect(2, 2, 100);
         return q.expect(2, 2, 100);
       },
       "a second grant"},
      {"junk bytes",
       [&](auto *f) {
         co::FdPacket p = packet(2, 0, 0, 1, f);
         p.bytes.resize(5);
         return q.add_packet(std::move(p), kAllWanted);
       },
       "malformed"},
  };
  for (const Case &c : cases) {
    std::vector<int> fds;
    const co::PieceQueue::Result r = c.run(&fds);
    if (r.kind != Kind::error) fail_msg("%s: accepted", c.what);
    expect_error(r, c.needle);
    expect_closed(fds);
    // Only the bystander is left, whole.
    assert_int_equal(q.packets(), 1);
    assert_int_equal(q.fds(), 2);
    assert_int_equal(q.bytes(), 2 * kGranule);
    for (int fd : keep) assert_true(is_open(fd));
  }

  // A late packet for an answered request is stale: closed, nothing kept.
  std::vector<int> late;
  const auto stale = [](uint64_t) { return Use::stale; };
  assert_int_equal(static_cast<int>(q.add_packet(packet(3, 0, 0, 2, &late), stale).kind),
                   static_cast<int>(Kind::stale));
  expect_closed(late);
  assert_int_equal(q.packets(), 1);
  // discard and clear close what they forget.
  assert_int_equal(q.discard(1), 1);
  expect_closed(keep);
  std::vector<int> more;
  q.add_packet(packet(4, 0, 0, 3, &more), kAllWanted);
  q.clear();
  expect_closed(more);
  assert_int_equal(q.packets() + q.fds() + q.bytes(), 0);
}

// A lender cannot make a borrower hold more than the bounds: packets, fds, bytes.
void bounds(void **) {
  {
    co::PieceQueue q(1 << 30);  // room for the bytes: the count is what runs out
    std::vector<int> fds;
    // 256 one-piece packets of one tag fit (countdown from 299); the 257th is refused and
    // every fd of the tag is closed.
    for (uint32_t i = 0; i < co::kMaxQueuedPackets; ++i) {
      const uint64_t tag = 1 + i / 32;  // eight tags of 32 packets
      const uint32_t in_tag = i % 32;
      const co::PieceQueue::Result r =
          q.add_packet(packet(tag, 299 - in_tag, in_tag, 1, &fds), kAllWanted);
      assert_int_equal(static_cast<int>(r.kind), static_cast<int>(Kind::kept));
    }
    std::vector<int> last;
    expect_error(q.add_packet(packet(8, 299 - 32, 32, 1, &last), kAllWanted),
                 "more memory ahead of its grants");
    expect_closed(last);
    assert_int_equal(q.packets(), co::kMaxQueuedPackets - 32);  // tag 8's went with it
  }
  {
    // Bytes: twice the region at most, whatever the count.
    co::PieceQueue q(kRegion);
    std::vector<int> fds;
    for (uint64_t tag = 1; tag <= 2; ++tag) {
      assert_int_equal(static_cast<int>(q.add_packet(packet(tag, 0, 0, 64, &fds), kAllWanted).kind),
                       static_cast<int>(Kind::kept));
    }
    assert_int_equal(q.bytes(), 2 * kRegion);
    std::vector<int> over;
    expect_error(q.add_packet(packet(3, 0, 0, 1, &over), kAllWanted), "bytes");
    expect_closed(over);
  }
  {
    // Fds: a region of many small pieces reaches the fd bound first.
    co::PieceQueue q(1 << 30);
    std::vector<int> fds;
    for (uint64_t tag = 1; tag <= co::kMaxQueuedFds / 128; ++tag) {
      co::PieceQueue::Result r = q.add_packet(packet(tag, 0, 0, 128, &fds), kAllWanted);
      assert_int_equal(static_cast<int>(r.kind), static_cast<int>(Kind::kept));
    }
    std::vector<int> over;
    expect_error(q.add_packet(packet(99, 0, 0, 1, &over), kAllWanted), "4097 fds");
    expect_closed(over);
  }
}

// Grants whose packets do not come by their deadline, and packets whose request was given up.
void overdue_and_unwanted(void **) {
  co::PieceQueue q(kRegion);
  std::vector<int> fds;
  q.expect(1, 2, 100);
  q.add_packet(packet(1, 1, 0, 1, &fds), kAllWanted);
  q.expect(2, 1, 300);
  q.add_packet(packet(3, 0, 5, 1, &fds), kAllWanted);  // no grant yet
  assert_int_equal(q.next_deadline_ns(), 100);
  assert_true(q.overdue(99).empty());
  const auto late = q.overdue(100);
  assert_int_equal(late.size(), 1);
  assert_int_equal(late[0].tag, 1);
  assert_int_equal(late[0].received, 1);
  assert_int_equal(late[0].expected, 2);
  assert_int_equal(q.overdue(300).size(), 2);
  // Only tag 3 has no grant; it is unwanted once its request is answered.
  assert_true(q.unwanted(kAllWanted).empty());
  const auto gone = q.unwanted([](uint64_t t) { return t == 3 ? Use::stale : Use::wanted; });
  assert_int_equal(gone.size(), 1);
  assert_int_equal(gone[0], 3);
}

}  // namespace

int main() {
  // The fd bound is 4096 held at once: room for it past the usual soft limit of 1024.
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < 8192) {
    r.rlim_cur = std::min<rlim_t>(r.rlim_max, 8192);
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(any_order),
      cmocka_unit_test(refusals_close_everything),
      cmocka_unit_test(bounds),
      cmocka_unit_test(overdue_and_unwanted),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
