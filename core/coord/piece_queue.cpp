// The fd channel's piece queue (see piece_queue.hpp): every packet is checked whole before any
// of it is kept, and every fd ends up either in take()'s result or closed.
#include "core/coord/piece_queue.hpp"

#include <algorithm>
#include <utility>

#include "core/coord/wire.hpp"

namespace swiftkv::coord {

PieceQueue::Result PieceQueue::fail_tag(uint64_t tag, std::string why) {
  if (const auto it = entries_.find(tag); it != entries_.end()) forget(it);
  return Result{Result::Kind::error, tag, std::move(why)};
}

void PieceQueue::forget(std::map<uint64_t, Entry>::iterator it) noexcept {
  packets_ -= it->second.received;
  fds_ -= it->second.pieces.size();
  bytes_ -= it->second.bytes;
  entries_.erase(it);  // closes the fds
}

PieceQueue::Result PieceQueue::add_packet(FdPacket p, const std::function<TagUse(uint64_t)> &use) {
  std::string error;
  const std::optional<PiecePacket> pp = decode_pieces(p.bytes, &error);
  if (!pp) return Result{Result::Kind::error, 0, error};
  const uint64_t tag = pp->tag;
  switch (use(tag)) {
    case TagUse::wanted: break;
    case TagUse::stale: return Result{Result::Kind::stale, tag, {}};
    case TagUse::foreign:
      return Result{Result::Kind::error, tag,
                    "a piece packet for request " + std::to_string(tag) +
                        ", which this borrower never asked for"};
  }
  if (pp->pieces.size() != p.fds.size()) {
    return fail_tag(tag, "a piece packet of " + std::to_string(pp->pieces.size()) +
                             " pieces with " + std::to_string(p.fds.size()) + " fds");
  }
  const auto found = entries_.find(tag);
  const Entry *e = found == entries_.end() ? nullptr : &found->second;
  // The countdown: the first packet says how many follow, each later one one fewer.
  const uint32_t expected = e != nullptr && e->expected ? *e->expected : pp->more + 1;
  const uint32_t received = e != nullptr ? e->received : 0;
  if (received >= expected) {
    return fail_tag(tag, "a surplus piece packet for request " + std::to_string(tag) + " (" +
                             std::to_string(expected) + " were named)");
  }
  if (pp->more != expected - received - 1) {
    return fail_tag(tag, "piece packet " + std::to_string(received + 1) + " of " +
                             std::to_string(expected) + " for request " + std::to_string(tag) +
                             " says " + std::to_string(pp->more) + " follow");
  }
  // Pieces ascend without overlap, inside the region, after the tag's earlier ones.
  uint64_t floor =
      e != nullptr && !e->pieces.empty() ? e->pieces.back().offset + e->pieces.back().size : 0;
  uint64_t bytes = 0;
  for (const WirePiece &w : pp->pieces) {
    if (w.size == 0 || w.offset > region_bytes_ || w.size > region_bytes_ - w.offset) {
      return fail_tag(tag, "a piece outside the region (offset " + std::to_string(w.offset) + ", " +
                               std::to_string(w.size) + " bytes)");
    }
    if (w.offset < floor) {
      return fail_tag(
          tag, "pieces that overlap or do not ascend (offset " + std::to_string(w.offset) + ")");
    }
    floor = w.offset + w.size;
    bytes += w.size;
  }
  if (packets_ + 1 > kMaxQueuedPackets || fds_ + p.fds.size() > kMaxQueuedFds ||
      bytes_ + bytes > 2 * region_bytes_) {
    return fail_tag(tag, "more memory ahead of its grants than a session may hold (" +
                             std::to_string(packets_ + 1) + " packets, " +
                             std::to_string(fds_ + p.fds.size()) + " fds, " +
                             std::to_string(bytes_ + bytes) + " bytes)");
  }
  Entry &entry = entries_[tag];
  entry.expected = expected;
  ++entry.received;
  for (size_t i = 0; i < pp->pieces.size(); ++i) {
    ExportedPiece piece;
    piece.offset = pp->pieces[i].offset;
    piece.size = pp->pieces[i].size;
    piece.generation = pp->pieces[i].generation;
    piece.fd = std::move(p.fds[i]);
    entry.pieces.push_back(std::move(piece));
  }
  entry.bytes += bytes;
  ++packets_;
  fds_ += pp->pieces.size();
  bytes_ += bytes;
  return Result{complete(entry) ? Result::Kind::complete : Result::Kind::kept, tag, {}};
}

PieceQueue::Result PieceQueue::expect(uint64_t tag, std::optional<uint32_t> packets,
                                      uint64_t deadline_ns) {
  Entry &e = entries_[tag];
  if (e.asked) return fail_tag(tag, "a second grant for request " + std::to_string(tag));
  if (packets && e.expected && *e.expected != *packets) {
    return fail_tag(tag, "a grant for request " + std::to_string(tag) + " naming " +
                             std::to_string(*packets) + " piece packets where its first packet " +
                             "named " + std::to_string(*e.expected));
  }
  if (packets) e.expected = *packets;
  e.asked = true;
  e.deadline_ns = deadline_ns;
  return Result{complete(e) ? Result::Kind::complete : Result::Kind::kept, tag, {}};
}

std::vector<ExportedPiece> PieceQueue::take(uint64_t tag) {
  const auto it = entries_.find(tag);
  if (it == entries_.end()) return {};
  std::vector<ExportedPiece> out = std::move(it->second.pieces);
  it->second.pieces.clear();
  fds_ -= out.size();
  forget(it);
  return out;
}

size_t PieceQueue::discard(uint64_t tag) {
  const auto it = entries_.find(tag);
  if (it == entries_.end()) return 0;
  const size_t n = it->second.received;
  forget(it);
  return n;
}

void PieceQueue::clear() noexcept {
  entries_.clear();
  packets_ = fds_ = 0;
  bytes_ = 0;
}

std::vector<PieceQueue::Overdue> PieceQueue::overdue(uint64_t now_ns) const {
  std::vector<Overdue> out;
  for (const auto &[tag, e] : entries_) {
    if (e.asked && now_ns >= e.deadline_ns) {
      out.push_back(Overdue{tag, e.received, e.expected.value_or(0)});
    }
  }
  return out;
}

std::vector<uint64_t> PieceQueue::unwanted(const std::function<TagUse(uint64_t)> &use) const {
  std::vector<uint64_t> out;
  for (const auto &[tag, e] : entries_) {
    if (!e.asked && use(tag) != TagUse::wanted) out.push_back(tag);
  }
  return out;
}

uint64_t PieceQueue::next_deadline_ns() const noexcept {
  uint64_t due = UINT64_MAX;
  for (const auto &[tag, e] : entries_) {
    if (e.asked) due = std::min(due, e.deadline_ns);
  }
  return due;
}

}  // namespace swiftkv::coord
