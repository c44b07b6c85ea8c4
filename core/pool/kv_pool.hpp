// An engine's KV page pool as the library sees it: a layout over per-layer tensors, either the
// engine's own (registered) or made by the library with stream pages aliased into every layer.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "core/common/unique_fd.hpp"
#include "core/memory/cuda_region.hpp"
#include "core/pool/page_layout.hpp"
#include "core/transfer/cuda_transfer.hpp"

namespace swiftkv {

// Immutable after construction (but for its device lanes, made at first use under a lock), so
// any thread may read it.
class KvPool {
 public:
  // An engine's tensors, checked against the model (EINVAL). The engine keeps the memory.
  KvPool(const ModelGeometry &g, PageLayout layout);
  // Library-made host memory: `regular` pages per layer, each layer its own memory, followed by
  // `stream` pages whose memory is one memfd range mapped into every layer at the same page
  // indices. The regular count is rounded up so that the stream pages start on a memory page
  // boundary (layout().stream_first says how many there are).
  static std::unique_ptr<KvPool> create_host(const ModelGeometry &g, uint32_t regular,
                                             uint32_t stream);
  // Library-made device memory on g.device: the same shape, the stream pages one VMM allocation
  // mapped into every layer (EUNSUPPORTED without VMM). The regular count is rounded up to whole
  // VMM granules.
  static std::unique_ptr<KvPool> create_device(const ModelGeometry &g, uint32_t regular,
                                               uint32_t stream);
  ~KvPool();
  KvPool(const KvPool &) = delete;
  KvPool &operator=(const KvPool &) = delete;

  const PageLayout &layout() const noexcept { return layout_; }
  const ModelGeometry &geometry() const noexcept { return geometry_; }
  bool owned() const noexcept { return fd_.get() >= 0 || device_memory_ != nullptr; }
  // A device pool's reusable CUDA objects for its requests' copies (cuda_transfer.hpp), made
  // at the first call; ENODEV without CUDA.
  const std::shared_ptr<DeviceLanes> &device_lanes() const;

 private:
  KvPool() = default;
  ModelGeometry geometry_;
  PageLayout layout_;
  UniqueFd fd_;                                   // the memfd of a library-made host pool
  std::unique_ptr<AliasedLayers> device_memory_;  // a library-made device pool's memory
  uint64_t mapped_bytes_ = 0;                     // reserved address range per layer
  mutable std::mutex lanes_mu_;
  mutable std::shared_ptr<DeviceLanes> lanes_;
};

}  // namespace swiftkv
