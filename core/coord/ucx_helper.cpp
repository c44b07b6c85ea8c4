// The lender's side of the UCX helper (see ucx_helper.hpp).
#include "core/coord/ucx_helper.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/common/error.hpp"
#include "core/common/log.hpp"
#include "core/coord/fd_channel.hpp"

extern char **environ;

#ifndef SWIFTKV_HELPER_FROM_LIBDIR
#define SWIFTKV_HELPER_FROM_LIBDIR "../libexec/swiftkv"
#endif

namespace swiftkv::coord {

namespace {

constexpr const char *kHelperName = "swiftkv-ucx-helper";
constexpr int kAnswerMs = 10'000;  // a helper that answers nothing in this long is treated as gone

bool executable(const std::filesystem::path &p) {
  return ::access(p.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(p);
}

}  // namespace

std::optional<std::string> ucx_helper_path() {
  if (const char *e = std::getenv("SWIFTKV_UCX_HELPER"); e != nullptr && *e != 0) {
    if (std::strcmp(e, "off") == 0) return std::nullopt;
    return std::string(e);
  }
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void *>(&ucx_helper_path), &info) == 0 ||
      info.dli_fname == nullptr) {
    return std::nullopt;
  }
  std::error_code ec;
  const std::filesystem::path image = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) return std::nullopt;
  const std::filesystem::path dir = image.parent_path();
  for (const std::filesystem::path &p :
       {dir / kHelperName, dir / SWIFTKV_HELPER_FROM_LIBDIR / kHelperName}) {
    if (executable(p)) return p.lexically_normal().string();
  }
  return std::nullopt;
}

// A registration the helper holds; unregistered there (and answered) when destroyed.
class HelperRegistration final : public transport::KeyedRegistration {
 public:
  HelperRegistration(std::shared_ptr<UcxHelper> h, uint64_t id, std::vector<std::byte> key,
                     uint64_t base, uint64_t bytes)
      : KeyedRegistration(std::move(key), base, bytes), h_(std::move(h)), id_(id) {}
  ~HelperRegistration() override { h_->unregister(id_); }

 private:
  std::shared_ptr<UcxHelper> h_;
  uint64_t id_;
};

std::shared_ptr<UcxHelper> UcxHelper::start(const std::string &path,
                                            const std::string &transports) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    fail(SWIFTKV_EPEER, std::string("UCX helper: socketpair: ") + std::strerror(errno));
  }
  UniqueFd mine(sv[0]), theirs(sv[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, theirs.get(), 3);  // dup2 clears close-on-exec
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&at, &none);
  posix_spawnattr_setsigdefault(&at, &all);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::string a0 = path, a1 = "--channel", a2 = "3", a3 = "--transports", a4 = transports;
  char *argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, path.c_str(), &fa, &at, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc != 0) fail(SWIFTKV_EPEER, "UCX helper: cannot start " + path + ": " + std::strerror(rc));
  theirs.reset();
  std::shared_ptr<UcxHelper> h(new UcxHelper(pid, std::move(mine)));
  FdPacket p;
  try {
    p = fd_recv(h->ch_.get(), kAnswerMs);
  } catch (const Error &e) {
    h->mark_gone();
    fail(SWIFTKV_EPEER, std::string("UCX helper: no hello: ") + e.what());
  }
  helper_wire::Answer a{};
  if (p.closed || p.bytes.size() < sizeof a) {
    h->mark_gone();
    fail(SWIFTKV_EPEER, "UCX helper " + path + " exited before its hello");
  }
  std::memcpy(&a, p.bytes.data(), sizeof a);
  const auto *tail = reinterpret_cast<const std::byte *>(p.bytes.data() + sizeof a);
  const size_t tail_len = p.bytes.size() - sizeof a;
  if (a.magic != helper_wire::kMagic || a.op != helper_wire::hello ||
      a.version != helper_wire::kVersion) {
    h->mark_gone();
    fail(SWIFTKV_EPEER, "UCX helper " + path + " speaks another protocol");
  }
  if (a.status != SWIFTKV_OK || tail_len == 0) {
    h->mark_gone();
    fail(SWIFTKV_EPEER,
         "UCX helper cannot serve: " + std::string(reinterpret_cast<const char *>(tail), tail_len));
  }
  h->address_.assign(tail, tail + tail_len);
  return h;
}

UcxHelper::~UcxHelper() {
  ch_.reset();  // the helper exits when its channel closes
  if (reaped_ || pid_ <= 0) return;
  // A helper that does not go within a second is killed.
  for (int i = 0; i < 100; ++i) {
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    ::usleep(10'000);
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

void UcxHelper::mark_gone() noexcept {
  gone_ = true;
  if (reaped_ || pid_ <= 0) return;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) {  // alive but useless to us: it goes
    ::kill(pid_, SIGKILL);
    r = ::waitpid(pid_, &status, 0);
  }
  reaped_ = true;
  if (r == pid_ && WIFSIGNALED(status)) {
    log_warn("coordinator: the UCX helper (pid " + std::to_string(pid_) + ") ended by signal " +
             std::to_string(WTERMSIG(status)) + "; the borrowers it served must borrow again");
  } else {
    log_warn("coordinator: the UCX helper (pid " + std::to_string(pid_) +
             ") ended; the borrowers it served must borrow again");
  }
}

bool UcxHelper::gone() {
  if (!gone_ && fd_peer_gone(ch_.get())) mark_gone();
  return gone_;
}

helper_wire::Answer UcxHelper::call(const helper_wire::Request &r, const int *fd,
                                    std::vector<std::byte> *tail, int timeout_ms) {
  if (gone_) fail(SWIFTKV_EPEER, "the UCX helper has gone");
  FdPacket p;
  try {
    fd_send(ch_.get(), std::span<const uint8_t>(reinterpret_cast<const uint8_t *>(&r), sizeof r),
            fd != nullptr ? std::span<const int>(fd, 1) : std::span<const int>());
    p = fd_recv(ch_.get(), timeout_ms);
  } catch (const Error &e) {
    mark_gone();
    fail(SWIFTKV_EPEER, std::string("the UCX helper: ") + e.what());
  }
  helper_wire::Answer a{};
  if (p.closed || p.bytes.size() < sizeof a) {
    mark_gone();
    fail(SWIFTKV_EPEER, "the UCX helper has gone");
  }
  std::memcpy(&a, p.bytes.data(), sizeof a);
  if (a.magic != helper_wire::kMagic || a.op != r.op || a.id != r.id) {
    mark_gone();
    fail(SWIFTKV_EPEER, "the UCX helper answered another request");
  }
  const auto *t = reinterpret_cast<const std::byte *>(p.bytes.data() + sizeof a);
  const size_t n = p.bytes.size() - sizeof a;
  if (a.status != SWIFTKV_OK) {
    fail(static_cast<swiftkv_status>(a.status),
         "the UCX helper: " + std::string(reinterpret_cast<const char *>(t), n));
  }
  if (tail != nullptr) tail->assign(t, t + n);
  return a;
}

std::unique_ptr<transport::UcxRegistration> UcxHelper::register_range(uint64_t region, int memfd,
                                                                      uint64_t region_bytes,
                                                                      uint64_t offset,
                                                                      uint64_t bytes) {
  using namespace helper_wire;
  if (mapped_.count(region) == 0) {
    call(Request{kMagic, map, region, region, 0, region_bytes}, &memfd, nullptr, kAnswerMs);
    mapped_.insert(region);
  }
  const uint64_t id = next_id_++;
  std::vector<std::byte> key;
  const Answer a = call(Request{kMagic, reg, id, region, offset, bytes}, nullptr, &key, kAnswerMs);
  if (key.empty()) {
    mark_gone();
    fail(SWIFTKV_EPEER, "the UCX helper sent no remote key");
  }
  return std::make_unique<HelperRegistration>(shared_from_this(), id, std::move(key), a.base,
                                              bytes);
}

void UcxHelper::unregister(uint64_t id) noexcept {
  if (gone_) return;  // gone: its registrations went with it
  try {
    call(helper_wire::Request{helper_wire::kMagic, helper_wire::unreg, id, 0, 0, 0}, nullptr,
         nullptr, kAnswerMs);
  } catch (const Error &e) {
    // A refused unregistration is the helper's bug: it must not keep serving the bytes.
    if (!gone_) {
      log_warn(std::string("coordinator: ") + e.what() + "; stopping the helper");
      mark_gone();
    }
  }
}

void UcxHelper::forget_region(uint64_t region) noexcept {
  if (gone_ || mapped_.erase(region) == 0) return;
  try {
    call(helper_wire::Request{helper_wire::kMagic, helper_wire::unmap, region, region, 0, 0},
         nullptr, nullptr, kAnswerMs);
  } catch (const Error &) {
    if (!gone_) mark_gone();
  }
}

}  // namespace swiftkv::coord
