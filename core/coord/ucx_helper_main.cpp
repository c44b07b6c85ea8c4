// swiftkv-ucx-helper: serves borrowers' UCX gets and puts on a lender's host memory, in a process
// of its own (see ucx_helper.hpp). Started by the lender with its channel as fd 3; exits when
// the channel closes or the lender dies.
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/coord/fd_channel.hpp"
#include "core/coord/ucx_helper.hpp"
#include "core/transport/ucx_transport.hpp"

namespace {

namespace co = swiftkv::coord;
namespace hw = swiftkv::coord::helper_wire;

struct Mapping {
  std::byte *base = nullptr;
  uint64_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
};

void answer(int ch, const hw::Request &r, swiftkv_status st, uint64_t base, const void *tail,
            size_t tail_len) {
  hw::Answer a{hw::kMagic, r.op, r.id, st, hw::kVersion, base};
  std::vector<uint8_t> b(sizeof a + tail_len);
  std::memcpy(b.data(), &a, sizeof a);
  if (tail_len != 0) std::memcpy(b.data() + sizeof a, tail, tail_len);
  co::fd_send(ch, b, {});
}

void refuse(int ch, const hw::Request &r, swiftkv_status st, const std::string &why) {
  answer(ch, r, st, 0, why.data(), why.size());
}

class Helper {
 public:
  Helper(int ch, std::shared_ptr<swiftkv::transport::UcxContext> ucx)
      : ch_(ch), ucx_(std::move(ucx)) {}

  // One request; false when the channel closed.
  bool on_channel() {
    co::FdPacket p = co::fd_recv(ch_, 0);
    if (p.closed) return false;
    hw::Request r{};
    if (p.bytes.size() != sizeof r) {
      r.magic = hw::kMagic;
      refuse(ch_, r, SWIFTKV_EINVAL, "a request of " + std::to_string(p.bytes.size()) + " bytes");
      return true;
    }
    std::memcpy(&r, p.bytes.data(), sizeof r);
    if (r.magic != hw::kMagic) {
      refuse(ch_, r, SWIFTKV_EINVAL, "a request without the magic");
      return true;
    }
    try {
      switch (r.op) {
        case hw::map: return map(r, p), true;
        case hw::reg: return reg(r), true;
        case hw::unreg:
          regs_.erase(r.id);  // ucp_mem_unmap, before the answer
          answer(ch_, r, SWIFTKV_OK, 0, nullptr, 0);
          return true;
        case hw::unmap:
          std::erase_if(regs_, [&](const auto &e) { return e.second.region == r.id; });
          maps_.erase(r.id);
          answer(ch_, r, SWIFTKV_OK, 0, nullptr, 0);
          return true;
        default: refuse(ch_, r, SWIFTKV_EINVAL, "op " + std::to_string(r.op)); return true;
      }
    } catch (const swiftkv::Error &e) {
      refuse(ch_, r, e.status(), e.what());
    }
    return true;
  }

 private:
  void map(const hw::Request &r, co::FdPacket &p) {
    if (p.fds.size() != 1) return refuse(ch_, r, SWIFTKV_EINVAL, "map without one fd");
    if (maps_.count(r.id) != 0) return refuse(ch_, r, SWIFTKV_EINVAL, "a region mapped twice");
    struct stat st {};
    if (::fstat(p.fds[0].get(), &st) != 0 || r.bytes == 0 ||
        static_cast<uint64_t>(st.st_size) < r.bytes) {
      return refuse(ch_, r, SWIFTKV_EINVAL, "the region's fd is smaller than its size");
    }
    void *m = ::mmap(nullptr, r.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, p.fds[0].get(), 0);
    if (m == MAP_FAILED) {
      return refuse(ch_, r, SWIFTKV_ENOMEM, std::string("mmap: ") + std::strerror(errno));
    }
    auto mapping = std::make_unique<Mapping>();
    mapping->base = static_cast<std::byte *>(m);
    mapping->bytes = r.bytes;
    maps_.emplace(r.id, std::move(mapping));
    answer(ch_, r, SWIFTKV_OK, 0, nullptr, 0);
  }

  void reg(const hw::Request &r) {
    const auto it = maps_.find(r.region);
    if (it == maps_.end()) return refuse(ch_, r, SWIFTKV_EINVAL, "a range of an unmapped region");
    const Mapping &m = *it->second;
    if (r.bytes == 0 || r.offset > m.bytes || r.bytes > m.bytes - r.offset) {
      return refuse(ch_, r, SWIFTKV_EINVAL, "a range outside its region");
    }
    if (regs_.count(r.id) != 0) return refuse(ch_, r, SWIFTKV_EINVAL, "a registration id twice");
    std::unique_ptr<swiftkv::transport::UcxRegistration> g =
        ucx_->register_memory(m.base + r.offset, r.bytes);
    const std::vector<std::byte> &key = g->packed_key();
    const uint64_t base = g->base();
    if (sizeof(hw::Answer) + key.size() > co::kMaxPacketBytes) {
      return refuse(ch_, r, SWIFTKV_EPEER, "a remote key too large for the channel");
    }
    regs_.emplace(r.id, Reg{r.region, std::move(g)});
    const std::vector<std::byte> &k = regs_.at(r.id).g->packed_key();
    answer(ch_, r, SWIFTKV_OK, base, k.data(), k.size());
  }

  int ch_;
  std::shared_ptr<swiftkv::transport::UcxContext> ucx_;
  // Registrations go before the mappings they cover.
  std::map<uint64_t, std::unique_ptr<Mapping>> maps_;
  struct Reg {
    uint64_t region;
    std::unique_ptr<swiftkv::transport::UcxRegistration> g;
  };
  std::map<uint64_t, Reg> regs_;
};

}  // namespace

int main(int argc, char **argv) {
  int ch = -1;
  std::string transports;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--channel") == 0) ch = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--transports") == 0) transports = argv[i + 1];
  }
  if (ch < 0) {
    std::fprintf(stderr, "swiftkv-ucx-helper: started by a swiftkv lender, not by hand\n");
    return 2;
  }
  // Ends with the lender, whatever way it ends; nothing else of the lender's stays open here.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() == 1) return 0;
  ::close_range(static_cast<unsigned>(ch) + 1, ~0U, 0);
  ::signal(SIGPIPE, SIG_IGN);
  hw::Request hello{hw::kMagic, hw::hello, 0, 0, 0, 0};
  std::shared_ptr<swiftkv::transport::UcxContext> ucx;
  try {
    ucx = swiftkv::transport::UcxContext::create(swiftkv::transport::UcxOptions{transports});
    const std::vector<std::byte> addr = ucx->serving_address();
    answer(ch, hello, SWIFTKV_OK, 0, addr.data(), addr.size());
  } catch (const swiftkv::Error &e) {
    try {
      refuse(ch, hello, e.status(), e.what());
    } catch (...) {
    }
    return 1;
  }
  Helper h(ch, ucx);
  try {
    // The lender's reg/unreg come between gets and puts: one poll drives both.
    for (;;) {
      pollfd p[2] = {{ch, POLLIN, 0}, {ucx->serving_event_fd(), POLLIN, 0}};
      ucx->serve();  // drain and re-arm before sleeping
      if (::poll(p, 2, 1000) < 0 && errno != EINTR) return 1;
      if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0 && !h.on_channel()) return 0;
    }
  } catch (const swiftkv::Error &e) {
    std::fprintf(stderr, "swiftkv-ucx-helper: %s\n", e.what());
    return 1;
  }
}
