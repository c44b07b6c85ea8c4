// libFuzzer target: the coordinator's wire decoder, with a re-encode oracle. Whatever bytes a
// peer sends, decode() either names what is wrong or gives a message whose encoding is exactly
// those bytes (the format has one encoding per message), and that encoding decodes again to
// the same message. The same holds for the fd channel's piece packets.
//
// The same input also drives the borrower's piece queue as a script of packets (tag, countdown,
// pieces' offsets and sizes, fds), grants, takes and expiries: whatever a lender sends, the
// queue stays within its bounds, hands out only pieces that ascend inside the region, says why
// it refuses, and closes every fd it was given that it does not hand out.
//
// SWIFTKV_FUZZ_WRITE_SEEDS=DIR writes one encoded message of every type and a piece packet to
// DIR and exits: the committed seed corpus (fuzz/seeds/wire) is made that way.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/coord/piece_queue.hpp"
#include "core/coord/wire.hpp"
#include "fuzz/fuzz_support.hpp"

namespace co = swiftkv::coord;

namespace {

template <size_t I = 0>
void write_seeds(const std::string &dir) {
  if constexpr (I < std::variant_size_v<co::Payload>) {
    co::Message m;
    m.seq = I + 1;
    m.epoch = I;
    m.payload.emplace<I>();
    const std::vector<uint8_t> bytes = co::encode(m);
    const std::string path = dir + "/type-" + std::to_string(I);
    FILE *f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
    write_seeds<I + 1>(dir);
  } else {
    co::PiecePacket p{3, 1, {{0, 4096, 1}, {8192, 4096, 2}}};
    const std::vector<uint8_t> bytes = co::encode_pieces(p);
    FILE *f = std::fopen((dir + "/pieces").c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
  }
}

void check_pieces(const uint8_t *data, size_t size) {
  std::string error;
  const std::optional<co::PiecePacket> p = co::decode_pieces({data, size}, &error);
  if (!p) {
    if (error.empty()) std::abort();
    return;
  }
  const std::vector<uint8_t> again = co::encode_pieces(*p);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
}

int g_null = -1;  // every fd the script passes is a dup of it

constexpr uint64_t kGranule = 4096, kRegion = 64 * kGranule;

void check_taken(const std::vector<swiftkv::ExportedPiece> &pieces) {
  uint64_t floor = 0;
  for (const swiftkv::ExportedPiece &p : pieces) {
    if (p.size == 0 || p.offset < floor || p.offset > kRegion || p.size > kRegion - p.offset ||
        !p.fd) {
      std::abort();
    }
    floor = p.offset + p.size;
  }
}

// The bytes as a script of packets, grants, takes and expiries against one queue of a 64-granule
// region.
void run_queue(const uint8_t *data, size_t size) {
  std::vector<int> given;  // every fd number handed to the queue
  {
    co::PieceQueue q(kRegion);
    // Tags 0-3 are wanted, 4 was answered already, 5 was never sent.
    const auto use = [](uint64_t tag) {
      return tag == 5   ? co::PieceQueue::TagUse::foreign
             : tag == 4 ? co::PieceQueue::TagUse::stale
                        : co::PieceQueue::TagUse::wanted;
    };
    // The bytes as a script; a field past the end reads 0.
    swiftkv::fuzz::Reader in{data, size};
    const auto next = [&in] { return in.take<uint8_t>(0); };
    for (int op = 0; op < 512 && in.n != 0; ++op) {
      co::PieceQueue::Result r;
      switch (next() % 5) {
        case 0:
        case 1: {  // a packet (the commonest step)
          co::PiecePacket p;
          p.tag = next() % 6;
          p.more = next() % 4;
          const size_t pieces = next() % 6;
          for (size_t i = 0; i < pieces; ++i) {
            p.pieces.push_back(co::WirePiece{(next() % 70) * kGranule, (next() % 3) * kGranule, 1});
          }
          co::FdPacket f;
          f.bytes = co::encode_pieces(p);
          const int extra = static_cast<int>(next() % 3) - 1;  // one fd too few, right, too many
          const size_t fds =
              static_cast<size_t>(std::max<int>(0, static_cast<int>(pieces) + extra));
          for (size_t i = 0; i < fds; ++i) {
            f.fds.emplace_back(::fcntl(g_null, F_DUPFD_CLOEXEC, 0));
            given.push_back(f.fds.back().get());
          }
          r = q.add_packet(std::move(f), use);
          break;
        }
        case 2: {  // a grant (or the handshake's message: no count)
          const uint64_t tag = next() % 4;
          const uint8_t c = next();
          r = q.expect(tag, c == 255 ? std::nullopt : std::optional<uint32_t>(c % 5), next());
          break;
        }
        case 3: check_taken(q.take(next() % 6)); break;
        default: {  // time passes: late grants and unwanted pieces go
          for (const auto &o : q.overdue(next())) q.discard(o.tag);
          for (uint64_t tag : q.unwanted(use)) q.discard(tag);
          break;
        }
      }
      if (r.kind == co::PieceQueue::Result::Kind::error && r.error.empty()) std::abort();
      if (r.kind == co::PieceQueue::Result::Kind::complete) check_taken(q.take(r.tag));
      if (q.packets() > co::kMaxQueuedPackets || q.fds() > co::kMaxQueuedFds ||
          q.bytes() > 2 * kRegion || (q.empty() && (q.packets() | q.fds() | q.bytes()) != 0)) {
        std::abort();
      }
    }
  }
  for (int fd : given) {
    if (::fcntl(fd, F_GETFD) != -1) std::abort();  // the queue is gone: nothing may stay open
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  if (const char *dir = std::getenv("SWIFTKV_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  g_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (g_null < 0) std::abort();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_pieces(data, size);
  run_queue(data, size);
  const co::Decoded d = co::decode({data, size});
  if (!d.message) {
    if (d.error.empty()) std::abort();  // a refusal always says why
    return 0;
  }
  const std::vector<uint8_t> again = co::encode(*d.message);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  const co::Decoded twice = co::decode(again);
  if (!twice.message || co::encode(*twice.message) != again) std::abort();
  return 0;
}
