// A request's loads and saves as tasks on the CPU executor: a layer's chunks in runs of about
// kTaskBytes a task, at least one task per executor thread, so that the chunks of a layer copy in
// parallel and a layer is done when its last task is.
#include "core/connector/request.hpp"

#include <algorithm>
#include <string>

#include "core/codec/chunk_codec.hpp"
#include "core/common/error.hpp"
#include "core/common/nontemporal_copy.hpp"
#include "core/memory/host_memory.hpp"
#include "core/transfer/copy_runs.hpp"

namespace swiftkv {

Request::Request(ChunkCache &cache, CpuExecutor &exec, std::shared_ptr<const KvPool> pool,
                 RequestSpec spec)
    : cache_(cache), exec_(exec), pool_(std::move(pool)), spec_(std::move(spec)) {
  const ModelGeometry &g = pool_->geometry();
  const GeometrySizes sizes = geometry_sizes(g, "model");
  piece_bytes_ = sizes.layer_chunk_bytes;
  chunk_tokens_ = g.chunk_tokens;
  layers_ = g.num_layers;
  load_left_.assign(layers_, 0);
  save_left_.assign(layers_, 0);
  load_submitted_.assign(layers_, false);
  if (!device()) host_stores_ = host_stores_choice();
  // What is held so far is given back by the members' destructors if a stage throws.
  hold_loads(sizes);
  reserve_saves(sizes);
  check_stream_pages();
  // A request that copies nothing (a decode step between chunk boundaries) makes no CUDA call.
  if (device() && (!loads_.empty() || !saves_.empty())) make_device_transfer();
  start_disk_reads();
}

std::vector<CopySegment> Request::plan_for(size_t c, uint32_t first_token) {
  const PageLayout &layout = pool_->layout();
  const ModelGeometry &g = pool_->geometry();
  const uint64_t pages_per_chunk = g.chunk_tokens / g.block_tokens;
  const auto pages =
      std::span<const int32_t>(spec_.pages).subspan(c * pages_per_chunk, pages_per_chunk);
  // A chunk copied into or out of stream pages orders each layer's load after the last save.
  for (int32_t p : pages.subspan(first_token / g.block_tokens)) {
    if (layout.is_stream(static_cast<uint32_t>(p))) info_.stream_ordered = true;
  }
  return chunk_copy_plan(layout, pages, g.chunk_tokens, first_token);
}

// The loads: the cached run from load_from, each chunk held until the request ends. A load_from
// inside a chunk (a block boundary: the engine has the blocks before it) loads that chunk's
// tokens from load_from on and leaves the pages before it alone.
void Request::hold_loads(const GeometrySizes &sizes) {
  const size_t first = spec_.load_from / chunk_tokens_;
  const auto skip = static_cast<uint32_t>(spec_.load_from % chunk_tokens_);
  bool tiers_used[kTierCount] = {};
  for (size_t c = first; spec_.load && c < spec_.keys.size(); ++c) {
    std::optional<ChunkUse> use = cache_.begin_read(spec_.keys[c]);
    if (!use) break;
    if (use->meta.bytes != sizes.full_chunk_bytes) {
      // Not this model's chunk whatever its key says: dropped as corrupt, the load ends here.
      cache_.end_read(spec_.keys[c]);
      cache_.report_failed_load(spec_.keys[c], use->meta, use->where.tier);
      break;
    }
    if (!cache_.loadable(use->meta)) {  // lossy, and the model asks for exact bytes
      cache_.end_read(spec_.keys[c]);
      break;
    }
    loads_.push_back(std::make_unique<LoadChunk>(cache_, spec_.keys[c], *use));
    LoadChunk &l = *loads_.back();
    l.plan = plan_for(c, c == first ? skip : 0);
    // An encoded chunk is staged (read and decoded into host memory) as a disk chunk is, unless
    // a device pool decodes it: then its frame goes to the device as stored, from host memory in
    // place (checked here) or read from the disk into staging (checked as it is read).
    if (device()) l.frame = cache_.device_decodable(use->meta);
    l.src = use->meta.encoded() && !l.frame ? nullptr : cache_.address(use->where, &l.src_device);
    if (l.frame && l.src != nullptr) {
      try {
        cache_.check_device_frame({l.src, use->meta.stored()}, use->meta);
      } catch (const Error &) {
        const ChunkMeta meta = use->meta;
        const Tier tier = use->where.tier;
        loads_.pop_back();  // ends the read
        cache_.report_failed_load(spec_.keys[c], meta, tier);
        break;
      }
    }
    tiers_used[tier_slot(use->where.tier)] = true;
    if (lent(use->where.tier)) peer_loads_ = true;
  }
  info_.load_begin = spec_.load_from;
  info_.load_end = std::max(spec_.load_from, (first + loads_.size()) * chunk_tokens_);
  info_.valid_end = info_.load_end;
  for (size_t t = 0; t < kTierCount; ++t) {
    if (tiers_used[t]) {
      load_scopes_.push_back(std::make_unique<ChunkCache::LoadScope>(cache_, static_cast<Tier>(t)));
    }
  }
}

// The saves: every full chunk that is neither loaded nor cached, into a reserved slot that
// becomes visible only in wait_save.
void Request::reserve_saves(const GeometrySizes &sizes) {
  const size_t first = spec_.load_from / chunk_tokens_;
  for (size_t c = 0; spec_.save && c < spec_.keys.size(); ++c) {
    if (c >= first && c < first + loads_.size()) continue;
    if (cache_.resident(spec_.keys[c])) continue;
    const ChunkMeta meta{spec_.model, static_cast<uint32_t>(c),
                         static_cast<uint32_t>(chunk_tokens_), sizes.full_chunk_bytes};
    std::optional<SlotRef> where = cache_.reserve_slot(spec_.keys[c], meta);
    if (!where) continue;  // no room anywhere: counted by the cache, the chunk is not saved
    saves_.push_back(std::make_unique<SaveChunk>(cache_, spec_.keys[c], meta, *where));
    SaveChunk &s = *saves_.back();
    s.plan = plan_for(c);
    s.dst = cache_.address(s.where, &s.slot_device);
    // A host pool reaches lent device memory through host staging; a device pool copies to
    // any memory directly, and stages only for the disk.
    // A tier that encodes its chunks takes them from staging too.
    if (s.dst == nullptr || (s.slot_device >= 0 && pool_->layout().device < 0) ||
        cache_.encodes_in(s.where.tier, spec_.model)) {
      s.staging.allocate(sizes.full_chunk_bytes, *pool_);
      s.dst = s.staging.data();
    }
    info_.save_tokens += chunk_tokens_;
  }
}

void Request::check_stream_pages() const {
  const PageLayout &layout = pool_->layout();
  const bool any_stream_page = std::any_of(spec_.pages.begin(), spec_.pages.end(), [&](int32_t p) {
    return layout.is_stream(static_cast<uint32_t>(p));
  });
  if (any_stream_page && !(spec_.load && spec_.save)) {
    fail_invalid(std::string("a ") + (spec_.load ? "load-only" : "save-only") +
                 " request cannot use stream pages: they hold one layer at a time, and only "
                 "a request that both loads and saves says when a layer is done with");
  }
}

// Chunks that are not in memory here (on disk, encoded, or lent by another node) are read and
// checked now, as early as the request is known: each disk or encoded chunk on its own task (the
// disk reads in parallel), every lent one in a single task, as one batch per lender.
void Request::start_disk_reads() {
  std::unique_lock lock(mu_);
  try {
    std::vector<LoadChunk *> lent_reads;
    for (size_t i = 0; i < loads_.size(); ++i) {
      if (loads_[i]->src != nullptr) continue;
      if (lent(loads_[i]->use.where.tier)) {
        lent_reads.push_back(loads_[i].get());
        continue;
      }
      exec_.submit(CpuExecutor::Lane::load, [this, i] {
        stage(*loads_[i]);
        std::lock_guard l(mu_);
        if (--tasks_in_flight_ == 0) cv_.notify_all();
      });
      ++tasks_in_flight_;
    }
    if (!lent_reads.empty()) {
      exec_.submit(CpuExecutor::Lane::load, [this, lent_reads] {
        stage_many(lent_reads);
        std::lock_guard l(mu_);
        if (--tasks_in_flight_ == 0) cv_.notify_all();
      });
      ++tasks_in_flight_;
    }
  } catch (...) {
    // A submit that failed (out of memory): the reads already running use this request, so
    // the constructor waits for them before it gives up.
    cv_.wait(lock, [this] { return tasks_in_flight_ == 0; });
    throw;
  }
}

void Request::HostBytes::allocate(uint64_t bytes, const KvPool &pool) {
  if (pool.layout().device >= 0) {
    pinned_ = take_pinned(pool.device_lanes(), bytes);
  } else {
    plain_.resize(bytes);
  }
}

Request::~Request() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return tasks_in_flight_ == 0; });
  lock.unlock();
  dev_.reset();  // waits for the device's copies: they read held chunks and write slots
  // The members then end the reads and release the slots not published.
}

bool Request::stage(LoadChunk &c) {
  LoadChunk *const one = &c;
  stage_many({&one, 1});
  std::lock_guard lock(c.stage_mu);
  return c.staged;
}

void Request::stage_many(std::span<LoadChunk *const> chunks) {
  // Each chunk's lock is held from the check to the end (only one caller takes several, in
  // request order; every other stager takes one at a time), so that a chunk is read once.
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<LoadChunk *> pending;
  for (LoadChunk *p : chunks) {
    LoadChunk &c = *p;
    std::unique_lock lock(c.stage_mu);
    if (c.staged || c.stage_failed) continue;
    locks.push_back(std::move(lock));
    pending.push_back(&c);
  }
  std::vector<uint8_t> ok(pending.size(), 0);
  try {
    std::vector<ChunkCache::ChunkRead> reads;
    reads.reserve(pending.size());
    for (LoadChunk *c : pending) {
      const bool as_stored = c->frame.has_value();
      c->staging.allocate(as_stored ? c->use.meta.stored() : c->use.meta.bytes, *pool_);
      reads.push_back({c->use.where, &c->use.meta, c->staging.data(), as_stored});
    }
    cache_.read_slots(reads, ok);
  } catch (...) {
    std::fill(ok.begin(), ok.end(), 0);  // out of memory: these chunks fail for this request
  }
  for (size_t k = 0; k < pending.size(); ++k) {
    LoadChunk &c = *pending[k];
    if (ok[k]) {
      c.staged = true;
      continue;
    }
    c.stage_failed = true;
    c.staging.clear();
    try {
      cache_.report_failed_load(c.key, c.use.meta, c.use.where.tier);
    } catch (...) {
      // The chunk stays failed for this request either way.
    }
  }
}

void Request::fail_chunk(size_t i) {
  size_t seen = first_failed_.load();
  while (i < seen && !first_failed_.compare_exchange_weak(seen, i)) {
  }
}

bool Request::layer_nontemporal(size_t chunks) const noexcept {
  switch (host_stores_) {
    case HostStores::cached: return false;
    case HostStores::nontemporal: return true;
    case HostStores::automatic: break;
  }
  // A load-only or save-only request copies every layer before anything reads what it wrote
  // (the engine runs the model after a load-only one; a save's chunks are read at a later
  // turn): its whole copy is what passes through the cache, not one layer's.
  const uint64_t layers = spec_.load != spec_.save ? layers_ : 1;
  return nontemporal_pays(chunks * piece_bytes_ * layers / std::max(exec_.threads(), 1u));
}

size_t Request::chunks_per_task(size_t chunks) const noexcept {
  // A task copies a run of a layer's chunks: enough bytes that queueing it, waking a thread
  // for it and counting it done cost little beside its copy (a layer of a 16-token page is
  // 8 KiB a head group: a task per chunk spent a third of a 128-page call waking threads),
  // yet no fewer tasks than the executor has threads, so that a layer's chunks still copy in
  // parallel.
  const size_t by_bytes = std::max<uint64_t>(1, kTaskBytes / std::max<uint64_t>(piece_bytes_, 1));
  const size_t threads = std::max(exec_.threads(), 1u);
  const size_t by_threads = (chunks + threads - 1) / threads;
  return std::max<size_t>(1, std::min(by_bytes, by_threads));
}

void Request::load_task(uint32_t layer, size_t i, bool nontemporal) {
  if (i >= first_failed_.load()) return;  // past the valid prefix: the engine recomputes it
  LoadChunk &c = *loads_[i];
  const bool lent_memory = lent(c.use.where.tier);  // peer or remote: checked around the copy
  const std::byte *src = nullptr;
  std::vector<std::byte> bounce;
  if (c.src == nullptr) {
    if (!stage(c)) return fail_chunk(i);
    src = c.staging.data() + layer * piece_bytes_;
  } else {
    if (lent_memory && !cache_.readable(c.use.where)) return fail_chunk(i);
    src = c.src + layer * piece_bytes_;
    if (c.src_device >= 0) {  // lent device memory and a host pool: through host memory
      bounce.resize(piece_bytes_);
      copy_bytes(bounce.data(), -1, src, c.src_device, piece_bytes_);
      src = bounce.data();
    }
  }
  scatter_piece(c.plan, src, pool_->layout().layer_base[layer], nontemporal);
  // Checked again after the copy: a range lost during it may have held the lender's bytes.
  if (lent_memory && !cache_.readable(c.use.where)) fail_chunk(i);
}

void Request::task_done(bool load, uint32_t layer) {
  std::lock_guard lock(mu_);
  --tasks_in_flight_;
  std::vector<uint32_t> &left = load ? load_left_ : save_left_;
  if (--left[layer] == 0) {
    if (load) {
      ++layers_load_done_;
      if (layers_load_done_ == layers_) load_scopes_.clear();
    } else if (info_.stream_ordered && layer + 1 < layers_) {
      submit_load_locked(layer + 1);
    }
    // Waiters wake when a layer is done (wait_layer_load, wait_save; the last task of all is
    // some layer's last too, for the destructor), not at every task.
    cv_.notify_all();
  }
}

void Request::submit_load_locked(uint32_t layer) {
  load_submitted_[layer] = true;
  if (loads_.empty()) {
    if (++layers_load_done_ == layers_) load_scopes_.clear();
    return;
  }
  const size_t per_task = chunks_per_task(loads_.size());
  load_left_[layer] = static_cast<uint32_t>((loads_.size() + per_task - 1) / per_task);
  const bool nontemporal = layer_nontemporal(loads_.size());
  for (size_t first = 0; first < loads_.size(); first += per_task) {
    const size_t end = std::min(loads_.size(), first + per_task);
    ++tasks_in_flight_;
    exec_.submit(CpuExecutor::Lane::load, [this, layer, first, end, nontemporal] {
      for (size_t i = first; i < end; ++i) load_task(layer, i, nontemporal);
      task_done(true, layer);
    });
  }
}

void Request::submit_save_locked(uint32_t layer) {
  if (saves_.empty()) {
    if (info_.stream_ordered && layer + 1 < layers_) submit_load_locked(layer + 1);
    return;
  }
  const size_t per_task = chunks_per_task(saves_.size());
  save_left_[layer] = static_cast<uint32_t>((saves_.size() + per_task - 1) / per_task);
  const bool nontemporal = layer_nontemporal(saves_.size());
  for (size_t first = 0; first < saves_.size(); first += per_task) {
    const size_t end = std::min(saves_.size(), first + per_task);
    ++tasks_in_flight_;
    exec_.submit(CpuExecutor::Lane::save, [this, layer, first, end, nontemporal] {
      const std::byte *base = pool_->layout().layer_base[layer];
      for (size_t i = first; i < end; ++i) {
        SaveChunk &s = *saves_[i];
        gather_piece(s.plan, base, s.dst + layer * piece_bytes_, nontemporal);
      }
      task_done(false, layer);
    });
  }
}

void Request::check_layer(uint32_t layer) const {
  if (layer >= layers_) {
    fail_invalid("layer " + std::to_string(layer) + " is not below the model's " +
                 std::to_string(layers_) + " layers");
  }
}

void Request::start_load(void *stream) {
  std::lock_guard lock(mu_);
  if (!spec_.load) fail_order("start_load");
  if (started_) fail(SWIFTKV_ESTATE, "start_load was already called for this request");
  if (device()) {
    refuse_capture(stream, "start_load");
    // The pages' previous users on the engine's stream go first.
    if (!loads_.empty()) dev_->after(stream);
    started_ = true;
    if (info_.stream_ordered) {
      enqueue_device_load_locked(0, -1);
    } else {
      // With something to copy the rest are enqueued by wait_layer_load, as the engine goes: the
      // engine's first layer is not held up behind every layer's copies and kernel launches, and
      // the staging buffers are two layers deep anyway. With nothing, every layer is done now.
      enqueue_device_loads_to_locked(loads_.empty() ? layers_
                                                    : std::min(layers_, kDeviceLoadsAhead));
    }
    return;
  }
  started_ = true;
  if (info_.stream_ordered) {
    submit_load_locked(0);
  } else {
    for (uint32_t l = 0; l < layers_; ++l) submit_load_locked(l);
  }
}

void Request::fail_order(const std::string &call) const {
  std::string next;
  if (info_.layers_loaded > info_.layers_saved) {
    next = "save_layer(" + std::to_string(info_.layers_saved) + ")";
  } else if (info_.layers_loaded < layers_) {
    next = "wait_layer_load(" + std::to_string(info_.layers_loaded) + ")";
  } else {
    next = "wait_save";
  }
  const std::string counts = std::to_string(info_.layers_loaded) + " of " +
                             std::to_string(layers_) + " layers waited for, " +
                             std::to_string(info_.layers_saved) + " saved";
  if (!spec_.save) {
    fail(SWIFTKV_ESTATE,
         call +
             " out of order: a load-only request waits for its layers in "
             "order, wait_layer_load(0) to wait_layer_load(" +
             std::to_string(layers_ - 1) + "), and saves nothing; " + counts +
             (info_.layers_loaded < layers_
                  ? ", next is wait_layer_load(" + std::to_string(info_.layers_loaded) + ")"
                  : ", next is request_finish"));
  }
  if (!spec_.load) {
    fail(SWIFTKV_ESTATE,
         call +
             " out of order: a save-only request loads nothing and saves its "
             "layers in order, save_layer(0) to save_layer(" +
             std::to_string(layers_ - 1) + "), then wait_save; " + counts +
             (info_.layers_saved < layers_
                  ? ", next is save_layer(" + std::to_string(info_.layers_saved) + ")"
                  : ", next is wait_save"));
  }
  fail(SWIFTKV_ESTATE, call +
                           " out of order: a request goes layer by layer, wait_layer_load(l) "
                           "then save_layer(l) before layer l+1 (layer l's pages are loaded before "
                           "the engine computes into them, and saved before the next layer's load "
                           "may reuse stream pages); " +
                           counts + ", next is " + next);
}

void Request::check_wait_layer_load_locked(uint32_t layer) const {
  if (!spec_.load) fail_order("wait_layer_load(" + std::to_string(layer) + ")");
  if (!started_) fail(SWIFTKV_ESTATE, "wait_layer_load before start_load");
  if (layer != info_.layers_loaded || (spec_.save && info_.layers_saved != layer)) {
    fail_order("wait_layer_load(" + std::to_string(layer) + ")");
  }
}

void Request::check_wait_layer_load(uint32_t layer) const {
  check_layer(layer);  // arguments before state: a layer past the model's is EINVAL in any state
  std::lock_guard lock(mu_);
  check_wait_layer_load_locked(layer);
}

uint64_t Request::wait_layer_load(uint32_t layer, void *stream, bool check_capture) {
  check_layer(layer);
  std::unique_lock lock(mu_);
  check_wait_layer_load_locked(layer);
  if (device()) {
    if (check_capture) refuse_capture(stream, "wait_layer_load");
    if (!info_.stream_ordered) {
      enqueue_device_loads_to_locked(std::min(layers_, layer + 1 + kDeviceLoadsAhead));
    }
    if (loads_.empty()) {
      // Nothing was loaded. With stream pages the engine is about to write this layer into the
      // memory that the previous layer's gather reads: it waits for that gather.
      if (info_.stream_ordered && !saves_.empty() && layer > 0) {
        dev_->stream_wait_save(layer - 1, stream);
      }
    } else if (peer_loads_) {
      // Lent memory: the lease is checked again once the copy is done, on the host.
      lock.unlock();
      dev_->sync_load(layer);
      lock.lock();
      for (size_t i = 0; i < loads_.size() && i < first_failed_.load(); ++i) {
        const LoadChunk &c = *loads_[i];
        if (lent(c.use.where.tier) && !cache_.readable(c.use.where)) fail_chunk(i);
      }
    } else {
      dev_->stream_wait_load(layer, stream);
    }
  } else {
    cv_.wait(lock, [&] { return load_submitted_[layer] && load_left_[layer] == 0; });
  }
  info_.layers_loaded = layer + 1;
  const size_t bad = first_failed_.load();
  if (bad < loads_.size()) {
    const uint64_t bad_begin = (spec_.load_from / chunk_tokens_ + bad) * chunk_tokens_;
    info_.valid_end = std::min(info_.valid_end, std::max(info_.load_begin, bad_begin));
  }
  return info_.valid_end;
}

void Request::check_save_layer_locked(uint32_t layer) const {
  if (!spec_.save) fail_order("save_layer(" + std::to_string(layer) + ")");
  if (layer != info_.layers_saved || (spec_.load && info_.layers_loaded != layer + 1)) {
    fail_order("save_layer(" + std::to_string(layer) + ")");
  }
}

void Request::check_save_layer(uint32_t layer) const {
  check_layer(layer);
  std::lock_guard lock(mu_);
  check_save_layer_locked(layer);
}

void Request::save_layer(uint32_t layer, void *stream, bool check_capture) {
  check_layer(layer);
  std::lock_guard lock(mu_);
  check_save_layer_locked(layer);
  if (device()) {
    if (check_capture) refuse_capture(stream, "save_layer");
    // With nothing to save the gather is only needed to order the next layer's load into
    // stream pages after the engine's work on this one.
    const bool orders_a_load = info_.stream_ordered && !loads_.empty() && layer + 1 < layers_;
    if (!saves_.empty() || orders_a_load) {
      dev_->enqueue_save(layer, stream, pool_->layout().layer_base[layer], save_dsts_);
    }
    info_.layers_saved = layer + 1;
    if (info_.stream_ordered && layer + 1 < layers_) {
      enqueue_device_load_locked(layer + 1, static_cast<int>(layer));
    }
    return;
  }
  info_.layers_saved = layer + 1;
  submit_save_locked(layer);
}

uint64_t Request::wait_save(void *stream) {
  std::unique_lock lock(mu_);
  if (!spec_.save) fail_order("wait_save");
  if (device()) refuse_capture(stream, "wait_save");
  if (save_done_) fail(SWIFTKV_ESTATE, "wait_save was already called for this request");
  if (info_.layers_saved != layers_) {
    fail(SWIFTKV_ESTATE, "wait_save with " + std::to_string(info_.layers_saved) + " of " +
                             std::to_string(layers_) + " layers saved");
  }
  cv_.wait(lock, [this] {
    return std::all_of(save_left_.begin(), save_left_.end(), [](uint32_t n) { return n == 0; });
  });
  save_done_ = true;
  lock.unlock();
  if (dev_) dev_->sync_saves();
  uint64_t saved = 0;
  for (auto &s : saves_) {
    s->published = true;  // publish() keeps or frees the slot either way
    try {
      const std::byte *staged = s->staging.empty() ? nullptr : s->staging.data();
      if (cache_.publish(s->key, s->meta, s->where, staged)) saved += chunk_tokens_;
    } catch (const Error &) {
      // An I/O error writing the chunk: it is not saved, and the engine loses nothing.
    }
  }
  if (saved != 0) cache_.after_stores(spec_.model);
  lock.lock();
  info_.saved_tokens = saved;
  return saved;
}

void Request::make_device_transfer() {
  const std::shared_ptr<DeviceLanes> &lanes = pool_->device_lanes();
  // A chunk in memory the pool's device reaches (its own, or a peer's) is copied in place by the
  // kernel; the rest (host memory, disk staging) goes through the staging buffers, laid out by
  // lay_out_staging below. A chunk decoded on the device stages its layer's payload.
  auto add = [&](DeviceSide &side, const std::vector<CopySegment> &plan, std::byte *mem,
                 int32_t mem_device, const ChunkMeta *encoded) {
    const auto chunk = static_cast<uint32_t>(side.chunks.size());
    ChunkSource src{0, 0, 0, 0};
    uint64_t layer_bytes = piece_bytes_;
    if (encoded != nullptr) {
      src.encoding = encoded->encoding & ~kEncodingLossy;
      layer_bytes = codec::layer_payload_bytes(side.shape, src.encoding);
      side.any_encoded = true;
    }
    if (encoded == nullptr && mem != nullptr && mem_device >= 0 &&
        reads_in_place(*lanes, mem_device)) {
      src.direct = reinterpret_cast<uint64_t>(mem);
    }
    side.chunks.push_back(src);
    side.layer_bytes.push_back(layer_bytes);
    static_assert(sizeof(CopySegment) == 3 * sizeof(uint64_t));
    append_copy_items(reinterpret_cast<const uint64_t *>(plan.data()), plan.size(), chunk,
                      side.items);
    side.items_before.push_back(static_cast<uint32_t>(side.items.size()));
  };
  // Staged pieces sit in staging in the order of their host addresses (copy_runs.hpp), each
  // aligned to 16: a run of chunks in consecutive host slots, whichever way round, is then one 2D
  // copy per layer. host[i]: chunk i's memory, null where it comes later (staged from disk).
  auto lay_out_staging = [](DeviceSide &side, const auto &host) {
    std::vector<const std::byte *> addresses;
    std::vector<uint64_t> sizes;
    std::vector<uint32_t> staged;
    for (uint32_t i = 0; i < side.chunks.size(); ++i) {
      if (side.chunks[i].direct != 0) continue;
      staged.push_back(i);
      addresses.push_back(host[i]);
      sizes.push_back(side.layer_bytes[i]);
    }
    std::vector<uint64_t> offsets(staged.size());
    side.staged_bytes =
        staging_by_address(addresses.data(), sizes.data(), staged.size(), offsets.data());
    for (size_t k = 0; k < staged.size(); ++k) side.chunks[staged[k]].staged_at = offsets[k];
  };
  DeviceSide load, save;
  std::vector<const std::byte *> host;
  for (const auto &l : loads_) {
    if (l->frame) load.shape = *l->frame;  // every chunk of the request is of its model
    add(load, l->plan, l->src, l->src_device, l->frame ? &l->use.meta : nullptr);
    host.push_back(l->src);
  }
  lay_out_staging(load, host);
  save_dsts_.clear();
  for (const auto &sc : saves_) {
    add(save, sc->plan, sc->staging.empty() ? sc->dst : nullptr, sc->slot_device, nullptr);
    save_dsts_.push_back(sc->dst);
  }
  lay_out_staging(save, save_dsts_);
  if (load.items.size() > UINT32_MAX || save.items.size() > UINT32_MAX) {
    fail_invalid("a request of more than 2^32 copy items");
  }
  dev_ = DeviceTransfer::create(lanes, layers_, piece_bytes_, std::move(load), std::move(save));
}

void Request::enqueue_device_loads_to_locked(uint32_t end) {
  while (device_loads_enqueued_ < end) enqueue_device_load_locked(device_loads_enqueued_++, -1);
}

// Enqueues the loads of one layer for the chunks still valid: disk chunks are staged (read and
// checked) first, on this thread if the early read has not finished; a lent chunk whose lease is
// gone, or a disk chunk that fails its check, ends the valid prefix there.
void Request::enqueue_device_load_locked(uint32_t layer, int after_save_layer) {
  if (loads_.empty()) {
    load_submitted_[layer] = true;
    if (++layers_load_done_ == layers_) load_scopes_.clear();
    return;
  }
  std::vector<const std::byte *> sources;
  sources.reserve(loads_.size());
  for (size_t i = 0; i < loads_.size() && i < first_failed_.load(); ++i) {
    LoadChunk &c = *loads_[i];
    // A frame's layers start after its header.
    const uint64_t skip = c.frame ? codec::kFrameHeaderBytes : 0;
    if (c.src == nullptr) {
      if (!stage(c)) {
        fail_chunk(i);
        break;
      }
      sources.push_back(c.staging.data() + skip);
    } else {
      if (lent(c.use.where.tier) && !cache_.readable(c.use.where)) {
        fail_chunk(i);
        break;
      }
      sources.push_back(c.src + skip);
    }
  }
  dev_->enqueue_load(layer, sources, static_cast<uint32_t>(sources.size()),
                     pool_->layout().layer_base[layer], after_save_layer);
  load_submitted_[layer] = true;
  if (++layers_load_done_ == layers_) load_scopes_.clear();
}

RequestInfo Request::info() const {
  std::lock_guard lock(mu_);
  return info_;
}

}  // namespace swiftkv
