// The borrower's half of the coordinator: sessions with remote lenders, from the hello to the
// mapped region, grants, heartbeats and their answers, reclaims, and losing a lender.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "core/common/clock.hpp"
#include "core/common/error.hpp"
#include "core/coord/coordinator_state.hpp"
#include "core/coord/fd_channel.hpp"

namespace swiftkv::coord {

void BorrowerSessions::add_to(PollSet &poll) {
  for (const auto &sp : active_) {
    Session &s = *sp;
    // A session closed by an earlier action in the same round is skipped.
    poll.add_socket(s.sock.get(), [this, sp] {
      if (sp->sock) on_session(sp);
    });
    if (s.fdconn) {
      poll.add_fd(s.fdconn.get(), [this, sp] {
        if (sp->sock && sp->fdconn) on_session_fd(sp);
      });
    }
    if (s.monitor) {
      poll.add_socket(s.monitor.get(), [this, sp] {
        if (sp->sock && sp->monitor) on_monitor(sp);
      });
    }
  }
}

uint64_t BorrowerSessions::next_due_ns() const noexcept {
  uint64_t due = UINT64_MAX;
  for (const auto &s : active_) {
    // A session on the beat page wakes this thread for no beat of its own, only for the
    // backstop (the cache's maintenance writes the beats), unless it sends messages.
    const uint64_t beat = s->beat_on && !s->beat_overflow.load()
                              ? s->last_beat_ns.load() + beat_backstop_ns(*s)
                              : message_due_ns(*s);
    due = std::min({due, beat, s->queue.next_deadline_ns()});
  }
  return due;
}

uint64_t BorrowerSessions::heartbeat_ns(const Session &s) const {
  return std::max<uint64_t>(1'000'000, std::min(st_.options.heartbeat_ns, s.info.lease_ns / 3));
}

uint64_t BorrowerSessions::beat_backstop_ns(const Session &s) const {
  return std::max(heartbeat_ns(s), s.info.lease_ns / 3);
}

uint64_t BorrowerSessions::message_due_ns(const Session &s) const {
  // One heartbeat message in flight: a lender slower to answer than the period would otherwise
  // get more than it answers, fall further behind at each, and its answers, to heartbeats sent
  // ever longer ago, would at last renew the leases into the past. Unanswered for a third of a
  // lease, the next goes anyway (the lender may never have had it).
  const uint64_t due = s.next_heartbeat_ns.load();
  if (s.hb_sent.empty()) return due;
  return std::max(due, s.hb_sent.rbegin()->second.first + beat_backstop_ns(s));
}

void BorrowerSessions::stop_all() noexcept {
  for (const auto &s : active_) {
    if (!s->sock) continue;
    try {
      send(*s, Bye{});
    } catch (...) {
      // Its leases expire on the lender's side instead.
    }
  }
  {
    std::lock_guard lock(st_.mu);
    for (auto &[key, s] : st_.sessions) s->lost = true;
    for (const auto &s : active_) s->lost = true;
    st_.sessions.clear();
  }
  st_.cv.notify_all();
  for (const auto &s : active_) {
    stop_monitor(*s);
    s->sock.reset();
  }
  active_.clear();
}

void BorrowerSessions::send(Session &s, Payload p) {
  uint64_t epoch = 0;
  {
    std::lock_guard lock(st_.mu);
    epoch = s.epoch;
  }
  const std::vector<uint8_t> bytes = encode(Message{++s.send_seq, epoch, std::move(p)});
  zmq_send(s.sock.get(), bytes.data(), bytes.size(), ZMQ_DONTWAIT);
  st_.count(&CoordStats::messages_sent);
}

void BorrowerSessions::on_command(const Command &c) {
  Session &s = *c.session;
  switch (c.kind) {
    case Command::Kind::connect: {
      {
        std::lock_guard lock(st_.mu);
        if (s.phase != Phase::connecting) return;  // the caller gave up already
      }
      s.sock = ZmqSocket(st_.zctx.get(), ZMQ_DEALER);
      if (!s.sock) {
        fail_session(s, SWIFTKV_EPEER, std::string("zmq_socket: ") + zmq_strerror(zmq_errno()));
        close_session(c.session);
        return;
      }
      s.sock.set(ZMQ_LINGER, 0);
      s.sock.set(ZMQ_MAXMSGSIZE, static_cast<int64_t>(kMaxMessageBytes));
      // Until the handshake is done, a refused connection (nothing listens: the lender is gone
      // or not started) or a dropped one fails it at once, not at the timeout.
      const std::string mon = "inproc://swiftkv-monitor-" + std::to_string(next_monitor_++);
      if (zmq_socket_monitor(s.sock.get(), mon.c_str(),
                             ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_DISCONNECTED) == 0) {
        s.monitor = ZmqSocket(st_.zctx.get(), ZMQ_PAIR);
        if (s.monitor) {
          s.monitor.set(ZMQ_LINGER, 0);
          if (zmq_connect(s.monitor.get(), mon.c_str()) != 0) s.monitor.reset();
        }
      }
      if (zmq_connect(s.sock.get(), s.endpoint.c_str()) != 0) {
        fail_session(s, SWIFTKV_EINVAL,
                     "cannot connect to \"" + s.endpoint + "\": " + zmq_strerror(zmq_errno()));
        close_session(c.session);
        return;
      }
      active_.push_back(c.session);
      // The wire's PathWish has RemotePath's values (checked in coordinator_state.hpp).
      send(s, Hello{s.mine, static_cast<uint32_t>(::getpid()), s.name, st_.host,
                    static_cast<uint8_t>(st_.options.path)});
      return;
    }
    case Command::Kind::lend: {
      if (!s.sock) return;
      uint64_t max_units = 0;
      {
        std::lock_guard lock(st_.mu);
        const auto it = s.lends.find(c.value);
        if (it == s.lends.end()) return;
        max_units = it->second.max_units;
      }
      send(s, Lend{c.value, max_units});
      return;
    }
    case Command::Kind::release: {
      // The lease's memory leaves this process before the lender hears it is free: granules no
      // other lease uses are unmapped (the caller has drained every reader of the lease).
      std::shared_ptr<RegionMapping> m;
      std::shared_ptr<transport::UcxEndpoint> ep;
      {
        std::lock_guard lock(st_.mu);
        m = s.mapping;
        ep = s.ep;
      }
      if (m) m->drop(c.offset, c.bytes);
      if (ep) ep->remove_range(c.value);
      if (c.tell && s.sock) send(s, Release{c.value});
      return;
    }
    case Command::Kind::close: close_session(c.session); return;
  }
}

void BorrowerSessions::close_session(const std::shared_ptr<Session> &s) {
  stop_monitor(*s);
  s->sock.reset();
  s->queue.clear();  // the memory passed for grants that will not come is closed
  s->parked.clear();
  std::erase(active_, s);
}

void BorrowerSessions::stop_monitor(Session &s) noexcept {
  if (!s.monitor) return;
  if (s.sock) zmq_socket_monitor(s.sock.get(), nullptr, 0);
  s.monitor.reset();
}

void BorrowerSessions::on_monitor(const std::shared_ptr<Session> &sp) {
  Session &s = *sp;
  // Each event is two frames: 2 bytes of event and 4 of value, then the endpoint.
  bool refused = false;
  for (;;) {
    Part frame;
    if (zmq_msg_recv(frame.get(), s.monitor.get(), ZMQ_DONTWAIT) < 0) break;
    uint16_t event = 0;
    const auto b = frame.bytes();
    if (b.size() >= sizeof event) std::memcpy(&event, b.data(), sizeof event);
    bool more = zmq_msg_more(frame.get()) != 0;
    while (more) {
      Part rest;
      more = zmq_msg_recv(rest.get(), s.monitor.get(), ZMQ_DONTWAIT) >= 0 &&
             zmq_msg_more(rest.get()) != 0;
    }
    refused |= event == ZMQ_EVENT_CONNECT_RETRIED || event == ZMQ_EVENT_DISCONNECTED;
  }
  if (!refused) return;
  {
    std::lock_guard lock(st_.mu);
    if (s.phase != Phase::connecting && s.phase != Phase::awaiting_pieces) return;
  }
  fail_session(s, SWIFTKV_EPEER,
               "nothing answers at " + s.endpoint +
                   " (the connection was refused or dropped: "
                   "no lender runs there now)");
  close_session(sp);
}

void BorrowerSessions::fail_session(Session &s, swiftkv_status st, const std::string &why) {
  {
    std::lock_guard lock(st_.mu);
    if (s.phase == Phase::failed) return;
    s.phase = Phase::failed;
    s.fail_status = st;
    s.fail_message = why;
  }
  st_.cv.notify_all();
}

void BorrowerSessions::lose_lender(const std::shared_ptr<Session> &s, const std::string &why) {
  std::function<void()> notify;
  {
    std::lock_guard lock(st_.mu);
    if (s->lost) return;
    s->lost = true;
    uint64_t n = 0;
    for (auto &[id, l] : s->leases) {
      if (!l.lost) ++n;
      l.lost = true;
    }
    s->live_stale = true;
    st_.stats.leases_lost += n;
    ++st_.stats.lenders_lost;
    // Lends still waiting fail with the cause, not a bare "went away".
    for (auto &[request, w] : s->lends) {
      if (w.done) continue;
      w.done = true;
      w.status = SWIFTKV_EPEER;
      w.message = "lost the lender: " + why;
    }
    if (s->ep) --st_.stats.remote_lenders;
    for (auto it = st_.sessions.begin(); it != st_.sessions.end(); ++it) {
      if (it->second == s) {
        st_.sessions.erase(it);
        break;
      }
    }
    st_.stats.lenders_connected = st_.sessions.size();
    notify = s->on_reclaim;
  }
  log_warn("coordinator: lost the lender \"" + s->name + "\" at " + s->endpoint + ": " + why);
  st_.cv.notify_all();
  close_session(s);
  if (notify) notify();
}

void BorrowerSessions::on_session(const std::shared_ptr<Session> &sp) {
  Session &s = *sp;
  std::vector<std::vector<uint8_t>> parts;
  while (s.sock && recv_parts(s.sock.get(), &parts)) {
    st_.count(&CoordStats::messages_received);
    if (parts.size() != 1) {
      st_.drop("a lender message of " + std::to_string(parts.size()) + " parts");
      continue;
    }
    Decoded d = decode(parts[0]);
    if (!d.message) {
      st_.drop(d.error);
      continue;
    }
    if (!accept(s, *d.message)) continue;
    if (handle(sp, *d.message) && s.on_reclaim) s.on_reclaim();
  }
}

bool BorrowerSessions::accept(Session &s, const Message &m) {
  const MsgType t = type_of(m.payload);
  Phase phase;
  uint64_t epoch = 0;
  {
    std::lock_guard lock(st_.mu);
    phase = s.phase;
    epoch = s.epoch;
  }
  if (m.seq <= s.recv_seq) {
    st_.drop(std::string("a duplicated or reordered ") + msg_type_name(t));
    return false;
  }
  if (m.epoch < epoch) {
    st_.drop(std::string("a ") + msg_type_name(t) + " of an older lease-table epoch");
    return false;
  }
  const bool handshake = t == MsgType::welcome || t == MsgType::refuse;
  if (handshake != (phase == Phase::connecting) || (!handshake && phase != Phase::ready) ||
      t == MsgType::hello || t == MsgType::lend || t == MsgType::heartbeat ||
      t == MsgType::release || t == MsgType::bye) {
    st_.drop(std::string("an unexpected ") + msg_type_name(t));
    return false;
  }
  s.recv_seq = m.seq;
  std::lock_guard lock(st_.mu);
  s.epoch = m.epoch;
  return true;
}

bool BorrowerSessions::handle(const std::shared_ptr<Session> &sp, const Message &m) {
  Session &s = *sp;
  switch (type_of(m.payload)) {
    case MsgType::welcome: on_welcome(s, std::get<Welcome>(m.payload)); return false;
    case MsgType::refuse: {
      const Refuse &r = std::get<Refuse>(m.payload);
      fail_session(
          s, known_error_status(r.status) ? static_cast<swiftkv_status>(r.status) : SWIFTKV_EPEER,
          "the lender \"" + s.name + "\" refused: " + r.message);
      return false;
    }
    case MsgType::grant: on_grant(sp, std::get<Grant>(m.payload)); return false;
    case MsgType::deny: on_deny(s, std::get<Deny>(m.payload)); return false;
    case MsgType::heartbeat_ack: return on_ack(s, std::get<HeartbeatAck>(m.payload));
    case MsgType::reclaim: return on_reclaim_asked(s, std::get<Reclaim>(m.payload));
    default: return false;  // accept() lets no other type through
  }
}

void BorrowerSessions::on_deny(Session &s, const Deny &dn) {
  s.queue.discard(dn.request);  // pieces sent before the lender gave up on the lend
  std::lock_guard lock(st_.mu);
  const auto it = s.lends.find(dn.request);
  if (it == s.lends.end() || it->second.done) {
    ++st_.stats.messages_dropped;  // a late answer to a lend that timed out
    return;
  }
  it->second.done = true;
  it->second.status =
      known_error_status(dn.status) ? static_cast<swiftkv_status>(dn.status) : SWIFTKV_EPEER;
  it->second.message = dn.message;
  st_.cv.notify_all();
}

bool BorrowerSessions::on_reclaim_asked(Session &s, const Reclaim &r) {
  // A lease whose memory is still coming is asked back once it is in (record_grant).
  for (auto &[request, p] : s.parked) {
    if (p.grant.lease == r.lease) {
      p.reclaim = true;
      return false;
    }
  }
  std::lock_guard lock(st_.mu);
  const auto it = s.leases.find(r.lease);
  if (it == s.leases.end() || it->second.lost) {
    ++st_.stats.messages_dropped;  // a lease the session does not hold (given back already)
    return false;
  }
  const bool first = !it->second.reclaim;
  it->second.reclaim = true;
  return first;
}

void BorrowerSessions::on_welcome(Session &s, const Welcome &w) {
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
  if (bad.empty() && (w.capacity_units == 0 || w.lease_ns == 0 ||
                      w.memory_kind > static_cast<uint32_t>(MemoryKind::host_granules) ||
                      w.capacity_units > w.region_bytes / w.unit_bytes || w.identity.empty())) {
    bad = "its region description does not add up";
  }
  if (bad.empty() && w.ucx_address.empty() == w.fd_socket.empty()) {
    bad = "it names both or neither of an fd channel and a UCX address";
  }
  if (!bad.empty()) {
    fail_session(s, SWIFTKV_EPEER, "the lender \"" + s.name + "\" sent a bad welcome: " + bad);
    return;
  }
  if (!w.ucx_address.empty()) return on_ucx_welcome(s, w);
  try {
    s.fdconn = fd_connect(w.fd_socket);
    // The beat page goes with the auth: a lender that reads it says so before the handshake's
    // last packet, and heartbeats are written there from then on.
    std::vector<int> fds;
    if (st_.options.beat_page) {
      s.beat = BeatPage::create(st_.options.beat_page_bytes);
      fds.push_back(s.beat.fd());
    }
    fd_send(s.fdconn.get(), encode_auth(FdAuth{w.session, w.token}), fds);
  } catch (const Error &e) {
    fail_session(s, SWIFTKV_EPEER, e.what());
    return;
  }
  // The region's own pieces (tag 0) follow on the fd channel, for the handshake to map, within
  // the handshake's own time.
  s.queue = PieceQueue(w.region_bytes);
  (void)s.queue.expect(0, std::nullopt, monotonic_ns() + st_.options.timeout_ns);
  std::lock_guard lock(st_.mu);
  s.info = w;
  s.phase = Phase::awaiting_pieces;
}

void BorrowerSessions::on_ucx_welcome(Session &s, const Welcome &w) {
  if (st_.options.path == RemotePath::local) {
    fail_session(s, SWIFTKV_EPEER,
                 "the lender \"" + s.name +
                     "\" offered UCX to a borrower that asked for mapped "
                     "memory only");
    return;
  }
  std::shared_ptr<transport::UcxEndpoint> ep;
  try {
    ep = st_.ucx_context().connect(std::as_bytes(std::span(w.ucx_address)));
  } catch (const Error &e) {
    fail_session(s, e.status() == SWIFTKV_EUNSUPPORTED ? SWIFTKV_EUNSUPPORTED : SWIFTKV_EPEER,
                 "reaching the lender \"" + s.name + "\" over UCX: " + e.what());
    return;
  }
  {
    std::lock_guard lock(st_.mu);
    s.info = w;
    s.ep = std::move(ep);
    s.phase = Phase::ready;
    st_.stats.lenders_connected = st_.sessions.size();
    ++st_.stats.remote_lenders;
  }
  // From here a lost lender is found by its endpoint's errors and by heartbeats.
  stop_monitor(s);
  st_.cv.notify_all();
}

void BorrowerSessions::add_remote_range(Session &s, const Grant &g) {
  const uint64_t bytes = g.units * s.info.unit_bytes;
  if (g.pieces != 0 || g.rkey.empty() || g.remote_base + bytes < g.remote_base) {
    fail(SWIFTKV_EPEER, "the lender's grant has no usable remote key or range");
  }
  std::shared_ptr<transport::UcxEndpoint> ep;
  {
    std::lock_guard lock(st_.mu);
    ep = s.ep;
  }
  transport::RemoteRange r;
  const auto *k = reinterpret_cast<const std::byte *>(g.rkey.data());
  r.packed_key.assign(k, k + g.rkey.size());
  r.base = g.remote_base;
  r.bytes = bytes;
  ep->add_range(g.lease, r);  // EPEER for a key UCX refuses (counted there as well)
}

namespace {

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

void BorrowerSessions::on_session_fd(const std::shared_ptr<Session> &sp) { drain_fd(sp); }

bool BorrowerSessions::drain_fd(const std::shared_ptr<Session> &sp) {
  Session &s = *sp;
  // Every packet waiting is taken now, whatever the session expects: the poll loop never waits
  // on this channel, and a packet ahead of its grant is kept, not lost.
  while (s.sock && s.fdconn && fd_pending(s.fdconn.get())) {
    FdPacket p;
    try {
      p = fd_recv(s.fdconn.get(), 0);
    } catch (const Error &e) {
      p.closed = true;
    }
    if (p.closed) {
      Phase phase;
      {
        std::lock_guard lock(st_.mu);
        phase = s.phase;
      }
      if (phase == Phase::ready) {
        lose_lender(sp, "its fd channel hung up");
      } else {
        fail_session(s, SWIFTKV_EPEER, "the lender \"" + s.name + "\" hung up in the handshake");
        close_session(sp);
      }
      return false;
    }
    if (!on_piece_packet(sp, std::move(p))) return false;
  }
  return static_cast<bool>(s.sock);
}

bool BorrowerSessions::on_piece_packet(const std::shared_ptr<Session> &sp, FdPacket p) {
  Session &s = *sp;
  Phase phase;
  {
    std::lock_guard lock(st_.mu);
    phase = s.phase;
  }
  // Tag 0 belongs to the handshake alone; a request's tag is wanted while its lend waits, stale
  // once it was answered or given up, and foreign if this side never sent it.
  const auto use = [&](uint64_t tag) {
    using Use = PieceQueue::TagUse;
    if (phase != Phase::ready) return tag == 0 ? Use::wanted : Use::foreign;
    std::lock_guard lock(st_.mu);
    if (tag == 0 || tag >= s.next_request) return Use::foreign;
    const auto it = s.lends.find(tag);
    return it != s.lends.end() && !it->second.done ? Use::wanted : Use::stale;
  };
  const PieceQueue::Result r = s.queue.add_packet(std::move(p), use);
  switch (r.kind) {
    case PieceQueue::Result::Kind::kept: return true;
    case PieceQueue::Result::Kind::stale:
      st_.drop("a piece packet for request " + std::to_string(r.tag) +
               ", which was answered or given up already (its fds are closed)");
      return true;
    case PieceQueue::Result::Kind::error:
      protocol_error(sp, "the lender \"" + s.name + "\" sent " + r.error);
      return false;
    case PieceQueue::Result::Kind::complete: break;
  }
  if (phase != Phase::ready) {
    finish_handshake(sp);
    return static_cast<bool>(s.sock);
  }
  const auto it = s.parked.find(r.tag);
  if (it == s.parked.end()) {  // complete means its grant came: the queue says so
    protocol_error(sp, "pieces for request " + std::to_string(r.tag) + " with no grant waiting");
    return false;
  }
  const Session::Parked parked = it->second;
  s.parked.erase(it);
  finish_grant(sp, parked.grant, s.queue.take(r.tag), parked.reclaim);
  return static_cast<bool>(s.sock);
}

void BorrowerSessions::finish_handshake(const std::shared_ptr<Session> &sp) {
  Session &s = *sp;
  std::vector<ExportedPiece> pieces = s.queue.take(0);
  try {
    // Memory passed per lease comes with each grant: it is mapped at the first one.
    std::shared_ptr<RegionMapping> m;
    const auto kind = static_cast<MemoryKind>(s.info.memory_kind);
    if (!(pieces.empty() && passed_per_lease(kind))) {
      m = open_region(export_of(s.info, std::move(pieces)), s.device);
    }
    // The lender accepted the beat page before it sent the handshake's last packet, which is in.
    s.beat_on = s.beat && s.beat.accepted();
    std::lock_guard lock(st_.mu);
    s.mapping = std::move(m);
    s.phase = Phase::ready;
    st_.stats.lenders_connected = st_.sessions.size();
  } catch (const Error &e) {
    fail_session(s, e.status(), std::string("mapping the lender's region: ") + e.what());
    return close_session(sp);
  }
  // From here a lost lender is found by its fd channel and heartbeats.
  stop_monitor(s);
  st_.cv.notify_all();
}

void BorrowerSessions::protocol_error(const std::shared_ptr<Session> &sp, const std::string &why) {
  Phase phase;
  {
    std::lock_guard lock(st_.mu);
    phase = sp->phase;
  }
  st_.count(&CoordStats::messages_dropped);
  if (phase == Phase::ready) return lose_lender(sp, why);
  fail_session(*sp, SWIFTKV_EPEER, why);
  close_session(sp);
}

void BorrowerSessions::expire_pieces(const std::shared_ptr<Session> &sp, uint64_t now) {
  Session &s = *sp;
  if (s.queue.empty()) return;
  for (const PieceQueue::Overdue &o : s.queue.overdue(now)) {
    const std::string got = std::to_string(o.received) + " of " +
                            (o.expected != 0 ? std::to_string(o.expected) : std::string("its")) +
                            " piece packets in ";
    if (o.tag == 0) {
      fail_session(s, SWIFTKV_EPEER,
                   "the lender \"" + s.name + "\" passed its region's memory too slowly: " + got +
                       std::to_string(st_.options.timeout_ns / 1'000'000) + " ms");
      return close_session(sp);
    }
    s.queue.discard(o.tag);
    const auto it = s.parked.find(o.tag);
    if (it == s.parked.end()) continue;
    const Grant g = it->second.grant;
    s.parked.erase(it);
    refuse_grant(s, g, SWIFTKV_EPEER,
                 "no piece packet on the fd channel in time: the lender passed " + got +
                     std::to_string(kFdWaitNs / 1'000'000) + " ms for lease " +
                     std::to_string(g.lease));
  }
  Phase phase;
  {
    std::lock_guard lock(st_.mu);
    phase = s.phase;
  }
  if (phase != Phase::ready) return;
  const auto use = [&](uint64_t tag) {
    std::lock_guard lock(st_.mu);
    const auto it = s.lends.find(tag);
    return it != s.lends.end() && !it->second.done ? PieceQueue::TagUse::wanted
                                                   : PieceQueue::TagUse::stale;
  };
  for (uint64_t tag : s.queue.unwanted(use)) {
    const size_t n = s.queue.discard(tag);
    st_.drop(std::to_string(n) + " piece packet(s) for request " + std::to_string(tag) +
             ", which was answered or given up before its grant came (their fds are closed)");
  }
}

void BorrowerSessions::on_grant(const std::shared_ptr<Session> &sp, const Grant &g) {
  Session &s = *sp;
  uint64_t max_units = 0;
  uint64_t sent_ns = 0;
  bool known = false;
  {
    std::lock_guard lock(st_.mu);
    const auto it = s.lends.find(g.request);
    if (it != s.lends.end() && !it->second.done) {
      max_units = it->second.max_units;
      sent_ns = it->second.sent_ns;
    }
    known = s.leases.count(g.lease) != 0;
  }
  if (max_units == 0) {
    log_warn("coordinator: a grant for no pending lend; giving lease " + std::to_string(g.lease) +
             " back");
    return refuse_grant(s, g, SWIFTKV_EPEER, "");
  }
  if (g.units == 0 || g.units > max_units || g.first_unit > s.info.capacity_units ||
      g.units > s.info.capacity_units - g.first_unit || known || g.lease == 0) {
    return refuse_grant(s, g, SWIFTKV_EPEER, "the lender granted a lease that does not add up");
  }
  if (s.ep) {  // set with the welcome, before any grant
    try {
      add_remote_range(s, g);
    } catch (const Error &e) {
      return refuse_grant(s, g, e.status(), e.what());
    }
    return record_grant(s, g, nullptr, sent_ns, false);
  }
  // The lender writes a grant's pieces before the grant: they wait in the socket now unless the
  // lender stopped. Taking them first means a grant rarely waits, and then only for a slow peer.
  if (g.pieces != 0 && !drain_fd(sp)) return;
  // The pieces may have come already, or come later: the queue keeps whichever is first.
  const PieceQueue::Result r = s.queue.expect(g.request, g.pieces, monotonic_ns() + kFdWaitNs);
  switch (r.kind) {
    case PieceQueue::Result::Kind::complete:
      return finish_grant(sp, g, s.queue.take(g.request), false);
    case PieceQueue::Result::Kind::kept: s.parked[g.request] = Session::Parked{g, false}; return;
    default: {
      const std::string why = "the lender \"" + s.name + "\" sent " + r.error;
      refuse_grant(s, g, SWIFTKV_EPEER, why);
      return protocol_error(sp, why);
    }
  }
}

void BorrowerSessions::finish_grant(const std::shared_ptr<Session> &sp, const Grant &g,
                                    std::vector<ExportedPiece> pieces, bool reclaim) {
  Session &s = *sp;
  std::optional<uint64_t> sent_ns;
  {
    std::lock_guard lock(st_.mu);
    const auto it = s.lends.find(g.request);
    if (it != s.lends.end() && !it->second.done) sent_ns = it->second.sent_ns;
  }
  if (!sent_ns) {  // given up while its pieces came: nothing is mapped
    log_warn("coordinator: the lend for lease " + std::to_string(g.lease) +
             " was given up before its memory came; giving it back");
    return refuse_grant(s, g, SWIFTKV_EPEER, "");
  }
  std::shared_ptr<RegionMapping> mapping;
  try {
    mapping = map_grant(s, g, std::move(pieces));
  } catch (const Error &e) {
    if (e.status() != SWIFTKV_EINVAL && e.status() != SWIFTKV_EPEER) {
      return refuse_grant(s, g, e.status(), e.what());  // this side's trouble (memory, driver)
    }
    // Pieces that do not fit the region (their size, their granule) are the lender's doing.
    const std::string why =
        "the lender \"" + s.name + "\" passed memory that does not fit: " + e.what();
    refuse_grant(s, g, SWIFTKV_EPEER, why);
    return protocol_error(sp, why);
  }
  record_grant(s, g, mapping, *sent_ns, reclaim);
}

void BorrowerSessions::record_grant(Session &s, const Grant &g,
                                    const std::shared_ptr<RegionMapping> &mapping, uint64_t sent_ns,
                                    bool reclaim) {
  const bool remote = mapping == nullptr;
  std::unique_lock lock(st_.mu);
  const auto it = s.lends.find(g.request);
  if (it == s.lends.end() || it->second.done) {
    // The caller gave up while the grant was mapped: the hold goes, the lease goes back.
    lock.unlock();
    if (mapping) mapping->drop(g.first_unit * s.info.unit_bytes, g.units * s.info.unit_bytes);
    if (remote) s.ep->remove_range(g.lease);
    return refuse_grant(s, g, SWIFTKV_EPEER, "");
  }
  if (!remote) s.mapping = mapping;
  MirrorLease l;
  l.first_unit = g.first_unit;
  l.units = g.units;
  l.deadline_ns = sent_ns + s.info.lease_ns;  // the lender's lease began after the lend was sent
  l.reclaim = reclaim;
  s.leases[g.lease] = l;
  s.live_stale = true;
  it->second.done = true;
  it->second.grant.lease_id = g.lease;
  it->second.grant.chunks = g.units * s.info.unit_chunks;
  it->second.grant.remote = remote;
  if (!remote) {
    it->second.grant.data = s.mapping->data() + g.first_unit * s.info.unit_bytes;
    it->second.grant.device = s.mapping->device();
  }
  lock.unlock();
  st_.cv.notify_all();
  if (reclaim && s.on_reclaim) s.on_reclaim();
}

void BorrowerSessions::refuse_grant(Session &s, const Grant &g, swiftkv_status st,
                                    const std::string &why) {
  // A lease this side cannot use goes straight back, so the lender does not wait a lease out;
  // whatever of its memory came is closed, and what comes later is a stale packet.
  s.queue.discard(g.request);
  s.parked.erase(g.request);
  send(s, Release{g.lease});
  std::lock_guard lock(st_.mu);
  ++st_.stats.grants_refused;
  const auto it = s.lends.find(g.request);
  if (it == s.lends.end() || it->second.done) {  // given up, or answered by an earlier message
    ++st_.stats.messages_dropped;
    return;
  }
  it->second.done = true;
  it->second.status = st;
  it->second.message = why;
  st_.cv.notify_all();
}

std::shared_ptr<RegionMapping> BorrowerSessions::map_grant(Session &s, const Grant &g,
                                                           std::vector<ExportedPiece> pieces) {
  std::shared_ptr<RegionMapping> mapping;
  {
    std::lock_guard lock(st_.mu);
    mapping = s.mapping;
  }
  if (!mapping && pieces.empty()) fail(SWIFTKV_EPEER, "the lender passed no memory for a lease");
  try {
    if (!mapping) {
      mapping = open_region(export_of(s.info, std::move(pieces)), s.device);
    } else if (!pieces.empty()) {
      mapping->adopt(export_of(s.info, std::move(pieces)));
    }
    mapping->hold(g.first_unit * s.info.unit_bytes, g.units * s.info.unit_bytes);
  } catch (const Error &e) {
    fail(e.status(), std::string("mapping the lease: ") + e.what());
  }
  return mapping;
}

bool BorrowerSessions::on_ack(Session &s, const HeartbeatAck &a) {
  const auto sent = s.hb_sent.find(a.echo);
  if (sent == s.hb_sent.end()) {
    // A lender that was stopped answers every heartbeat it missed: the old ones are late, and
    // say nothing the newer answers don't.
    if (a.echo != 0 && a.echo <= s.hb_given_up) return false;
    st_.drop("a heartbeat ack for no heartbeat sent");
    return false;
  }
  if (sent != s.hb_sent.begin()) s.hb_given_up = std::max(s.hb_given_up, std::prev(sent)->first);
  const uint64_t sent_ns = sent->second.first;
  const std::vector<uint64_t> listed = std::move(sent->second.second);
  s.hb_sent.erase(s.hb_sent.begin(), std::next(sent));
  std::lock_guard lock(st_.mu);
  return apply_table_locked(s, sent_ns, listed, a.leases);
}

bool BorrowerSessions::read_beat_answer_locked(Session &s) {
  BeatAnswer a;
  if (!s.beat_on || s.beats_sent.empty() || !s.beat.read_answer(&a, s.beat_answered)) {
    return false;
  }
  const auto sent = s.beats_sent.find(a.echo);
  if (sent == s.beats_sent.end()) {
    // An answer to a beat given up on (more than 64 unanswered) says nothing newer ones won't;
    // one to a beat never written is the lender's error.
    if (a.echo > s.beats_sent.rbegin()->first) st_.drop_locked("a beat answer to no beat written");
    s.beat_answered = a.echo;
    return false;
  }
  s.beat_answered = a.echo;
  const uint64_t sent_ns = sent->second.first;
  const std::vector<uint64_t> listed = std::move(sent->second.second);
  s.beats_sent.erase(s.beats_sent.begin(), std::next(sent));
  return apply_table_locked(s, sent_ns, listed, a.leases);
}

bool BorrowerSessions::apply_table_locked(Session &s, uint64_t sent_ns,
                                          const std::vector<uint64_t> &listed,
                                          const std::vector<LeaseState> &leases) {
  // The answer by lease id, walked beside the session's leases (both ascending): a lender
  // answers in the order of the ids it was sent, which are listed ascending, so the sort is
  // only a check, and the walk allocates nothing per lease.
  std::vector<const LeaseState *> table(leases.size());
  for (size_t i = 0; i < leases.size(); ++i) table[i] = &leases[i];
  const auto by_id = [](const LeaseState *a, const LeaseState *b) { return a->lease < b->lease; };
  if (!std::is_sorted(table.begin(), table.end(), by_id)) {
    std::sort(table.begin(), table.end(), by_id);
  }
  const bool listed_sorted = std::is_sorted(listed.begin(), listed.end());
  const auto was_listed = [&](uint64_t id) {
    return listed_sorted ? std::binary_search(listed.begin(), listed.end(), id)
                         : std::find(listed.begin(), listed.end(), id) != listed.end();
  };
  bool notify = false;
  ++st_.stats.heartbeats_answered;
  auto next = table.begin();
  for (auto &[id, l] : s.leases) {
    while (next != table.end() && (*next)->lease < id) ++next;
    if (l.lost) continue;
    if (next != table.end() && (*next)->lease == id) {
      const uint64_t span = std::min((*next)->remaining_ns, s.info.lease_ns);
      l.deadline_ns = std::max(l.deadline_ns, sent_ns + span);
      if ((*next)->reclaim && !l.reclaim) {
        l.reclaim = true;
        notify = true;
      }
    } else if (was_listed(id)) {
      // The lender no longer holds it: it expired there. Its bytes may be reused now.
      l.lost = true;
      s.live_stale = true;
      ++st_.stats.leases_lost;
      notify = true;
    }
  }
  return notify;
}

std::vector<uint64_t> BorrowerSessions::live_leases_locked(Session &s, uint64_t now, bool *notify) {
  if (!s.live_stale && now < s.live_due_ns) return s.live_ids;
  std::vector<uint64_t> ids;
  uint64_t due = UINT64_MAX;
  for (auto &[id, l] : s.leases) {
    if (l.lost) continue;
    if (now >= l.deadline_ns) {  // no answer in time: the lease may be the lender's again
      l.lost = true;
      ++st_.stats.leases_lost;
      *notify = true;
      continue;
    }
    ids.push_back(id);
    due = std::min(due, l.deadline_ns);
  }
  s.live_ids = ids;
  s.live_due_ns = due;
  s.live_stale = false;
  return ids;
}

bool BorrowerSessions::beat_round_locked(Session &s, uint64_t now, uint64_t due_ns,
                                         std::vector<uint64_t> *overflow) {
  bool notify = read_beat_answer_locked(s);
  std::vector<uint64_t> ids = live_leases_locked(s, now, &notify);
  const bool overflow_now = ids.size() > s.beat.capacity();
  s.beat_overflow = overflow_now;
  if (now < due_ns || ids.empty()) return notify;
  if (overflow_now) {
    if (overflow != nullptr) *overflow = std::move(ids);
    return notify;
  }
  if (s.beats_sent.size() >= 64) s.beats_sent.erase(s.beats_sent.begin());  // unanswered
  const uint64_t seq = s.beat.write_beat(ids);
  s.beats_sent[seq] = {now, std::move(ids)};
  s.next_heartbeat_ns = now + heartbeat_ns(s);
  s.last_beat_ns = now;
  ++st_.stats.heartbeats_sent;
  return notify;
}

void BorrowerSessions::heartbeats(uint64_t now) {
  std::vector<std::shared_ptr<Session>> sessions_now = active_;
  for (const auto &sp : sessions_now) {
    Session &s = *sp;
    if (!s.sock) continue;
    expire_pieces(sp, now);
    if (!s.sock) continue;
    std::vector<uint64_t> ids;
    bool notify = false;
    std::shared_ptr<transport::UcxEndpoint> ep;
    {
      std::lock_guard lock(st_.mu);
      if (s.phase != Phase::ready || s.lost) continue;
      ep = s.ep;
    }
    // A UCX lender's death shows on its endpoint first (a failed batch wakes this thread).
    if (ep && ep->failed()) {
      lose_lender(sp, "its UCX endpoint failed");
      continue;
    }
    if (s.beat_on) {
      // The cache's maintenance pass writes the beats; this thread applies answers as it wakes,
      // writes a beat only when none was written for a third of a lease (a pass that took that
      // long), and sends messages for a session with more leases than a beat names.
      {
        std::lock_guard lock(st_.mu);
        const uint64_t due =
            s.beat_overflow ? message_due_ns(s) : s.last_beat_ns + beat_backstop_ns(s);
        notify = beat_round_locked(s, now, due, &ids);
        if (!ids.empty()) s.next_heartbeat_ns = now + heartbeat_ns(s);
      }
      if (ids.empty()) {
        if (notify && s.on_reclaim) s.on_reclaim();
        continue;
      }
    } else {
      std::lock_guard lock(st_.mu);
      if (now < message_due_ns(s)) continue;
      ids = live_leases_locked(s, now, &notify);
      s.next_heartbeat_ns = now + heartbeat_ns(s);
    }
    if (notify && s.on_reclaim) s.on_reclaim();
    // A UCX session heartbeats with no lease too: it is the lender's only sign of this process.
    if (ids.empty() && !ep) continue;
    if (ids.size() > kMaxLeasesPerMessage) ids.resize(kMaxLeasesPerMessage);
    if (s.hb_sent.size() > 64) {  // answers lost for good
      s.hb_given_up = std::max(s.hb_given_up, s.hb_sent.begin()->first);
      s.hb_sent.erase(s.hb_sent.begin());
    }
    s.hb_sent[s.send_seq + 1] = {now, ids};
    send(s, Heartbeat{std::move(ids)});
    st_.count(&CoordStats::heartbeats_sent);
  }
}

}  // namespace swiftkv::coord
