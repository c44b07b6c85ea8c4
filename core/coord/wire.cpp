#include "core/coord/wire.hpp"

#include <cstring>
#include <type_traits>

namespace swiftkv::coord {

namespace {

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void i32(int32_t v) { put(static_cast<uint32_t>(v), 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(const uint8_t *p, size_t n) { out_.insert(out_.end(), p, p + n); }
  void str(const std::string &s) {
    const size_t n = s.size() > kMaxString ? kMaxString : s.size();
    u16(static_cast<uint16_t>(n));
    bytes(reinterpret_cast<const uint8_t *>(s.data()), n);
  }
  void geometry(const WireGeometry &g) {
    u32(g.num_layers);
    u32(g.num_kv_heads);
    u32(g.head_dim);
    u32(g.block_tokens);
    u32(g.chunk_tokens);
    i32(g.dtype);
  }
  std::vector<uint8_t> &out() { return out_; }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

// Reads fields in order; the first read past the end sets failed and every later read gives 0.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  int32_t i32() { return static_cast<int32_t>(static_cast<uint32_t>(get(4))); }
  uint64_t u64() { return get(8); }
  template <size_t N>
  void bytes(std::array<uint8_t, N> &a) {
    if (!take(N)) return;
    std::memcpy(a.data(), b_.data() + pos_ - N, N);
  }
  std::string str() {
    const uint16_t n = u16();
    if (n > kMaxString) {
      failed_ = true;
      return {};
    }
    if (!take(n)) return {};
    return std::string(reinterpret_cast<const char *>(b_.data() + pos_ - n), n);
  }
  WireGeometry geometry() {
    WireGeometry g;
    g.num_layers = u32();
    g.num_kv_heads = u32();
    g.head_dim = u32();
    g.block_tokens = u32();
    g.chunk_tokens = u32();
    g.dtype = i32();
    return g;
  }
  // A count of items of `item_bytes` each that must fit in what is left and under `max`.
  uint32_t count(uint32_t max, size_t item_bytes) {
    const uint32_t n = u32();
    if (n > max || static_cast<uint64_t>(n) * item_bytes > left()) {
      failed_ = true;
      return 0;
    }
    return n;
  }
  size_t left() const { return failed_ ? 0 : b_.size() - pos_; }
  bool ok_and_done() const { return !failed_ && pos_ == b_.size(); }
  bool failed() const { return failed_; }

 private:
  bool take(size_t n) {
    if (failed_ || b_.size() - pos_ < n) {
      failed_ = true;
      return false;
    }
    pos_ += n;
    return true;
  }
  uint64_t get(int n) {
    if (!take(static_cast<size_t>(n))) return 0;
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(b_[pos_ - static_cast<size_t>(n) + static_cast<size_t>(i)]) << (8 * i);
    return v;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  bool failed_ = false;
};

void write_payload(Writer &w, const Payload &p) {
  std::visit(
      [&w](const auto &m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Hello>) {
          w.geometry(m.borrower);
          w.u32(m.pid);
          w.str(m.region);
        } else if constexpr (std::is_same_v<T, Welcome>) {
          w.u64(m.session);
          w.bytes(m.token.data(), m.token.size());
          w.str(m.fd_socket);
          w.geometry(m.lender);
          w.geometry(m.borrower);
          w.u64(m.unit_blocks);
          w.u64(m.unit_chunks);
          w.u64(m.unit_bytes);
          w.u64(m.capacity_units);
          w.u64(m.lease_ns);
          w.u32(m.memory_kind);
          w.i32(m.device);
          w.u64(m.region_bytes);
          w.str(m.identity);
          w.bytes(m.ipc_handle.data(), m.ipc_handle.size());
        } else if constexpr (std::is_same_v<T, Refuse>) {
          w.i32(m.status);
          w.str(m.message);
        } else if constexpr (std::is_same_v<T, Lend>) {
          w.u64(m.request);
          w.u64(m.max_units);
        } else if constexpr (std::is_same_v<T, Grant>) {
          w.u64(m.request);
          w.u64(m.lease);
          w.u64(m.first_unit);
          w.u64(m.units);
          w.u32(m.pieces);
        } else if constexpr (std::is_same_v<T, Deny>) {
          w.u64(m.request);
          w.i32(m.status);
          w.str(m.message);
        } else if constexpr (std::is_same_v<T, Heartbeat>) {
          w.u32(static_cast<uint32_t>(m.leases.size()));
          for (uint64_t id : m.leases) w.u64(id);
        } else if constexpr (std::is_same_v<T, HeartbeatAck>) {
          w.u64(m.echo);
          w.u32(static_cast<uint32_t>(m.leases.size()));
          for (const LeaseState &l : m.leases) {
            w.u64(l.lease);
            w.u64(l.remaining_ns);
            w.u8(l.reclaim ? 1 : 0);
          }
        } else if constexpr (std::is_same_v<T, Reclaim> || std::is_same_v<T, Release>) {
          w.u64(m.lease);
        } else {
          static_assert(std::is_same_v<T, Bye>);
        }
      },
      p);
}

bool read_payload(Reader &r, MsgType t, Payload *out, std::string *error) {
  switch (t) {
    case MsgType::hello: {
      Hello m;
      m.borrower = r.geometry();
      m.pid = r.u32();
      m.region = r.str();
      *out = std::move(m);
      break;
    }
    case MsgType::welcome: {
      Welcome m;
      m.session = r.u64();
      r.bytes(m.token);
      m.fd_socket = r.str();
      m.lender = r.geometry();
      m.borrower = r.geometry();
      m.unit_blocks = r.u64();
      m.unit_chunks = r.u64();
      m.unit_bytes = r.u64();
      m.capacity_units = r.u64();
      m.lease_ns = r.u64();
      m.memory_kind = r.u32();
      m.device = r.i32();
      m.region_bytes = r.u64();
      m.identity = r.str();
      r.bytes(m.ipc_handle);
      *out = std::move(m);
      break;
    }
    case MsgType::refuse: {
      Refuse m;
      m.status = r.i32();
      m.message = r.str();
      *out = std::move(m);
      break;
    }
    case MsgType::lend: {
      Lend m;
      m.request = r.u64();
      m.max_units = r.u64();
      *out = m;
      break;
    }
    case MsgType::grant: {
      Grant m;
      m.request = r.u64();
      m.lease = r.u64();
      m.first_unit = r.u64();
      m.units = r.u64();
      m.pieces = r.u32();
      *out = m;
      break;
    }
    case MsgType::deny: {
      Deny m;
      m.request = r.u64();
      m.status = r.i32();
      m.message = r.str();
      *out = std::move(m);
      break;
    }
    case MsgType::heartbeat: {
      Heartbeat m;
      const uint32_t n = r.count(kMaxLeasesPerMessage, 8);
      m.leases.reserve(n);
      for (uint32_t i = 0; i < n; ++i) m.leases.push_back(r.u64());
      *out = std::move(m);
      break;
    }
    case MsgType::heartbeat_ack: {
      HeartbeatAck m;
      m.echo = r.u64();
      const uint32_t n = r.count(kMaxLeasesPerMessage, 17);
      m.leases.reserve(n);
      for (uint32_t i = 0; i < n; ++i) {
        LeaseState l;
        l.lease = r.u64();
        l.remaining_ns = r.u64();
        const uint8_t flag = r.u8();
        if (flag > 1) {
          *error = "reclaim flag is neither 0 nor 1";
          return false;
        }
        l.reclaim = flag == 1;
        m.leases.push_back(l);
      }
      *out = std::move(m);
      break;
    }
    case MsgType::reclaim: *out = Reclaim{r.u64()}; break;
    case MsgType::release: *out = Release{r.u64()}; break;
    case MsgType::bye: *out = Bye{}; break;
    default:
      *error = "unknown message type " + std::to_string(static_cast<unsigned>(t));
      return false;
  }
  if (!r.ok_and_done()) {
    *error = std::string("the ") + msg_type_name(t) + " payload's length does not match its fields";
    return false;
  }
  return true;
}

}  // namespace

const char *msg_type_name(MsgType t) noexcept {
  switch (t) {
    case MsgType::hello: return "hello";
    case MsgType::welcome: return "welcome";
    case MsgType::refuse: return "refuse";
    case MsgType::lend: return "lend";
    case MsgType::grant: return "grant";
    case MsgType::deny: return "deny";
    case MsgType::heartbeat: return "heartbeat";
    case MsgType::heartbeat_ack: return "heartbeat_ack";
    case MsgType::reclaim: return "reclaim";
    case MsgType::release: return "release";
    case MsgType::bye: return "bye";
  }
  return "unknown";
}

MsgType type_of(const Payload &p) noexcept {
  return static_cast<MsgType>(p.index() + 1);  // the variant lists the types in wire order
}

std::vector<uint8_t> encode(const Message &m) {
  Writer body;
  write_payload(body, m.payload);
  Writer w;
  w.u32(kMagic);
  w.u16(kProtocolVersion);
  w.u16(static_cast<uint16_t>(type_of(m.payload)));
  w.u64(m.seq);
  w.u64(m.epoch);
  w.u32(static_cast<uint32_t>(body.out().size()));
  w.u32(0);
  w.bytes(body.out().data(), body.out().size());
  return std::move(w.out());
}

Decoded decode(std::span<const uint8_t> bytes) {
  Decoded d;
  if (bytes.size() < kHeaderBytes) {
    d.error = "a message of " + std::to_string(bytes.size()) + " bytes is shorter than a header";
    return d;
  }
  if (bytes.size() > kMaxMessageBytes) {
    d.error = "a message of " + std::to_string(bytes.size()) + " bytes is over the limit";
    return d;
  }
  Reader h(bytes.first(kHeaderBytes));
  const uint32_t magic = h.u32();
  const uint16_t version = h.u16();
  const uint16_t type = h.u16();
  Message m;
  m.seq = h.u64();
  m.epoch = h.u64();
  const uint32_t length = h.u32();
  const uint32_t reserved = h.u32();
  if (magic != kMagic) {
    d.error = "bad magic";
    return d;
  }
  if (version != kProtocolVersion) {
    d.error = "protocol version " + std::to_string(version) + ", this library speaks " +
              std::to_string(kProtocolVersion);
    return d;
  }
  if (reserved != 0 || length != bytes.size() - kHeaderBytes) {
    d.error = "the header's payload length or reserved field is wrong";
    return d;
  }
  if (m.seq == 0) {
    d.error = "sequence number 0";
    return d;
  }
  Reader r(bytes.subspan(kHeaderBytes));
  if (!read_payload(r, static_cast<MsgType>(type), &m.payload, &d.error)) return d;
  d.message = std::move(m);
  return d;
}

std::vector<uint8_t> encode_pieces(const PiecePacket &p) {
  Writer w;
  w.u32(kMagic);
  w.u64(p.tag);
  w.u32(p.more);
  w.u32(static_cast<uint32_t>(p.pieces.size()));
  for (const WirePiece &x : p.pieces) {
    w.u64(x.offset);
    w.u64(x.size);
    w.u64(x.generation);
  }
  return std::move(w.out());
}

std::optional<PiecePacket> decode_pieces(std::span<const uint8_t> bytes, std::string *error) {
  Reader r(bytes);
  PiecePacket p;
  const uint32_t magic = r.u32();
  p.tag = r.u64();
  p.more = r.u32();
  const uint32_t n = r.count(kPiecesPerPacket, 24);
  for (uint32_t i = 0; i < n; ++i) {
    WirePiece x;
    x.offset = r.u64();
    x.size = r.u64();
    x.generation = r.u64();
    p.pieces.push_back(x);
  }
  if (magic != kMagic || !r.ok_and_done() || p.more > kMaxPieces) {
    *error = "a malformed piece packet";
    return std::nullopt;
  }
  return p;
}

std::vector<uint8_t> encode_auth(const FdAuth &a) {
  Writer w;
  w.u32(kMagic);
  w.u64(a.session);
  w.bytes(a.token.data(), a.token.size());
  return std::move(w.out());
}

std::optional<FdAuth> decode_auth(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  FdAuth a;
  const uint32_t magic = r.u32();
  a.session = r.u64();
  r.bytes(a.token);
  if (magic != kMagic || !r.ok_and_done()) return std::nullopt;
  return a;
}

}  // namespace swiftkv::coord
