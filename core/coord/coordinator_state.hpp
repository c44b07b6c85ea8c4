// The coordinator's private state, in three parts, each saying which thread owns what:
//  - Coordinator::State (coordinator.cpp): what callers and the coordinator's thread share,
//    guarded by its mutex, and the thread's loop with its poll set;
//  - LenderService (coord_lender.cpp): borrower sessions on this process's offered regions;
//  - BorrowerSessions (coord_borrower.cpp): this process's sessions with remote lenders.
// The two sides belong to the coordinator's thread (set up before it starts, torn down after it
// ends) and reach the shared part only through State, under its mutex. Not installed; nothing
// outside core/coord includes it.
#pragma once

#include <sys/types.h>

#include <zmq.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/common/error.hpp"
#include "core/common/log.hpp"
#include "core/common/unique_fd.hpp"
#include "core/coord/beat_page.hpp"
#include "core/coord/coordinator.hpp"
#include "core/coord/piece_queue.hpp"
#include "core/coord/ucx_helper.hpp"
#include "core/coord/wire.hpp"
#include "core/memory/memory_region.hpp"
#include "core/transport/ucx_transport.hpp"

namespace swiftkv::coord {

// How long a grant (or the handshake) waits for the fd packets it names once it has come. The
// lender writes them before it sends the grant, so only a lender that stopped takes this long.
inline constexpr uint64_t kFdWaitNs = 2'000'000'000;
inline constexpr size_t kMaxServed = 4096;  // borrower sessions one context serves at most

inline WireGeometry wire_geometry(const ModelGeometry &g) {
  return WireGeometry{g.num_layers,   g.num_kv_heads, g.head_dim,
                      g.block_tokens, g.chunk_tokens, static_cast<int32_t>(g.dtype)};
}

inline ModelGeometry model_geometry(const WireGeometry &w) {
  ModelGeometry g;
  g.num_layers = w.num_layers;
  g.num_kv_heads = w.num_kv_heads;
  g.head_dim = w.head_dim;
  g.block_tokens = w.block_tokens;
  g.chunk_tokens = w.chunk_tokens;
  g.dtype = static_cast<swiftkv_dtype>(w.dtype);
  return g;
}

inline std::string geometry_text(const WireGeometry &g) {
  return "layers " + std::to_string(g.num_layers) + ", kv heads " + std::to_string(g.num_kv_heads) +
         ", head dim " + std::to_string(g.head_dim) + ", chunk " + std::to_string(g.chunk_tokens) +
         " tokens, dtype " + std::to_string(g.dtype);
}

// A borrower's option goes on the wire as is.
static_assert(static_cast<uint8_t>(RemotePath::automatic) ==
                  static_cast<uint8_t>(PathWish::automatic) &&
              static_cast<uint8_t>(RemotePath::ucx) == static_cast<uint8_t>(PathWish::ucx) &&
              static_cast<uint8_t>(RemotePath::local) == static_cast<uint8_t>(PathWish::local));

inline bool known_error_status(int32_t s) { return s <= SWIFTKV_EINVAL && s >= SWIFTKV_EINTERNAL; }

// The chunk layout a borrower's lent memory must have: its geometry with the lender's block size
// irrelevant (the lent tail is laid out in borrower chunks).
inline bool same_chunk_layout(const WireGeometry &a, const WireGeometry &b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.chunk_tokens == b.chunk_tokens && a.dtype == b.dtype;
}

// One ZeroMQ message part, closed exactly once.
class Part {
 public:
  Part() { zmq_msg_init(&m_); }
  ~Part() { zmq_msg_close(&m_); }
  Part(const Part &) = delete;
  Part &operator=(const Part &) = delete;
  zmq_msg_t *get() { return &m_; }
  std::span<const uint8_t> bytes() {
    return {static_cast<const uint8_t *>(zmq_msg_data(&m_)), zmq_msg_size(&m_)};
  }

 private:
  zmq_msg_t m_;
};

// Receives one whole message (all its parts) without waiting; false when none is queued.
inline bool recv_parts(void *sock, std::vector<std::vector<uint8_t>> *parts) {
  parts->clear();
  for (;;) {
    Part p;
    if (zmq_msg_recv(p.get(), sock, ZMQ_DONTWAIT) < 0) return !parts->empty();
    const auto b = p.bytes();
    parts->emplace_back(b.begin(), b.end());
    if (!zmq_msg_more(p.get())) return true;
    if (parts->size() > 4) {  // drain the rest of an oversized multipart message
      while (zmq_msg_more(p.get()) && zmq_msg_recv(p.get(), sock, ZMQ_DONTWAIT) >= 0) {
      }
      return true;
    }
  }
}

// A ZeroMQ context, terminated exactly once (every socket of it must be closed before).
class ZmqContext {
 public:
  ZmqContext() = default;
  ~ZmqContext() { reset(); }
  ZmqContext(const ZmqContext &) = delete;
  ZmqContext &operator=(const ZmqContext &) = delete;
  // Makes the context if there is none yet; EPEER when ZeroMQ cannot.
  void *get_or_make() {
    if (c_ == nullptr) c_ = zmq_ctx_new();
    if (c_ == nullptr) fail(SWIFTKV_EPEER, "zmq_ctx_new failed");
    return c_;
  }
  void *get() const noexcept { return c_; }
  void reset() noexcept {
    if (c_ != nullptr) zmq_ctx_term(c_);
    c_ = nullptr;
  }

 private:
  void *c_ = nullptr;
};

// A ZeroMQ socket, closed exactly once: by reset() or when it goes.
class ZmqSocket {
 public:
  ZmqSocket() = default;
  ZmqSocket(void *ctx, int type) : s_(zmq_socket(ctx, type)) {}
  ~ZmqSocket() { reset(); }
  ZmqSocket(ZmqSocket &&o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  ZmqSocket &operator=(ZmqSocket &&o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  void *get() const noexcept { return s_; }
  explicit operator bool() const noexcept { return s_ != nullptr; }
  void reset() noexcept {
    if (s_ != nullptr) zmq_close(s_);
    s_ = nullptr;
  }
  void set(int opt, int v) noexcept { zmq_setsockopt(s_, opt, &v, sizeof(v)); }
  void set(int opt, int64_t v) noexcept { zmq_setsockopt(s_, opt, &v, sizeof(v)); }

 private:
  void *s_ = nullptr;
};

// What one zmq_poll waits on, each item with what to do when it is ready. dispatch() runs the
// actions in the order the items were added; an item added with `always` runs its action
// whether it is ready or not (sources read without waiting, woken by something else).
class PollSet {
 public:
  void clear() {
    items_.clear();
    actions_.clear();
  }
  void add_socket(void *sock, std::function<void()> action, bool always = false) {
    items_.push_back({sock, 0, ZMQ_POLLIN, 0});
    actions_.push_back({std::move(action), always});
  }
  void add_fd(int fd, std::function<void()> action, bool always = false) {
    items_.push_back({nullptr, fd, ZMQ_POLLIN, 0});
    actions_.push_back({std::move(action), always});
  }
  // zmq_poll's result: the number of ready items, or -1 with zmq_errno() set.
  int wait(long timeout_ms) {
    return zmq_poll(items_.data(), static_cast<int>(items_.size()), timeout_ms);
  }
  void dispatch() {
    for (size_t i = 0; i < items_.size(); ++i) {
      if (actions_[i].always || items_[i].revents != 0) actions_[i].run();
    }
  }

 private:
  struct Action {
    std::function<void()> run;
    bool always = false;
  };
  std::vector<zmq_pollitem_t> items_;
  std::vector<Action> actions_;
};

struct MirrorLease {
  uint64_t first_unit = 0;
  uint64_t units = 0;
  uint64_t deadline_ns = 0;  // on CLOCK_MONOTONIC: never past the lender's expiry
  bool reclaim = false;
  bool lost = false;
};

struct LendWait {
  uint64_t max_units = 0;
  uint64_t sent_ns = 0;
  bool done = false;
  swiftkv_status status = SWIFTKV_OK;
  std::string message;
  LeaseGrant grant;
};

enum class Phase { connecting, awaiting_pieces, ready, failed };

// A borrower's session with one remote lender.
struct Session {
  std::string endpoint, name;
  WireGeometry mine;
  GeometrySizes sizes{};
  int32_t device = -1;  // the borrower's CUDA device: lent device memory is mapped for it
  std::function<void()> on_reclaim;

  // Guarded by Coordinator::State::mu.
  Phase phase = Phase::connecting;
  swiftkv_status fail_status = SWIFTKV_OK;
  std::string fail_message;
  bool lost = false;
  uint64_t epoch = 0;
  Welcome info;
  std::shared_ptr<RegionMapping> mapping;
  std::map<uint64_t, MirrorLease> leases;
  // The ids of the leases not lost, ascending, and the earliest of their deadlines, as
  // live_leases_locked listed them last: every heartbeat lists them, and walking a map of a
  // thousand leases each time was a third of a beat's cost. Listed again when a deadline may
  // have passed (deadlines only move later) or live_stale says the set changed: whatever adds
  // or erases a lease, or marks one lost, sets it.
  std::vector<uint64_t> live_ids;
  uint64_t live_due_ns = 0;
  bool live_stale = true;
  std::map<uint64_t, LendWait> lends;
  uint64_t next_request = 1;

  // The coordinator thread's alone, but fdconn: closed only there, so other threads may poll it.
  ZmqSocket sock;
  ZmqSocket monitor;  // sock's connection events, until the handshake is done
  UniqueFd fdconn;
  uint64_t send_seq = 0, recv_seq = 0;
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint64_t>>> hb_sent;  // seq -> (ns, ids)
  // The newest heartbeat given up on without its answer (more than 64 unanswered, or a newer
  // one answered first): an answer to it or an older one is late, not foreign.
  uint64_t hb_given_up = 0;
  // Written under mu (the cache's thread writes beats too); atomic so that next_due_ns() reads it
  // without the lock.
  std::atomic<uint64_t> next_heartbeat_ns{0};
  // The beat page passed with the fd channel's auth (beat_page.hpp), and whether the lender
  // accepted it (set by the thread before the session is ready): then heartbeats are beats
  // written there, on the cache's maintenance pass (RemoteLender::renew_many), not messages,
  // while they name at most beat.capacity() leases (kWideBeatLeases when the lender accepted the
  // page wide, else kBeatLeases). Under mu: beats written and not yet answered, seq -> (ns,
  // ids); the last answered; when the last beat was written; whether the live leases are more
  // than a beat names (the thread then sends heartbeat messages).
  BeatPage beat;
  bool beat_on = false;
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint64_t>>> beats_sent;
  uint64_t beat_answered = 0;
  std::atomic<uint64_t> last_beat_ns{0};
  std::atomic<bool> beat_overflow{false};
  // Memory pieces from the fd channel by request tag (0: the handshake's) until the message that
  // asks for them and all their packets are in, whichever came first (piece_queue.hpp); and the
  // grants waiting for their pieces, by request.
  PieceQueue queue{0};
  struct Parked {
    Grant grant;
    bool reclaim = false;  // the lender asked the lease back before its memory was all in
  };
  std::map<uint64_t, Parked> parked;
  // A session over UCX (its welcome carried a UCX address): set with the welcome, under mu, then
  // never changed. Its leases are not mapped; each has a range on the endpoint, by lease id.
  std::shared_ptr<transport::UcxEndpoint> ep;
};

// A borrower session on one of this process's regions. The coordinator thread's alone.
struct Served {
  std::string routing;
  uint64_t id = 0;
  std::array<uint8_t, 16> token{};
  std::string name;
  std::weak_ptr<ElasticRegion> region;
  uint32_t pid = 0;
  uint64_t recv_seq = 0, send_seq = 0, epoch = 0;
  std::set<uint64_t> leases;
  std::map<uint64_t, uint64_t> reclaim_sent_ns;
  UniqueFd fdconn;
  bool gone = false;        // the fd channel hung up: the borrower process is gone
  uint64_t created_ns = 0;  // a session whose fd channel never connects is forgotten
  // The borrower's beat page, when its auth passed one: read every beat_period_ns (the lender's
  // heartbeat, at most a third of the lease, at least 1 ms); the last beat answered.
  BeatPage beat;
  uint64_t beat_period_ns = 0;
  uint64_t beat_seen = 0;
  // A session over UCX: no fd channel; each lease's bytes registered on their own, unregistered
  // before the region gets the lease back. Forgotten once silent with no lease.
  bool remote = false;
  uint64_t last_heard_ns = 0;
  // The helper process that serves this session's UCX (null: this process serves it), and the
  // region's key there. Before regs: a registration goes first.
  std::shared_ptr<UcxHelper> helper;
  uint64_t helper_region = 0;
  std::map<uint64_t, std::unique_ptr<transport::UcxRegistration>> regs;
};

struct Command {
  enum class Kind { connect, lend, release, close } kind;
  std::shared_ptr<Session> session;
  uint64_t value = 0;  // lend: the request; release: the lease
  // release: the lease's bytes in the mapping, and whether the lender is told (not when the
  // lease or the lender was already lost).
  uint64_t offset = 0, bytes = 0;
  bool tell = true;
};

// The lender side: sessions remote borrowers hold on this process's offered regions, from the
// hello to the last release, and the scans that send reclaims and forget expired leases. The
// coordinator's thread owns it; the offers, the stats and the wake-up are State's.
class LenderService {
 public:
  explicit LenderService(Coordinator::State &st) : st_(st) {}
  // Binds the router at `endpoint` and opens the fd channel's listener; EPEER when either fails
  // (nothing is left bound then). Before the thread starts.
  void bind(const std::string &endpoint);
  // Closes the router and the listener, and removes the endpoint's socket file. After the
  // thread ends.
  void stop() noexcept;
  bool bound() const noexcept { return static_cast<bool>(router_); }
  void add_to(PollSet &poll);
  void scan_served(uint64_t now);
  // A context that serves no session has nothing to scan for (reclaims wake the thread).
  uint64_t next_due_ns() const noexcept {
    return served_.empty() ? UINT64_MAX : std::min(next_expiry_scan_ns_, next_beat_scan_ns_);
  }

 private:
  void note_ipc_file() noexcept;    // after the bind
  void remove_ipc_file() noexcept;  // after the router is closed
  void send_served(Served &srv, Payload p);
  void on_router();
  void on_hello(const std::string &routing, const Message &m);
  void on_accept();
  void on_auth(UniqueFd fd);
  void on_served_fd(Served &srv);
  void on_lend(Served &srv, const Lend &l);
  void on_heartbeat(Served &srv, const Message &m, const Heartbeat &h);
  // Renews `ids` that the session holds; the table of what it holds after (all of its leases,
  // or only those named), leases the region no longer has forgotten.
  std::vector<LeaseState> renew_leases(Served &srv, const std::vector<uint64_t> &ids,
                                       bool whole_table);
  // Reads every beat page whose time has come and answers a new beat.
  void scan_beats(uint64_t now);
  void on_release(Served &srv, const Release &r);
  void end_served(Served &srv);
  void send_pieces(int fd, uint64_t tag, const RegionExport &e, uint32_t *packets);
  // Whether `h`'s borrower reaches the region over UCX; refuses (and returns nullopt) when it can
  // reach it neither way.
  std::optional<bool> choose_path(Served &srv, const Hello &h, const ElasticRegion &region);
  // A UCX session's lease: its bytes registered, the grant's key filled in.
  void register_lease(Served &srv, const ElasticRegion &region, const Lease &lease, Grant *g);
  // Forgets a lease of the session (and its registration); the region is not told.
  void forget_lease(Served &srv, uint64_t id);
  // The helper for a new UCX session on host memory, started when there is none or it has gone;
  // null when there is no helper binary (or it will not start): this process serves then.
  std::shared_ptr<UcxHelper> helper_for_session();
  // Erases a session; its region's mapping in a helper goes once no session uses it there.
  std::map<std::string, Served>::iterator erase_served(std::map<std::string, Served>::iterator it);

  Coordinator::State &st_;
  ZmqSocket router_;
  // The socket file an ipc:// endpoint made, with its identity, so that closing removes this
  // very file and never one that another process bound at the same path since.
  std::string ipc_file_;
  dev_t ipc_dev_ = 0;
  ino_t ipc_ino_ = 0;
  UniqueFd listener_;
  std::string fd_name_;
  std::vector<UniqueFd> unauthed_;
  std::map<std::string, Served> served_;  // by routing id
  std::shared_ptr<UcxHelper> helper_;     // the UCX helper new sessions use (may have gone)
  bool helper_missing_logged_ = false;
  std::map<std::string, uint64_t> helper_regions_;  // region identity -> key in the helpers
  std::deque<std::string> ended_;                   // routing ids of sessions closed lately
  uint64_t next_session_ = 1;
  uint64_t next_expiry_scan_ns_ = 0;
  uint64_t next_beat_scan_ns_ = UINT64_MAX;  // none while no session has a beat page
};

// The borrower side: this process's sessions with remote lenders, from the hello to the mapped
// region, grants, heartbeats and their answers, reclaims, and losing a lender. The coordinator's
// thread owns it; the session table callers wait on is State's.
class BorrowerSessions {
 public:
  explicit BorrowerSessions(Coordinator::State &st) : st_(st) {}
  void on_command(const Command &c);
  void add_to(PollSet &poll);
  void heartbeats(uint64_t now);
  uint64_t next_due_ns() const noexcept;
  // Under mu, for a ready session whose beat page the lender accepted: the page's newest answer
  // applied, leases past their deadline lost and, once `now` reaches `due_ns`, a beat naming
  // every live lease written (none with no lease; with more than the page names, their ids are
  // left in *overflow, when given, for a heartbeat message). True when the engine is due a call.
  // The coordinator's thread and the cache's (through the link) both call it.
  bool beat_round_locked(Session &s, uint64_t now, uint64_t due_ns,
                         std::vector<uint64_t> *overflow);
  // How long the thread lets a session's beat page go without a beat before it writes one
  // itself (the cache's maintenance pass writes them otherwise): a third of the lease.
  uint64_t beat_backstop_ns(const Session &s) const;
  // When the session's next heartbeat message may go: a heartbeat after the last, and not while
  // the last, sent less than beat_backstop_ns() ago, waits for its answer. The thread's alone.
  uint64_t message_due_ns(const Session &s) const;
  // Says bye to every lender and closes every session's sockets. After the thread ends.
  void stop_all() noexcept;

 private:
  void send(Session &s, Payload p);
  void on_session(const std::shared_ptr<Session> &s);
  // A decoded message in order, of this epoch, and one this phase expects; else dropped.
  bool accept(Session &s, const Message &m);
  // Acts on an accepted message; true when the engine's reclaim callback is due.
  bool handle(const std::shared_ptr<Session> &s, const Message &m);
  void on_deny(Session &s, const Deny &d);
  bool on_reclaim_asked(Session &s, const Reclaim &r);
  void on_session_fd(const std::shared_ptr<Session> &s);
  // One packet from the fd channel into the session's queue; false when it ended the session.
  bool on_piece_packet(const std::shared_ptr<Session> &s, FdPacket p);
  // The handshake's pieces are all in: the region is mapped (or, passed per lease, not yet).
  void finish_handshake(const std::shared_ptr<Session> &s);
  // A grant whose pieces are all in: mapped and recorded, or given back.
  void finish_grant(const std::shared_ptr<Session> &s, const Grant &g,
                    std::vector<ExportedPiece> pieces, bool reclaim);
  // A grant usable on this side: the lease mirrored (asked back already if `reclaim`), its lend
  // answered (mapping null: UCX).
  void record_grant(Session &s, const Grant &g, const std::shared_ptr<RegionMapping> &mapping,
                    uint64_t sent_ns, bool reclaim);
  // Takes every packet the fd channel holds now into the queue; false when that ended the
  // session.
  bool drain_fd(const std::shared_ptr<Session> &s);
  // Grants whose pieces did not come in time are given back; pieces nobody waits for any more
  // are closed.
  void expire_pieces(const std::shared_ptr<Session> &s, uint64_t now);
  // A peer that broke the protocol: the handshake fails, or a ready session loses its lender.
  void protocol_error(const std::shared_ptr<Session> &s, const std::string &why);
  void on_monitor(const std::shared_ptr<Session> &s);
  void stop_monitor(Session &s) noexcept;
  void on_welcome(Session &s, const Welcome &w);
  void on_grant(const std::shared_ptr<Session> &s, const Grant &g);
  // Gives a lease this side cannot use straight back and fails its lend with `why`.
  void refuse_grant(Session &s, const Grant &g, swiftkv_status st, const std::string &why);
  // The session's mapping with the grant's pieces adopted and its units held.
  std::shared_ptr<RegionMapping> map_grant(Session &s, const Grant &g,
                                           std::vector<ExportedPiece> pieces);
  // A UCX grant's key unpacked on the session's endpoint; EPEER when it cannot be used.
  void add_remote_range(Session &s, const Grant &g);
  void on_ucx_welcome(Session &s, const Welcome &w);
  bool on_ack(Session &s, const HeartbeatAck &a);
  // Under mu: the lender's table for a heartbeat sent at `sent_ns` naming `listed`: deadlines
  // extended, reclaims marked, listed leases it no longer holds lost. True when the engine is
  // due a call.
  bool apply_table_locked(Session &s, uint64_t sent_ns, const std::vector<uint64_t> &listed,
                          const std::vector<LeaseState> &table);
  // Under mu: the beat page's newest answer, if it is new; true when the engine is due a call.
  bool read_beat_answer_locked(Session &s);
  // Under mu: the session's leases still within their deadline; those past it are lost (and
  // *notify set).
  std::vector<uint64_t> live_leases_locked(Session &s, uint64_t now, bool *notify);

  void fail_session(Session &s, swiftkv_status st, const std::string &why);
  void lose_lender(const std::shared_ptr<Session> &s, const std::string &why);
  void close_session(const std::shared_ptr<Session> &s);
  uint64_t heartbeat_ns(const Session &s) const;

  Coordinator::State &st_;
  std::vector<std::shared_ptr<Session>> active_;
  uint64_t next_monitor_ = 1;
};

// What callers and the coordinator's thread share, and the thread itself.
struct Coordinator::State : std::enable_shared_from_this<Coordinator::State> {
  CoordOptions options;  // set before the thread starts, then read-only
  mutable std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  std::deque<Command> commands;
  std::map<std::string, std::weak_ptr<ElasticRegion>> offers;
  std::map<std::string, std::shared_ptr<Session>> sessions;  // endpoint '\n' name
  CoordStats stats;
  bool started = false, stopping = false;
  std::thread thread;

  UniqueFd wake_fd;                    // written by anyone, read by the thread
  std::string host = host_identity();  // set before the thread starts, then read-only
  // Made by the thread the first time a session needs it (guarded by mu for readers of stats);
  // its serving worker is driven by the thread alone.
  std::shared_ptr<transport::UcxContext> ucx;
  // The UCX context, made now if there is none; EUNSUPPORTED without UCX, EPEER when UCX does
  // not start. The coordinator thread's.
  transport::UcxContext &ucx_context();
  transport::UcxContext *ucx_now() {
    std::lock_guard lock(mu);
    return ucx.get();
  }
  // Made before the thread starts; terminated after it ends and every socket is closed.
  ZmqContext zctx;
  // The coordinator thread's (declared after zctx: their sockets close before it ends).
  LenderService lender{*this};
  BorrowerSessions borrower{*this};

  void wake() const noexcept {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd.get(), &one, sizeof(one));
  }
  void count(uint64_t CoordStats::*field, uint64_t n = 1) {
    std::lock_guard lock(mu);
    stats.*field += n;
  }
  // A message not acted on: counted, and logged at most once per 10 s (a peer may send many).
  void drop(const std::string &why) {
    count(&CoordStats::messages_dropped);
    drop_log.warn("coordinator: dropped a message: " + why);
  }
  void drop_locked(const std::string &why) {
    ++stats.messages_dropped;
    drop_log.warn("coordinator: dropped a message: " + why);
  }
  LogLimiter drop_log;

  void start_locked();
  void run();
  void stop_all() noexcept;
};

}  // namespace swiftkv::coord
