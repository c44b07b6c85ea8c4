#include "core/coord/wire.hpp"

#include <cstddef>
#include <cstring>
#include <type_traits>

namespace swiftkv::coord {

namespace {

// Each message's fields in wire order, written down once: the Writer reads them and the Reader
// fills them, so the two directions cannot drift apart. A field's C++ type is its wire type
// (u8 for a bool, u16 length + bytes for a string, u32 count + items for a vector).
template <class Io, class M>
void fields(Io &io, M &m) {
  using T = std::remove_const_t<M>;
  if constexpr (std::is_same_v<T, WireGeometry>) {
    io(m.num_layers, m.num_kv_heads, m.head_dim, m.block_tokens, m.chunk_tokens, m.dtype);
  } else if constexpr (std::is_same_v<T, Hello>) {
    io(m.borrower, m.pid, m.region, m.host, m.path);
  } else if constexpr (std::is_same_v<T, Welcome>) {
    io(m.session, m.token, m.fd_socket, m.lender, m.borrower, m.unit_blocks, m.unit_chunks,
       m.unit_bytes, m.capacity_units, m.lease_ns, m.memory_kind, m.device, m.region_bytes,
       m.identity, m.ipc_handle, m.ucx_address);
  } else if constexpr (std::is_same_v<T, Refuse>) {
    io(m.status, m.message);
  } else if constexpr (std::is_same_v<T, Lend>) {
    io(m.request, m.max_units);
  } else if constexpr (std::is_same_v<T, Grant>) {
    io(m.request, m.lease, m.first_unit, m.units, m.pieces, m.rkey, m.remote_base);
  } else if constexpr (std::is_same_v<T, Deny>) {
    io(m.request, m.status, m.message);
  } else if constexpr (std::is_same_v<T, Heartbeat>) {
    io(m.leases);
  } else if constexpr (std::is_same_v<T, LeaseState>) {
    io(m.lease, m.remaining_ns, m.reclaim);
  } else if constexpr (std::is_same_v<T, HeartbeatAck>) {
    io(m.echo, m.leases);
  } else if constexpr (std::is_same_v<T, Reclaim> || std::is_same_v<T, Release>) {
    io(m.lease);
  } else if constexpr (std::is_same_v<T, Bye>) {
  } else if constexpr (std::is_same_v<T, WirePiece>) {
    io(m.offset, m.size, m.generation);
  } else {
    static_assert(std::is_same_v<T, FdAuth>, "a type with no wire fields");
    io(m.session, m.token);
  }
}

// How many items a vector of T may carry in one message or packet.
template <class T>
constexpr uint32_t kMaxItems = kMaxLeasesPerMessage;  // lease ids and lease states
template <>
constexpr uint32_t kMaxItems<WirePiece> = kPiecesPerPacket;
template <>
constexpr uint32_t kMaxItems<uint8_t> = kMaxBlobBytes;  // opaque bytes (UCX addresses, keys)

class Writer {
 public:
  template <class... F>
  void operator()(const F &...f) {
    (put(f), ...);
  }
  std::vector<uint8_t> &out() { return out_; }

 private:
  void put(bool v) { out_.push_back(v ? 1 : 0); }
  template <class T>
  requires std::is_integral_v<T>
  void put(T v) {
    const auto u = static_cast<std::make_unsigned_t<T>>(v);
    for (size_t i = 0; i < sizeof(T); ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  template <size_t N>
  void put(const std::array<uint8_t, N> &a) {
    out_.insert(out_.end(), a.begin(), a.end());
  }
  void put(const std::string &s) {
    const size_t n = s.size() > kMaxString ? kMaxString : s.size();
    put(static_cast<uint16_t>(n));
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  template <class T>
  void put(const std::vector<T> &v) {
    put(static_cast<uint32_t>(v.size()));
    for (const T &x : v) put(x);
  }
  template <class T>
  requires std::is_class_v<T>
  void put(const T &m) { fields(*this, m); }
  std::vector<uint8_t> out_;
};

// The bytes a fixed-size item takes on the wire (what a count is checked against).
struct Sizer {
  size_t bytes = 0;
  template <class... F>
  void operator()(const F &...f) {
    (add(f), ...);
  }
  template <class T>
  requires std::is_arithmetic_v<T>
  void add(const T &) { bytes += sizeof(T); }
  template <class T>
  requires std::is_class_v<T>
  void add(const T &m) { fields(*this, m); }
};
template <class T>
size_t wire_bytes() {
  Sizer s;
  s.add(T{});
  return s.bytes;
}

// Reads fields in order; the first read past the end (or a bad count, length or flag) sets
// failed, and every later read gives 0.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <class... F>
  void operator()(F &...f) {
    (get(f), ...);
  }
  bool ok_and_done() const { return !failed_ && pos_ == b_.size(); }

 private:
  void get(bool &v) {
    uint8_t x = 0;
    get(x);
    if (x > 1) failed_ = true;  // a flag is 0 or 1: one encoding per message
    v = x == 1;
  }
  template <class T>
  requires std::is_integral_v<T>
  void get(T &v) {
    std::make_unsigned_t<T> u = 0;
    if (take(sizeof(T))) {
      for (size_t i = 0; i < sizeof(T); ++i) {
        u = static_cast<decltype(u)>(u | static_cast<decltype(u)>(b_[pos_ - sizeof(T) + i])
                                             << (8 * i));
      }
    }
    v = static_cast<T>(u);
  }
  template <size_t N>
  void get(std::array<uint8_t, N> &a) {
    if (take(N)) std::memcpy(a.data(), b_.data() + pos_ - N, N);
  }
  void get(std::string &s) {
    uint16_t n = 0;
    get(n);
    if (n > kMaxString) failed_ = true;
    if (!take(n)) return;
    s.assign(reinterpret_cast<const char *>(b_.data() + pos_ - n), n);
  }
  // A count that must fit in what is left and under its type's limit, checked before any
  // allocation.
  template <class T>
  void get(std::vector<T> &v) {
    uint32_t n = 0;
    get(n);
    if (n > kMaxItems<T> || static_cast<uint64_t>(n) * wire_bytes<T>() > left()) {
      failed_ = true;
      return;
    }
    v.resize(n);
    for (T &x : v) get(x);
  }
  template <class T>
  requires std::is_class_v<T>
  void get(T &m) { fields(*this, m); }
  size_t left() const { return failed_ ? 0 : b_.size() - pos_; }
  bool take(size_t n) {
    if (failed_ || b_.size() - pos_ < n) {
      failed_ = true;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  bool failed_ = false;
};

// The payload of type t, default-constructed into the variant (which lists the types in wire
// order), then filled.
template <size_t I = 0>
bool read_payload(Reader &r, size_t index, Payload *out) {
  if constexpr (I < std::variant_size_v<Payload>) {
    if (index != I) return read_payload<I + 1>(r, index, out);
    r(out->emplace<I>());
    return true;
  } else {
    return false;
  }
}

struct Header {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t type = 0;
  uint64_t seq = 0, epoch = 0;
  uint32_t length = 0, reserved = 0;
};

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
  std::visit(body, m.payload);
  const uint32_t length = static_cast<uint32_t>(body.out().size());
  Writer w;
  w(kMagic, kProtocolVersion, static_cast<uint16_t>(type_of(m.payload)), m.seq, m.epoch, length,
    uint32_t{0});
  w.out().insert(w.out().end(), body.out().begin(), body.out().end());
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
  Header hd;
  Reader h(bytes.first(kHeaderBytes));
  h(hd.magic, hd.version, hd.type, hd.seq, hd.epoch, hd.length, hd.reserved);
  const auto &[magic, version, type, seq, epoch, length, reserved] = hd;
  Message m;
  m.seq = seq;
  m.epoch = epoch;
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
  const auto t = static_cast<MsgType>(type);
  Reader r(bytes.subspan(kHeaderBytes));
  if (type == 0 || !read_payload(r, type - 1u, &m.payload)) {
    d.error = "unknown message type " + std::to_string(type);
    return d;
  }
  if (!r.ok_and_done()) {
    d.error = std::string("the ") + msg_type_name(t) +
              " payload does not match its fields (length, a count, a string or a flag)";
    return d;
  }
  d.message = std::move(m);
  return d;
}

std::vector<uint8_t> encode_pieces(const PiecePacket &p) {
  Writer w;
  w(kMagic, p.tag, p.more, p.pieces);
  return std::move(w.out());
}

std::optional<PiecePacket> decode_pieces(std::span<const uint8_t> bytes, std::string *error) {
  Reader r(bytes);
  PiecePacket p;
  uint32_t magic = 0;
  r(magic, p.tag, p.more, p.pieces);
  if (magic != kMagic || !r.ok_and_done() || p.more > kMaxPieces) {
    *error = "a malformed piece packet";
    return std::nullopt;
  }
  return p;
}

std::vector<uint8_t> encode_auth(const FdAuth &a) {
  Writer w;
  w(kMagic, a);
  return std::move(w.out());
}

std::optional<FdAuth> decode_auth(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  FdAuth a;
  uint32_t magic = 0;
  r(magic, a);
  if (magic != kMagic || !r.ok_and_done()) return std::nullopt;
  return a;
}

}  // namespace swiftkv::coord
