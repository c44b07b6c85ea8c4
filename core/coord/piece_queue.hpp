// The borrower's side of the fd channel: memory pieces kept by request tag until the message that
// asks for them (a Grant, or the handshake) has arrived and every packet it names is in.
//
// A grant travels in two pieces, a ZeroMQ message and fd packets on a Unix socket, and nothing
// orders the two: the packets may come before, around or after their grant. So a packet is kept
// under its tag whichever comes first, and a set of pieces is handed out only when both sides
// agree: the grant's packet count, the packets' own `more` countdown, pieces that ascend without
// overlap inside the region, one fd per piece. Anything else is a protocol error the caller fails
// the session with; nothing is dropped without the caller being told.
//
// Bounds per session: kMaxQueuedPackets packets, kMaxQueuedFds fds, and twice the region's bytes
// of pieces (each lease's granules once, with room for the granules two leases share). A packet
// past them is a protocol error too: a lender cannot make a borrower hold unbounded fds.
//
// Single-threaded: the coordinator's thread owns it. Time is passed in, never read here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/coord/fd_channel.hpp"
#include "core/memory/memory_region.hpp"

namespace swiftkv::coord {

inline constexpr size_t kMaxQueuedPackets = 256;
inline constexpr size_t kMaxQueuedFds = 4096;

class PieceQueue {
 public:
  explicit PieceQueue(uint64_t region_bytes) : region_bytes_(region_bytes) {}

  // What the caller knows of a tag: a request waiting for its pieces (or the handshake's tag 0
  // while it runs), a request answered or given up already (its late pieces are closed), or
  // a tag this side never sent (a forgery).
  enum class TagUse { wanted, stale, foreign };

  struct Result {
    enum class Kind {
      kept,      // queued; the message or more packets are still to come
      complete,  // the tag's pieces are all in and its message has come: take() them
      stale,     // a late packet for a tag nobody waits for: its fds are closed
      error,     // a protocol error: `error` says what; the tag's pieces are closed
    } kind = Kind::kept;
    uint64_t tag = 0;
    std::string error;
  };

  // One packet from the fd channel; its fds are kept or closed, never leaked.
  Result add_packet(FdPacket p, const std::function<TagUse(uint64_t)> &use);

  // The message that asks for `tag`'s pieces has come: `packets` of them (nullopt: as many as
  // the first packet's countdown says, the handshake's case), wanted by `deadline_ns`.
  Result expect(uint64_t tag, std::optional<uint32_t> packets, uint64_t deadline_ns);

  // The pieces of a complete tag, in the order they came; the tag is forgotten.
  std::vector<ExportedPiece> take(uint64_t tag);
  // Forgets a tag and closes its fds; the packets it held (0 when none).
  size_t discard(uint64_t tag);
  // Closes every fd held.
  void clear() noexcept;

  // Tags whose message came but whose packets did not all arrive by its deadline, with how many
  // did and how many were named; and tags without a message that `use` no longer wants. Both
  // are for the caller to refuse or discard.
  struct Overdue {
    uint64_t tag = 0;
    uint32_t received = 0;
    uint32_t expected = 0;  // 0: not known yet (no packet came)
  };
  std::vector<Overdue> overdue(uint64_t now_ns) const;
  std::vector<uint64_t> unwanted(const std::function<TagUse(uint64_t)> &use) const;
  // The earliest deadline of a tag whose message came; UINT64_MAX when none.
  uint64_t next_deadline_ns() const noexcept;

  size_t packets() const noexcept { return packets_; }
  size_t fds() const noexcept { return fds_; }
  uint64_t bytes() const noexcept { return bytes_; }
  bool empty() const noexcept { return entries_.empty(); }

 private:
  struct Entry {
    std::vector<ExportedPiece> pieces;
    uint32_t received = 0;             // packets
    std::optional<uint32_t> expected;  // packets in all, from the first packet or the message
    bool asked = false;                // the message came
    uint64_t deadline_ns = 0;
    uint64_t bytes = 0;
  };
  Result fail_tag(uint64_t tag, std::string why);
  void forget(std::map<uint64_t, Entry>::iterator it) noexcept;
  static bool complete(const Entry &e) noexcept {
    return e.asked && e.expected && e.received == *e.expected;
  }

  uint64_t region_bytes_;
  std::map<uint64_t, Entry> entries_;  // by tag
  size_t packets_ = 0, fds_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace swiftkv::coord
