// One-sided access to another node's lent memory over UCX (issue: lending across nodes).
//
// The lender registers a region's memory (ucp_mem_map) and hands the borrower two blobs through
// the control plane: its worker's address and the region's packed remote key. The borrower
// connects an endpoint to that address, unpacks the key, and reads and writes the region with
// ucp_get_nbx / ucp_put_nbx. A batch issues all its operations non-blocking, then one flush, and
// waits once for all of them.
//
// Two workers per process, by role, so that each has exactly one driver:
// - the serving worker (lender side) is progressed only by the thread that owns the process's
//   control plane (it polls event_fd()): with transports that emulate RMA in software (tcp), the
//   borrower's gets and puts complete only while the lender progresses;
// - the client worker (borrower side) is shared by the threads that copy chunks; a mutex
//   serialises every call on it, and a waiting batch drives it for everyone.
// Both live in one UCX context, so memory registered once is reachable through either.
//
// Failures never return wrong bytes: a batch either completes (every byte moved) or throws, and
// when it throws the caller must treat every operation of the batch as failed. The peer's death
// reaches an endpoint through UCX's error callback (peer error handling mode); a peer that stops
// answering without a reset (a link taken down) is caught by the batch's timeout, which closes
// the endpoint so that no operation can still land in the caller's buffers afterwards.
//
// A build without UCX has a twin (ucx_transport_disabled.cpp) whose constructors throw
// SWIFTKV_EUNSUPPORTED.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace swiftkv::transport {

// Whether this build has UCX.
bool ucx_built() noexcept;

struct UcxOptions {
  // UCX's transports, as UCX_TLS names them ("tcp", "rc,cuda_copy", ...). Empty: what UCX picks
  // (UCX_TLS from the environment, else all it finds).
  std::string transports;
};

struct UcxStats {
  uint64_t batches = 0;
  uint64_t ops = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t batches_failed = 0;  // the peer failed or timed out: nothing of the batch is trusted
  uint64_t keys_refused = 0;    // remote keys that did not unpack or named an impossible range
  uint64_t endpoints_failed = 0;
};

class UcxEndpoint;
class UcxRegistration;

// A UCX context and its two workers. Thread-safe.
class UcxContext : public std::enable_shared_from_this<UcxContext> {
 public:
  // EUNSUPPORTED without UCX in the build; EPEER when UCX cannot start (no transport usable, a
  // transport name it does not know).
  static std::shared_ptr<UcxContext> create(const UcxOptions &options);
  virtual ~UcxContext() = default;

  // The serving worker's address, for the borrower to connect to.
  virtual std::vector<std::byte> serving_address() const = 0;
  // Readable when the serving worker may have work; the owner then calls serve().
  virtual int serving_event_fd() const noexcept = 0;
  // Drives the serving worker until it is idle and re-arms its event fd. Call from one thread.
  virtual void serve() = 0;

  // Whether UCX reaches CUDA device memory here (a UCX built with CUDA): only then may a batch's
  // local buffers or a registration be device memory.
  virtual bool cuda_memory() const noexcept = 0;

  // Makes [base, base + bytes) reachable by peers (EPEER when UCX refuses it).
  virtual std::unique_ptr<UcxRegistration> register_memory(void *base, size_t bytes) = 0;
  // Connects the client worker to a serving worker's address (EPEER when UCX refuses it).
  virtual std::shared_ptr<UcxEndpoint> connect(std::span<const std::byte> peer_address) = 0;

  virtual UcxStats stats() const = 0;
};

// Registered memory. Unregistered when destroyed: peers' operations on it then fail.
class UcxRegistration {
 public:
  virtual ~UcxRegistration() = default;
  // The remote key as the peer unpacks it.
  virtual const std::vector<std::byte> &packed_key() const noexcept = 0;
  virtual uint64_t base() const noexcept = 0;  // the address peers name
  virtual uint64_t bytes() const noexcept = 0;
};

// A registration's key, base and size held as values: what every kind of registration shares.
class KeyedRegistration : public UcxRegistration {
 public:
  KeyedRegistration(std::vector<std::byte> key, uint64_t base, uint64_t bytes)
      : key_(std::move(key)), base_(base), bytes_(bytes) {}
  const std::vector<std::byte> &packed_key() const noexcept override { return key_; }
  uint64_t base() const noexcept override { return base_; }
  uint64_t bytes() const noexcept override { return bytes_; }

 private:
  std::vector<std::byte> key_;
  uint64_t base_, bytes_;
};

// A peer's registered range, reached through one endpoint.
struct RemoteRange {
  std::vector<std::byte> packed_key;
  uint64_t base = 0;
  uint64_t bytes = 0;
};

// The most bytes one UCX operation of a batch moves: a longer op goes in pieces this long. A
// batch times out when no piece completes for its timeout, so a link is taken for a dead one only
// when it moves less than a piece in that time (1 MiB in the default 2 s: 0.5 MB/s).
inline constexpr uint64_t kRmaPieceBytes = 1 << 20;

// One operation of a batch: `bytes` between local memory and the range's byte `offset`.
struct RmaOp {
  enum class Kind { get, put } kind;
  uint64_t offset;
  std::byte *local;
  size_t bytes;
};

// An operation on one of an endpoint's ranges.
struct RangeOp {
  uint64_t range;
  RmaOp op;
};

// An endpoint of the client worker to one serving peer. Thread-safe.
class UcxEndpoint {
 public:
  virtual ~UcxEndpoint() = default;

  // Unpacks a peer's key for `range` and keeps it under `id` (replacing one there). EPEER (and
  // counted in keys_refused) for a key UCX does not accept, an empty or wrapping range, or a key
  // over 64 KiB; the endpoint stays usable.
  virtual void add_range(uint64_t id, const RemoteRange &range) = 0;
  // Forgets a range; nothing more is issued on it. Safe for an unknown id.
  virtual void remove_range(uint64_t id) noexcept = 0;

  // Issues every op (each on its own range) at once, then one flush, and waits for all of them
  // and their remote completion. EINVAL (nothing issued): an unknown range, or an op outside
  // its range. EPEER: the peer failed or refused an op; ETIMEDOUT: timeout_ns passed with none
  // of the batch's outstanding pieces completing (kRmaPieceBytes: a batch that keeps moving may
  // take longer, however large its ops). After EPEER or ETIMEDOUT the endpoint is closed
  // (failed() is true), no op can still touch the local buffers, and none of the batch's bytes
  // may be trusted.
  virtual void run(std::span<const RangeOp> ops, uint64_t timeout_ns) = 0;
  // run() with every op on range `id`.
  void run(uint64_t id, std::span<const RmaOp> ops, uint64_t timeout_ns);

  // Whether the peer is gone (its error callback fired, or a batch timed out).
  virtual bool failed() const noexcept = 0;
};

inline void UcxEndpoint::run(uint64_t id, std::span<const RmaOp> ops, uint64_t timeout_ns) {
  std::vector<RangeOp> on_range;
  on_range.reserve(ops.size());
  for (const RmaOp &op : ops) on_range.push_back({id, op});
  run(on_range, timeout_ns);
}

}  // namespace swiftkv::transport
