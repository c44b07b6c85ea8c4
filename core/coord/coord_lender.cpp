// The lender's half of the coordinator: borrower sessions on this process's regions, from the
// hello to the last release, and the scans that send reclaims and forget expired leases.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
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

void LenderService::bind(const std::string &endpoint) {
  ZmqSocket router(st_.zctx.get_or_make(), ZMQ_ROUTER);
  if (!router) fail(SWIFTKV_EPEER, std::string("zmq_socket: ") + zmq_strerror(zmq_errno()));
  router.set(ZMQ_LINGER, 0);
  router.set(ZMQ_MAXMSGSIZE, static_cast<int64_t>(kMaxMessageBytes));
  if (zmq_bind(router.get(), endpoint.c_str()) != 0) {
    fail(SWIFTKV_EPEER,
         "cannot bind coord_endpoint \"" + endpoint + "\": " + zmq_strerror(zmq_errno()));
  }
  router_ = std::move(router);
  note_ipc_file();
  try {
    listener_ = fd_listen(&fd_name_);
  } catch (...) {
    stop();
    throw;
  }
}

void LenderService::stop() noexcept {
  router_.reset();
  listener_.reset();
  remove_ipc_file();
}

void LenderService::note_ipc_file() noexcept {
  char ep[512] = {};
  size_t len = sizeof ep - 1;
  if (zmq_getsockopt(router_.get(), ZMQ_LAST_ENDPOINT, ep, &len) != 0) return;
  const std::string bound(ep);
  // "ipc://@name" is an abstract socket: no file.
  if (bound.rfind("ipc://", 0) != 0 || bound.size() <= 6 || bound[6] == '@') return;
  struct stat st {};
  if (::stat(bound.c_str() + 6, &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  ipc_file_ = bound.substr(6);
  ipc_dev_ = st.st_dev;
  ipc_ino_ = st.st_ino;
}

void LenderService::remove_ipc_file() noexcept {
  if (ipc_file_.empty()) return;
  struct stat st {};
  if (::stat(ipc_file_.c_str(), &st) == 0 && st.st_dev == ipc_dev_ && st.st_ino == ipc_ino_) {
    ::unlink(ipc_file_.c_str());
  }
  ipc_file_.clear();
}

void LenderService::add_to(PollSet &poll) {
  if (!router_) return;
  // The router is read without waiting on every round: its readiness is edge-triggered.
  poll.add_socket(
      router_.get(), [this] { on_router(); }, /*always=*/true);
  // Auth packets: an fd that answered is either attached to its session or closed (and left
  // empty here); those accepted below are polled from the next round on.
  for (size_t i = 0; i < unauthed_.size(); ++i) {
    poll.add_fd(unauthed_[i].get(), [this, i] { on_auth(std::move(unauthed_[i])); });
  }
  poll.add_fd(
      listener_.get(),
      [this] {
        std::erase_if(unauthed_, [](const UniqueFd &f) { return !f; });
        on_accept();
      },
      /*always=*/true);
  // The helper says nothing unasked: its channel turns readable when it has gone.
  if (helper_) {
    poll.add_fd(helper_->event_fd(), [this] {
      if (helper_ && helper_->gone()) helper_.reset();  // the next session starts another
    });
  }
  for (auto &[routing, srv] : served_) {
    if (!srv.fdconn || srv.gone) continue;
    poll.add_fd(srv.fdconn.get(), [this, routing = routing] {
      const auto it = served_.find(routing);
      if (it != served_.end()) on_served_fd(it->second);
    });
  }
}

void LenderService::send_served(Served &srv, Payload p) {
  Message m{++srv.send_seq, srv.epoch, std::move(p)};
  const std::vector<uint8_t> bytes = encode(m);
  zmq_send(router_.get(), srv.routing.data(), srv.routing.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT);
  zmq_send(router_.get(), bytes.data(), bytes.size(), ZMQ_DONTWAIT);
  st_.count(&CoordStats::messages_sent);
}

void LenderService::on_router() {
  std::vector<std::vector<uint8_t>> parts;
  while (recv_parts(router_.get(), &parts)) {
    st_.count(&CoordStats::messages_received);
    if (parts.size() != 2) {
      st_.drop("a message of " + std::to_string(parts.size()) + " parts (a routing id and a body)");
      continue;
    }
    const std::string routing(parts[0].begin(), parts[0].end());
    Decoded d = decode(parts[1]);
    if (!d.message) {
      st_.drop(d.error);
      continue;
    }
    const Message &m = *d.message;
    const MsgType t = type_of(m.payload);
    const auto it = served_.find(routing);
    if (t == MsgType::hello) {
      if (it != served_.end()) {
        st_.drop("a second hello on one session");
      } else {
        on_hello(routing, m);
      }
      continue;
    }
    if (it == served_.end()) {
      if (std::find(ended_.begin(), ended_.end(), routing) != ended_.end()) {
        continue;  // a borrower's last words (its bye) after its session was closed: harmless
      }
      st_.drop(std::string("a ") + msg_type_name(t) + " from a peer that never said hello");
      continue;
    }
    Served &srv = it->second;
    srv.last_heard_ns = monotonic_ns();
    if (m.seq <= srv.recv_seq) {
      st_.drop(std::string("a duplicated or reordered ") + msg_type_name(t) + " (seq " +
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
          st_.drop("a release of lease " + std::to_string(std::get<Release>(m.payload).lease) +
                   ", which the session does not hold");
          break;
        }
        srv.recv_seq = m.seq;
        on_release(srv, std::get<Release>(m.payload));
        break;
      case MsgType::bye:
        srv.recv_seq = m.seq;
        end_served(srv);
        erase_served(it);
        break;
      default: st_.drop(std::string("a ") + msg_type_name(t) + ", which a borrower never sends");
    }
  }
}

void LenderService::on_hello(const std::string &routing, const Message &m) {
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
    std::lock_guard lock(st_.mu);
    const auto it = st_.offers.find(h.region);
    if (it != st_.offers.end()) region = it->second.lock();
  }
  if (!region) return refuse(SWIFTKV_ENOTFOUND, "no region is offered as \"" + h.region + "\"");
  if (served_.size() >= kMaxServed) {
    return refuse(SWIFTKV_EBUSY,
                  "this lender serves " + std::to_string(kMaxServed) + " sessions already");
  }
  const WireGeometry want = wire_geometry(*region->borrower());
  if (!same_chunk_layout(h.borrower, want)) {
    return refuse(SWIFTKV_EINVAL, "the region lends to a borrower of " + geometry_text(want) +
                                      ", not " + geometry_text(h.borrower));
  }
  const std::optional<bool> remote = choose_path(srv, h, *region);
  if (!remote) return;
  std::random_device rd;
  for (size_t i = 0; i < srv.token.size(); i += 4) {
    const uint32_t r = rd();
    std::memcpy(srv.token.data() + i, &r, 4);
  }
  srv.id = next_session_++;
  srv.name = h.region;
  srv.region = region;
  srv.pid = h.pid;
  srv.created_ns = monotonic_ns();
  srv.last_heard_ns = srv.created_ns;
  srv.remote = *remote;
  Welcome w;
  w.session = srv.id;
  w.token = srv.token;
  if (srv.remote) {
    // Host memory (one memfd) is served by the helper process where there is one
    // (ucx_helper.hpp).
    const RegionExport mem = region->export_range(0, 0);
    if (mem.kind == MemoryKind::host_memfd && mem.pieces.size() == 1 && mem.pieces[0].fd) {
      srv.helper = helper_for_session();
    }
    if (srv.helper) {
      srv.helper_region =
          helper_regions_.try_emplace(mem.identity, helper_regions_.size() + 1).first->second;
    }
    const std::vector<std::byte> a =
        srv.helper ? srv.helper->address() : st_.ucx_context().serving_address();
    const auto *p = reinterpret_cast<const uint8_t *>(a.data());
    w.ucx_address.assign(p, p + a.size());
  } else {
    w.fd_socket = fd_name_;
  }
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
  // The session is counted before its welcome leaves: a borrower holding the welcome sees it in
  // the lender's statistics.
  const bool remote_session = srv.remote;
  Served &kept = served_.emplace(routing, std::move(srv)).first->second;
  {
    std::lock_guard lock(st_.mu);
    st_.stats.sessions_served = served_.size();
    if (remote_session) ++st_.stats.remote_sessions;
  }
  send_served(kept, std::move(w));
}

std::optional<bool> LenderService::choose_path(Served &srv, const Hello &h,
                                               const ElasticRegion &region) {
  auto refuse = [&](swiftkv_status st, const std::string &why) -> std::optional<bool> {
    log_info("coordinator: refused a borrower (pid " + std::to_string(h.pid) + "): " + why);
    send_served(srv, Refuse{st, why});
    return std::nullopt;
  };
  if (h.path > static_cast<uint8_t>(PathWish::local)) {
    return refuse(SWIFTKV_EINVAL, "path " + std::to_string(h.path) + " is not a path");
  }
  const auto wish = static_cast<PathWish>(h.path);
  const bool same_host = !st_.host.empty() && h.host == st_.host;
  if (same_host && wish != PathWish::ucx) return false;
  if (wish == PathWish::local) {
    return refuse(SWIFTKV_EUNSUPPORTED,
                  "the borrower runs on another host (or network namespace) and accepts mapped "
                  "memory only (SWIFTKV_REMOTE_PATH_LOCAL)");
  }
  transport::UcxContext *ucx = nullptr;
  try {
    ucx = &st_.ucx_context();
  } catch (const Error &e) {
    return refuse(e.status() == SWIFTKV_EUNSUPPORTED ? SWIFTKV_EUNSUPPORTED : SWIFTKV_EPEER,
                  std::string("the lender cannot serve over UCX: ") + e.what());
  }
  if (region.memory().device() >= 0 && !ucx->cuda_memory()) {
    return refuse(SWIFTKV_EUNSUPPORTED,
                  "the region is CUDA device memory and this lender's UCX has no CUDA support");
  }
  return true;
}

void LenderService::register_lease(Served &srv, const ElasticRegion &region, const Lease &lease,
                                   Grant *g) {
  const uint64_t bytes = lease.units * region.unit_bytes();
  std::unique_ptr<transport::UcxRegistration> reg;
  if (srv.helper) {
    const RegionExport e = region.export_range(0, 0);
    if (e.kind != MemoryKind::host_memfd || e.pieces.size() != 1 || !e.pieces[0].fd) {
      fail(SWIFTKV_EINTERNAL, "a helper-served region that is not one memfd");
    }
    reg = srv.helper->register_range(srv.helper_region, e.pieces[0].fd.get(),
                                     region.memory().size(), region.lease_offset(lease), bytes);
  } else {
    reg = st_.ucx_context().register_memory(region.memory().data() + region.lease_offset(lease),
                                            bytes);
  }
  const auto *k = reinterpret_cast<const uint8_t *>(reg->packed_key().data());
  g->rkey.assign(k, k + reg->packed_key().size());
  g->remote_base = reg->base();
  srv.regs[lease.id] = std::move(reg);
}

void LenderService::forget_lease(Served &srv, uint64_t id) {
  srv.regs.erase(id);  // unregistered before the region may reuse the bytes
  srv.reclaim_sent_ns.erase(id);
  srv.leases.erase(id);
  ++srv.epoch;
}

void LenderService::on_accept() {
  for (;;) {
    UniqueFd fd = fd_accept(listener_.get());
    if (!fd) return;
    if (unauthed_.size() >= 64) {
      log_warn("coordinator: too many fd channel connections without a session; closing one");
      continue;
    }
    unauthed_.push_back(std::move(fd));
  }
}

void LenderService::on_auth(UniqueFd fd) {
  FdPacket p;
  try {
    p = fd_recv(fd.get(), 0);
  } catch (const Error &e) {
    return st_.drop(std::string("fd channel: ") + e.what());
  }
  if (p.closed) return;
  const std::optional<FdAuth> a = decode_auth(p.bytes);
  Served *srv = nullptr;
  if (a) {
    for (auto &[routing, s] : served_) {
      if (s.id == a->session && s.token == a->token && !s.fdconn) srv = &s;
    }
  }
  if (srv == nullptr || p.fds.size() > 1) {
    return st_.drop("an fd channel connection without a valid session token");
  }
  const auto region = srv->region.lock();
  if (p.fds.size() == 1) {
    // The borrower's beat page: its heartbeats come there from now on. One the lender cannot
    // trust ends the connection, as a wrong token does.
    std::string why;
    BeatPage page = BeatPage::adopt(std::move(p.fds[0]), &why);
    if (!page) return st_.drop("an fd channel auth with a bad beat page: " + why);
    // Read at the lender's own heartbeat, as often as its expiry scan, and at least three
    // times a lease so that a live borrower's leases never run out.
    const uint64_t lease_third = region ? region->lease_ns() / 3 : st_.options.heartbeat_ns;
    srv->beat_period_ns =
        std::max<uint64_t>(1'000'000, std::min(st_.options.heartbeat_ns, lease_third));
    page.accept();
    srv->beat = std::move(page);
    next_beat_scan_ns_ = std::min(next_beat_scan_ns_, monotonic_ns() + srv->beat_period_ns);
  }
  srv->fdconn = std::move(fd);
  if (!region) return;  // its region went away: the session's lends are denied
  try {
    uint32_t packets = 0;
    // memfd: the whole file, mapped once; VMM and host granules: nothing yet (each grant
    // brings its granules); CUDA IPC: the handle went in the welcome.
    const RegionExport e = region->export_range(0, 0);
    send_pieces(srv->fdconn.get(), 0, e, &packets);
  } catch (const Error &e) {
    log_warn(std::string("coordinator: could not pass the region to a borrower: ") + e.what());
    srv->gone = true;
  }
}

void LenderService::send_pieces(int fd, uint64_t tag, const RegionExport &e, uint32_t *packets) {
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

void LenderService::on_served_fd(Served &srv) {
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
  st_.drop("a packet from a borrower on the fd channel");
}

void LenderService::on_lend(Served &srv, const Lend &l) {
  auto deny = [&](swiftkv_status st, const std::string &why) {
    send_served(srv, Deny{l.request, st, why});
  };
  const auto region = srv.region.lock();
  if (!region) return deny(SWIFTKV_ENOTFOUND, "the region \"" + srv.name + "\" is gone");
  if (!srv.remote && (!srv.fdconn || srv.gone)) {
    return deny(SWIFTKV_ESTATE, "the session's fd channel is not connected");
  }
  if (l.max_units == 0) return deny(SWIFTKV_EINVAL, "max_units is 0");
  // A heartbeat message names at most kMaxLeasesPerMessage leases, and its answer as many: a
  // lease past them would never be renewed, and would be lost at each lease's end.
  if (srv.leases.size() >= kMaxLeasesPerMessage) {
    return deny(SWIFTKV_ENOMEM, "a borrower holds at most " + std::to_string(kMaxLeasesPerMessage) +
                                    " leases of one lender; borrow more units per lease");
  }
  Lease lease;
  try {
    lease = region->lend(l.max_units);
  } catch (const Error &e) {
    return deny(e.status(), e.what());
  }
  uint32_t packets = 0;
  Grant grant{l.request, lease.id, lease.first_unit, lease.units, 0, {}, 0};
  if (srv.remote) {
    try {
      register_lease(srv, *region, lease, &grant);
    } catch (const Error &e) {
      try {
        region->release(lease.id);
      } catch (const Error &) {
      }
      return deny(SWIFTKV_EPEER, std::string("registering the lease with UCX failed: ") + e.what());
    }
  } else if (passed_per_lease(region->memory().kind())) {
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
  grant.pieces = packets;
  send_served(srv, std::move(grant));
}

void LenderService::on_heartbeat(Served &srv, const Message &m, const Heartbeat &h) {
  HeartbeatAck ack;
  ack.echo = m.seq;
  ack.leases = renew_leases(srv, h.leases, /*whole_table=*/true);
  if (ack.leases.size() > kMaxLeasesPerMessage) ack.leases.resize(kMaxLeasesPerMessage);
  send_served(srv, std::move(ack));
}

std::vector<LeaseState> LenderService::renew_leases(Served &srv, const std::vector<uint64_t> &ids,
                                                    bool whole_table) {
  std::vector<LeaseState> table;
  const auto region = srv.region.lock();
  if (!region) {
    if (!srv.leases.empty()) {
      srv.regs.clear();
      srv.leases.clear();
      ++srv.epoch;
    }
    return table;
  }
  std::vector<uint64_t> mine;  // never another session's lease
  for (uint64_t id : ids) {
    if (srv.leases.count(id) != 0) mine.push_back(id);
  }
  const std::vector<ElasticRegion::Renewal> renewed = region->renew_many(mine.data(), mine.size());
  const uint64_t now = region->clock_now();
  const auto left = [now](uint64_t expires) { return expires > now ? expires - now : 0; };
  if (!whole_table) {  // the named leases as renewed; those it no longer holds are forgotten
    for (size_t i = 0; i < mine.size(); ++i) {
      if (renewed[i].held) {
        table.push_back(LeaseState{mine[i], left(renewed[i].expires_ns), renewed[i].reclaim});
      } else {
        forget_lease(srv, mine[i]);
      }
    }
    return table;
  }
  for (auto it = srv.leases.begin(); it != srv.leases.end();) {
    const uint64_t id = *it++;  // forget_lease may erase it
    try {
      const Lease l = region->lease(id);
      table.push_back(LeaseState{l.id, left(l.expires_ns), l.reclaim_requested});
    } catch (const Error &) {
      forget_lease(srv, id);
    }
  }
  return table;
}

void LenderService::scan_beats(uint64_t now) {
  if (now < next_beat_scan_ns_) return;
  uint64_t period = UINT64_MAX;
  Beat beat;
  for (auto &[routing, srv] : served_) {
    if (!srv.beat || srv.gone) continue;
    period = std::min(period, srv.beat_period_ns);
    // A beat being written is read at the next scan; an old one is answered already.
    if (!srv.beat.read_beat(&beat, srv.beat_seen)) continue;
    srv.beat_seen = beat.seq;
    srv.beat.write_answer(
        BeatAnswer{beat.seq, renew_leases(srv, beat.leases, /*whole_table=*/false)});
  }
  next_beat_scan_ns_ = period == UINT64_MAX ? UINT64_MAX : now + period;
}

void LenderService::on_release(Served &srv, const Release &r) {
  // The ack is counted before the region gets the lease back: whoever sees the blocks come back
  // (swiftkv_elastic_wait_reclaims) also sees the ack in the stats.
  if (const auto it = srv.reclaim_sent_ns.find(r.lease); it != srv.reclaim_sent_ns.end()) {
    const uint64_t ns = monotonic_ns() - it->second;
    srv.reclaim_sent_ns.erase(it);
    std::lock_guard lock(st_.mu);
    ++st_.stats.reclaims_acked;
    st_.stats.reclaim_ns_total += ns;
    st_.stats.reclaim_ns_max = std::max(st_.stats.reclaim_ns_max, ns);
  }
  forget_lease(srv, r.lease);  // unregistered first: no borrower reaches the bytes after
  if (const auto region = srv.region.lock()) {
    try {
      region->release(r.lease);
    } catch (const Error &) {
      // It expired meanwhile: the region has it back already.
    }
  }
}

void LenderService::end_served(Served &srv) {
  srv.regs.clear();
  if (const auto region = srv.region.lock()) {
    for (uint64_t id : srv.leases) {
      try {
        region->release(id);
      } catch (const Error &) {
      }
    }
  }
  srv.leases.clear();
  std::lock_guard lock(st_.mu);
  st_.stats.sessions_served = served_.size() - 1;
  if (srv.remote) --st_.stats.remote_sessions;
}

void LenderService::scan_served(uint64_t now) {
  scan_beats(now);
  const bool expiry_scan = now >= next_expiry_scan_ns_;
  if (expiry_scan) next_expiry_scan_ns_ = now + st_.options.heartbeat_ns;
  std::map<const ElasticRegion *, std::vector<uint64_t>> pending;
  for (auto it = served_.begin(); it != served_.end();) {
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
        st_.count(&CoordStats::reclaims_sent);
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
        forget_lease(srv, *l++);
      }
    }
    // A borrower that hung up and whose leases all ended is forgotten, and so is a hello whose
    // fd channel never connected.
    const bool stillborn =
        !srv.remote && !srv.fdconn && now - srv.created_ns > st_.options.timeout_ns;
    if (stillborn) log_info("coordinator: a session never connected its fd channel; forgotten");
    // A UCX session has no channel to hang up: a borrower silent for two leases is gone (a
    // live one heartbeats every third of a lease, with or without leases).
    if (srv.remote && !srv.gone && srv.leases.empty() && region &&
        now - srv.last_heard_ns > 2 * region->lease_ns() + st_.options.timeout_ns) {
      log_info("coordinator: a UCX borrower (pid " + std::to_string(srv.pid) +
               ") went silent; forgotten");
      srv.gone = true;
    }
    if ((srv.gone || stillborn) && srv.leases.empty()) {
      if (srv.gone) {
        ended_.push_back(srv.routing);
        if (ended_.size() > 256) ended_.pop_front();
      }
      const bool remote = srv.remote;
      it = erase_served(it);
      std::lock_guard lock(st_.mu);
      st_.stats.sessions_served = served_.size();
      if (remote) --st_.stats.remote_sessions;
    } else {
      ++it;
    }
  }
}

std::shared_ptr<UcxHelper> LenderService::helper_for_session() {
  if (helper_ && !helper_->gone()) return helper_;
  helper_.reset();
  const std::optional<std::string> path = ucx_helper_path();
  if (!path) {
    if (!helper_missing_logged_) {
      log_info("coordinator: no UCX helper (SWIFTKV_UCX_HELPER); serving UCX in this process");
      helper_missing_logged_ = true;
    }
    return nullptr;
  }
  try {
    helper_ = UcxHelper::start(*path, st_.options.ucx_transports);
    log_info("coordinator: the UCX helper " + *path + " (pid " + std::to_string(helper_->pid()) +
             ") serves lent host memory");
  } catch (const Error &e) {
    log_warn(std::string("coordinator: ") + e.what() + "; serving UCX in this process");
  }
  return helper_;
}

std::map<std::string, Served>::iterator LenderService::erase_served(
    std::map<std::string, Served>::iterator it) {
  const std::shared_ptr<UcxHelper> helper = it->second.helper;
  const uint64_t key = it->second.helper_region;
  it = served_.erase(it);  // its registrations go first
  if (!helper) return it;
  for (const auto &[routing, s] : served_) {
    if (s.helper == helper && s.helper_region == key) return it;
  }
  helper->forget_region(key);
  return it;
}

// --- Borrower side ------------------------------------------------------------------------------

}  // namespace swiftkv::coord
