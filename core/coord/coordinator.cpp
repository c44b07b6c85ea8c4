// The coordinator over ZeroMQ (see coordinator.hpp for the protocol): set-up, the thread that
// owns the sockets, the borrower's link to a remote lender, and the public calls.
#include "core/coord/coordinator.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "core/common/clock.hpp"
#include "core/common/error.hpp"
#include "core/coord/coordinator_state.hpp"
#include "core/coord/fd_channel.hpp"

namespace swiftkv::coord {

std::string host_identity() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  char net[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", net, sizeof net - 1);
  // Without either (no procfs) nothing says two processes share a host: they use UCX.
  if (boot.empty() || n <= 0) return "";
  return boot + " " + std::string(net, static_cast<size_t>(n));
}

transport::UcxContext &Coordinator::State::ucx_context() {
  {
    std::lock_guard lock(mu);
    if (ucx) return *ucx;
  }
  std::shared_ptr<transport::UcxContext> c =
      transport::UcxContext::create(transport::UcxOptions{options.ucx_transports});
  std::lock_guard lock(mu);
  ucx = std::move(c);
  return *ucx;
}

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
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(st_->options.timeout_ns);
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

  LinkLeaseState renew(uint64_t lease_id) override { return renew_many({&lease_id, 1})[0]; }

  // The heartbeat renews on the lender's side; here the session's table is read, once per
  // heartbeat unless a reclaim wakes the borrower sooner. On the lender's host the heartbeat is
  // written here: a beat on the page, on the cache's maintenance pass, so that no thread wakes
  // for it (the coordinator's thread writes one only if these stop for a third of a lease).
  std::vector<LinkLeaseState> renew_many(std::span<const uint64_t> ids) override {
    std::vector<LinkLeaseState> out(ids.size());
    const uint64_t now = monotonic_ns();
    uint64_t renew_at = now + st_->options.heartbeat_ns;
    // On the page one beat names every lease of the session, so one lease (the lowest live id)
    // comes back at the next beat's time and the others a third of a lease on: the cache looks
    // at each lease rarely (a reclaim or a loss wakes it to look at all of them).
    uint64_t driver = UINT64_MAX, others_at = renew_at;
    bool notify = false;
    {
      std::lock_guard lock(st_->mu);
      if (s_->beat_on && s_->phase == Phase::ready && !s_->lost) {
        notify = st_->borrower.beat_round_locked(*s_, now, s_->next_heartbeat_ns, nullptr);
        if (s_->next_heartbeat_ns > now) renew_at = s_->next_heartbeat_ns;
        others_at = std::max(renew_at, now + st_->borrower.beat_backstop_ns(*s_));
        driver = beat_driver_locked();
      }
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto it = s_->leases.find(ids[i]);
        if (s_->lost || it == s_->leases.end() || it->second.lost ||
            now >= it->second.deadline_ns) {
          out[i] = LinkLeaseState{false, true, 0};
        } else {
          const uint64_t at = driver == UINT64_MAX || ids[i] == driver ? renew_at : others_at;
          out[i] = LinkLeaseState{it->second.reclaim, false, at};
        }
      }
    }
    // Another lease of the session asked back or lost: the cache looks at every lease (it only
    // signals).
    if (notify && s_->on_reclaim) s_->on_reclaim();
    return out;
  }

  uint64_t clock_now() const override { return monotonic_ns(); }
  const void *identity() const noexcept override { return s_.get(); }

  bool valid(uint64_t lease_id) const noexcept override {
    std::shared_ptr<transport::UcxEndpoint> ep;
    {
      std::lock_guard lock(st_->mu);
      ep = s_->ep;
      const auto it = s_->leases.find(lease_id);
      if (s_->lost || it == s_->leases.end() || it->second.lost ||
          monotonic_ns() >= it->second.deadline_ns) {
        return false;
      }
    }
    // A lender that died a moment ago has not been noticed by the thread yet.
    if (ep) return !ep->failed();
    return !fd_peer_gone(s_->fdconn.get());
  }

  void transfer(std::span<const transport::RangeOp> ops) override {
    std::shared_ptr<transport::UcxEndpoint> ep;
    {
      std::lock_guard lock(st_->mu);
      ep = s_->ep;
    }
    if (!ep) LenderLink::transfer(ops);
    try {
      ep->run(ops, st_->options.rma_timeout_ns);  // a lease's range is named by its id
    } catch (const Error &e) {
      // The thread loses the lender at once, not at its next heartbeat.
      if (ep->failed()) st_->wake();
      throw;
    }
  }

  void release(uint64_t lease_id) noexcept override {
    bool beats = false;
    try {
      std::lock_guard lock(st_->mu);
      const auto it = s_->leases.find(lease_id);
      if (it == s_->leases.end()) return;
      const bool tell = !it->second.lost && !s_->lost;
      beats = beat_driver_locked() == lease_id;  // the lease that brought the beats
      const uint64_t unit = s_->info.unit_bytes;
      Command c{Command::Kind::release,  s_,  lease_id, it->second.first_unit * unit,
                it->second.units * unit, tell};
      s_->leases.erase(it);
      s_->live_stale = true;
      st_->commands.push_back(std::move(c));
      st_->wake();
    } catch (...) {
      // Out of memory queueing the message: the lease expires on the lender's side instead.
    }
    // It was: the cache looks at every lease again, so that another brings them from the next
    // pass on (not after every release: a reclaim of many leases would look at all each time).
    if (beats && s_->on_reclaim) s_->on_reclaim();
  }

  std::string describe() const override {
    return "the lender \"" + s_->name + "\" at " + s_->endpoint;
  }

 private:
  // The lease whose renewals bring a page session's beats: its lowest live id (none when the
  // session has no beat page, or sends messages for more leases than a beat names). Under mu.
  uint64_t beat_driver_locked() const {
    if (!s_->beat_on || s_->beat_overflow) return UINT64_MAX;
    for (const auto &[id, l] : s_->leases) {
      if (!l.lost) return id;
    }
    return UINT64_MAX;
  }

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
  // ZeroMQ (and its threads) starts only for a context that serves or borrows across processes.
  if (s_->options.endpoint) {
    const std::string &ep = *s_->options.endpoint;
    if (ep.rfind("ipc://", 0) != 0 && ep.rfind("tcp://", 0) != 0) {
      fail_invalid("coord_endpoint \"" + ep + "\" is neither ipc:// nor tcp://");
    }
    s_->lender.bind(ep);  // on failure nothing is left bound; State's members close the rest
    std::lock_guard lock(s_->mu);
    s_->start_locked();
  }
}

Coordinator::~Coordinator() { shutdown(); }

const CoordOptions &Coordinator::options() const noexcept { return s_->options; }

void Coordinator::State::start_locked() {
  if (started) return;
  zctx.get_or_make();
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
  borrower.stop_all();
  lender.stop();
  zctx.reset();  // every socket is closed now
}

void Coordinator::State::run() {
  PollSet poll;
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (stopping) return;
    }
    // In the order they are handled: callers' commands (woken through wake_fd), the lender
    // side's sockets, then the borrower side's sessions.
    poll.clear();
    poll.add_fd(
        wake_fd.get(),
        [this] {
          uint64_t n = 0;
          [[maybe_unused]] const ssize_t r = ::read(wake_fd.get(), &n, sizeof(n));
          std::deque<Command> queued;
          {
            std::lock_guard lock(mu);
            queued.swap(commands);
          }
          for (const Command &c : queued) borrower.on_command(c);
        },
        /*always=*/true);
    lender.add_to(poll);
    borrower.add_to(poll);
    // A UCX serving worker answers borrowers' software gets and puts (tcp) only when driven.
    if (transport::UcxContext *u = ucx_now()) {
      poll.add_fd(
          u->serving_event_fd(), [u] { u->serve(); }, /*always=*/true);
    }
    // Sleep until the next heartbeat or lease scan is due (messages and callers wake it early).
    const uint64_t due = std::min(lender.next_due_ns(), borrower.next_due_ns());
    const uint64_t t = monotonic_ns();
    const long timeout_ms =
        static_cast<long>(std::min<uint64_t>(due > t ? (due - t + 999'999) / 1'000'000 : 0, 50));
    if (poll.wait(timeout_ms) < 0 && zmq_errno() != EINTR) {
      log_warn(std::string("coordinator: zmq_poll: ") + zmq_strerror(zmq_errno()));
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      continue;
    }
    try {
      poll.dispatch();
      const uint64_t now = monotonic_ns();
      lender.scan_served(now);
      borrower.heartbeats(now);
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
        fail_invalid("the session with " + name + " at " + endpoint + " is for a borrower of " +
                     geometry_text(s->mine));
      }
      if (s->device != g.device) {
        fail_invalid(
            "the session with " + name + " at " + endpoint + " maps its memory for " +
            (s->device < 0 ? std::string("the host") : "CUDA device " + std::to_string(s->device)) +
            ", not the borrower's device " + std::to_string(g.device));
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
  s->device = g.device;
  s->on_reclaim = std::move(on_reclaim);
  s_->start_locked();
  s_->sessions[key] = s;
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

CoordStats Coordinator::stats() const {
  std::shared_ptr<transport::UcxContext> ucx;
  CoordStats out;
  {
    std::lock_guard lock(s_->mu);
    out = s_->stats;
    ucx = s_->ucx;
  }
  if (ucx) {
    const transport::UcxStats u = ucx->stats();
    out.rma_batches = u.batches;
    out.rma_batches_failed = u.batches_failed;
    out.rma_bytes_read = u.bytes_read;
    out.rma_bytes_written = u.bytes_written;
  }
  return out;
}

}  // namespace swiftkv::coord
