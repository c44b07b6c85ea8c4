#include "core/coord/fd_channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "core/common/error.hpp"

namespace swiftkv::coord {

namespace {

socklen_t abstract_address(const std::string &name, sockaddr_un *a) {
  if (name.empty() || name.size() + 1 > sizeof(a->sun_path)) {
    fail(SWIFTKV_EPEER, "fd channel name of " + std::to_string(name.size()) + " bytes");
  }
  std::memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

[[noreturn]] void fail_errno(swiftkv_status s, const std::string &what) {
  fail(s, what + ": " + std::strerror(errno));
}

}  // namespace

UniqueFd fd_listen(std::string *name_out) {
  static std::atomic<uint64_t> counter{0};
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s) fail_errno(SWIFTKV_EPEER, "fd channel socket");
  std::random_device rd;
  const std::string name = "swiftkv-coord-" + std::to_string(::getpid()) + "-" +
                           std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rd());
  sockaddr_un a;
  const socklen_t len = abstract_address(name, &a);
  if (::bind(s.get(), reinterpret_cast<sockaddr *>(&a), len) != 0) {
    fail_errno(SWIFTKV_EPEER, "bind of the fd channel");
  }
  if (::listen(s.get(), 64) != 0) fail_errno(SWIFTKV_EPEER, "listen on the fd channel");
  *name_out = name;
  return s;
}

UniqueFd fd_accept(int listener) {
  return UniqueFd(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
}

UniqueFd fd_connect(const std::string &name) {
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) fail_errno(SWIFTKV_EPEER, "fd channel socket");
  sockaddr_un a;
  const socklen_t len = abstract_address(name, &a);
  if (::connect(s.get(), reinterpret_cast<sockaddr *>(&a), len) != 0) {
    fail_errno(SWIFTKV_EPEER, "connect to the lender's fd channel");
  }
  return s;
}

void fd_send(int sock, std::span<const uint8_t> bytes, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerPacket || bytes.size() > kMaxPacketBytes) {
    fail(SWIFTKV_EINTERNAL, "an fd packet over the channel's limits");
  }
  iovec iov{const_cast<uint8_t *>(bytes.data()), bytes.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket)];
  if (!fds.empty()) {
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &m, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(bytes.size())) return;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{sock, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) fail(SWIFTKV_EPEER, "the fd channel's peer stopped reading");
      continue;
    }
    fail_errno(SWIFTKV_EPEER, "send on the fd channel");
  }
}

FdPacket fd_recv(int sock, int timeout_ms) {
  pollfd p{sock, POLLIN, 0};
  int r = 0;
  do {
    r = ::poll(&p, 1, timeout_ms);
  } while (r < 0 && errno == EINTR);
  if (r == 0) fail(SWIFTKV_ETIMEDOUT, "no packet on the fd channel in time");
  if (r < 0) fail_errno(SWIFTKV_EPEER, "poll of the fd channel");
  FdPacket out;
  out.bytes.resize(kMaxPacketBytes);
  iovec iov{out.bytes.data(), out.bytes.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerPacket)];
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  ssize_t n = 0;
  do {
    n = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) fail_errno(SWIFTKV_EPEER, "receive on the fd channel");
  // Take every fd that arrived, so that none leaks whatever else is wrong.
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (n == 0) {
    out.closed = true;
    out.bytes.clear();
    return out;
  }
  if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    fail(SWIFTKV_EPEER, "a truncated packet on the fd channel");
  }
  out.bytes.resize(static_cast<size_t>(n));
  return out;
}

bool fd_pending(int sock) noexcept {
  pollfd p{sock, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && p.revents != 0;
}

bool fd_peer_gone(int sock) noexcept {
  pollfd p{sock, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace swiftkv::coord
