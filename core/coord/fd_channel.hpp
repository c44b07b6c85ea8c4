// The fd channel: a Unix SOCK_SEQPACKET socket in the abstract namespace that carries file
// descriptors (memfds, VMM shareable handles) between processes of one node as SCM_RIGHTS, which
// ZeroMQ cannot. The lender listens; each borrower session connects once, proves who it is with
// the token from the handshake, and keeps the connection open: its hang-up is the fastest sign
// that the other side is gone.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/common/unique_fd.hpp"

namespace swiftkv::coord {

inline constexpr size_t kMaxFdsPerPacket = 128;
inline constexpr size_t kMaxPacketBytes = 8192;

// Listens on a fresh abstract name; *name_out is it without the leading NUL. Non-blocking.
UniqueFd fd_listen(std::string *name_out);
// Accepts one connection (non-blocking; an invalid fd when none is waiting).
UniqueFd fd_accept(int listener);
// Connects to `name` (blocking, close-on-exec). Throws Error(EPEER) when nobody listens.
UniqueFd fd_connect(const std::string &name);

// Sends one packet with `fds` attached. Throws Error(EPEER) when the peer is gone.
void fd_send(int sock, std::span<const uint8_t> bytes, std::span<const int> fds);

struct FdPacket {
  std::vector<uint8_t> bytes;
  std::vector<UniqueFd> fds;
  bool closed = false;  // the peer hung up: no packet
};
// Receives one packet, waiting at most timeout_ms (-1: forever). Throws Error(ETIMEDOUT) when
// none came, Error(EPEER) for a truncated packet or a socket error.
FdPacket fd_recv(int sock, int timeout_ms);

// True when a packet (or the peer's hang-up) waits to be received (checked without blocking).
bool fd_pending(int sock) noexcept;

// True when the peer of a connected socket hung up (checked without blocking).
bool fd_peer_gone(int sock) noexcept;

}  // namespace swiftkv::coord
