// The beat page: a heartbeat without a message, for a borrower and a lender on one host.
//
// A heartbeat message costs two processes about eight thread wake-ups (ZeroMQ's I/O threads on
// both sides) for a few dozen bytes. A borrower whose lender is on the same host instead makes
// one sealed memfd of kWideBeatPageBytes, passes it with its fd channel's auth packet, and from
// then on writes each heartbeat there: its lease ids, under a sequence number. The lender reads
// the page at its periodic scan, renews the named leases of that session as a heartbeat message
// would, and writes its answer (each named lease it holds, with its time left and reclaim flag)
// in its own half of the page; the borrower reads it at its next beat. Neither side is woken by
// the other: a beat costs the borrower's timer and a share of the lender's scan.
//
// Narrow and wide. The first kBeatPageBytes hold a beat of up to kBeatLeases ids and its answer;
// every lender reads them, and a lender of an earlier build reads nothing else (it takes any
// sealed page of at least that size). The rest of a wide page holds the ids and answers past
// kBeatLeases, up to kWideBeatLeases (what one borrower may hold of one lender), and a word the
// lender sets when it accepts the page wide. A borrower names more than kBeatLeases leases in a
// beat only once its lender said so; until then (a narrow lender) such a session heartbeats by
// message.
//
// Each half has one writer and is read as a seqlock: the writer makes the sequence odd, writes,
// and makes it even again; a reader that sees it odd, or changed across its copy, reads again
// later. Words are read and written through std::atomic_ref, so the two processes (or two
// mappings in one process) never race in the C++ sense. The lender trusts nothing it reads: a
// count past what it mapped, an odd sequence or a lease of another session is ignored, and the
// page is sealed against shrinking before the lender maps it, so no borrower can make the
// lender's reads fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/common/unique_fd.hpp"
#include "core/coord/wire.hpp"

namespace swiftkv::coord {

// The narrow page, the least a lender takes, and the most lease ids a beat on it names.
inline constexpr size_t kBeatPageBytes = 8192;
inline constexpr size_t kBeatLeases = 240;
// The page a borrower makes, and the most lease ids a beat names once its lender accepted it
// wide: all a borrower may hold of one lender.
inline constexpr size_t kWideBeatPageBytes = 32768;
inline constexpr size_t kWideBeatLeases = kMaxLeasesPerMessage;
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

  // The borrower's side: a fresh page of `bytes` (kWideBeatPageBytes, or kBeatPageBytes as a
  // borrower of a build before wide pages), sealed against resizing. Throws Error(ENOMEM)
  // when the memfd cannot be made or mapped.
  static BeatPage create(size_t bytes = kWideBeatPageBytes);
  // The lender's side: maps a page a borrower passed, wide when it holds kWideBeatPageBytes and
  // `max_bytes` allows (kBeatPageBytes: as a lender that reads narrow pages only, for tests).
  // Returns an empty page and says why when `fd` is not a memfd sealed against shrinking, is
  // smaller than kBeatPageBytes, or does not start with kBeatMagic. Takes the fd in every case.
  static BeatPage adopt(UniqueFd fd, std::string *why, size_t max_bytes = kWideBeatPageBytes);

  explicit operator bool() const noexcept { return words_ != nullptr; }
  int fd() const noexcept { return fd_.get(); }

  // The most lease ids a beat names here: kWideBeatLeases on a wide page its lender accepted
  // wide, else kBeatLeases.
  size_t capacity() const;
  // The borrower's half. Writes `leases` (at most capacity()) as the next beat; returns its
  // sequence number.
  uint64_t write_beat(const std::vector<uint64_t> &leases);
  // The lender's half, read: the newest beat, or false when none is there yet, the borrower is
  // writing it, or what is there does not add up (a count past the page). False too, reading
  // none of its ids, when its sequence number is not past `newer_than` (one already read).
  bool read_beat(Beat *out, uint64_t newer_than = 0) const;

  // The lender's half. The lender says it reads the page (before the handshake's last packet
  // leaves), and reads it wide if it mapped it wide, then answers beats.
  void accept();
  bool accepted() const;
  // Writes `answer` (as many leases as a beat names here, the most; remaining_ns is clamped
  // below 2^63).
  void write_answer(const BeatAnswer &answer);
  // The borrower's half, read: the newest answer, or false when there is none, or it is being
  // written, or it does not add up. False too, reading none of its leases, when the beat it
  // answers is not past `newer_than` (an answer already applied).
  bool read_answer(BeatAnswer *out, uint64_t newer_than = 0) const;

  // For tests of torn reads: make a half's sequence odd, as a writer that stopped mid-write.
  void tear_beat_for_test();
  void tear_answer_for_test();

 private:
  BeatPage(UniqueFd fd, uint64_t *words, size_t bytes) noexcept
      : fd_(std::move(fd)), words_(words), bytes_(bytes) {}
  uint64_t load(size_t word) const;
  void store(size_t word, uint64_t v);
  bool wide() const noexcept { return bytes_ >= kWideBeatPageBytes; }
  // The most ids a beat or an answer read from this mapping may hold.
  size_t mapped_leases() const noexcept { return wide() ? kWideBeatLeases : kBeatLeases; }

  UniqueFd fd_;
  uint64_t *words_ = nullptr;  // bytes_, mapped shared
  size_t bytes_ = 0;           // kBeatPageBytes or kWideBeatPageBytes
  uint64_t beat_seq_ = 0;      // the borrower's: the last beat written
  uint64_t answer_seq_ = 0;    // the lender's: its answers' seqlock
};

}  // namespace swiftkv::coord
