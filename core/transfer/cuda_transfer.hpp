// The CUDA executor of the transfer engine for requests on a device pool.
//
// Per pool, DeviceLanes keeps what a request needs and reuses it: lanes (four streams, events
// per layer, staging and table buffers on the device, a page-locked upload buffer) and a cache of
// page-locked host buffers for chunks staged through the host (disk). A request takes a lane at
// begin and gives it back at its end, so in the steady state a request creates no stream or event
// and allocates no memory; its copy items and chunk table go up with one asynchronous copy.
//
// Per layer of a load: the pieces of the chunks that live in host memory are copied into one of
// two staging buffers on the load-copy stream (pieces in consecutive host slots as one 2D copy,
// copy_runs.hpp; the rest one copy per chunk, batched), and the scatter
// kernel runs on the load-kernel stream, reading device-resident chunks (peer or IPC-mapped lent
// memory) in place and the rest from staging. A chunk stored encoded (kivi or fp8) crosses the
// link compressed, its layer's payload only, and the decode kernel, after the scatter on the same
// stream, decodes it straight into the pages. Layer l+1's copy overlaps layer l's scatter; it
// waits only for the scatter of layer l-1, the last reader of its buffer. Saves mirror this: the
// gather kernel writes device-resident slots in place and the rest into staging, and the
// save-copy stream copies staging out. The load-kernel stream has the highest priority, which
// orders its kernels before the save's on the SMs; copy engines take DMA work in the order it was
// issued whatever the stream's priority.
//
// None of the calls may be captured into a CUDA graph: a call whose engine stream is capturing
// fails with EUNSUPPORTED and changes nothing (its waits would pull the library's streams into
// the capture, and a replayed graph would copy the chunks of another request).
//
// Two implementations: cuda_transfer.cu and cuda_transfer_nocuda.cpp (without CUDA: ENODEV). C++17,
// so that nvcc compiles it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/transfer/copy_items.hpp"

namespace swiftkv {

class DeviceLanes;

// A device pool's lanes and page-locked buffers (ENODEV without CUDA or for a device this
// process cannot use).
std::shared_ptr<DeviceLanes> make_device_lanes(int32_t device);
// Whether the lanes' device reads and writes memory of `memory_device` in place (the same device,
// or a peer it can access).
bool reads_in_place(DeviceLanes &lanes, int32_t memory_device);

// Page-locked host memory from a pool's cache, given back when destroyed. Empty by default.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(std::shared_ptr<DeviceLanes> owner, std::byte *p, uint64_t size) noexcept
      : owner_(std::move(owner)), p_(p), size_(size) {}
  PinnedBuffer(PinnedBuffer &&o) noexcept { swap(o); }
  PinnedBuffer &operator=(PinnedBuffer &&o) noexcept {
    PinnedBuffer(std::move(o)).swap(*this);
    return *this;
  }
  PinnedBuffer(const PinnedBuffer &) = delete;
  PinnedBuffer &operator=(const PinnedBuffer &) = delete;
  ~PinnedBuffer();
  std::byte *data() const noexcept { return p_; }
  uint64_t size() const noexcept { return size_; }

 private:
  void swap(PinnedBuffer &o) noexcept {
    std::swap(owner_, o.owner_);
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
  }
  std::shared_ptr<DeviceLanes> owner_;
  std::byte *p_ = nullptr;
  uint64_t size_ = 0;
};

// `bytes` of page-locked memory, from the cache when a buffer of that size is free.
PinnedBuffer take_pinned(const std::shared_ptr<DeviceLanes> &lanes, uint64_t bytes);

// One direction of a request: its copy items, items_before[i] = the items of chunks [0, i)
// (size: chunks + 1), where each chunk's piece is, and the staging its staged chunks need.
// Loads only: layer_bytes[i] is what a layer of chunk i's source holds (the piece, or an encoded
// chunk's layer payload: its source is a frame's payload, layer after layer), and `shape` the
// chunks' shape for the decode kernel.
struct DeviceSide {
  std::vector<CopyItem> items;
  std::vector<uint32_t> items_before{0};
  std::vector<ChunkSource> chunks;
  std::vector<uint64_t> layer_bytes;
  uint64_t staged_bytes = 0;
  codec::LayerShape shape{};
  bool any_encoded = false;
};

class DeviceTransfer {
 public:
  // Takes a lane of `lanes` (or makes one) and uploads both sides' tables.
  static std::unique_ptr<DeviceTransfer> create(const std::shared_ptr<DeviceLanes> &lanes,
                                                uint32_t layers, uint64_t piece_bytes,
                                                DeviceSide load, DeviceSide save);
  // Waits for everything enqueued, then gives the lane back.
  virtual ~DeviceTransfer() = default;

  // The scatters wait for what `stream` has enqueued so far (the pages' previous users).
  virtual void after(void *stream) = 0;
  // Enqueues layer `layer` of the first `chunks` load chunks: sources[i] + layer * layer_bytes[i]
  // is chunk i's piece (or encoded layer) for a staged chunk (host memory); a direct chunk's entry
  // is not read. With
  // after_save_layer >= 0 the scatter first waits for that layer's gather (stream pages). Layers
  // are enqueued in increasing order.
  virtual void enqueue_load(uint32_t layer, const std::vector<const std::byte *> &sources,
                            uint32_t chunks, std::byte *layer_base, int after_save_layer) = 0;
  // `stream` waits for layer's loads (enqueue only); sync_load waits on the host.
  virtual void stream_wait_load(uint32_t layer, void *stream) = 0;
  // `stream` waits for layer's gather (enqueue only): the engine is about to write the next
  // layer into stream pages that the gather reads.
  virtual void stream_wait_save(uint32_t layer, void *stream) = 0;
  virtual void sync_load(uint32_t layer) = 0;
  // After `stream`'s work so far (the engine wrote the layer's K/V): gathers every save chunk's
  // segments of the pages at `layer_base`, in place for a direct chunk, else through staging to
  // dsts[i] + layer * piece_bytes. Layers are enqueued in increasing order.
  virtual void enqueue_save(uint32_t layer, void *stream, const std::byte *layer_base,
                            const std::vector<std::byte *> &dsts) = 0;
  // Waits on the host for every save enqueued.
  virtual void sync_saves() = 0;
};

// The gather/scatter kernel alone, once, on `stream` of `device`, launched as `kernel` says:
// what a request does for one layer, with `items` and `chunks` in device memory. For benchmarks
// and tests of the kernel.
void launch_copy_items(int32_t device, const CopyItem *items, uint32_t n, const ChunkSource *chunks,
                       uint64_t layer_offset, std::byte *staging, std::byte *pages, bool scatter,
                       void *stream, CopyKernel kernel);

// The decode kernel alone, once, launched as `kernel` says: the items of encoded chunks
// (ChunkSource::encoding != 0) decoded from their layer payloads at staging + staged_at into
// `pages`. For benchmarks and tests.
void launch_decode_items(int32_t device, const CopyItem *items, uint32_t n,
                         const ChunkSource *chunks, const std::byte *staging, std::byte *pages,
                         const codec::LayerShape &shape, void *stream, CopyKernel kernel);

// EUNSUPPORTED when `stream` is capturing into a CUDA graph (see above); `call` names the call.
void refuse_capture(void *stream, const char *call);

}  // namespace swiftkv
