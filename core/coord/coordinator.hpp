// The coordinator: the control plane between the lenders and borrowers of different processes
// (SwiftCache §3.5), one per context, over ZeroMQ.
//
// Lender side: the context binds its endpoint (a ROUTER socket) and offers elastic regions under
// names. A borrower's handshake names one; both sides check that the region's borrower geometry
// is the borrower's and compute the lending unit; the lender then passes the region's export
// (memfd or VMM fds over the fd channel, or CUDA IPC handle bytes in the welcome) and the
// borrower maps it once. Leases are granted on request, renewed by heartbeat, asked back when
// the region must grow (reclaim), and given back by the borrower once it evacuated them (the
// ack; its latency is measured). A borrower that goes silent loses its leases when they expire.
//
// Borrower side: one session (a DEALER socket and an fd-channel connection) per lender endpoint
// and name, with a mirror of the session's leases. A lease is read only while the mirror says it
// is within its lease: its deadline is counted from when the renewing heartbeat was sent, so it
// never outlasts the lender's. The lender gone (its fd channel hung up, or no heartbeat answered
// in time) makes every lease of the session lost: the cache drops the chunks there and loads
// from it fail.
//
// Every message carries the protocol version, a per-direction sequence number and the lender's
// lease-table epoch (one step per grant, reclaim, release or expiry). A malformed, unexpected,
// duplicated or reordered message is logged, counted and dropped; none changes any state.
//
// Threads: one thread owns every socket. Callers post commands to it and wait (bounded by the
// timeout) for the answer; mu_ guards everything the thread shares with them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/common/defaults.hpp"
#include "core/coord/beat_page.hpp"
#include "core/elastic/elastic_region.hpp"
#include "core/geometry/model_geometry.hpp"
#include "core/tiers/lender_link.hpp"

namespace swiftkv::coord {

// How a borrower reaches a lender's memory (swiftkv_remote_path).
enum class RemotePath : uint32_t { automatic = 0, ucx = 1, local = 2 };

struct CoordOptions {
  std::optional<std::string> endpoint;  // where this process's regions are offered
  // How often a borrower renews (at most lease / 3).
  uint64_t heartbeat_ns = defaults::ns_of_ms(defaults::kCtx.coord_heartbeat_ms);
  // A handshake's or a lend's longest wait.
  uint64_t timeout_ns = defaults::ns_of_ms(defaults::kCtx.coord_timeout_ms);
  // As a borrower: mapped memory on this host, UCX from elsewhere (or always one of them).
  RemotePath path = static_cast<RemotePath>(defaults::kCtx.coord_remote_path);
  std::string ucx_transports;  // UCX_TLS; empty: what UCX picks
  // One UCX batch's longest wait.
  uint64_t rma_timeout_ns = defaults::ns_of_ms(defaults::kCtx.coord_rma_timeout_ms);
  // As a borrower on the lender's host: heartbeats through a shared page (beat_page.hpp) rather
  // than messages, of beat_page_bytes (a wide page, or the narrow page of the builds before
  // it). The environment's SWIFTKV_COORD_HEARTBEAT says message, page or narrow-page.
  bool beat_page = true;
  size_t beat_page_bytes = kWideBeatPageBytes;
};

struct CoordStats {
  uint64_t offered_regions = 0;
  uint64_t sessions_served = 0;    // borrower sessions on this process's regions, now
  uint64_t lenders_connected = 0;  // remote lenders this process borrows from, now
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t messages_dropped = 0;  // malformed, unexpected, duplicated or stale
  uint64_t heartbeats_sent = 0;
  uint64_t heartbeats_answered = 0;
  uint64_t reclaims_sent = 0;     // leases asked back from remote borrowers
  uint64_t reclaims_acked = 0;    // ... and given back
  uint64_t reclaim_ns_total = 0;  // request to ack, summed over reclaims_acked
  uint64_t reclaim_ns_max = 0;
  uint64_t leases_lost = 0;      // borrower side: leases lost to expiry or a dead lender
  uint64_t lenders_lost = 0;     // borrower side: sessions whose lender went away
  uint64_t remote_sessions = 0;  // lender side: sessions served over UCX, now
  uint64_t remote_lenders = 0;   // borrower side: lenders reached over UCX, now
  uint64_t grants_refused = 0;   // borrower side: grants given straight back
  uint64_t rma_batches = 0;      // borrower side, from the UCX transport
  uint64_t rma_batches_failed = 0;
  uint64_t rma_bytes_read = 0;
  uint64_t rma_bytes_written = 0;
};

// Where this process runs, as far as sharing memory goes: the kernel's boot id and the network
// namespace (the fd channel is an abstract Unix socket, which lives in one). Two processes with
// the same identity can pass fds; any others reach each other's memory over UCX.
std::string host_identity();

class Coordinator {
 public:
  // Binds options.endpoint when set (EINVAL for a malformed one, EPEER when it cannot be bound).
  // Throws EUNSUPPORTED in a build without ZeroMQ when an endpoint is given.
  explicit Coordinator(CoordOptions options);
  ~Coordinator();
  Coordinator(const Coordinator &) = delete;
  Coordinator &operator=(const Coordinator &) = delete;

  // Ends every session: borrowers say bye, the thread stops. Links answer "lost" afterwards.
  void shutdown() noexcept;

  // Offers `region` to remote borrowers under `name` (1-255 bytes). ESTATE without an endpoint
  // or for a region without a borrower geometry; EBUSY when the name is taken.
  void offer(const std::string &name, const std::shared_ptr<ElasticRegion> &region);
  // Stops offering `region`; sessions on it see it gone. Safe for a region never offered.
  void withdraw(const ElasticRegion *region) noexcept;

  // A link to the region `name` at `endpoint`, for a borrower of geometry `g`, reusing an open
  // session. `on_reclaim` is called (from the coordinator's thread, with no lock held) when the
  // lender asks a lease back or is lost. EPEER / ETIMEDOUT / EINVAL / EVERSION as the handshake
  // fails.
  std::shared_ptr<LenderLink> connect(const std::string &endpoint, const std::string &name,
                                      const ModelGeometry &g, std::function<void()> on_reclaim);

  CoordStats stats() const;
  const CoordOptions &options() const noexcept;

  struct State;  // the implementation's

 private:
  std::shared_ptr<State> s_;
};

}  // namespace swiftkv::coord
