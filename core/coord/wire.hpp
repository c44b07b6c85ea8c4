// The coordinator's messages: a fixed 32-byte header and a typed payload, encoded little-endian
// field by field (never a struct copy), so that a message means the same on both sides whatever
// the compiler. decode() checks every length, count and enum before anything is built: a peer's
// bytes are never trusted, and a message that fails a check is dropped by the caller.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace swiftkv::coord {

inline constexpr uint32_t kMagic = 0x564b5753;  // "SWKV" read as little-endian bytes
// Version 2 added the UCX path: the hello's host and path, the welcome's UCX address, the grant's
// remote key. Version 3 lets the fd channel's auth packet carry the borrower's beat page
// (beat_page.hpp); the messages are encoded as in version 2.
inline constexpr uint16_t kProtocolVersion = 3;
inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kMaxMessageBytes = 64 * 1024;
inline constexpr size_t kMaxString = 255;
inline constexpr uint32_t kMaxLeasesPerMessage = 1024;
inline constexpr uint32_t kMaxPieces = 1u << 20;
inline constexpr uint32_t kMaxBlobBytes = 16 * 1024;  // a UCX worker address or a packed key

enum class MsgType : uint16_t {
  hello = 1,          // borrower -> lender: who I am, what I want to borrow
  welcome = 2,        // lender -> borrower: the region, the lending unit, the fd channel
  refuse = 3,         // lender -> borrower: the handshake failed (status, message)
  lend = 4,           // borrower -> lender: lend me up to max_units units
  grant = 5,          // lender -> borrower: a lease
  deny = 6,           // lender -> borrower: no lease (status, message)
  heartbeat = 7,      // borrower -> lender: renew these leases
  heartbeat_ack = 8,  // lender -> borrower: the session's lease table after renewing
  reclaim = 9,        // lender -> borrower: give this lease back
  release = 10,       // borrower -> lender: this lease is evacuated and given back (the ack)
  bye = 11,           // borrower -> lender: the session ends; every lease is given back
};
const char *msg_type_name(MsgType t) noexcept;

// The geometry fields both sides compare in the handshake (swiftkv_model_desc minus name/device).
struct WireGeometry {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_tokens = 0;
  uint32_t chunk_tokens = 0;
  int32_t dtype = 0;
  bool operator==(const WireGeometry &) const = default;
};

// How a borrower asks to reach lent memory (swiftkv_remote_path).
enum class PathWish : uint8_t {
  automatic = 0,  // the fd channel on the lender's host, UCX from anywhere else
  ucx = 1,        // UCX even on the lender's host
  local = 2,      // the fd channel only
};

struct Hello {
  WireGeometry borrower;
  uint32_t pid = 0;
  std::string region;  // the name the lender offers its region under
  std::string host;    // where the borrower runs (host_identity()): same host, same memory
  uint8_t path = 0;    // a PathWish
};
struct Welcome {
  uint64_t session = 0;
  std::array<uint8_t, 16> token{};  // proves the fd channel's caller is this session
  std::string fd_socket;            // abstract Unix socket name, without the leading NUL
  WireGeometry lender;              // the region's lender geometry
  WireGeometry borrower;            // the region's borrower geometry
  uint64_t unit_blocks = 0;
  uint64_t unit_chunks = 0;
  uint64_t unit_bytes = 0;
  uint64_t capacity_units = 0;
  uint64_t lease_ns = 0;
  uint32_t memory_kind = 0;  // swiftkv_memory_kind
  int32_t device = -1;
  uint64_t region_bytes = 0;
  std::string identity;
  std::array<uint8_t, 64> ipc_handle{};
  // Not empty: the session reaches lent memory over UCX at this serving worker's address, and
  // fd_socket is empty; each grant then carries a remote key.
  std::vector<uint8_t> ucx_address;
};
struct Refuse {
  int32_t status = 0;
  std::string message;
};
struct Lend {
  uint64_t request = 0;
  uint64_t max_units = 0;
};
struct Grant {
  uint64_t request = 0;
  uint64_t lease = 0;
  uint64_t first_unit = 0;
  uint64_t units = 0;
  uint32_t pieces = 0;  // piece packets sent on the fd channel before this message
  // A UCX session's: the lease's bytes registered on their own, as [remote_base, + units bytes).
  std::vector<uint8_t> rkey;
  uint64_t remote_base = 0;
};
struct Deny {
  uint64_t request = 0;
  int32_t status = 0;
  std::string message;
};
struct Heartbeat {
  std::vector<uint64_t> leases;
};
struct LeaseState {
  uint64_t lease = 0;
  uint64_t remaining_ns = 0;  // time left on the lender's clock when the ack was made
  bool reclaim = false;
};
struct HeartbeatAck {
  uint64_t echo = 0;               // the heartbeat's seq
  std::vector<LeaseState> leases;  // every lease the session holds, ascending id
};
struct Reclaim {
  uint64_t lease = 0;
};
struct Release {
  uint64_t lease = 0;
};
struct Bye {};

using Payload = std::variant<Hello, Welcome, Refuse, Lend, Grant, Deny, Heartbeat, HeartbeatAck,
                             Reclaim, Release, Bye>;

struct Message {
  uint64_t seq = 0;    // per direction and session, from 1, strictly increasing
  uint64_t epoch = 0;  // the lender's lease-table epoch (0 from a borrower)
  Payload payload;
};

MsgType type_of(const Payload &p) noexcept;
std::vector<uint8_t> encode(const Message &m);

// The message, or why it is not one (for the log).
struct Decoded {
  std::optional<Message> message;
  std::string error;
};
Decoded decode(std::span<const uint8_t> bytes);

// --- The fd channel's packets: a tag (0: the handshake, else the Grant's request id), the
// pieces of this packet, and how many packets follow. The fds ride along as SCM_RIGHTS.
inline constexpr uint32_t kPiecesPerPacket = 128;
struct WirePiece {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t generation = 0;
};
struct PiecePacket {
  uint64_t tag = 0;
  uint32_t more = 0;  // packets still to come after this one
  std::vector<WirePiece> pieces;
};
std::vector<uint8_t> encode_pieces(const PiecePacket &p);
std::optional<PiecePacket> decode_pieces(std::span<const uint8_t> bytes, std::string *error);

// The auth packet a borrower sends first on the fd channel.
struct FdAuth {
  uint64_t session = 0;
  std::array<uint8_t, 16> token{};
};
std::vector<uint8_t> encode_auth(const FdAuth &a);
std::optional<FdAuth> decode_auth(std::span<const uint8_t> bytes);

}  // namespace swiftkv::coord
