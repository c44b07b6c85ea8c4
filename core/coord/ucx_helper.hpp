// The UCX helper: a child process of the lender that serves borrowers' UCX gets and puts on lent
// host memory, so that nothing a borrower does over UCX reaches the lender process itself.
//
// Over a transport without hardware RMA (tcp) UCX emulates every get and put with messages that
// the serving worker answers, and UCX 1.13 stops the serving process when an answer cannot be
// sent because the borrower died (docs/remote.md). A remote key is also checked by nobody over
// tcp: a borrower that speaks UCX directly can name any address of the serving process. In the
// helper both land on a process that maps only the lent regions' memfds: an abort costs the
// borrowers it served their sessions (they see their lender fail and borrow again), never the
// lender its process; a forged address reaches the helper's memory, not the lender's.
//
// The lender talks to its helper over a Unix SOCK_SEQPACKET socket pair (the fd channel's
// packets), one request and one answer at a time, from the coordinator's thread:
//   hello   (helper -> lender, once): its serving worker's address
//   map     a region's memfd (attached) under a key, with its size
//   reg     [offset, offset + bytes) of a mapped region -> packed remote key and base address
//   unreg   a registration, answered once UCX has unregistered it: the lender reuses the bytes
//           only after that answer (or after the helper is gone, which unregisters everything)
//   unmap   a region's mapping
// A helper that exits, is killed or aborts closes its end; the lender notices on its next
// request or when its poll sees the hang-up, reaps it and starts another for the next session.
//
// Host memory only: a CUDA region is served in the lender's process, as before (its transports
// have hardware RMA, where the lender takes no part in a get or put).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/common/unique_fd.hpp"
#include "core/transport/ucx_transport.hpp"

namespace swiftkv::coord {

// The helper binary: $SWIFTKV_UCX_HELPER when set ("off": none, serve in the lender's process),
// else swiftkv-ucx-helper beside the library (or program) holding this code, else in the
// install's libexec directory. nullopt when there is none.
std::optional<std::string> ucx_helper_path();

// The protocol's requests and answers (little-endian, fixed layouts, checked by size).
namespace helper_wire {
inline constexpr uint32_t kMagic = 0x48564b53;  // "SKVH"
inline constexpr uint32_t kVersion = 1;
enum Op : uint32_t { hello = 1, map = 2, reg = 3, unreg = 4, unmap = 5 };
struct Request {
  uint32_t magic, op;
  uint64_t id;      // reg/unreg: the registration; map/unmap: the region key
  uint64_t region;  // reg: the region key
  uint64_t offset, bytes;
};
struct Answer {
  uint32_t magic, op;
  uint64_t id;
  int32_t status;  // a swiftkv_status
  uint32_t version;
  uint64_t base;  // reg: the address peers name
  // followed by: hello: the worker address; reg: the packed key; an error: its message
};
}  // namespace helper_wire

// One running helper. Not thread-safe: the coordinator's thread owns it.
class UcxHelper : public std::enable_shared_from_this<UcxHelper> {
 public:
  // Starts `path` with UCX transports `transports` (empty: UCX's choice) and waits for its
  // hello. EPEER when it cannot start or does not say hello within 10 s.
  static std::shared_ptr<UcxHelper> start(const std::string &path, const std::string &transports);
  ~UcxHelper();
  UcxHelper(const UcxHelper &) = delete;
  UcxHelper &operator=(const UcxHelper &) = delete;

  const std::vector<std::byte> &address() const noexcept { return address_; }
  pid_t pid() const noexcept { return pid_; }
  // Readable (or hung up) when the helper has gone; the owner then calls gone().
  int event_fd() const noexcept { return ch_.get(); }
  // Whether it has gone (checked without blocking); reaps it the first time.
  bool gone();

  // Registers [offset, offset + bytes) of the memfd region `region` (its key, unique in this
  // process; the fd goes to the helper with its first registration). EPEER when the helper
  // refuses or has gone (which then also counts as gone()).
  std::unique_ptr<transport::UcxRegistration> register_range(uint64_t region, int memfd,
                                                             uint64_t region_bytes, uint64_t offset,
                                                             uint64_t bytes);
  // Unmaps a region the helper mapped (nothing when it did not).
  void forget_region(uint64_t region) noexcept;

 private:
  friend class HelperRegistration;
  UcxHelper(pid_t pid, UniqueFd ch) : pid_(pid), ch_(std::move(ch)) {}
  // One request, its answer (EPEER: the helper has gone or answered nonsense; the helper's own
  // error status otherwise). Extra bytes of the answer go to *tail.
  helper_wire::Answer call(const helper_wire::Request &r, const int *fd,
                           std::vector<std::byte> *tail, int timeout_ms);
  void unregister(uint64_t id) noexcept;
  void mark_gone() noexcept;

  pid_t pid_;
  UniqueFd ch_;
  std::vector<std::byte> address_;
  std::set<uint64_t> mapped_;
  uint64_t next_id_ = 1;
  bool gone_ = false;
  bool reaped_ = false;
};

}  // namespace swiftkv::coord
