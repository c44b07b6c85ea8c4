// The beat page: a heartbeat without a message, for a borrower and a lender on one host.
//
// A heartbeat message costs two processes about eight thread wake-ups (ZeroMQ's I/O threads on
// both sides) for a few dozen bytes. A borrower whose lender is on the same host instead makes
// one sealed memfd of kBeatPageBytes, passes it with its fd channel's auth packet, and from then
// on writes each heartbeat there: its lease ids, under a sequence number. The lender reads the
// page at its periodic scan, renews the named leases of that session as a heartbeat message
// would, and writes its answer (each named lease it holds, with its time left and reclaim flag)
// in its own half of the page; the borrower reads it at its next beat. Neither side is woken by
// the other: a beat costs the borrower's timer and a share of the lender's scan.
//
// Each half has one writer and is read as a seqlock: the writer makes the sequence odd, writes,
// and makes it even again; a reader that sees it odd, or changed across its copy, reads again
// later. Words are read and written through std::atomic_ref, so the two processes (or two
// mappings in one process) never race in the C++ sense. The lender trusts nothing it reads: a
// count past the page, an odd sequence or a lease of another session is ignored, and the page
// is sealed against shrinking before the lender maps it, so no borrower can make the lender's
// reads fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/common/unique_fd.hpp"
#include "core/coord/wire.hpp"

namespace swiftkv::coord {

inline constexpr size_t kBeatPageBytes = 8192;
inline constexpr size_t kBeatLeases = 240;                     // the most lease ids one beat names
inline constexpr uint64_t kBeatMagic = 0x3154414542564b53ull;  // "SKVBEAT1", little-endian

// A heartbeat written by the borrower: its sequence number (even, from 2) and the leases it asks
// renewed.
struct Beat {
  uint64_t seq = 0;
  std::vector<uint64_t> leases;
};

// The lender's answer to the beat `echo`: every lease that beat named and the session holds,
// as a heartbeat_ack lists them (remaining_ns below 2^63).
struct BeatAnswer {
  uint64_t echo = 0;
  std::vector<LeaseState> leases;
};

class BeatPage {
 public:
  BeatPage() noexcept = default;
  BeatPage(BeatPage &&o) noexcept;
  BeatPage &operator=(BeatPage &&o) noexcept;
  BeatPage(const BeatPage &) = delete;
  BeatPage &operator=(const BeatPage &) = delete;
  ~BeatPage();

  // The borrower's side: a fresh page, sealed against resizing. Throws Error(ENOMEM) when the
  // memfd cannot be made or mapped.
  static BeatPage create();
  // The lender's side: maps a page a borrower passed. Returns an empty page and says why when
  // `fd` is not a memfd sealed against shrinking, is smaller than kBeatPageBytes, or does not
  // start with kBeatMagic. Takes the fd in every case.
  static BeatPage adopt(UniqueFd fd, std::string *why);

  explicit operator bool() const noexcept { return words_ != nullptr; }
  int fd() const noexcept { return fd_.get(); }

  // The borrower's half. Writes `leases` (at most kBeatLeases) as the next beat; returns its
  // sequence number.
  uint64_t write_beat(const std::vector<uint64_t> &leases);
  // The lender's half, read: the newest beat, or false when none is there yet, the borrower is
  // writing it, or what is there does not add up (a count past the page).
  bool read_beat(Beat *out) const;

  // The lender's half. The lender says it reads the page (before the handshake's last packet
  // leaves), then answers beats.
  void accept();
  bool accepted() const;
  // Writes `answer` (at most kBeatLeases leases; remaining_ns is clamped below 2^63).
  void write_answer(const BeatAnswer &answer);
  // The borrower's half, read: the newest answer, or false when there is none, or it is being
  // written, or it does not add up.
  bool read_answer(BeatAnswer *out) const;

  // For tests of torn reads: make a half's sequence odd, as a writer that stopped mid-write.
  void tear_beat_for_test();
  void tear_answer_for_test();

 private:
  BeatPage(UniqueFd fd, uint64_t *words) noexcept : fd_(std::move(fd)), words_(words) {}
  uint64_t load(size_t word) const;
  void store(size_t word, uint64_t v);

  UniqueFd fd_;
  uint64_t *words_ = nullptr;  // kBeatPageBytes, mapped shared
  uint64_t beat_seq_ = 0;      // the borrower's: the last beat written
  uint64_t answer_seq_ = 0;    // the lender's: its answers' seqlock
};

}  // namespace swiftkv::coord
