// The coordinator over ZeroMQ: see coordinator.hpp for the protocol. One thread owns the
// sockets; State::mu guards what callers share with it.
#include "core/coord/coordinator.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/common/clock.hpp"
#include "core/common/error.hpp"
#include "core/common/log.hpp"
#include "core/common/unique_fd.hpp"
#include "core/coord/fd_channel.hpp"
#include "core/coord/wire.hpp"

namespace swiftkv::coord {

namespace {

constexpr int kFdWaitMs = 2000;  // the pieces of a grant are written before it: never long

WireGeometry wire_geometry(const ModelGeometry &g) {
  return WireGeometry{g.num_layers,   g.num_kv_heads, g.head_dim,
                      g.block_tokens, g.chunk_tokens, static_cast<int32_t>(g.dtype)};
}

ModelGeometry model_geometry(const WireGeometry &w) {
  ModelGeometry g;
  g.num_layers = w.num_layers;
  g.num_kv_heads = w.num_kv_heads;
  g.head_dim = w.head_dim;
  g.block_tokens = w.block_tokens;
  g.chunk_tokens = w.chunk_tokens;
  g.dtype = static_cast<swiftkv_dtype>(w.dtype);
  return g;
}

std::string geometry_text(const WireGeometry &g) {
  return "layers " + std::to_string(g.num_layers) + ", kv heads " +
         std::to_string(g.num_kv_heads) + ", head dim " + std::to_string(g.head_dim) +
         ", chunk " + std::to_string(g.chunk_tokens) + " tokens, dtype " +
         std::to_string(g.dtype);
}

bool known_error_status(int32_t s) { return s <= SWIFTKV_EINVAL && s >= SWIFTKV_EINTERNAL; }

// The chunk layout a borrower's lent memory must have: its geometry with the lender's block size
// irrelevant (the lent tail is laid out in borrower chunks).
bool same_chunk_layout(const WireGeometry &a, const WireGeometry &b) {
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
bool recv_parts(void *sock, std::vector<std::vector<uint8_t>> *parts) {
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

void set_int(void *sock, int opt, int v) { zmq_setsockopt(sock, opt, &v, sizeof(v)); }

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

}  // namespace

// A borrower's session with one remote lender.
struct Session {
  std::string endpoint, name;
  WireGeometry mine;
  GeometrySizes sizes{};
  std::function<void()> on_reclaim;

  // Guarded by State::mu.
  Phase phase = Phase::connecting;
  swiftkv_status fail_status = SWIFTKV_OK;
  std::string fail_message;
  bool lost = false;
  uint64_t epoch = 0;
  Welcome info;
  std::shared_ptr<RegionMapping> mapping;
  std::map<uint64_t, MirrorLease> leases;
  std::map<uint64_t, LendWait> lends;
  uint64_t next_request = 1;

  // The thread's alone, but fdconn: closed only here, so other threads may poll it.
  void *sock = nullptr;
  UniqueFd fdconn;
  uint64_t send_seq = 0, recv_seq = 0;
  std::map<uint64_t, std::pair<uint64_t, std::vector<uint64_t>>> hb_sent;  // seq -> (ns, ids)
  uint64_t next_heartbeat_ns = 0;
  std::vector<ExportedPiece> pieces;  // the handshake's, as they arrive
};

namespace {

// A borrower session on one of this process's regions. The thread's alone.
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
  bool gone = false;  // the fd channel hung up: the borrower process is gone
};

struct Command {
  enum class Kind { connect, lend, release, close } kind;
  std::shared_ptr<Session> session;
  uint64_t value = 0;  // lend: the request; release: the lease
};

}  // namespace

struct Coordinator::State : std::enable_shared_from_this<Coordinator::State> {
  CoordOptions options;
  mutable std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  std::deque<Command> commands;
  std::map<std::string, std::weak_ptr<ElasticRegion>> offers;
  std::map<std::string, std::shared_ptr<Session>> sessions;  // endpoint '\n' name
  CoordStats stats;
  bool started = false, stopping = false;
  std::thread thread;

  // The thread's alone (set up before it starts).
  void *zctx = nullptr;
  void *router = nullptr;
  UniqueFd wake_fd;
  UniqueFd listener;
  std::string fd_name;
  std::vector<UniqueFd> unauthed;
  std::map<std::string, Served> served;  // by routing id
  std::deque<std::string> ended;         // routing ids of sessions closed lately
  std::vector<std::shared_ptr<Session>> active;
  uint64_t next_session = 1;
  uint64_t next_expiry_scan_ns = 0;

  void wake() const noexcept {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd.get(), &one, sizeof(one));
  }
  void post(Command c) {
    {
      std::lock_guard lock(mu);
      commands.push_back(std::move(c));
    }
    wake();
  }
  void count(uint64_t CoordStats::*field, uint64_t n = 1) {
    std::lock_guard lock(mu);
    stats.*field += n;
  }
  void drop(const std::string &why) {
    count(&CoordStats::messages_dropped);
    log_warn("coordinator: dropped a message: " + why);
  }
  uint64_t heartbeat_ns(const Session &s) const {
    return std::max<uint64_t>(1'000'000, std::min(options.heartbeat_ns, s.info.lease_ns / 3));
  }

  void start_locked();
  void run();
  void stop_all() noexcept;

  // Lender side.
  void send_served(Served &srv, Payload p);
  void on_router();
  void on_hello(const std::string &routing, const Message &m);
  void on_accept();
  void on_auth(UniqueFd fd);
  void on_served_fd(Served &srv);
  void on_lend(Served &srv, const Lend &l);
  void on_heartbeat(Served &srv, const Message &m, const Heartbeat &h);
  void on_release(Served &srv, const Release &r);
  void end_served(Served &srv);
  void scan_served(uint64_t now);
  void send_pieces(int fd, uint64_t tag, const RegionExport &e, uint32_t *packets);

  // Borrower side.
  void send(Session &s, Payload p);
  void on_command(const Command &c);
  void on_session(const std::shared_ptr<Session> &s);
  void on_session_fd(const std::shared_ptr<Session> &s);
  void on_welcome(Session &s, const Welcome &w);
  void on_grant(Session &s, const Grant &g);
  bool on_ack(Session &s, const HeartbeatAck &a);
  void fail_session(Session &s, swiftkv_status st, const std::string &why);
  void lose_lender(const std::shared_ptr<Session> &s, const std::string &why);
  void close_session(const std::shared_ptr<Session> &s);
  void heartbeats(uint64_t now);
};

namespace {

// The borrower's view of one remote lender, as the peer tier uses it.
class RemoteLender final : public LenderLink {
 public:
  RemoteLender(std::shared_ptr<Coordinator::State> st, std::shared_ptr<Session> s)
      : st_(std::move(st)), s_(std::move(s)) {}

  void check_geometry(const GeometrySizes &sizes) const override {
    if (sizes.layer_chunk_bytes != s_->sizes.layer_chunk_bytes ||
        sizes.full_chunk_bytes != s_->sizes.full_chunk_bytes) {
      fail_invalid("the remote lender's session was made for another borrower geometry");
    }
  }

  LeaseGrant lend(uint64_t max_units) override {
    std::unique_lock lock(st_->mu);
    if (s_->lost || s_->phase != Phase::ready) {
      fail(SWIFTKV_EPEER, describe() + " is gone");
    }
    const uint64_t request = s_->next_request++;
    s_->lends[request] = LendWait{max_units, monotonic_ns(), false, SWIFTKV_OK, {}, {}};
    st_->commands.push_back(Command{Command::Kind::lend, s_, request});
    st_->wake();
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::nanoseconds(st_->options.timeout_ns);
    st_->cv.wait_until(lock, deadline, [&] { return s_->lends[request].done || s_->lost; });
    LendWait w = s_->lends[request];
    s_->lends.erase(request);
    if (!w.done) {
      fail(s_->lost ? SWIFTKV_EPEER : SWIFTKV_ETIMEDOUT,
           describe() + (s_->lost ? " went away" : " did not answer a lend in time"));
    }
    if (w.status != SWIFTKV_OK) fail(w.status, describe() + ": " + w.message);
    return w.grant;
  }

  LinkLeaseState renew(uint64_t lease_id) override {
    std::lock_guard lock(st_->mu);
    const auto it = s_->leases.find(lease_id);
    if (s_->lost || it == s_->leases.end() || it->second.lost ||
        monotonic_ns() >= it->second.deadline_ns) {
      return LinkLeaseState{false, true};
    }
    return LinkLeaseState{it->second.reclaim, false};
  }

  bool valid(uint64_t lease_id) const noexcept override {
    {
      std::lock_guard lock(st_->mu);
      const auto it = s_->leases.find(lease_id);
      if (s_->lost || it == s_->leases.end() || it->second.lost ||
          monotonic_ns() >= it->second.deadline_ns) {
        return false;
      }
    }
    // A lender that died a moment ago has not been noticed by the thread yet.
    return !fd_peer_gone(s_->fdconn.get());
  }

  void release(uint64_t lease_id) noexcept override {
    try {
      std::lock_guard lock(st_->mu);
      const auto it = s_->leases.find(lease_id);
      if (it == s_->leases.end()) return;
      const bool tell = !it->second.lost && !s_->lost;
      s_->leases.erase(it);
      if (tell) {
        st_->commands.push_back(Command{Command::Kind::release, s_, lease_id});
        st_->wake();
      }
    } catch (...) {
      // Out of memory queueing the message: the lease expires on the lender's side instead.
    }
  }

  std::string describe() const override {
    return "the lender \"" + s_->name + "\" at " + s_->endpoint;
  }

 private:
  std::shared_ptr<Coordinator::State> st_;
  std::shared_ptr<Session> s_;
};

}  // namespace

// --- Setup and the thread ---------------------------------------------------------------------

Coordinator::Coordinator(CoordOptions options) : s_(std::make_shared<State>()) {
  s_->options = std::move(options);
  if (s_->options.heartbeat_ns == 0 || s_->options.timeout_ns == 0) {
    fail_invalid("the coordinator's heartbeat and timeout must be positive");
  }
  s_->wake_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s_->wake_fd) fail(SWIFTKV_EINTERNAL, std::string("eventfd: ") + std::strerror(errno));
  s_->zctx = zmq_ctx_new();
  if (s_->zctx == nullptr) fail(SWIFTKV_EPEER, "zmq_ctx_new failed");
  if (s_->options.endpoint) {
    const std::string &ep = *s_->options.endpoint;
    if (ep.rfind("ipc://", 0) != 0 && ep.rfind("tcp://", 0) != 0) {
      zmq_ctx_term(s_->zctx);
      fail_invalid("coord_endpoint \"" + ep + "\" is neither ipc:// nor tcp://");
    }
    s_->router = zmq_socket(s_->zctx, ZMQ_ROUTER);
    set_int(s_->router, ZMQ_LINGER, 0);
    const int64_t max = kMaxMessageBytes;
    zmq_setsockopt(s_->router, ZMQ_MAXMSGSIZE, &max, sizeof(max));
    if (zmq_bind(s_->router, ep.c_str()) != 0) {
      const std::string why = zmq_strerror(zmq_errno());
      zmq_close(s_->router);
      zmq_ctx_term(s_->zctx);
      fail(SWIFTKV_EPEER, "cannot bind coord_endpoint \"" + ep + "\": " + why);
    }
    try {
      s_->listener = fd_listen(&s_->fd_name);
    } catch (...) {
      zmq_close(s_->router);
      zmq_ctx_term(s_->zctx);
      throw;
    }
    std::lock_guard lock(s_->mu);
    s_->start_locked();
  }
}

Coordinator::~Coordinator() { shutdown(); }

const CoordOptions &Coordinator::options() const noexcept { return s_->options; }

void Coordinator::State::start_locked() {
  if (started) return;
  started = true;
  thread = std::thread([this] { run(); });
}

void Coordinator::shutdown() noexcept {
  {
    std::lock_guard lock(s_->mu);
    if (s_->stopping) return;
    s_->stopping = true;
    for (auto &[name, w] : s_->offers) {
      if (auto r = w.lock()) r->set_reclaim_listener(nullptr);
    }
  }
  s_->wake();
  if (s_->thread.joinable()) s_->thread.join();
  s_->stop_all();
}

void Coordinator::State::stop_all() noexcept {
  for (const auto &s : active) {
    if (s->sock == nullptr) continue;
    try {
      send(*s, Bye{});
    } catch (...) {
      // Its leases expire on the lender's side instead.
    }
  }
  {
    std::lock_guard lock(mu);
    for (auto &[key, s] : sessions) s->lost = true;
    for (const auto &s : active) s->lost = true;
    sessions.clear();
  }
  cv.notify_all();
  for (const auto &s : active) {
    if (s->sock != nullptr) zmq_close(s->sock);
    s->sock = nullptr;
  }
  active.clear();
  if (router != nullptr) zmq_close(router);
  router = nullptr;
  if (zctx != nullptr) zmq_ctx_term(zctx);
  zctx = nullptr;
}

void Coordinator::State::run() {
  std::vector<zmq_pollitem_t> items;
  std::vector<std::shared_ptr<Session>> polled;
  std::vector<std::string> polled_served;
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
    }
    items.clear();
    polled.clear();
    polled_served.clear();
    items.push_back({nullptr, wake_fd.get(), ZMQ_POLLIN, 0});
    if (router != nullptr) items.push_back({router, 0, ZMQ_POLLIN, 0});
    if (listener) items.push_back({nullptr, listener.get(), ZMQ_POLLIN, 0});
    const size_t first_unauthed = items.size();
    for (const UniqueFd &f : unauthed) items.push_back({nullptr, f.get(), ZMQ_POLLIN, 0});
    const size_t first_served = items.size();
    for (auto &[routing, srv] : served) {
      if (!srv.fdconn || srv.gone) continue;
      items.push_back({nullptr, srv.fdconn.get(), ZMQ_POLLIN, 0});
      polled_served.push_back(routing);
    }
    const size_t first_session = items.size();
    for (const auto &s : active) {
      items.push_back({s->sock, 0, ZMQ_POLLIN, 0});
      items.push_back({nullptr, s->fdconn ? s->fdconn.get() : -1, ZMQ_POLLIN, 0});
      polled.push_back(s);
    }
    // Sleep until the next heartbeat or lease scan is due (messages and callers wake it early).
    uint64_t due = next_expiry_scan_ns;
    for (const auto &s : active) due = std::min(due, s->next_heartbeat_ns);
    const uint64_t t = monotonic_ns();
    const long timeout_ms =
        static_cast<long>(std::min<uint64_t>(due > t ? (due - t + 999'999) / 1'000'000 : 0, 50));
    if (zmq_poll(items.data(), static_cast<int>(items.size()), timeout_ms) < 0 &&
        zmq_errno() != EINTR) {
      log_warn(std::string("coordinator: zmq_poll: ") + zmq_strerror(zmq_errno()));
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      continue;
    }
    try {
      if (items[0].revents != 0) {
        uint64_t n = 0;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd.get(), &n, sizeof(n));
      }
      std::deque<Command> todo;
      {
        std::lock_guard lock(mu);
        todo.swap(commands);
      }
      for (const Command &c : todo) on_command(c);
      if (router != nullptr) on_router();
      // Auth packets: an fd that answered is either attached to its session or closed. Those
      // accepted below are polled from the next round on.
      const size_t polled_unauthed = first_served - first_unauthed;
      std::vector<UniqueFd> waiting;
      for (size_t i = 0; i < unauthed.size(); ++i) {
        if (i < polled_unauthed && items[first_unauthed + i].revents != 0) {
          on_auth(std::move(unauthed[i]));
        } else {
          waiting.push_back(std::move(unauthed[i]));
        }
      }
      unauthed.swap(waiting);
      if (listener) on_accept();
      for (size_t i = 0; i < polled_served.size(); ++i) {
        if (items[first_served + i].revents == 0) continue;
        const auto it = served.find(polled_served[i]);
        if (it != served.end()) on_served_fd(it->second);
      }
      for (size_t i = 0; i < polled.size(); ++i) {
        const auto &s = polled[i];
        if (s->sock == nullptr) continue;
        if (items[first_session + 2 * i].revents != 0) on_session(s);
        if (s->sock != nullptr && s->fdconn && items[first_session + 2 * i + 1].revents != 0) {
          on_session_fd(s);
        }
      }
      const uint64_t now = monotonic_ns();
      scan_served(now);
      heartbeats(now);
    } catch (const std::exception &e) {
      // Nothing a peer sends reaches here (messages are checked first); memory may run out.
      log_warn(std::string("coordinator: ") + e.what());
    }
  }
}

// --- Lender side --------------------------------------------------------------------------------

void Coordinator::offer(const std::string &name, const std::shared_ptr<ElasticRegion> &region) {
  if (!s_->options.endpoint) {
    fail(SWIFTKV_ESTATE, "the context has no coord_endpoint: nothing can reach an offered region");
  }
  if (name.empty() || name.size() > kMaxString) {
    fail_invalid("name must be 1 to " + std::to_string(kMaxString) + " bytes");
  }
  if (!region->borrower()) {
    fail(SWIFTKV_ESTATE, "the region was created without a borrower; it lends nothing");
  }
  std::lock_guard lock(s_->mu);
  if (s_->stopping) fail(SWIFTKV_ESTATE, "the coordinator is shutting down");
  for (auto it = s_->offers.begin(); it != s_->offers.end();) {
    it = it->second.expired() ? s_->offers.erase(it) : std::next(it);
  }
  if (s_->offers.count(name) != 0) fail(SWIFTKV_EBUSY, "a region is offered as \"" + name + "\"");
  for (const auto &[n, w] : s_->offers) {
    if (w.lock() == region) fail(SWIFTKV_EBUSY, "the region is offered already, as \"" + n + "\"");
  }
  s_->offers[name] = region;
  s_->stats.offered_regions = s_->offers.size();
  std::weak_ptr<State> weak = s_;
  region->set_reclaim_listener([weak] {
    if (auto st = weak.lock()) st->wake();
  });
}

void Coordinator::withdraw(const ElasticRegion *region) noexcept {
  std::lock_guard lock(s_->mu);
  for (auto it = s_->offers.begin(); it != s_->offers.end();) {
    const auto r = it->second.lock();
    if (r.get() == region || !r) {
      if (r) r->set_reclaim_listener(nullptr);
      it = s_->offers.erase(it);
    } else {
      ++it;
    }
  }
  s_->stats.offered_regions = s_->offers.size();
}

void Coordinator::State::send_served(Served &srv, Payload p) {
  Message m{++srv.send_seq, srv.epoch, std::move(p)};
  const std::vector<uint8_t> bytes = encode(m);
  zmq_send(router, srv.routing.data(), srv.routing.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(router, bytes.data(), bytes.size(), ZMQ_DONTWAIT);
  count(&CoordStats::messages_sent);
}

void Coordinator::State::on_router() {
  std::vector<std::vector<uint8_t>> parts;
  while (recv_parts(router, &parts)) {
    count(&CoordStats::messages_received);
    if (parts.size() != 2) {
      drop("a message of " + std::to_string(parts.size()) + " parts (a routing id and a body)");
      continue;
    }
    const std::string routing(parts[0].begin(), parts[0].end());
    Decoded d = decode(parts[1]);
    if (!d.message) {
      drop(d.error);
      continue;
    }
    const Message &m = *d.message;
    const MsgType t = type_of(m.payload);
    const auto it = served.find(routing);
    if (t == MsgType::hello) {
      if (it != served.end()) {
        drop("a second hello on one session");
      } else {
        on_hello(routing, m);
      }
      continue;
    }
    if (it == served.end()) {
      if (std::find(ended.begin(), ended.end(), routing) != ended.end()) {
        continue;  // a borrower's last words (its bye) after its session was closed: harmless
      }
      drop(std::string("a ") + msg_type_name(t) + " from a peer that never said hello");
      continue;
    }
    Served &srv = it->second;
    if (m.seq <= srv.recv_seq) {
      drop(std::string("a duplicated or reordered ") + msg_type_name(t) + " (seq " +
           std::to_string(m.seq) + " after " + std::to_string(srv.recv_seq) + ")");
      continue;
    }
    switch (t) {
      case MsgType::lend:
        srv.recv_seq = m.seq;
        on_lend(srv, std::get<Lend>(m.payload));
        break;
      case MsgType::heartbeat:
        srv.recv_seq = m.seq;
        on_heartbeat(srv, m, std::get<Heartbeat>(m.payload));
        break;
      case MsgType::release:
        if (srv.leases.count(std::get<Release>(m.payload).lease) == 0) {
          drop("a release of lease " + std::to_string(std::get<Release>(m.payload).lease) +
               ", which the session does not hold");
          break;
        }
        srv.recv_seq = m.seq;
        on_release(srv, std::get<Release>(m.payload));
        break;
      case MsgType::bye:
        srv.recv_seq = m.seq;
        end_served(srv);
        served.erase(it);
        break;
      default: drop(std::string("a ") + msg_type_name(t) + ", which a borrower never sends");
    }
  }
}

void Coordinator::State::on_hello(const std::string &routing, const Message &m) {
  const Hello &h = std::get<Hello>(m.payload);
  Served srv;
  srv.routing = routing;
  srv.recv_seq = m.seq;
  auto refuse = [&](swiftkv_status st, const std::string &why) {
    log_info("coordinator: refused a borrower (pid " + std::to_string(h.pid) + "): " + why);
    send_served(srv, Refuse{st, why});
  };
  std::shared_ptr<ElasticRegion> region;
  {
    std::lock_guard lock(mu);
    const auto it = offers.find(h.region);
    if (it != offers.end()) region = it->second.lock();
  }
  if (!region) return refuse(SWIFTKV_ENOTFOUND, "no region is offered as \"" + h.region + "\"");
  const WireGeometry want = wire_geometry(*region->borrower());
  if (!same_chunk_layout(h.borrower, want)) {
    return refuse(SWIFTKV_EINVAL, "the region lends to a borrower of " + geometry_text(want) +
                                      ", not " + geometry_text(h.borrower));
  }
  std::random_device rd;
  for (size_t i = 0; i < srv.token.size(); i += 4) {
    const uint32_t r = rd();
    std::memcpy(srv.token.data() + i, &r, 4);
  }
  srv.id = next_session++;
  srv.name = h.region;
  srv.region = region;
  srv.pid = h.pid;
  Welcome w;
  w.session = srv.id;
  w.token = srv.token;
  w.fd_socket = fd_name;
  w.lender = wire_geometry(region->lender());
  w.borrower = want;
  w.unit_blocks = region->unit_blocks();
  w.unit_chunks = region->unit_chunks();
  w.unit_bytes = region->unit_bytes();
  w.capacity_units = region->capacity_units();
  w.lease_ns = region->lease_ns();
  const RegionExport e = region->export_range(0, 0);
  w.memory_kind = static_cast<uint32_t>(e.kind);
  w.device = e.device;
  w.region_bytes = region->memory().size();
  w.identity = e.identity;
  std::copy(e.ipc_handle.begin(), e.ipc_handle.end(), w.ipc_handle.begin());
  send_served(srv, std::move(w));
  served.emplace(routing, std::move(srv));
  std::lock_guard lock(mu);
  stats.sessions_served = served.size();
}

void Coordinator::State::on_accept() {
  for (;;) {
    UniqueFd fd = fd_accept(listener.get());
    if (!fd) return;
    if (unauthed.size() >= 64) {
      log_warn("coordinator: too many fd channel connections without a session; closing one");
      continue;
    }
    unauthed.push_back(std::move(fd));
  }
}

void Coordinator::State::on_auth(UniqueFd fd) {
  FdPacket p;
  try {
    p = fd_recv(fd.get(), 0);
  } catch (const Error &e) {
    return drop(std::string("fd channel: ") + e.what());
  }
  if (p.closed) return;
  const std::optional<FdAuth> a = decode_auth(p.bytes);
  Served *srv = nullptr;
  if (a) {
    for (auto &[routing, s] : served) {
      if (s.id == a->session && s.token == a->token && !s.fdconn) srv = &s;
    }
  }
  if (srv == nullptr || !p.fds.empty()) {
    return drop("an fd channel connection without a valid session token");
  }
  srv->fdconn = std::move(fd);
  const auto region = srv->region.lock();
  if (!region) return;  // its region went away: the session's lends are denied
  try {
    uint32_t packets = 0;
    // memfd: the whole file, mapped once; VMM: nothing yet (each grant brings its granules);
    // CUDA IPC: the handle went in the welcome.
    const RegionExport e = region->export_range(0, 0);
    send_pieces(srv->fdconn.get(), 0, e, &packets);
  } catch (const Error &e) {
    log_warn(std::string("coordinator: could not pass the region to a borrower: ") + e.what());
    srv->gone = true;
  }
}

void Coordinator::State::send_pieces(int fd, uint64_t tag, const RegionExport &e,
                                     uint32_t *packets) {
  const size_t n = e.pieces.size();
  size_t sent = 0;
  *packets = 0;
  do {
    const size_t k = std::min<size_t>(kPiecesPerPacket, n - sent);
    PiecePacket p;
    p.tag = tag;
    p.more = static_cast<uint32_t>((n - sent - k + kPiecesPerPacket - 1) / kPiecesPerPacket);
    std::vector<int> fds;
    for (size_t i = sent; i < sent + k; ++i) {
      p.pieces.push_back(WirePiece{e.pieces[i].offset, e.pieces[i].size, e.pieces[i].generation});
      fds.push_back(e.pieces[i].fd.get());
    }
    fd_send(fd, encode_pieces(p), fds);
    sent += k;
    ++*packets;
  } while (sent < n);
}

void Coordinator::State::on_served_fd(Served &srv) {
  // A borrower sends nothing after its auth: whatever is readable is a hang-up or noise.
  FdPacket p;
  try {
    p = fd_recv(srv.fdconn.get(), 0);
  } catch (const Error &e) {
    p.closed = true;
  }
  if (p.closed) {
    srv.gone = true;
    log_info("coordinator: borrower pid " + std::to_string(srv.pid) +
             " hung up; its leases end when they expire");
    return;
  }
  drop("a packet from a borrower on the fd channel");
}

void Coordinator::State::on_lend(Served &srv, const Lend &l) {
  auto deny = [&](swiftkv_status st, const std::string &why) {
    send_served(srv, Deny{l.request, st, why});
  };
  const auto region = srv.region.lock();
  if (!region) return deny(SWIFTKV_ENOTFOUND, "the region \"" + srv.name + "\" is gone");
  if (!srv.fdconn || srv.gone) {
    return deny(SWIFTKV_ESTATE, "the session's fd channel is not connected");
  }
  if (l.max_units == 0) return deny(SWIFTKV_EINVAL, "max_units is 0");
  Lease lease;
  try {
    lease = region->lend(l.max_units);
  } catch (const Error &e) {
    return deny(e.status(), e.what());
  }
  uint32_t packets = 0;
  if (region->memory().kind() == MemoryKind::cuda_vmm) {
    try {
      const RegionExport e =
          region->export_range(region->lease_offset(lease), lease.units * region->unit_bytes());
      send_pieces(srv.fdconn.get(), l.request, e, &packets);
    } catch (const Error &e) {
      try {
        region->release(lease.id);
      } catch (const Error &) {
      }
      return deny(SWIFTKV_EPEER, std::string("passing the lease's memory failed: ") + e.what());
    }
  }
  srv.leases.insert(lease.id);
  ++srv.epoch;
  send_served(srv, Grant{l.request, lease.id, lease.first_unit, lease.units, packets});
}

void Coordinator::State::on_heartbeat(Served &srv, const Message &m, const Heartbeat &h) {
  const auto region = srv.region.lock();
  HeartbeatAck ack;
  ack.echo = m.seq;
  if (region) {
    for (uint64_t id : h.leases) {
      if (srv.leases.count(id) == 0) continue;  // never another session's lease
      try {
        region->renew(id);
      } catch (const Error &) {
        // Expired already: left out of the table below.
      }
    }
    const uint64_t now = region->clock_now();
    for (auto it = srv.leases.begin(); it != srv.leases.end();) {
      try {
        const Lease l = region->lease(*it);
        ack.leases.push_back(LeaseState{l.id, l.expires_ns > now ? l.expires_ns - now : 0,
                                        l.reclaim_requested});
        ++it;
      } catch (const Error &) {
        srv.reclaim_sent_ns.erase(*it);
        it = srv.leases.erase(it);
        ++srv.epoch;
      }
    }
  } else if (!srv.leases.empty()) {
    srv.leases.clear();
    ++srv.epoch;
  }
  if (ack.leases.size() > kMaxLeasesPerMessage) ack.leases.resize(kMaxLeasesPerMessage);
  send_served(srv, std::move(ack));
}

void Coordinator::State::on_release(Served &srv, const Release &r) {
  if (const auto region = srv.region.lock()) {
    try {
      region->release(r.lease);
    } catch (const Error &) {
      // It expired meanwhile: the region has it back already.
    }
  }
  srv.leases.erase(r.lease);
  ++srv.epoch;
  const auto it = srv.reclaim_sent_ns.find(r.lease);
  if (it == srv.reclaim_sent_ns.end()) return;
  const uint64_t ns = monotonic_ns() - it->second;
  srv.reclaim_sent_ns.erase(it);
  std::lock_guard lock(mu);
  ++stats.reclaims_acked;
  stats.reclaim_ns_total += ns;
  stats.reclaim_ns_max = std::max(stats.reclaim_ns_max, ns);
}

void Coordinator::State::end_served(Served &srv) {
  if (const auto region = srv.region.lock()) {
    for (uint64_t id : srv.leases) {
      try {
        region->release(id);
      } catch (const Error &) {
      }
    }
  }
  srv.leases.clear();
  std::lock_guard lock(mu);
  stats.sessions_served = served.size() - 1;
}

void Coordinator::State::scan_served(uint64_t now) {
  const bool expiry_scan = now >= next_expiry_scan_ns;
  if (expiry_scan) next_expiry_scan_ns = now + options.heartbeat_ns;
  std::map<const ElasticRegion *, std::vector<uint64_t>> pending;
  for (auto it = served.begin(); it != served.end();) {
    Served &srv = it->second;
    const auto region = srv.region.lock();
    if (region && !srv.leases.empty()) {
      auto p = pending.find(region.get());
      if (p == pending.end()) p = pending.emplace(region.get(), region->pending_reclaims()).first;
      for (uint64_t id : p->second) {
        if (srv.leases.count(id) == 0 || srv.reclaim_sent_ns.count(id) != 0) continue;
        srv.reclaim_sent_ns[id] = monotonic_ns();
        ++srv.epoch;
        send_served(srv, Reclaim{id});
        count(&CoordStats::reclaims_sent);
      }
    }
    if (expiry_scan) {
      for (auto l = srv.leases.begin(); l != srv.leases.end();) {
        bool held = false;
        if (region) {
          try {
            region->lease(*l);
            held = true;
          } catch (const Error &) {
          }
        }
        if (held) {
          ++l;
          continue;
        }
        srv.reclaim_sent_ns.erase(*l);
        l = srv.leases.erase(l);
        ++srv.epoch;
      }
    }
    // A borrower that hung up and whose leases all ended is forgotten.
    if (srv.gone && srv.leases.empty()) {
      ended.push_back(srv.routing);
      if (ended.size() > 256) ended.pop_front();
      it = served.erase(it);
      std::lock_guard lock(mu);
      stats.sessions_served = served.size();
    } else {
      ++it;
    }
  }
}

// --- Borrower side ------------------------------------------------------------------------------

std::shared_ptr<LenderLink> Coordinator::connect(const std::string &endpoint,
                                                 const std::string &name, const ModelGeometry &g,
                                                 std::function<void()> on_reclaim) {
  if (endpoint.rfind("ipc://", 0) != 0 && endpoint.rfind("tcp://", 0) != 0) {
    fail_invalid("endpoint \"" + endpoint + "\" is neither ipc:// nor tcp://");
  }
  if (name.empty() || name.size() > kMaxString) {
    fail_invalid("lender_name must be 1 to " + std::to_string(kMaxString) + " bytes");
  }
  const std::string key = endpoint + '\n' + name;
  std::unique_lock lock(s_->mu);
  if (s_->stopping) fail(SWIFTKV_ESTATE, "the coordinator is shutting down");
  if (const auto it = s_->sessions.find(key); it != s_->sessions.end()) {
    const auto &s = it->second;
    if (s->phase == Phase::ready && !s->lost) {
      if (!same_chunk_layout(s->mine, wire_geometry(g))) {
        fail_invalid("the session with " + name + " at " + endpoint +
                     " is for a borrower of " + geometry_text(s->mine));
      }
      return std::make_shared<RemoteLender>(s_, s);
    }
    if (s->phase != Phase::connecting && s->phase != Phase::awaiting_pieces) {
      s_->sessions.erase(it);
    } else {
      fail(SWIFTKV_EBUSY, "a handshake with " + name + " at " + endpoint + " is under way");
    }
  }
  auto s = std::make_shared<Session>();
  s->endpoint = endpoint;
  s->name = name;
  s->mine = wire_geometry(g);
  s->sizes = geometry_sizes(g, "the borrower");
  s->on_reclaim = std::move(on_reclaim);
  s_->sessions[key] = s;
  s_->start_locked();
  s_->commands.push_back(Command{Command::Kind::connect, s, 0});
  s_->wake();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(s_->options.timeout_ns);
  s_->cv.wait_until(lock, deadline,
                    [&] { return s->phase == Phase::ready || s->phase == Phase::failed; });
  if (s->phase == Phase::ready) return std::make_shared<RemoteLender>(s_, s);
  s_->sessions.erase(key);
  if (s->phase != Phase::failed) {
    s->phase = Phase::failed;
    s->fail_status = SWIFTKV_ETIMEDOUT;
    s->fail_message = "no answer from " + name + " at " + endpoint + " in time";
  }
  s_->commands.push_back(Command{Command::Kind::close, s, 0});
  s_->wake();
  fail(s->fail_status, s->fail_message);
}

void Coordinator::State::send(Session &s, Payload p) {
  uint64_t epoch = 0;
  {
    std::lock_guard lock(mu);
    epoch = s.epoch;
  }
  const std::vector<uint8_t> bytes = encode(Message{++s.send_seq, epoch, std::move(p)});
  zmq_send(s.sock, bytes.data(), bytes.size(), ZMQ_DONTWAIT);
  count(&CoordStats::messages_sent);
}

void Coordinator::State::on_command(const Command &c) {
  Session &s = *c.session;
  switch (c.kind) {
    case Command::Kind::connect: {
      {
        std::lock_guard lock(mu);
        if (s.phase != Phase::connecting) return;  // the caller gave up already
      }
      s.sock = zmq_socket(zctx, ZMQ_DEALER);
      set_int(s.sock, ZMQ_LINGER, 0);
      const int64_t max = kMaxMessageBytes;
      zmq_setsockopt(s.sock, ZMQ_MAXMSGSIZE, &max, sizeof(max));
      if (zmq_connect(s.sock, s.endpoint.c_str()) != 0) {
        fail_session(s, SWIFTKV_EINVAL,
                     "cannot connect to \"" + s.endpoint + "\": " + zmq_strerror(zmq_errno()));
        zmq_close(s.sock);
        s.sock = nullptr;
        return;
      }
      active.push_back(c.session);
      send(s, Hello{s.mine, static_cast<uint32_t>(::getpid()), s.name});
      return;
    }
    case Command::Kind::lend: {
      if (s.sock == nullptr) return;
      uint64_t max_units = 0;
      {
        std::lock_guard lock(mu);
        const auto it = s.lends.find(c.value);
        if (it == s.lends.end()) return;
        max_units = it->second.max_units;
      }
      send(s, Lend{c.value, max_units});
      return;
    }
    case Command::Kind::release:
      if (s.sock != nullptr) send(s, Release{c.value});
      return;
    case Command::Kind::close: close_session(c.session); return;
  }
}

void Coordinator::State::close_session(const std::shared_ptr<Session> &s) {
  if (s->sock != nullptr) zmq_close(s->sock);
  s->sock = nullptr;
  std::erase(active, s);
}

void Coordinator::State::fail_session(Session &s, swiftkv_status st, const std::string &why) {
  {
    std::lock_guard lock(mu);
    if (s.phase == Phase::failed) return;
    s.phase = Phase::failed;
    s.fail_status = st;
    s.fail_message = why;
  }
  cv.notify_all();
}

void Coordinator::State::lose_lender(const std::shared_ptr<Session> &s, const std::string &why) {
  std::function<void()> notify;
  {
    std::lock_guard lock(mu);
    if (s->lost) return;
    s->lost = true;
    uint64_t n = 0;
    for (auto &[id, l] : s->leases) {
      if (!l.lost) ++n;
      l.lost = true;
    }
    stats.leases_lost += n;
    ++stats.lenders_lost;
    for (auto it = sessions.begin(); it != sessions.end(); ++it) {
      if (it->second == s) {
        sessions.erase(it);
        break;
      }
    }
    stats.lenders_connected = sessions.size();
    notify = s->on_reclaim;
  }
  log_warn("coordinator: lost the lender \"" + s->name + "\" at " + s->endpoint + ": " + why);
  cv.notify_all();
  close_session(s);
  if (notify) notify();
}

void Coordinator::State::on_session(const std::shared_ptr<Session> &sp) {
  Session &s = *sp;
  std::vector<std::vector<uint8_t>> parts;
  while (s.sock != nullptr && recv_parts(s.sock, &parts)) {
    count(&CoordStats::messages_received);
    if (parts.size() != 1) {
      drop("a lender message of " + std::to_string(parts.size()) + " parts");
      continue;
    }
    Decoded d = decode(parts[0]);
    if (!d.message) {
      drop(d.error);
      continue;
    }
    const Message &m = *d.message;
    const MsgType t = type_of(m.payload);
    Phase phase;
    uint64_t epoch = 0;
    {
      std::lock_guard lock(mu);
      phase = s.phase;
      epoch = s.epoch;
    }
    if (m.seq <= s.recv_seq) {
      drop(std::string("a duplicated or reordered ") + msg_type_name(t));
      continue;
    }
    if (m.epoch < epoch) {
      drop(std::string("a ") + msg_type_name(t) + " of an older lease-table epoch");
      continue;
    }
    const bool handshake = t == MsgType::welcome || t == MsgType::refuse;
    if (handshake != (phase == Phase::connecting) ||
        (!handshake && phase != Phase::ready) || t == MsgType::hello || t == MsgType::lend ||
        t == MsgType::heartbeat || t == MsgType::release || t == MsgType::bye) {
      drop(std::string("an unexpected ") + msg_type_name(t));
      continue;
    }
    s.recv_seq = m.seq;
    bool notify = false;
    {
      std::lock_guard lock(mu);
      s.epoch = m.epoch;
    }
    switch (t) {
      case MsgType::welcome: on_welcome(s, std::get<Welcome>(m.payload)); break;
      case MsgType::refuse: {
        const Refuse &r = std::get<Refuse>(m.payload);
        fail_session(s, known_error_status(r.status) ? static_cast<swiftkv_status>(r.status)
                                                     : SWIFTKV_EPEER,
                     "the lender \"" + s.name + "\" refused: " + r.message);
        break;
      }
      case MsgType::grant: on_grant(s, std::get<Grant>(m.payload)); break;
      case MsgType::deny: {
        const Deny &dn = std::get<Deny>(m.payload);
        std::lock_guard lock(mu);
        const auto it = s.lends.find(dn.request);
        if (it == s.lends.end() || it->second.done) {
          ++stats.messages_dropped;  // a late answer to a lend that timed out
          break;
        }
        it->second.done = true;
        it->second.status =
            known_error_status(dn.status) ? static_cast<swiftkv_status>(dn.status) : SWIFTKV_EPEER;
        it->second.message = dn.message;
        cv.notify_all();
        break;
      }
      case MsgType::heartbeat_ack: notify = on_ack(s, std::get<HeartbeatAck>(m.payload)); break;
      case MsgType::reclaim: {
        std::lock_guard lock(mu);
        const auto it = s.leases.find(std::get<Reclaim>(m.payload).lease);
        if (it == s.leases.end() || it->second.lost) {
          ++stats.messages_dropped;  // a lease the session does not hold (given back already)
          break;
        }
        notify = !it->second.reclaim;
        it->second.reclaim = true;
        break;
      }
      default: break;
    }
    if (notify && s.on_reclaim) s.on_reclaim();
  }
}

void Coordinator::State::on_welcome(Session &s, const Welcome &w) {
  // The lender's figures are checked against what this side computes itself: nothing about the
  // memory is taken on trust.
  std::string bad;
  GeometrySizes lender{};
  try {
    lender = geometry_sizes(model_geometry(w.lender), "the lender's geometry");
  } catch (const Error &e) {
    bad = e.what();
  }
  if (bad.empty() && !same_chunk_layout(w.borrower, s.mine)) {
    bad = "it lends to a borrower of " + geometry_text(w.borrower);
  }
  if (bad.empty()) {
    const LendUnit u = lend_unit(s.sizes, lender);
    if (u.borrower_chunks != w.unit_chunks || u.lender_blocks != w.unit_blocks ||
        w.unit_bytes != u.lender_blocks * lender.full_block_bytes ||
        w.unit_bytes != u.borrower_chunks * s.sizes.full_chunk_bytes) {
      bad = "its lending unit (" + std::to_string(w.unit_blocks) + " blocks, " +
            std::to_string(w.unit_chunks) + " chunks) is not " + std::to_string(u.lender_blocks) +
            " blocks, " + std::to_string(u.borrower_chunks) + " chunks";
    }
  }
  if (bad.empty() && (w.capacity_units == 0 || w.lease_ns == 0 || w.memory_kind > 2 ||
                      w.capacity_units > w.region_bytes / w.unit_bytes || w.identity.empty())) {
    bad = "its region description does not add up";
  }
  if (!bad.empty()) {
    fail_session(s, SWIFTKV_EPEER, "the lender \"" + s.name + "\" sent a bad welcome: " + bad);
    return;
  }
  try {
    s.fdconn = fd_connect(w.fd_socket);
    fd_send(s.fdconn.get(), encode_auth(FdAuth{w.session, w.token}), {});
  } catch (const Error &e) {
    fail_session(s, SWIFTKV_EPEER, e.what());
    return;
  }
  std::lock_guard lock(mu);
  s.info = w;
  s.phase = Phase::awaiting_pieces;
}

namespace {

// Checks a piece packet against what was asked for: its tag, one fd per piece, pieces inside
// the region. Appends the pieces; returns the packets that follow, or an error.
std::optional<uint32_t> take_pieces(FdPacket &p, uint64_t tag, uint64_t region_bytes,
                                    std::vector<ExportedPiece> *out, std::string *error) {
  std::optional<PiecePacket> pp = decode_pieces(p.bytes, error);
  if (!pp) return std::nullopt;
  if (pp->tag != tag || pp->pieces.size() != p.fds.size()) {
    *error = "a piece packet for another request, or with the wrong number of fds";
    return std::nullopt;
  }
  for (size_t i = 0; i < pp->pieces.size(); ++i) {
    const WirePiece &w = pp->pieces[i];
    if (w.size == 0 || w.offset > region_bytes || w.size > region_bytes - w.offset) {
      *error = "a piece outside the region";
      return std::nullopt;
    }
    ExportedPiece e;
    e.offset = w.offset;
    e.size = w.size;
    e.generation = w.generation;
    e.fd = std::move(p.fds[i]);
    out->push_back(std::move(e));
  }
  return pp->more;
}

RegionExport export_of(const Welcome &w, std::vector<ExportedPiece> pieces) {
  RegionExport e;
  e.kind = static_cast<MemoryKind>(w.memory_kind);
  e.device = w.device;
  e.size = w.region_bytes;
  e.identity = w.identity;
  e.pieces = std::move(pieces);
  std::copy(w.ipc_handle.begin(), w.ipc_handle.end(), e.ipc_handle.begin());
  return e;
}

}  // namespace

void Coordinator::State::on_session_fd(const std::shared_ptr<Session> &sp) {
  Session &s = *sp;
  Phase phase;
  {
    std::lock_guard lock(mu);
    phase = s.phase;
  }
  FdPacket p;
  try {
    p = fd_recv(s.fdconn.get(), 0);
  } catch (const Error &e) {
    p.closed = true;
  }
  if (p.closed) {
    if (phase == Phase::ready) return lose_lender(sp, "its fd channel hung up");
    fail_session(s, SWIFTKV_EPEER, "the lender \"" + s.name + "\" hung up in the handshake");
    return close_session(sp);
  }
  if (phase != Phase::awaiting_pieces) return drop("an fd packet nobody asked for");
  std::string error;
  const std::optional<uint32_t> more = take_pieces(p, 0, s.info.region_bytes, &s.pieces, &error);
  if (!more) {
    fail_session(s, SWIFTKV_EPEER, "the lender \"" + s.name + "\" sent " + error);
    return close_session(sp);
  }
  if (*more != 0) return;
  try {
    // A VMM region passes its granules with each grant: it is mapped at the first one.
    std::shared_ptr<RegionMapping> m;
    if (!(s.pieces.empty() && s.info.memory_kind == static_cast<uint32_t>(MemoryKind::cuda_vmm))) {
      m = open_region(export_of(s.info, std::move(s.pieces)));
    }
    std::lock_guard lock(mu);
    s.mapping = std::move(m);
    s.phase = Phase::ready;
    stats.lenders_connected = sessions.size();
  } catch (const Error &e) {
    fail_session(s, e.status(), std::string("mapping the lender's region: ") + e.what());
    return close_session(sp);
  }
  cv.notify_all();
}

void Coordinator::State::on_grant(Session &s, const Grant &g) {
  uint64_t max_units = 0;
  uint64_t sent_ns = 0;
  {
    std::lock_guard lock(mu);
    const auto it = s.lends.find(g.request);
    if (it != s.lends.end() && !it->second.done) {
      max_units = it->second.max_units;
      sent_ns = it->second.sent_ns;
    }
  }
  auto refuse = [&](swiftkv_status st, const std::string &why) {
    // A lease this side cannot use goes straight back, so the lender does not wait a lease out.
    send(s, Release{g.lease});
    std::lock_guard lock(mu);
    const auto it = s.lends.find(g.request);
    if (it == s.lends.end()) {
      ++stats.messages_dropped;
      return;
    }
    it->second.done = true;
    it->second.status = st;
    it->second.message = why;
    cv.notify_all();
  };
  if (max_units == 0) {
    log_warn("coordinator: a grant for no pending lend; giving lease " + std::to_string(g.lease) +
             " back");
    return refuse(SWIFTKV_EPEER, "");
  }
  bool known = false;
  {
    std::lock_guard lock(mu);
    known = s.leases.count(g.lease) != 0;
  }
  if (g.units == 0 || g.units > max_units || g.first_unit > s.info.capacity_units ||
      g.units > s.info.capacity_units - g.first_unit || known || g.lease == 0) {
    return refuse(SWIFTKV_EPEER, "the lender granted a lease that does not add up");
  }
  std::vector<ExportedPiece> pieces;
  for (uint32_t i = 0; i < g.pieces; ++i) {
    std::string error;
    try {
      FdPacket p = fd_recv(s.fdconn.get(), kFdWaitMs);
      if (p.closed) return refuse(SWIFTKV_EPEER, "the lender hung up while passing memory");
      const std::optional<uint32_t> more =
          take_pieces(p, g.request, s.info.region_bytes, &pieces, &error);
      if (!more || *more != g.pieces - i - 1) {
        return refuse(SWIFTKV_EPEER, "the lender sent " + (error.empty() ? "too few pieces" : error));
      }
    } catch (const Error &e) {
      return refuse(SWIFTKV_EPEER, e.what());
    }
  }
  std::shared_ptr<RegionMapping> mapping;
  try {
    {
      std::lock_guard lock(mu);
      mapping = s.mapping;
    }
    if (!mapping) {
      if (pieces.empty()) return refuse(SWIFTKV_EPEER, "the lender passed no memory for a lease");
      mapping = open_region(export_of(s.info, std::move(pieces)));
    } else if (!pieces.empty()) {
      mapping->adopt(export_of(s.info, std::move(pieces)));
    }
  } catch (const Error &e) {
    return refuse(e.status(), std::string("mapping the lease: ") + e.what());
  }
  std::lock_guard lock(mu);
  s.mapping = mapping;
  const auto it = s.lends.find(g.request);
  MirrorLease l;
  l.first_unit = g.first_unit;
  l.units = g.units;
  l.deadline_ns = sent_ns + s.info.lease_ns;  // the lender's lease began after the lend was sent
  s.leases[g.lease] = l;
  it->second.done = true;
  it->second.grant.lease_id = g.lease;
  it->second.grant.data = s.mapping->data() + g.first_unit * s.info.unit_bytes;
  it->second.grant.device = s.mapping->device();
  it->second.grant.chunks = g.units * s.info.unit_chunks;
  cv.notify_all();
}

bool Coordinator::State::on_ack(Session &s, const HeartbeatAck &a) {
  const auto sent = s.hb_sent.find(a.echo);
  if (sent == s.hb_sent.end()) {
    drop("a heartbeat ack for no heartbeat in flight");
    return false;
  }
  const uint64_t sent_ns = sent->second.first;
  const std::vector<uint64_t> listed = std::move(sent->second.second);
  s.hb_sent.erase(s.hb_sent.begin(), std::next(sent));
  std::map<uint64_t, const LeaseState *> table;
  for (const LeaseState &l : a.leases) table[l.lease] = &l;
  bool notify = false;
  std::lock_guard lock(mu);
  ++stats.heartbeats_answered;
  for (auto &[id, l] : s.leases) {
    if (l.lost) continue;
    const auto it = table.find(id);
    if (it != table.end()) {
      const uint64_t span = std::min(it->second->remaining_ns, s.info.lease_ns);
      l.deadline_ns = std::max(l.deadline_ns, sent_ns + span);
      if (it->second->reclaim && !l.reclaim) {
        l.reclaim = true;
        notify = true;
      }
    } else if (std::find(listed.begin(), listed.end(), id) != listed.end()) {
      // The lender no longer holds it: it expired there. Its bytes may be reused now.
      l.lost = true;
      ++stats.leases_lost;
      notify = true;
    }
  }
  return notify;
}

void Coordinator::State::heartbeats(uint64_t now) {
  std::vector<std::shared_ptr<Session>> sessions_now = active;
  for (const auto &sp : sessions_now) {
    Session &s = *sp;
    if (s.sock == nullptr) continue;
    std::vector<uint64_t> ids;
    bool notify = false;
    {
      std::lock_guard lock(mu);
      if (s.phase != Phase::ready || s.lost || now < s.next_heartbeat_ns) continue;
      for (auto &[id, l] : s.leases) {
        if (l.lost) continue;
        if (now >= l.deadline_ns) {  // no answer in time: the lease may be the lender's again
          l.lost = true;
          ++stats.leases_lost;
          notify = true;
          continue;
        }
        ids.push_back(id);
      }
      s.next_heartbeat_ns = now + heartbeat_ns(s);
    }
    if (notify && s.on_reclaim) s.on_reclaim();
    if (ids.empty()) continue;
    if (ids.size() > kMaxLeasesPerMessage) ids.resize(kMaxLeasesPerMessage);
    if (s.hb_sent.size() > 64) s.hb_sent.erase(s.hb_sent.begin());  // answers lost for good
    s.hb_sent[s.send_seq + 1] = {now, ids};
    send(s, Heartbeat{std::move(ids)});
    count(&CoordStats::heartbeats_sent);
  }
}

CoordStats Coordinator::stats() const {
  std::lock_guard lock(s_->mu);
  return s_->stats;
}

}  // namespace swiftkv::coord
