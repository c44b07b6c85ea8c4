// One engine request through the connector: which cached chunks it loads into which pages,
// layer by layer, and which new chunks it saves out of its pages, and the order rules between
// them (stream pages: the load of layer l+1 waits for the save of layer l out of the same pages).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/common/nontemporal_copy.hpp"
#include "core/pool/kv_pool.hpp"
#include "core/tiers/chunk_cache.hpp"
#include "core/transfer/copy_plan.hpp"
#include "core/transfer/cpu_executor.hpp"
#include "core/transfer/cuda_transfer.hpp"

namespace swiftkv {

struct RequestInfo {
  uint64_t load_begin = 0;      // first token loaded (load_from, a block boundary)
  uint64_t load_end = 0;        // end of the cached run found at begin
  uint64_t valid_end = 0;       // [load_begin, valid_end) was loaded intact in every layer so far
  uint64_t save_tokens = 0;     // tokens in the chunks this request will save
  uint64_t saved_tokens = 0;    // tokens in the chunks stored by wait_save
  uint32_t layers_loaded = 0;   // layers the engine has waited for
  uint32_t layers_saved = 0;    // layers the engine has handed to save_layer
  bool stream_ordered = false;  // stream pages are loaded or saved: layer l+1 after the save of l
};

// What a request is asked to do. `pages[b]` is the pool page of tokens [b*B, (b+1)*B).
struct RequestSpec {
  ChunkKey model;
  std::vector<ChunkKey> keys;  // of the full chunks of the tokens
  std::vector<int32_t> pages;  // checked by the caller: in range, distinct, enough of them
  uint64_t n_tokens = 0;
  uint64_t load_from = 0;  // a block boundary: the pages before it are the engine's
  // The request's shape: both (the engine's per-layer loop), loads only (the cached prefix into
  // the pages, nothing saved) or saves only (pages the engine computed, nothing loaded). A
  // shape without one half cannot use stream pages (no call says when a layer is done with).
  bool load = true;
  bool save = true;
};

// The call order is the engine's loop: start_load, then per layer wait_layer_load(l) and
// save_layer(l), then wait_save. A load-only request is start_load, then wait_layer_load(l) for
// each layer; a save-only one save_layer(l) for each layer, then wait_save. A call out of order,
// or of the half a shape lacks, throws Error(ESTATE) and changes nothing.
// Thread-safe: mu_ guards the per-layer counters and the call state; tasks on the executor touch
// only their own chunk's fields and report through mu_. The destructor waits for every task.
//
// A pool on a device runs its copies on a DeviceTransfer instead of the CPU executor: the calls
// take the engine's CUDA stream and only enqueue (wait_layer_load waits on the host only when
// the layer read lent memory, whose lease is checked again after the copy; wait_save waits for
// the saves). On the host the stream must be null.
class Request {
 public:
  Request(ChunkCache &cache, CpuExecutor &exec, std::shared_ptr<const KvPool> pool,
          RequestSpec spec);
  ~Request();
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;

  void start_load(void *stream = nullptr);
  // Layer l is in the pages (host: blocks until it is; device: `stream` waits for it); returns
  // valid_end.
  // check_capture false: the caller has checked that `stream` is not capturing (a batch).
  uint64_t wait_layer_load(uint32_t layer, void *stream = nullptr, bool check_capture = true);
  void save_layer(uint32_t layer, void *stream = nullptr, bool check_capture = true);
  // What wait_layer_load(layer) or save_layer(layer) would throw for its arguments and order,
  // without doing anything: a batch checks every request before it changes any.
  void check_wait_layer_load(uint32_t layer) const;
  void check_save_layer(uint32_t layer) const;
  // Every layer is saved (waits), then the whole chunks become visible; returns saved tokens.
  uint64_t wait_save(void *stream = nullptr);
  RequestInfo info() const;
  const KvPool &pool() const noexcept { return *pool_; }

 private:
  // A chunk's bytes in host memory on their way to or from the disk (or, for a host pool, lent
  // device memory): page-locked from the pool's cache when the pool is on a device, so that its
  // copies are asynchronous, else a plain vector.
  class HostBytes {
   public:
    void allocate(uint64_t bytes, const KvPool &pool);
    std::byte *data() noexcept {
      return pinned_.data() != nullptr ? pinned_.data() : plain_.data();
    }
    bool empty() const noexcept { return pinned_.data() == nullptr && plain_.empty(); }
    void clear() noexcept {
      pinned_ = PinnedBuffer();
      plain_ = std::vector<std::byte>();
    }

   private:
    std::vector<std::byte> plain_;
    PinnedBuffer pinned_;
  };
  // A chunk this request loads. It holds the chunk's read (its copy cannot be freed) for as
  // long as it lives: the read ends in its destructor.
  struct LoadChunk {
    LoadChunk(ChunkCache &c, const ChunkKey &k, const ChunkUse &u) : cache(c), key(k), use(u) {}
    ~LoadChunk() { cache.end_read(key); }
    LoadChunk(const LoadChunk &) = delete;
    LoadChunk &operator=(const LoadChunk &) = delete;
    ChunkCache &cache;
    ChunkKey key;
    ChunkUse use;
    std::vector<CopySegment> plan;
    std::byte *src = nullptr;  // the chunk's bytes in memory, or nullptr (disk: staged)
    int32_t src_device = -1;
    // A device pool's chunk stored kivi or fp8: it goes to the device as its frame (src, or the
    // staging, holds the frame) and is decoded there, layer by layer.
    std::optional<codec::LayerShape> frame;
    std::mutex stage_mu;  // guards staging, staged, stage_failed
    HostBytes staging;
    bool staged = false, stage_failed = false;
  };
  // A chunk this request saves, into a reserved slot that it releases when it goes unless the
  // slot was handed to publish().
  struct SaveChunk {
    SaveChunk(ChunkCache &c, const ChunkKey &k, const ChunkMeta &m, SlotRef w)
        : cache(c), key(k), meta(m), where(w) {}
    ~SaveChunk() {
      if (!published) cache.release_slot(where, meta);
    }
    SaveChunk(const SaveChunk &) = delete;
    SaveChunk &operator=(const SaveChunk &) = delete;
    ChunkCache &cache;
    ChunkKey key;
    ChunkMeta meta;
    SlotRef where;
    std::vector<CopySegment> plan;
    std::byte *dst = nullptr;  // the slot's bytes, or the staging buffer (disk)
    int32_t slot_device = -1;  // the device of the slot's memory, -1: host
    HostBytes staging;
    bool published = false;
  };

  // The constructor's stages, in order.
  void hold_loads(const GeometrySizes &sizes);
  void reserve_saves(const GeometrySizes &sizes);
  void check_stream_pages() const;
  void start_disk_reads();
  // The copy plan of chunk c between its pages and a chunk's bytes; notes stream pages.
  // Chunk c's segments, from token first_token of the chunk on.
  std::vector<CopySegment> plan_for(size_t c, uint32_t first_token = 0);

  void submit_load_locked(uint32_t layer);
  void submit_save_locked(uint32_t layer);
  // Whether a layer's copies of `chunks` chunks go around the cache: as host_stores_ says, and
  // under `auto` where nontemporal_pays for one copy thread's share of them (of every layer's,
  // in a load-only or save-only request).
  bool layer_nontemporal(size_t chunks) const noexcept;
  // How many of a layer's chunks one copy task takes (kTaskBytes of copying, at least one
  // task per executor thread).
  size_t chunks_per_task(size_t chunks) const noexcept;
  static constexpr uint64_t kTaskBytes = 512 << 10;
  void load_task(uint32_t layer, size_t i, bool nontemporal);
  bool stage(LoadChunk &c);
  // stage() for several chunks at once: those one lender holds are read in one batch.
  void stage_many(std::span<LoadChunk *const> chunks);
  void task_done(bool load, uint32_t layer);
  void fail_chunk(size_t i);
  void check_layer(uint32_t layer) const;  // EINVAL past the model's layers
  void check_wait_layer_load_locked(uint32_t layer) const;
  void check_save_layer_locked(uint32_t layer) const;
  // The ESTATE message of a call out of order: what came, the order, what is due next.
  [[noreturn]] void fail_order(const std::string &call) const;
  // The device path.
  void make_device_transfer();
  void enqueue_device_load_locked(uint32_t layer, int after_save_layer);
  // Enqueues the device loads of layers device_loads_enqueued_ .. end - 1, in order.
  void enqueue_device_loads_to_locked(uint32_t end);
  // How many layers' device loads are enqueued ahead of the one the engine waits for.
  static constexpr uint32_t kDeviceLoadsAhead = 2;
  bool device() const noexcept { return pool_->layout().device >= 0; }

  ChunkCache &cache_;
  CpuExecutor &exec_;
  const std::shared_ptr<const KvPool> pool_;
  const RequestSpec spec_;
  uint64_t piece_bytes_ = 0;
  HostStores host_stores_ = HostStores::automatic;  // SWIFTKV_HOST_STORES at begin (host pools)
  uint64_t chunk_tokens_ = 0;
  uint32_t layers_ = 0;
  // Declared before dev_, so that they go after it (its copies read held chunks and write
  // reserved slots), also when the constructor throws.
  std::vector<std::unique_ptr<LoadChunk>> loads_;
  std::vector<std::unique_ptr<SaveChunk>> saves_;
  std::vector<std::unique_ptr<ChunkCache::LoadScope>> load_scopes_;  // while loads are pending
  std::atomic<size_t> first_failed_{SIZE_MAX};  // loads stop at the first chunk that failed
  // A device pool's executor; none when the request copies nothing.
  std::unique_ptr<DeviceTransfer> dev_;
  std::vector<std::byte *> save_dsts_;  // each save chunk's dst, for dev_
  bool peer_loads_ = false;             // some load reads lent memory

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> load_left_, save_left_;  // copy tasks outstanding per layer
  std::vector<bool> load_submitted_;
  uint32_t layers_load_done_ = 0;  // layers whose loads all finished
  uint64_t tasks_in_flight_ = 0;
  bool started_ = false, save_done_ = false;
  // Device loads not ordered by stream pages: layers below this are enqueued. start_load
  // enqueues the first kDeviceLoadsAhead (every layer when nothing is copied), each
  // wait_layer_load(l) up to l + kDeviceLoadsAhead.
  uint32_t device_loads_enqueued_ = 0;
  RequestInfo info_;
};

}  // namespace swiftkv
