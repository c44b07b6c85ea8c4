// The replay simulator: an event loop in simulated time over one borrower GPU that prefills
// turns first come, first served, with the library's contexts standing in for every cache.
//
//   gpu ctx    the borrower's own GPU prefix cache (vLLM's, LRU): a host tier of the library
//              sized to the GPU's KV memory (the regular cache under swiftkv)
//   tiers ctx  the library's tiers behind it: host (host-offload), host + disk (hierarchical),
//              peer + host + disk with retention eviction (swiftkv)
//   lender ctx elastic regions of the lenders (swiftkv), lending their tail to the tiers ctx and
//              taking it back by Algorithm 1 when their own requests need it
//
// All three read one simulated clock, so LRU order, retention idle times, ScaleDown windows and
// leases follow the trace's time, not the machine's.
#include "replay.hpp"

#include "sim_random.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <queue>
#include <random>
#include <stdexcept>

#include <swiftkv/swiftkv.h>

namespace swiftkv::bench {

namespace {

// Set by request_stop (from a signal handler): lock-free atomics only.
std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

void check(swiftkv_status st, const char *what) {
  if (st != SWIFTKV_OK && st != SWIFTKV_IN_PROGRESS) {
    throw std::runtime_error(std::string(what) + ": " + swiftkv_status_string(st) + ": " +
                             swiftkv_last_error_message());
  }
}

uint64_t gcd_all(const ServerConfig &c) {
  uint64_t g = bytes_per_token(c.borrower);
  for (const ModelSpec &m : c.lenders) g = std::gcd(g, bytes_per_token(m));
  return g;
}

// Shadow geometry: one layer, one head, 1-byte elements, head_dim = k * bpt / g, so that every
// model's bytes per token shrink by the same factor g / (2k) and the borrower's chunk is a whole
// number of 4 KiB pages (the host tier then holds exactly budget / chunk chunks).
// With compression the borrower's shadow has f16 elements (the codecs take f16 and bf16) and a
// head of at least 128 of them, so that a codec's scales weigh in a shadow chunk about as they
// do in a real one (FP8: a scale per token and head; KIVI: per channel and per 32 channels).
struct Shadow {
  uint64_t k = 1, g = 1;
  bool f16 = false;  // the borrower's elements
  // Shadow bytes of one token's K or V in one model.
  uint64_t row_bytes(const ModelSpec &m) const { return k * bytes_per_token(m) / g; }
  uint32_t head_dim(const ModelSpec &m) const { return static_cast<uint32_t>(row_bytes(m)); }
  uint64_t chunk_bytes(const ServerConfig &c) const {
    return uint64_t{c.chunk_tokens} * 2 * row_bytes(c.borrower);
  }
  swiftkv_model_desc desc(const ModelSpec &m, const ServerConfig &c, uint32_t chunk,
                          bool borrower = false) const {
    swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
    d.name = m.name.c_str();
    d.num_layers = 1;
    d.num_kv_heads = 1;
    d.head_dim = head_dim(m);
    d.block_tokens = c.block_tokens;
    d.chunk_tokens = chunk;
    d.dtype = SWIFTKV_DTYPE_I8;
    if (borrower && f16) {
      d.head_dim /= 2;
      d.dtype = SWIFTKV_DTYPE_F16;
    }
    return d;
  }
};

Shadow make_shadow(const ServerConfig &c) {
  Shadow s;
  s.g = gcd_all(c);
  s.f16 = c.compression.mode != CompressionSpec::Mode::none;
  auto fits = [&] {
    if (s.chunk_bytes(c) % 4096 != 0) return false;
    const uint64_t row = s.row_bytes(c.borrower);
    return !s.f16 || (row % 2 == 0 && row / 2 >= 128);
  };
  while (!fits()) ++s.k;
  return s;
}

// f16 bits of a float (round to nearest even; the synthetic values are normal or flushed to 0)
// and back.
uint16_t to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7bff);
  uint32_t mant = x & 0x7fffff;
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1) != 0)) ++h;
  return static_cast<uint16_t>(h);
}
float from_half(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {
      float f = std::ldexp(static_cast<float>(mant), -24);
      return sign != 0 ? -f : f;
    }
  } else {
    x = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// One shadow chunk of f16 K/V shaped like real keys and values (per-channel offsets and scales,
// every 37th key channel an outlier, smooth along the tokens, noise): what zstd's ratio and the
// lossy codecs' error are measured on. Synthetic, as docs/codecs.md says of bench_codec's.
std::vector<std::byte> synthetic_chunk(uint32_t tokens, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<std::byte> out(uint64_t{2} * tokens * dim * 2);
  uint64_t i = 0;
  for (uint32_t kv = 0; kv < 2; ++kv) {
    std::vector<float> offset(dim), scale(dim);
    for (uint32_t c = 0; c < dim; ++c) {
      offset[c] = noise(rng) * (kv == 0 ? 2.0f : 0.2f);
      scale[c] = (kv == 0 && c % 37 == 0) ? 8.0f : 0.5f + std::fabs(noise(rng)) * 0.5f;
    }
    for (uint32_t t = 0; t < tokens; ++t) {
      for (uint32_t c = 0; c < dim; ++c, ++i) {
        const float wave = std::sin(0.05f * static_cast<float>(t) + static_cast<float>(c));
        const uint16_t v = to_half(offset[c] + scale[c] * (0.6f * wave + 0.4f * noise(rng)));
        std::memcpy(&out[i * 2], &v, 2);
      }
    }
  }
  return out;
}

swiftkv_codec_params codec_params(const std::string &name) {
  swiftkv_codec_params p = SWIFTKV_CODEC_PARAMS_INIT;
  if (name == "zstd" || name == "zstd-planes") {
    p.codec = SWIFTKV_CODEC_ZSTD;
    p.byte_planes = name == "zstd-planes" ? 1 : 0;
  } else if (name == "fp8") {
    p.codec = SWIFTKV_CODEC_FP8;
  } else if (name == "kivi8" || name == "kivi4" || name == "kivi2") {
    p.codec = SWIFTKV_CODEC_KIVI;
    p.bits = static_cast<uint32_t>(name[4] - '0');
    p.group = 32;
  } else {
    throw std::runtime_error("no codec named " + name);
  }
  return p;
}

swiftkv_model_desc real_desc(const ModelSpec &m, const ServerConfig &c) {
  swiftkv_model_desc d = to_desc(m, c.block_tokens);
  d.chunk_tokens = c.chunk_tokens;
  return d;
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

uint64_t gib_bytes(double gib) { return static_cast<uint64_t>(gib * kGiB); }

uint64_t lender_capacity_blocks(const ServerConfig &c, const ModelSpec &l, uint64_t unit_blocks) {
  const uint64_t kv = kv_bytes_on_gpu(l, c.gpu_gib, c.utilization, c.activation_gib);
  const uint64_t blocks = kv / (bytes_per_token(l) * c.block_tokens);
  return blocks / unit_blocks * unit_blocks;
}

uint64_t lender_initial_blocks(const ServerConfig &c, uint64_t unit_blocks, uint64_t capacity) {
  const uint64_t blocks = (c.lender_initial_tokens + c.block_tokens - 1) / c.block_tokens;
  const uint64_t units = (blocks + unit_blocks - 1) / unit_blocks;
  return std::min(capacity, units * unit_blocks);
}

struct LendUnit {
  uint64_t borrower_chunks = 0, lender_blocks = 0;
};

LendUnit lend_unit(const ServerConfig &c, const ModelSpec &l) {
  const swiftkv_model_desc b = real_desc(c.borrower, c), ld = real_desc(l, c);
  LendUnit u;
  check(swiftkv_geometry_lend_unit(&u.borrower_chunks, &u.lender_blocks, &b, &ld),
        "swiftkv_geometry_lend_unit");
  return u;
}

// Token ids a session's text is made of when the trace gives only lengths.
uint32_t synthetic_token(uint64_t session_hash, uint64_t position) {
  uint64_t z = session_hash + (position + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>((z ^ (z >> 31)) % 128000);
}

uint64_t hash_string(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// The simulated clock every context and region reads.
struct SimClock {
  std::atomic<uint64_t> ns{1'000'000'000};
  static uint64_t read(void *self) { return static_cast<SimClock *>(self)->ns.load(); }
  void set(double seconds) {
    const auto v = static_cast<uint64_t>(seconds * 1e9) + 1'000'000'000;
    if (v > ns.load()) ns.store(v);
  }
};

struct CtxDeleter {
  void operator()(swiftkv_ctx *c) const { swiftkv_ctx_destroy(c); }
};
struct ElasticDeleter {
  void operator()(swiftkv_elastic *e) const { swiftkv_elastic_destroy(e); }
};
using CtxPtr = std::unique_ptr<swiftkv_ctx, CtxDeleter>;
using ElasticPtr = std::unique_ptr<swiftkv_elastic, ElasticDeleter>;

// Counts what the library moved on its own (demotions, evictions, evacuations), from the chunk
// event callback, which may run on the tiers ctx's background thread.
struct EventCounts {
  std::mutex mu;
  uint64_t chunk_bytes = 0;  // real bytes of one chunk
  uint64_t pcie = 0, disk = 0, evicted = 0, reclaim_moved = 0, reclaim_dropped = 0;
  uint64_t reclaim_to_host = 0, reclaim_to_disk = 0;  // chunks moved out of reclaimed leases
  static void on_event(const swiftkv_chunk_event *e, void *self) {
    auto *c = static_cast<EventCounts *>(self);
    std::lock_guard lock(c->mu);
    if (e->to == SWIFTKV_TIER_DROPPED) {
      ++c->evicted;
      if (e->reason == SWIFTKV_CHUNK_REVOKED) ++c->reclaim_dropped;
      return;
    }
    if (e->reason == SWIFTKV_CHUNK_REVOKED) {
      ++c->reclaim_moved;
      if (e->to == SWIFTKV_TIER_HOST) ++c->reclaim_to_host;
      if (e->to == SWIFTKV_TIER_DISK) ++c->reclaim_to_disk;
    }
    if (e->to == SWIFTKV_TIER_HOST) c->pcie += c->chunk_bytes;  // lender GPU -> host
    if (e->to == SWIFTKV_TIER_DISK) c->disk += c->chunk_bytes;
  }
};

struct Event {
  double t;
  uint64_t seq;
  enum Kind : uint8_t { ready, prefill_end, complete, lender_arrive, lender_done, tick } kind;
  uint32_t who;     // session or lender
  uint64_t tokens;  // lender_done
  bool operator>(const Event &o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct SessionState {
  std::vector<uint32_t> tokens;  // every token so far (history)
  uint64_t hash = 0;
  uint32_t next_turn = 0;
  uint64_t record = 0;   // index of its current turn's record
  uint64_t history = 0;  // tokens before the current turn's prompt
  bool dead = false;     // a turn was rejected: the conversation ends
};

struct Lender {
  ElasticPtr region;
  uint64_t active_tokens = 0;
  uint64_t capacity_blocks = 0;
};

class Simulation {
 public:
  ~Simulation() { teardown(); }
  Simulation(const Simulation &) = delete;
  Simulation &operator=(const Simulation &) = delete;
  Simulation(const ServerConfig &cfg, const Trace &trace, Policy p, const ProgressFn &progress)
      : cfg_(cfg),
        trace_(trace),
        policy_(p),
        progress_(progress),
        shadow_(make_shadow(cfg)),
        chunk_real_(bytes_per_token(cfg.borrower) * cfg.chunk_tokens),
        chunk_shadow_(shadow_.chunk_bytes(cfg)),
        rng_(cfg.seed) {
    result_.policy = p;
    result_.capacity = policy_capacity(cfg, p);
    events_.chunk_bytes = chunk_real_;
    content_ = compressing()
                   ? synthetic_chunk(cfg.chunk_tokens, shadow_.head_dim(cfg.borrower) / 2, 7)
                   : std::vector<std::byte>(chunk_shadow_);
  }

  PolicyResult run() {
    const auto wall0 = std::chrono::steady_clock::now();
    setup();
    std::vector<uint64_t> first_record(trace_.sessions.size());
    uint64_t n = 0;
    for (size_t s = 0; s < trace_.sessions.size(); ++s) {
      first_record[s] = n;
      n += trace_.sessions[s].turns.size();
    }
    result_.requests.resize(n);
    sessions_.resize(trace_.sessions.size());
    double first = INFINITY;
    for (size_t s = 0; s < trace_.sessions.size(); ++s) {
      sessions_[s].hash = hash_string(trace_.sessions[s].id);
      sessions_[s].record = first_record[s];
      const double t0 = trace_.sessions[s].turns[0].arrival_s.value_or(0);
      first = std::min(first, t0);
      result_.requests[first_record[s]].ready_s = t0;
      push(t0, Event::ready, static_cast<uint32_t>(s));
    }
    if (!lenders_.empty()) {
      for (uint32_t l = 0; l < lenders_.size(); ++l) {
        push(first + rng_.exponential(1.0 / cfg_.lender_rate), Event::lender_arrive, l);
      }
      push(first + 1.0, Event::tick, 0);
    }
    total_turns_ = n;
    double last = first;
    while (!queue_.empty() && (done_turns_ < total_turns_ || busy_)) {
      if (g_stop.load(std::memory_order_relaxed)) throw Interrupted();
      const Event e = queue_.top();
      queue_.pop();
      clock_.set(e.t);
      last = std::max(last, e.t);
      handle(e);
    }
    result_.sim_seconds = last - first;
    {
      std::lock_guard lock(events_.mu);
      result_.pcie_bytes += events_.pcie;
      result_.disk_bytes += events_.disk;
      result_.evicted_chunks = events_.evicted;
      result_.reclaim_moved = events_.reclaim_moved;
      result_.reclaim_dropped = events_.reclaim_dropped;
    }
    for (Lender &l : lenders_) {
      swiftkv_elastic_stats st = SWIFTKV_ELASTIC_STATS_INIT;
      check(swiftkv_elastic_stats_get(&st, l.region.get()), "swiftkv_elastic_stats_get");
      result_.lender_scale_ups += st.scale_ups;
      result_.reclaims += st.reclaims_requested;
    }
    teardown();
    result_.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return std::move(result_);
  }

 private:
  bool has_tiers() const { return policy_ != Policy::gpu_only; }
  bool has_disk() const { return policy_ == Policy::hierarchical || policy_ == Policy::swiftkv; }

  CtxPtr make_ctx(uint64_t host_chunks, bool disk, swiftkv_eviction_policy ev, uint32_t interval_ms,
                  uint64_t extra_host_bytes) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.host_budget_bytes = host_chunks * chunk_shadow_ + extra_host_bytes;
    if (disk) {
      c.disk_path = disk_dir_.c_str();
      // Segments of 16 chunks (or 1 GiB of real chunks if that is more), and a budget of one
      // segment more than the chunks need (the one the log keeps free for cleaning), so the
      // tier holds the server's disk in chunks (docs/disk-format.md has the sizes).
      const uint64_t per_segment = std::max<uint64_t>(16, (uint64_t{1} << 30) / chunk_real_);
      const uint64_t record = (128 + chunk_shadow_ + 63) / 64 * 64;
      const uint64_t chunks = result_.capacity.disk_tokens / cfg_.chunk_tokens;
      c.disk_segment_bytes = 2 * 128 + per_segment * record;
      c.disk_budget_bytes = ((chunks + per_segment - 1) / per_segment + 1) * c.disk_segment_bytes;
    }
    c.eviction_policy = ev;
    c.demote_free_percent = 0;  // demote only when a store needs room: deterministic
    c.maintenance_interval_ms = interval_ms;
    c.clock = &SimClock::read;
    c.clock_user_data = &clock_;
    swiftkv_ctx *ctx = nullptr;
    check(swiftkv_ctx_create(&ctx, &c), "swiftkv_ctx_create");
    return CtxPtr(ctx);
  }

  bool compressing() const { return cfg_.compression.mode != CompressionSpec::Mode::none; }

  uint32_t register_borrower(swiftkv_ctx *ctx) {
    const swiftkv_model_desc d = shadow_.desc(cfg_.borrower, cfg_, cfg_.chunk_tokens, true);
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &d;
    uint32_t id = 0;
    check(swiftkv_model_register(&id, ctx, &mc), "swiftkv_model_register");
    return id;
  }

  void setup() {
    const Capacity &cap = result_.capacity;
    const uint64_t gpu_chunks = cap.gpu_tokens / cfg_.chunk_tokens;
    gpu_ = make_ctx(gpu_chunks, false, SWIFTKV_EVICT_LRU, 1000, 0);
    gpu_model_ = register_borrower(gpu_.get());
    if (has_disk()) {
      const std::string base =
          cfg_.work_dir.empty() ? std::filesystem::temp_directory_path().string() : cfg_.work_dir;
      std::string tmpl = base + "/swiftkv-replay-XXXXXX";
      if (mkdtemp(tmpl.data()) == nullptr) {
        throw std::runtime_error("cannot make a directory for the disk tier under " + base);
      }
      disk_dir_ = tmpl;
    }
    if (!has_tiers()) return;
    const swiftkv_eviction_policy ev = policy_ == Policy::swiftkv && cfg_.swiftkv_retention
                                           ? SWIFTKV_EVICT_RETENTION
                                           : SWIFTKV_EVICT_LRU;
    tiers_ = make_ctx(cap.host_tokens / cfg_.chunk_tokens, has_disk(), ev, 1, 0);
    tiers_model_ = register_borrower(tiers_.get());
    configure_compression();
    check(swiftkv_set_chunk_event_callback(tiers_.get(), &EventCounts::on_event, &events_),
          "swiftkv_set_chunk_event_callback");
    if (policy_ != Policy::swiftkv) return;
    // Lenders: one elastic region each, in one context of their own.
    uint64_t region_bytes = 0;
    std::vector<std::pair<uint64_t, uint64_t>> sizes;  // capacity, owned (blocks)
    for (const ModelSpec &l : cfg_.lenders) {
      const LendUnit u = lend_unit(cfg_, l);
      const uint64_t capacity = lender_capacity_blocks(cfg_, l, u.lender_blocks);
      sizes.emplace_back(capacity, lender_initial_blocks(cfg_, u.lender_blocks, capacity));
      region_bytes += capacity * cfg_.block_tokens * 2 * shadow_.head_dim(l) + (uint64_t{1} << 22);
    }
    swiftkv_ctx_config lc = SWIFTKV_CTX_CONFIG_INIT;
    lc.host_budget_bytes = region_bytes;
    lc.clock = &SimClock::read;
    lc.clock_user_data = &clock_;
    swiftkv_ctx *lctx = nullptr;
    check(swiftkv_ctx_create(&lctx, &lc), "swiftkv_ctx_create (lenders)");
    lender_ctx_.reset(lctx);
    const swiftkv_model_desc bd = shadow_.desc(cfg_.borrower, cfg_, cfg_.chunk_tokens, true);
    for (size_t i = 0; i < cfg_.lenders.size(); ++i) {
      if (sizes[i].first == 0) continue;  // the lender does not fit: nothing to lend
      const swiftkv_model_desc ld = shadow_.desc(cfg_.lenders[i], cfg_, cfg_.block_tokens);
      swiftkv_elastic_config ec = SWIFTKV_ELASTIC_CONFIG_INIT;
      ec.lender = &ld;
      ec.borrower = &bd;
      ec.capacity_blocks = sizes[i].first;
      ec.owned_blocks = sizes[i].second;
      ec.lease_ms = uint64_t{1} << 40;  // renewed by the borrower; never runs out in a replay
      ec.clock = &SimClock::read;
      ec.clock_user_data = &clock_;
      swiftkv_elastic *e = nullptr;
      check(swiftkv_elastic_create(&e, lender_ctx_.get(), &ec), "swiftkv_elastic_create");
      Lender l;
      l.region.reset(e);
      l.capacity_blocks = sizes[i].first;
      lenders_.push_back(std::move(l));
      borrow_all(lenders_.back());
    }
  }

  // Takes every free lending unit of a lender, one lease per unit so that a reclaim takes back
  // no more than it needs.
  void borrow_all(Lender &l) {
    for (;;) {
      uint64_t lease = 0;
      const swiftkv_status st =
          swiftkv_borrow(&lease, tiers_.get(), tiers_model_, l.region.get(), 1);
      if (st == SWIFTKV_ENOMEM) return;
      check(st, "swiftkv_borrow");
    }
  }

  // Ends the contexts and removes the disk tier's directory; again (from the destructor, after
  // a failure or an interruption) it does nothing more.
  void teardown() {
    tiers_.reset();
    lenders_.clear();
    lender_ctx_.reset();
    gpu_.reset();
    if (!disk_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(disk_dir_, ec);
      disk_dir_.clear();
    }
  }

  void push(double t, Event::Kind k, uint32_t who, uint64_t tokens = 0) {
    queue_.push(Event{t, seq_++, k, who, tokens});
  }

  void handle(const Event &e) {
    switch (e.kind) {
      case Event::ready:
        fifo_.push(e.who);
        if (!busy_) start_next(e.t);
        break;
      case Event::prefill_end: prefill_end(e.who, e.t); break;
      case Event::complete: complete(e.who, e.t); break;
      case Event::lender_arrive: lender_arrive(e.who, e.t); break;
      case Event::lender_done: lenders_[e.who].active_tokens -= e.tokens; break;
      case Event::tick: tick(e.t); break;
    }
  }

  const Turn &turn_of(uint32_t s) const { return trace_.sessions[s].turns[sessions_[s].next_turn]; }

  // Extends a session's tokens to `n`: the trace's prompt ids where it has them, else ids made
  // from the session and the position.
  void grow_tokens(uint32_t s, uint64_t n, const Turn *prompt_of) {
    SessionState &ss = sessions_[s];
    if (prompt_of != nullptr && !prompt_of->prompt_ids.empty()) {
      ss.tokens.insert(ss.tokens.end(), prompt_of->prompt_ids.begin(), prompt_of->prompt_ids.end());
    }
    while (ss.tokens.size() < n) ss.tokens.push_back(synthetic_token(ss.hash, ss.tokens.size()));
  }

  // The tiers ctx's compression. Bandwidths go to the library in shadow bytes per second (the
  // real rate times shadow / real), so that its utilities are the real server's seconds.
  void configure_compression() {
    const CompressionSpec &cs = cfg_.compression;
    if (!compressing()) return;
    swiftkv_compression_config cc = SWIFTKV_COMPRESSION_CONFIG_INIT;
    cc.accept_lossy = 1;
    if (cs.mode == CompressionSpec::Mode::fixed) {
      cc.host = codec_params(cs.codec);
      cc.disk = cc.host;
    } else {
      const double f = static_cast<double>(chunk_shadow_) / static_cast<double>(chunk_real_);
      cc.adaptive = 1;
      cc.alpha = cs.alpha;
      cc.host_gbps = cfg_.pcie_gbps * f;
      cc.disk_gbps = std::min(cfg_.disk_gbps, cfg_.pcie_gbps) * f;
      // A recompute makes a chunk's KV in its prefill time, at an 8K-token context.
      const double per_s =
          static_cast<double>(chunk_real_) / prefill_seconds(cfg_, 8192, cfg_.chunk_tokens);
      cc.recompute_gbps = per_s / 1e9 * f;
      const char *methods[] = {"kivi8", "fp8", "kivi4"};
      cc.n_methods = 3;
      for (uint32_t i = 0; i < 3; ++i) {
        cc.methods[i].params = codec_params(methods[i]);
        cc.methods[i].decode_gbps = cs.gpu_decode_gbps * f;
      }
    }
    check(swiftkv_compression_set(tiers_.get(), tiers_model_, &cc), "swiftkv_compression_set");
  }

  // The quality of a chunk stored under (codec, bits): 1 for a lossless codec, else 1 - the
  // relative RMS error of the replay's synthetic chunk through the library and back.
  double quality_of(uint8_t codec, uint8_t bits) {
    if (codec == SWIFTKV_CODEC_RAW || codec == SWIFTKV_CODEC_ZSTD) return 1.0;
    const auto key = std::make_pair(codec, bits);
    if (const auto it = quality_.find(key); it != quality_.end()) return it->second;
    swiftkv_codec_params p = SWIFTKV_CODEC_PARAMS_INIT;
    p.codec = static_cast<swiftkv_codec>(codec);
    if (codec == SWIFTKV_CODEC_KIVI) {
      p.bits = bits;
      p.group = 32;
    }
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.host_budget_bytes = 4 * chunk_shadow_ + (uint64_t{1} << 20);
    swiftkv_ctx *raw = nullptr;
    check(swiftkv_ctx_create(&raw, &c), "swiftkv_ctx_create (quality)");
    const CtxPtr ctx(raw);
    const uint32_t model = register_borrower(ctx.get());
    swiftkv_compression_config cc = SWIFTKV_COMPRESSION_CONFIG_INIT;
    cc.accept_lossy = 1;
    cc.host = p;
    check(swiftkv_compression_set(ctx.get(), model, &cc), "swiftkv_compression_set (quality)");
    std::vector<uint32_t> tokens(cfg_.chunk_tokens);
    std::iota(tokens.begin(), tokens.end(), 1u);
    uint64_t n = 0;
    check(swiftkv_store(&n, ctx.get(), model, tokens.data(), tokens.size(), content_.data(),
                        content_.size()),
          "swiftkv_store (quality)");
    std::vector<std::byte> back(content_.size());
    check(swiftkv_retrieve(&n, ctx.get(), model, tokens.data(), tokens.size(), 0, back.data(),
                           back.size()),
          "swiftkv_retrieve (quality)");
    if (n != tokens.size()) throw std::runtime_error("the quality probe's chunk did not come back");
    double err = 0, ref = 0;
    for (size_t i = 0; i + 1 < content_.size(); i += 2) {
      uint16_t a, b;
      std::memcpy(&a, &content_[i], 2);
      std::memcpy(&b, &back[i], 2);
      const double x = from_half(a), y = from_half(b);
      err += (x - y) * (x - y);
      ref += x * x;
    }
    const double q = ref > 0 ? std::max(0.0, 1.0 - std::sqrt(err / ref)) : 1.0;
    quality_[key] = q;
    return q;
  }

  // How the tiers ctx holds chunks [0, n) of the tokens (empty without compression).
  std::vector<swiftkv_chunk_info> chunk_info(const std::vector<uint32_t> &tokens, uint64_t n) {
    std::vector<swiftkv_chunk_info> info;
    if (!compressing() || !has_tiers() || n == 0) return info;
    info.resize(n);
    size_t chunks = 0;
    check(swiftkv_chunk_info_get(info.data(), n, &chunks, tiers_.get(), tiers_model_, tokens.data(),
                                 n * cfg_.chunk_tokens),
          "swiftkv_chunk_info_get");
    return info;
  }
  // The real bytes a chunk's stored shadow bytes stand for.
  double real_bytes(const std::vector<swiftkv_chunk_info> &info, uint64_t i) const {
    if (info.empty() || info[i].tier == SWIFTKV_TIER_DROPPED)
      return static_cast<double>(chunk_real_);
    return static_cast<double>(chunk_real_) * static_cast<double>(info[i].stored_bytes) /
           static_cast<double>(chunk_shadow_);
  }

  void lookup(swiftkv_ctx *ctx, uint32_t model, const std::vector<uint32_t> &tokens, uint64_t n_tok,
              std::vector<uint8_t> &res) {
    const uint64_t chunks = n_tok / cfg_.chunk_tokens;
    res.assign(chunks, SWIFTKV_TIER_DROPPED);
    if (chunks == 0) return;
    swiftkv_lookup_result r = SWIFTKV_LOOKUP_RESULT_INIT;
    check(swiftkv_lookup(&r, res.data(), res.size(), ctx, model, tokens.data(), n_tok),
          "swiftkv_lookup");
  }

  void start_next(double now) {
    while (!fifo_.empty()) {
      const uint32_t s = fifo_.front();
      fifo_.pop();
      if (start(s, now)) return;
    }
  }

  // Begins the prefill of session s's current turn; false when it is rejected.
  bool start(uint32_t s, double now) {
    SessionState &ss = sessions_[s];
    const Turn &t = turn_of(s);
    RequestRecord &rec = result_.requests[ss.record];
    const uint64_t ctx_len = ss.history + t.prompt_tokens;
    rec.context_tokens = ctx_len;
    const Capacity &cap = result_.capacity;
    if (ctx_len + t.output_tokens > cap.max_context) {
      reject_rest(s);
      return false;
    }
    grow_tokens(s, ctx_len, &t);
    const uint64_t C = cfg_.chunk_tokens;
    const uint64_t n = ctx_len / C;
    std::vector<uint8_t> g, r;
    lookup(gpu_.get(), gpu_model_, ss.tokens, n * C, g);
    if (has_tiers())
      lookup(tiers_.get(), tiers_model_, ss.tokens, n * C, r);
    else
      r.assign(n, SWIFTKV_TIER_DROPPED);
    // HiCache's selective write-through: a chunk used again from the GPU is backed up to host
    // memory now (its second hit).
    if (selective_backup()) {
      uint64_t used = 0;
      while (used < n && g[used] != SWIFTKV_TIER_DROPPED) ++used;
      store(tiers_.get(), tiers_model_, ss.tokens, used * C, true);
      lookup(tiers_.get(), tiers_model_, ss.tokens, n * C, r);
    }
    // The chunk's source: the own GPU cache where the chunk may sit in regular pages, else the
    // tier the library has it in.
    const uint64_t gpu_chunks_usable = cap.gpu_tokens / C;
    std::vector<int> src(n, -1);
    for (uint64_t i = 0; i < n; ++i) {
      if (g[i] != SWIFTKV_TIER_DROPPED && i < gpu_chunks_usable)
        src[i] = kGpu;
      else if (r[i] == SWIFTKV_TIER_PEER)
        src[i] = kPeer;
      else if (r[i] == SWIFTKV_TIER_HOST)
        src[i] = kHost;
      else if (r[i] == SWIFTKV_TIER_DISK)
        src[i] = kDisk;
    }
    std::vector<uint8_t> resident(n);
    for (uint64_t i = 0; i < n; ++i) resident[i] = src[i] >= 0 ? 1 : 0;
    const PrefillPlan plan =
        plan_prefill(cfg_, policy_ == Policy::swiftkv, resident, ctx_len, cap.gpu_tokens);
    const std::vector<uint8_t> &load = plan.load;
    uint64_t last_load = 0;  // one past the last chunk loaded
    for (uint64_t i = 0; i < n; ++i)
      if (load[i] != 0) last_load = i + 1;
    double nv = 0, pcie = 0, disk = 0;
    // Compressed chunks cross the links as stored; lossy ones decode on the GPU (beside the
    // prefill), zstd on the CPU before the link (beside the transfers).
    double gpu_decode = 0, cpu_decode = 0;
    const std::vector<swiftkv_chunk_info> info = chunk_info(ss.tokens, last_load);
    const uint64_t hist_chunks = std::min<uint64_t>(ss.history / C, n);
    for (uint64_t i = 0; i < last_load; ++i) {
      if (load[i] == 0) continue;
      const bool below = src[i] == kHost || src[i] == kDisk;
      const double b = below ? real_bytes(info, i) : static_cast<double>(chunk_real_);
      double q = 1;
      if (below && !info.empty()) {
        const swiftkv_chunk_info &v = info[i];
        q = quality_of(v.codec, v.bits);
        const double decoded = static_cast<double>(chunk_real_);
        if (v.codec == SWIFTKV_CODEC_ZSTD)
          cpu_decode += decoded / (cfg_.compression.cpu_decode_gbps * 1e9);
        if (v.codec == SWIFTKV_CODEC_KIVI || v.codec == SWIFTKV_CODEC_FP8) {
          gpu_decode += decoded / (cfg_.compression.gpu_decode_gbps * 1e9);
        }
      }
      if (src[i] == kPeer) nv += b;
      if (src[i] == kHost) pcie += b;
      if (src[i] == kDisk) {
        pcie += b;
        disk += b;
      }
      if (i < hist_chunks) {
        ++result_.hit_chunks[static_cast<size_t>(src[i])];
        ++result_.quality_chunks;
        result_.quality_sum += q;
      }
    }
    result_.decode_seconds += gpu_decode + cpu_decode;
    result_.history_chunks += hist_chunks;
    result_.nvlink_bytes += static_cast<uint64_t>(nv);
    result_.pcie_bytes += static_cast<uint64_t>(pcie);
    result_.disk_bytes += static_cast<uint64_t>(disk);
    const uint64_t computed = plan.computed_tokens;
    const double compute = plan.compute_seconds + gpu_decode;
    // Under swiftkv the tokens past the regular cache live in stream pages: the new ones are
    // saved out over NVLink layer by layer, on the same link as the loads.
    double stream_save = 0;
    if (policy_ == Policy::swiftkv && ctx_len > cap.gpu_tokens) {
      stream_save = static_cast<double>(plan.streamed_tokens * bytes_per_token(cfg_.borrower));
    }
    const double link =
        std::max({(nv + stream_save) / (cfg_.nvlink_gbps * 1e9), pcie / (cfg_.pcie_gbps * 1e9),
                  disk / (cfg_.disk_gbps * 1e9), cpu_decode});
    const double L = cfg_.borrower.num_layers;
    const double lt = link / L, ct = compute / L;
    // Layer-wise overlap (SwiftCache §3.3): the load of layer l+1 runs under the compute of
    // layer l. host-offload loads everything before the prefill starts (LMCache's default)
    // unless --lmcache-layerwise, and runs slower by LMCache's in-process overhead.
    const bool overlap = policy_ != Policy::host_offload || cfg_.lmcache_layerwise;
    double prefill = overlap ? std::max(lt + L * ct, L * lt + ct) : link + compute;
    if (policy_ == Policy::host_offload) prefill *= 1 + cfg_.lmcache_overhead;
    rec.computed_tokens = computed;
    result_.computed_tokens += computed;
    const uint64_t new_tokens = t.prompt_tokens;
    result_.recomputed_tokens += computed > new_tokens ? computed - new_tokens : 0;
    busy_ = true;
    push(now + prefill, Event::prefill_end, s);
    return true;
  }

  void reject_rest(uint32_t s) {
    SessionState &ss = sessions_[s];
    const Session &ses = trace_.sessions[s];
    for (uint32_t k = ss.next_turn; k < ses.turns.size(); ++k) {
      RequestRecord &rec = result_.requests[ss.record + (k - ss.next_turn)];
      rec.rejected = true;
      rec.ttft_s = -1;
      ++result_.rejected;
      ++done_turns_;
      tick_progress();
    }
    ss.dead = true;
  }

  // Stores the chunks of tokens [0, n_tok) into a context (only those it does not have) and
  // counts the bytes each new chunk crossed.
  void store(swiftkv_ctx *ctx, uint32_t model, const std::vector<uint32_t> &tokens, uint64_t n_tok,
             bool count_bytes) {
    const uint64_t n = n_tok / cfg_.chunk_tokens;
    if (n == 0) return;
    std::vector<uint8_t> before, after;
    if (count_bytes) lookup(ctx, model, tokens, n * cfg_.chunk_tokens, before);
    while (payload_.size() < n * chunk_shadow_) {
      payload_.insert(payload_.end(), content_.begin(), content_.end());
    }
    uint64_t cached = 0;
    check(swiftkv_store(&cached, ctx, model, tokens.data(), n * cfg_.chunk_tokens, payload_.data(),
                        n * chunk_shadow_),
          "swiftkv_store");
    if (!count_bytes) return;
    lookup(ctx, model, tokens, n * cfg_.chunk_tokens, after);
    const std::vector<swiftkv_chunk_info> info = chunk_info(tokens, n);
    for (uint64_t i = 0; i < n; ++i) {
      if (before[i] != SWIFTKV_TIER_DROPPED) continue;
      const auto b = static_cast<uint64_t>(real_bytes(info, i));
      if (after[i] == SWIFTKV_TIER_PEER) result_.nvlink_bytes += chunk_real_;
      if (after[i] == SWIFTKV_TIER_HOST) result_.pcie_bytes += b;
      if (after[i] == SWIFTKV_TIER_DISK) {
        result_.pcie_bytes += b;
        result_.disk_bytes += b;
      }
    }
  }

  void save_context(uint32_t s, uint64_t n_tok) {
    SessionState &ss = sessions_[s];
    const uint64_t regular = result_.capacity.gpu_tokens / cfg_.chunk_tokens * cfg_.chunk_tokens;
    store(gpu_.get(), gpu_model_, ss.tokens, std::min(n_tok, regular), false);
    if (has_tiers() && !selective_backup())
      store(tiers_.get(), tiers_model_, ss.tokens, n_tok, true);
  }
  bool selective_backup() const {
    return policy_ == Policy::hierarchical && cfg_.hicache_selective;
  }

  void prefill_end(uint32_t s, double now) {
    SessionState &ss = sessions_[s];
    const Turn &t = turn_of(s);
    RequestRecord &rec = result_.requests[ss.record];
    rec.ttft_s = now - rec.ready_s;
    ++result_.served;
    save_context(s, ss.history + t.prompt_tokens);
    busy_ = false;
    push(now + static_cast<double>(t.output_tokens) * cfg_.tpot_ms / 1e3, Event::complete, s);
    start_next(now);
  }

  void complete(uint32_t s, double now) {
    SessionState &ss = sessions_[s];
    const Session &ses = trace_.sessions[s];
    const Turn &t = turn_of(s);
    const uint64_t total = ss.history + t.prompt_tokens + t.output_tokens;
    result_.max_context = std::max(result_.max_context, total);
    grow_tokens(s, total, nullptr);
    save_context(s, total);
    ss.history = total;
    ++ss.next_turn;
    ++ss.record;
    ++done_turns_;
    tick_progress();
    if (ss.next_turn < ses.turns.size()) {
      const Turn &next = ses.turns[ss.next_turn];
      const double ready = std::max(now + next.think_s, next.arrival_s.value_or(0));
      result_.requests[ss.record].ready_s = ready;
      push(ready, Event::ready, s);
    }
  }

  void tick_progress() {
    if (progress_) progress_(done_turns_, total_turns_);
  }

  // A lender's own request: Algorithm 1 ScaleUp, reclaiming lent units when it must; the
  // borrower's context answers on its background thread, and the lender waits for it.
  void lender_arrive(uint32_t li, double now) {
    Lender &l = lenders_[li];
    const auto tokens = static_cast<uint64_t>(
        std::clamp(rng_.lognormal(cfg_.lender_median_tokens, 1.0), 64.0, 32768.0));
    l.active_tokens += tokens;
    // Counted from before the call: the borrower's background thread starts moving chunks as
    // soon as the reclaim is asked for.
    uint64_t host0 = 0, disk0 = 0;
    {
      std::lock_guard lock(events_.mu);
      host0 = events_.reclaim_to_host;
      disk0 = events_.reclaim_to_disk;
    }
    uint64_t lb = 0, bc = 0;
    const swiftkv_status st =
        swiftkv_elastic_scale_for_request(&lb, &bc, l.region.get(), l.active_tokens);
    if (st != SWIFTKV_ENOMEM) check(st, "swiftkv_elastic_scale_for_request");
    if (st == SWIFTKV_IN_PROGRESS) {
      wait_reclaimed(l);
      // The request waits for the evacuation: the moved chunks' bytes over PCIe, and the disk
      // as well for those that went down to it.
      double wait = 0;
      {
        std::lock_guard lock(events_.mu);
        const auto c = static_cast<double>(chunk_real_);
        wait = static_cast<double>(events_.reclaim_to_host - host0) * c / (cfg_.pcie_gbps * 1e9) +
               static_cast<double>(events_.reclaim_to_disk - disk0) * c /
                   (std::min(cfg_.pcie_gbps, cfg_.disk_gbps) * 1e9);
      }
      ServerConfig as_lender = cfg_;
      as_lender.borrower = cfg_.lenders[li];
      result_.lender_reclaim_waits.push_back({wait, wait / prefill_seconds(as_lender, 0, tokens)});
    }
    ++result_.lender_requests;
    push(now + 200 * cfg_.tpot_ms / 1e3, Event::lender_done, li, tokens);
    push(now + rng_.exponential(1.0 / cfg_.lender_rate), Event::lender_arrive, li);
  }

  // The borrower's background thread answers at once (the region wakes it); a reclaim that is
  // never answered is a library failure.
  void wait_reclaimed(Lender &l) {
    const swiftkv_status st = swiftkv_elastic_wait_reclaims(l.region.get(), 30'000);
    if (st == SWIFTKV_ETIMEDOUT) throw std::runtime_error("a reclaim was not answered within 30 s");
    check(st, "swiftkv_elastic_wait_reclaims");
  }

  // Every simulated second: ScaleDown on each lender, and the borrower takes what it freed.
  void tick(double now) {
    for (Lender &l : lenders_) {
      const uint64_t in_use = std::min<uint64_t>(
          (l.active_tokens + cfg_.block_tokens - 1) / cfg_.block_tokens, l.capacity_blocks);
      uint64_t lb = 0, bc = 0;
      check(swiftkv_elastic_tick(&lb, &bc, l.region.get(), in_use), "swiftkv_elastic_tick");
      if (bc > 0) borrow_all(l);
    }
    if (done_turns_ < total_turns_) push(now + 1.0, Event::tick, 0);
  }

  const ServerConfig &cfg_;
  const Trace &trace_;
  const Policy policy_;
  const ProgressFn &progress_;
  const Shadow shadow_;
  const uint64_t chunk_real_, chunk_shadow_;
  Rng rng_;
  PolicyResult result_;
  SimClock clock_;
  EventCounts events_;
  std::string disk_dir_;
  CtxPtr gpu_, tiers_, lender_ctx_;
  uint32_t gpu_model_ = 0, tiers_model_ = 0;
  std::vector<Lender> lenders_;
  std::vector<SessionState> sessions_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  std::queue<uint32_t> fifo_;
  uint64_t seq_ = 0, done_turns_ = 0, total_turns_ = 0;
  bool busy_ = false;
  std::vector<std::byte> content_;  // one shadow chunk: zeros, or synthetic KV to compress
  std::vector<std::byte> payload_;  // content_ repeated for a store of many chunks
  std::map<std::pair<uint8_t, uint8_t>, double> quality_;  // (codec, bits) -> quality_of
};

}  // namespace

const char *policy_name(Policy p) {
  switch (p) {
    case Policy::swiftkv: return "swiftkv";
    case Policy::host_offload: return "host-offload";
    case Policy::hierarchical: return "hierarchical";
    case Policy::gpu_only: return "gpu-only";
  }
  return "?";
}

std::optional<Policy> parse_policy(const std::string &name) {
  for (Policy p : kAllPolicies) {
    if (name == policy_name(p)) return p;
  }
  return std::nullopt;
}

std::optional<CompressionSpec> parse_compression(const std::string &s) {
  CompressionSpec c;
  if (s == "none") return c;
  if (s == "adaptive") {
    c.mode = CompressionSpec::Mode::adaptive;
    return c;
  }
  const std::string prefix = "fixed:";
  if (s.rfind(prefix, 0) != 0) return std::nullopt;
  c.mode = CompressionSpec::Mode::fixed;
  c.codec = s.substr(prefix.size());
  for (const char *known : {"zstd", "zstd-planes", "kivi8", "kivi4", "kivi2", "fp8"}) {
    if (c.codec == known) return c;
  }
  return std::nullopt;
}

std::string compression_name(const CompressionSpec &c) {
  switch (c.mode) {
    case CompressionSpec::Mode::none: return "none";
    case CompressionSpec::Mode::fixed: return "fixed:" + c.codec;
    case CompressionSpec::Mode::adaptive: return "adaptive";
  }
  return "?";
}

const char *source_name(Source s) {
  static const char *names[] = {"gpu", "peer", "host", "disk"};
  return names[s];
}

double prefill_seconds(const ServerConfig &cfg, uint64_t context, uint64_t tokens) {
  const ModelSpec &m = cfg.borrower;
  const double params = m.params > 0 ? m.params : static_cast<double>(m.weight_bytes) / 2;
  const double q_heads = m.num_q_heads > 0 ? m.num_q_heads : m.num_kv_heads;
  const auto a = static_cast<double>(context), b = static_cast<double>(context + tokens);
  // Dense layers 2 * params per token; attention 4 * L * H_q * D per token per earlier token
  // (QK^T and PV), summed over positions a+1 .. b.
  const double attended = (b * (b + 1) - a * (a + 1)) / 2;
  const double flops = static_cast<double>(tokens) * 2 * params +
                       4.0 * m.num_layers * q_heads * m.head_dim * attended;
  return flops / (cfg.gpu_tflops * 1e12);
}

PrefillPlan plan_prefill(const ServerConfig &cfg, bool recompute_head,
                         const std::vector<uint8_t> &resident, uint64_t context_tokens,
                         uint64_t gpu_tokens) {
  const uint64_t C = cfg.chunk_tokens;
  const uint64_t n = resident.size();
  if (n * C > context_tokens)
    throw std::invalid_argument("plan_prefill: more full chunks than the context holds");
  // The run loaded, [h, j): from chunk 0, or with recompute_head the longest one (the earliest
  // of equal ones), as swiftkv_lookup reports it.
  uint64_t h = 0, j = 0;
  while (j < n && resident[j] != 0) ++j;
  for (uint64_t i = j; recompute_head && i < n;) {
    if (resident[i] == 0) {
      ++i;
      continue;
    }
    uint64_t e = i;
    while (e < n && resident[e] != 0) ++e;
    if (e - i > j - h) {
      h = i;
      j = e;
    }
    i = e;
  }
  PrefillPlan p;
  p.load.assign(n, 0);
  for (uint64_t i = h; i < j; ++i) p.load[i] = 1;
  // A computed range [a, b): its tokens, its time after the a tokens before it, and what of it
  // lies past the regular cache.
  const auto compute = [&](uint64_t a, uint64_t b) {
    if (b == a) return;
    p.computed_tokens += b - a;
    p.compute_seconds += prefill_seconds(cfg, a, b - a);
    if (b > gpu_tokens) p.streamed_tokens += b - std::max(a, gpu_tokens);
  };
  compute(0, h * C);
  compute(j * C, context_tokens);
  return p;
}

Capacity policy_capacity(const ServerConfig &cfg, Policy p) {
  Capacity c;
  const uint64_t bpt = bytes_per_token(cfg.borrower);
  const uint64_t C = cfg.chunk_tokens;
  const uint64_t own =
      kv_bytes_on_gpu(cfg.borrower, cfg.gpu_gib, cfg.utilization, cfg.activation_gib);
  if (own == 0)
    throw std::runtime_error("the borrower " + cfg.borrower.name + " does not fit its GPU");
  const uint64_t chunk_bytes = bpt * C;
  const uint64_t block_bytes = bpt * cfg.block_tokens;
  c.gpu_tokens = own / block_bytes * cfg.block_tokens;
  c.max_context = c.gpu_tokens;
  if (p != Policy::gpu_only) c.host_tokens = gib_bytes(cfg.host_gib) / chunk_bytes * C;
  if (p == Policy::hierarchical || p == Policy::swiftkv) {
    c.disk_tokens = gib_bytes(cfg.disk_gib) / chunk_bytes * C;
  }
  if (p != Policy::swiftkv) return c;
  std::vector<uint64_t> lendable;
  for (const ModelSpec &l : cfg.lenders) {
    const LendUnit u = lend_unit(cfg, l);
    const uint64_t capacity = lender_capacity_blocks(cfg, l, u.lender_blocks);
    const uint64_t owned = lender_initial_blocks(cfg, u.lender_blocks, capacity);
    const uint64_t units = (capacity - owned) / u.lender_blocks;
    lendable.push_back((capacity - owned) * bytes_per_token(l) * cfg.block_tokens);
    c.peer_tokens += units * u.borrower_chunks * C;
  }
  const swiftkv_model_desc b = real_desc(cfg.borrower, cfg);
  swiftkv_capacity_plan plan = SWIFTKV_CAPACITY_PLAN_INIT;
  check(swiftkv_plan_borrower(&b, own, lendable.data(), lendable.size(), &plan),
        "swiftkv_plan_borrower");
  c.gpu_tokens = plan.regular_blocks * cfg.block_tokens;
  c.max_context = plan.max_context_tokens;
  return c;
}

void request_stop() noexcept { g_stop.store(true, std::memory_order_relaxed); }
int stop_signal() noexcept { return g_stop_signal.load(std::memory_order_relaxed); }
void note_stop_signal(int sig) noexcept { g_stop_signal.store(sig, std::memory_order_relaxed); }

PolicyResult run_policy(const ServerConfig &cfg, const Trace &trace, Policy p,
                        const ProgressFn &progress) {
  Simulation sim(cfg, trace, p, progress);
  return sim.run();
}

}  // namespace swiftkv::bench
