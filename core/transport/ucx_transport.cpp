// UCX's side of the transport (see ucx_transport.hpp).
#include "core/transport/ucx_transport.hpp"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/common/clock.hpp"
#include "core/common/error.hpp"

namespace swiftkv::transport {

bool ucx_built() noexcept { return true; }

namespace {

constexpr size_t kMaxKeyBytes = 64 * 1024;
// A remote key is copied into a buffer this much longer, zero-filled: UCX's unpack takes no
// length, so a truncated key must not make it read past our allocation.
constexpr size_t kKeyPadding = 4096;

[[noreturn]] void fail_ucx(swiftkv_status status, const std::string &what, ucs_status_t s) {
  fail(status, "UCX: " + what + ": " + ucs_status_string(s));
}

struct Counters {
  std::atomic<uint64_t> batches{0}, ops{0}, bytes_read{0}, bytes_written{0}, batches_failed{0},
      keys_refused{0}, endpoints_failed{0};
};

class Context;

class Registration final : public KeyedRegistration {
 public:
  Registration(std::shared_ptr<Context> owner, ucp_mem_h memh, std::vector<std::byte> key,
               uint64_t base, uint64_t bytes)
      : KeyedRegistration(std::move(key), base, bytes), owner_(std::move(owner)), memh_(memh) {}
  ~Registration() override;

 private:
  std::shared_ptr<Context> owner_;
  ucp_mem_h memh_;
};

// What a batch's completions count down. Touched only inside the client worker's progress,
// which runs under its mutex.
struct BatchWait {
  size_t pending = 0;
  ucs_status_t status = UCS_OK;
};

void op_done(void *request, ucs_status_t status, void *user_data) {
  auto *w = static_cast<BatchWait *>(user_data);
  if (status != UCS_OK && w->status == UCS_OK) w->status = status;
  --w->pending;
  ucp_request_free(request);
}

class Endpoint;

class Context final : public UcxContext {
 public:
  explicit Context(const UcxOptions &options) {
    ucp_config_t *config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "reading its configuration", s);
    if (!options.transports.empty()) {
      s = ucp_config_modify(config, "TLS", options.transports.c_str());
      if (s != UCS_OK) {
        ucp_config_release(config);
        fail_ucx(SWIFTKV_EINVAL, "transports '" + options.transports + "'", s);
      }
    }
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;
    s = ucp_init(&p, config, &ctx_);
    ucp_config_release(config);
    if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "starting", s);
    try {
      serving_ = make_worker();
      client_ = make_worker();
      s = ucp_worker_get_efd(serving_, &serving_fd_);
      if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "the serving worker's event fd", s);
      s = ucp_worker_get_efd(client_, &client_fd_);
      if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "the client worker's event fd", s);
      ucp_context_attr_t a{};
      a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
      if (ucp_context_query(ctx_, &a) == UCS_OK) {
        cuda_ = (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
      }
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~Context() override { destroy(); }

  std::vector<std::byte> serving_address() const override {
    ucp_address_t *addr = nullptr;
    size_t len = 0;
    std::lock_guard lock(serving_mu_);
    const ucs_status_t s = ucp_worker_get_address(serving_, &addr, &len);
    if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "the serving worker's address", s);
    const auto *b = reinterpret_cast<const std::byte *>(addr);
    std::vector<std::byte> out(b, b + len);
    ucp_worker_release_address(serving_, addr);
    return out;
  }

  int serving_event_fd() const noexcept override { return serving_fd_; }

  void serve() override {
    std::lock_guard lock(serving_mu_);
    for (;;) {
      while (ucp_worker_progress(serving_) != 0) {
      }
      const ucs_status_t s = ucp_worker_arm(serving_);
      if (s == UCS_OK) return;  // armed: the fd wakes the owner for the next event
      if (s != UCS_ERR_BUSY) fail_ucx(SWIFTKV_EPEER, "arming the serving worker", s);
    }
  }

  bool cuda_memory() const noexcept override { return cuda_; }

  std::unique_ptr<UcxRegistration> register_memory(void *base, size_t bytes) override {
    if (base == nullptr || bytes == 0) fail_invalid("UCX: registering no memory");
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = base;
    mp.length = bytes;
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(ctx_, &mp, &memh);
    if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "registering memory", s);
    void *buf = nullptr;
    size_t len = 0;
    s = ucp_rkey_pack(ctx_, memh, &buf, &len);
    if (s != UCS_OK) {
      ucp_mem_unmap(ctx_, memh);
      fail_ucx(SWIFTKV_EPEER, "packing a remote key", s);
    }
    const auto *b = static_cast<const std::byte *>(buf);
    std::vector<std::byte> key(b, b + len);
    ucp_rkey_buffer_release(buf);
    return std::make_unique<Registration>(std::static_pointer_cast<Context>(shared_from_this()),
                                          memh, std::move(key), reinterpret_cast<uint64_t>(base),
                                          bytes);
  }

  std::shared_ptr<UcxEndpoint> connect(std::span<const std::byte> peer_address) override;

  UcxStats stats() const override {
    UcxStats s;
    s.batches = n_.batches.load();
    s.ops = n_.ops.load();
    s.bytes_read = n_.bytes_read.load();
    s.bytes_written = n_.bytes_written.load();
    s.batches_failed = n_.batches_failed.load();
    s.keys_refused = n_.keys_refused.load();
    s.endpoints_failed = n_.endpoints_failed.load();
    return s;
  }

  void unmap(ucp_mem_h memh) noexcept { ucp_mem_unmap(ctx_, memh); }

  // Drives the client worker once; waits on its event fd (at most wait_ms) when it had nothing
  // to do. Call with client_mu held.
  void progress_client(int wait_ms) {
    if (ucp_worker_progress(client_) != 0) return;
    if (wait_ms <= 0) return;
    if (ucp_worker_arm(client_) != UCS_OK) return;  // busy: events are waiting
    pollfd p{client_fd_, POLLIN, 0};
    ::poll(&p, 1, wait_ms);
  }

  std::mutex client_mu;  // every call on the client worker and its endpoints
  ucp_worker_h client() const noexcept { return client_; }
  Counters &counters() noexcept { return n_; }

 private:
  ucp_worker_h make_worker() {
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucp_worker_h w = nullptr;
    const ucs_status_t s = ucp_worker_create(ctx_, &wp, &w);
    if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "creating a worker", s);
    return w;
  }
  void destroy() noexcept {
    if (client_ != nullptr) ucp_worker_destroy(client_);
    if (serving_ != nullptr) ucp_worker_destroy(serving_);
    if (ctx_ != nullptr) ucp_cleanup(ctx_);
    client_ = serving_ = nullptr;
    ctx_ = nullptr;
  }

  ucp_context_h ctx_ = nullptr;
  ucp_worker_h serving_ = nullptr;
  ucp_worker_h client_ = nullptr;
  int serving_fd_ = -1;
  int client_fd_ = -1;
  bool cuda_ = false;
  mutable std::mutex serving_mu_;
  Counters n_;
};

Registration::~Registration() { owner_->unmap(memh_); }

class Endpoint final : public UcxEndpoint {
 public:
  Endpoint(std::shared_ptr<Context> owner, std::span<const std::byte> peer_address)
      : owner_(std::move(owner)) {
    if (peer_address.empty() || peer_address.size() > kMaxKeyBytes) {
      fail(SWIFTKV_EPEER,
           "UCX: a peer address of " + std::to_string(peer_address.size()) + " bytes");
    }
    // The address is parsed by UCX without a length: give it a zero-padded copy.
    std::vector<std::byte> addr(peer_address.size() + kKeyPadding);
    std::copy(peer_address.begin(), peer_address.end(), addr.begin());
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t *>(addr.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Endpoint::on_error;
    ep.err_handler.arg = this;
    std::lock_guard lock(owner_->client_mu);
    const ucs_status_t s = ucp_ep_create(owner_->client(), &ep, &ep_);
    if (s != UCS_OK) fail_ucx(SWIFTKV_EPEER, "connecting to a peer", s);
  }

  ~Endpoint() override {
    std::lock_guard lock(owner_->client_mu);
    drop_ranges_locked();
    close_locked(failed_.load());
  }

  void add_range(uint64_t id, const RemoteRange &range) override {
    const bool wraps = range.base + range.bytes < range.base;
    if (range.packed_key.empty() || range.packed_key.size() > kMaxKeyBytes || range.bytes == 0 ||
        wraps) {
      owner_->counters().keys_refused.fetch_add(1);
      fail(SWIFTKV_EPEER, "UCX: a remote key of " + std::to_string(range.packed_key.size()) +
                              " bytes for " + std::to_string(range.bytes) + " bytes at " +
                              std::to_string(range.base));
    }
    std::vector<std::byte> key(range.packed_key.size() + kKeyPadding);
    std::copy(range.packed_key.begin(), range.packed_key.end(), key.begin());
    std::lock_guard lock(owner_->client_mu);
    if (ep_ == nullptr) fail(SWIFTKV_EPEER, "UCX: the endpoint is closed");
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t s = ucp_ep_rkey_unpack(ep_, key.data(), &rkey);
    if (s != UCS_OK) {
      owner_->counters().keys_refused.fetch_add(1);
      fail_ucx(SWIFTKV_EPEER, "unpacking a remote key", s);
    }
    auto it = ranges_.find(id);
    if (it != ranges_.end()) {
      ucp_rkey_destroy(it->second.rkey);
      it->second = Range{rkey, range.base, range.bytes};
    } else {
      ranges_.emplace(id, Range{rkey, range.base, range.bytes});
    }
  }

  void remove_range(uint64_t id) noexcept override {
    std::lock_guard lock(owner_->client_mu);
    auto it = ranges_.find(id);
    if (it == ranges_.end()) return;
    ucp_rkey_destroy(it->second.rkey);
    ranges_.erase(it);
  }

  using UcxEndpoint::run;
  void run(std::span<const RangeOp> ops, uint64_t timeout_ns) override {
    std::lock_guard lock(owner_->client_mu);
    Counters &n = owner_->counters();
    if (ep_ == nullptr || failed_.load()) {
      n.batches_failed.fetch_add(1);
      fail(SWIFTKV_EPEER, "UCX: the peer is gone");
    }
    // Every op is checked before any is issued; `last` saves a lookup for runs on one range.
    std::vector<const Range *> on(ops.size());
    const Range *last = nullptr;
    uint64_t last_id = 0, read = 0, written = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const RangeOp &ro = ops[i];
      if (last == nullptr || ro.range != last_id) {
        const auto it = ranges_.find(ro.range);
        if (it == ranges_.end()) fail_invalid("UCX: no remote range " + std::to_string(ro.range));
        last = &it->second;
        last_id = ro.range;
      }
      const RmaOp &op = ro.op;
      if (op.offset > last->bytes || op.bytes > last->bytes - op.offset || op.local == nullptr) {
        fail_invalid("UCX: " + std::to_string(op.bytes) + " bytes at offset " +
                     std::to_string(op.offset) + " of a " + std::to_string(last->bytes) +
                     "-byte remote range");
      }
      on[i] = last;
      (op.kind == RmaOp::Kind::get ? read : written) += op.bytes;
    }
    n.batches.fetch_add(1);
    BatchWait w;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.send = &op_done;
    rp.user_data = &w;
    auto track = [&](ucs_status_ptr_t p) {
      if (UCS_PTR_IS_ERR(p)) {
        if (w.status == UCS_OK) w.status = UCS_PTR_STATUS(p);
      } else if (p != nullptr) {
        ++w.pending;
      }
    };
    // An op goes in pieces of at most kRmaPieceBytes, each its own UCX operation: the deadline
    // below moves on when one completes, so one large op on a slow link shows its progress.
    for (size_t i = 0; i < ops.size() && w.status == UCS_OK; ++i) {
      const RmaOp &op = ops[i].op;
      ucp_rkey_h key = on[i]->rkey;
      uint64_t done = 0;
      do {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(op.bytes - done, kRmaPieceBytes));
        const uint64_t addr = on[i]->base + op.offset + done;
        std::byte *local = op.local + done;
        track(op.kind == RmaOp::Kind::get ? ucp_get_nbx(ep_, local, n, addr, key, &rp)
                                          : ucp_put_nbx(ep_, local, n, addr, key, &rp));
        done += n;
      } while (done < op.bytes && w.status == UCS_OK);
    }
    n.ops.fetch_add(ops.size());
    // One flush: every op above is complete at the peer when it completes.
    if (w.status == UCS_OK) track(ucp_ep_flush_nbx(ep_, &rp));
    // The deadline moves on whenever an op completes: a long batch that keeps moving is not
    // a peer that stopped answering.
    uint64_t deadline = monotonic_ns() + timeout_ns;
    size_t pending_then = w.pending;
    bool timed_out = false;
    while (w.pending > 0) {
      const uint64_t now = monotonic_ns();
      if (w.pending < pending_then) {
        pending_then = w.pending;
        deadline = now + timeout_ns;
      }
      if (ep_ != nullptr && (failed_.load() || now >= deadline)) {
        // Closing by force completes whatever is still in flight (with an error), so that
        // nothing lands in the local buffers once this returns.
        timed_out = !failed_.load();
        close_locked(true);
        continue;
      }
      owner_->progress_client(1);
    }
    if (w.status != UCS_OK || timed_out || failed_.load()) {
      n.batches_failed.fetch_add(1);
      if (!failed_.exchange(true)) n.endpoints_failed.fetch_add(1);
      close_locked(true);
      drop_ranges_locked();  // after the close: no operation uses a key any more
      if (timed_out)
        fail(SWIFTKV_ETIMEDOUT, "UCX: a batch of " + std::to_string(ops.size()) +
                                    " operations stopped completing for " +
                                    std::to_string(timeout_ns / 1000000) + " ms");
      fail(SWIFTKV_EPEER,
           std::string("UCX: a batch failed: ") +
               ucs_status_string(w.status == UCS_OK ? UCS_ERR_CONNECTION_RESET : w.status));
    }
    n.bytes_read.fetch_add(read);
    n.bytes_written.fetch_add(written);
  }

  bool failed() const noexcept override { return failed_.load(); }

 private:
  struct Range {
    ucp_rkey_h rkey;
    uint64_t base, bytes;
  };

  static void on_error(void *arg, ucp_ep_h, ucs_status_t) {
    auto *self = static_cast<Endpoint *>(arg);
    if (!self->failed_.exchange(true)) self->owner_->counters().endpoints_failed.fetch_add(1);
  }

  void drop_ranges_locked() noexcept {
    for (auto &[id, r] : ranges_) ucp_rkey_destroy(r.rkey);
    ranges_.clear();
  }

  // Closes the endpoint (flushing it first unless forced) and waits for the close; with
  // client_mu held. A closed endpoint is not reopened.
  void close_locked(bool force) noexcept {
    if (ep_ == nullptr) return;
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t p = ucp_ep_close_nbx(ep_, &rp);
    ep_ = nullptr;
    if (p == nullptr || UCS_PTR_IS_ERR(p)) return;
    // A graceful close waits for the peer; a bounded wait, then it is left to UCX.
    const uint64_t deadline = monotonic_ns() + 1'000'000'000ULL;
    while (ucp_request_check_status(p) == UCS_INPROGRESS && monotonic_ns() < deadline) {
      owner_->progress_client(1);
    }
    ucp_request_free(p);
  }

  std::shared_ptr<Context> owner_;
  ucp_ep_h ep_ = nullptr;
  std::atomic<bool> failed_{false};
  std::unordered_map<uint64_t, Range> ranges_;
};

std::shared_ptr<UcxEndpoint> Context::connect(std::span<const std::byte> peer_address) {
  return std::make_shared<Endpoint>(std::static_pointer_cast<Context>(shared_from_this()),
                                    peer_address);
}

}  // namespace

std::shared_ptr<UcxContext> UcxContext::create(const UcxOptions &options) {
  return std::make_shared<Context>(options);
}

}  // namespace swiftkv::transport
