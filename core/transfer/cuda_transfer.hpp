// The CUDA executor of the transfer engine, for one request on a device pool: a load stream (high
// priority, which orders its kernels before the save's on the SMs but does not reorder copy-engine
// work) and a save stream, a staging buffer each, an event per layer each. Per layer, each
// chunk's layer piece is one contiguous cudaMemcpyAsync (host, disk-staged or lent memory to
// staging, or back) and one gather/scatter kernel moves every chunk's segments between staging
// and the pages: never one copy per page. Two twins: cuda_transfer.cu and cuda_transfer_host.cpp
// (without CUDA: ENODEV). C++17, so that nvcc compiles the twin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace swiftkv {

// A CopySegment whose piece_offset counts from the start of a layer's staging buffer (chunk i's
// piece at i * piece_bytes).
struct StagedSegment {
  uint64_t page_offset;
  uint64_t piece_offset;
  uint64_t bytes;
};

class DeviceTransfer {
 public:
  // load_prefix[i]: the segments of load chunks [0, i) (size: load chunks + 1); likewise
  // save_prefix. Allocates the staging buffers and uploads the segments once.
  static std::unique_ptr<DeviceTransfer> create(int32_t device, uint32_t layers,
                                                uint64_t piece_bytes,
                                                const std::vector<StagedSegment> &load_segments,
                                                const std::vector<uint32_t> &load_prefix,
                                                const std::vector<StagedSegment> &save_segments,
                                                const std::vector<uint32_t> &save_prefix);
  // Waits for everything enqueued, then frees.
  virtual ~DeviceTransfer() = default;

  // The load stream waits for what `stream` has enqueued so far (the pages' previous users).
  virtual void after(void *stream) = 0;
  // Enqueues layer `layer` of the first `chunks` load chunks: sources[i] + layer * piece_bytes
  // to staging (any memory, UVA), then the scatter into the pages at `layer_base`. With
  // after_save_layer >= 0 the load stream first waits for that layer's save (stream pages).
  virtual void enqueue_load(uint32_t layer, const std::vector<const std::byte *> &sources,
                            uint32_t chunks, std::byte *layer_base, int after_save_layer) = 0;
  // `stream` waits for layer's loads (enqueue only); sync_load waits on the host.
  virtual void stream_wait_load(uint32_t layer, void *stream) = 0;
  virtual void sync_load(uint32_t layer) = 0;
  // After `stream`'s work so far (the engine wrote the layer's K/V): gathers the save chunks'
  // segments of the pages at `layer_base` into staging, then staging piece i to
  // dsts[i] + layer * piece_bytes.
  virtual void enqueue_save(uint32_t layer, void *stream, const std::byte *layer_base,
                            const std::vector<std::byte *> &dsts) = 0;
  // Waits on the host for every save enqueued.
  virtual void sync_saves() = 0;
};

}  // namespace swiftkv
