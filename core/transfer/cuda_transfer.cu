// The CUDA executor of the transfer engine (see cuda_transfer.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/memory/cuda_check.hpp"
#include "core/transfer/copy_runs.hpp"
#include "core/transfer/cuda_transfer.hpp"
#if defined(SWIFTKV_TRANSFER_EMULATION)
// Built on the host against tests/emu/runtime (the runtime's streams as threads): the kernels
// run in their CPU emulation, launched through transfer_emulation::launch_*.
#include "transfer_kernels_emu.hpp"
#else
#include "kernels/segment_copy.cuh"
#endif

namespace swiftkv {

namespace {

// Page-locked host buffers kept for reuse beyond this are freed.
constexpr uint64_t kPinnedCacheBytes = uint64_t{2} << 30;

// Device memory that only grows. Grown only while its lane is idle (cudaFree waits for the
// device), so in the steady state nothing is allocated.
struct DeviceBuffer {
  unsigned char *p = nullptr;
  uint64_t size = 0;
  void ensure(uint64_t bytes, const char *what) {
    if (bytes <= size) return;
    release();
    check_cuda(cudaMalloc(&p, bytes), std::string("cudaMalloc (") + what + ")");
    size = bytes;
  }
  void release() noexcept {
    if (p != nullptr) (void)cudaFree(p);
    p = nullptr;
    size = 0;
  }
};

void record(cudaEvent_t e, cudaStream_t s) { check_cuda(cudaEventRecord(e, s), "cudaEventRecord"); }
void wait(cudaStream_t s, cudaEvent_t e) {
  check_cuda(cudaStreamWaitEvent(s, e, 0), "cudaStreamWaitEvent");
}

uint64_t round16(uint64_t n) { return (n + 15) / 16 * 16; }

// One warp per unit of work (an item, or a group of them); at most 8 blocks of 256 threads per SM
// are resident, so a larger grid only queues blocks that the grid-stride loop covers anyway.
unsigned grid_for(int sms, uint32_t n) {
  const uint64_t want = (uint64_t{n} + kernels::kCopyWarps - 1) / kernels::kCopyWarps;
  return static_cast<unsigned>(
      std::min<uint64_t>(want, static_cast<uint64_t>(std::max(sms, 1)) * 8));
}

// How the gather/scatter kernel is launched on one device (CopyKernel, copy_items.hpp). The
// device's figures are asked once per device and process (the occupancy query is not free, and
// launch_copy_items runs inside the benchmark's timed region).
struct CopyLaunch {
  CopyKernel kernel = CopyKernel::spread;
  int sms = 1;
  unsigned resident_blocks = 1;  // blocks of copy_items_ahead the device holds at once

  // Under a DeviceGuard of `device`.
  CopyLaunch(int32_t device, CopyKernel k) : kernel(k) {
    static std::mutex mu;
    static std::map<int32_t, std::pair<int, unsigned>> known;  // device -> (sms, resident)
    std::lock_guard lock(mu);
    auto it = known.find(device);
    if (it == known.end()) {
      int n = 0, per_sm = 0;
      check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                 "cudaDeviceGetAttribute (SM count)");
      check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernels::copy_items_ahead,
                                                               kernels::kCopyThreads, 0),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor (the gather/scatter kernel)");
      n = std::max(n, 1);
      it =
          known.emplace(device, std::pair{n, static_cast<unsigned>(n * std::max(per_sm, 1))}).first;
    }
    sms = it->second.first;
    resident_blocks = it->second.second;
  }
};

void launch_kernel(const CopyLaunch &how, const CopyItem *items, uint32_t n,
                   const ChunkSource *chunks, uint64_t layer_offset, unsigned char *staging,
                   unsigned char *pages, bool scatter, cudaStream_t s) {
  if (n == 0) return;
  const bool ahead = how.kernel == CopyKernel::ahead;
  const uint64_t want = (uint64_t{n} + kernels::kCopyWarps - 1) / kernels::kCopyWarps;
  const unsigned grid = ahead ? static_cast<unsigned>(std::min<uint64_t>(want, how.resident_blocks))
                              : grid_for(how.sms, n);
#if defined(SWIFTKV_TRANSFER_EMULATION)
  transfer_emulation::launch_copy(ahead, grid, items, n, chunks, layer_offset, staging, pages,
                                  scatter, s);
#else
  if (ahead) {
    kernels::copy_items_ahead<<<grid, kernels::kCopyThreads, 0, s>>>(
        items, n, chunks, layer_offset, staging, pages, scatter ? 1 : 0);
  } else {
    kernels::copy_items<<<grid, kernels::kCopyThreads, 0, s>>>(items, n, chunks, layer_offset,
                                                               staging, pages, scatter ? 1 : 0);
  }
#endif
  check_cuda(cudaGetLastError(), "the gather/scatter kernel launch");
}

void launch_decode_kernel(const CopyLaunch &how, const CopyItem *items, uint32_t n,
                          const ChunkSource *chunks, const unsigned char *staging,
                          unsigned char *pages, const codec::LayerShape &shape, cudaStream_t s) {
  if (n == 0) return;
  const bool ahead = how.kernel == CopyKernel::ahead;
  const unsigned grid = grid_for(how.sms, n);
#if defined(SWIFTKV_TRANSFER_EMULATION)
  transfer_emulation::launch_decode(ahead, grid, items, n, chunks, staging, pages, shape, s);
#else
  if (ahead) {
    kernels::decode_items_ahead<<<grid, kernels::kCopyThreads, 0, s>>>(items, n, chunks, staging,
                                                                       pages, shape);
  } else {
    kernels::decode_items<<<grid, kernels::kCopyThreads, 0, s>>>(items, n, chunks, staging, pages,
                                                                 shape);
  }
#endif
  check_cuda(cudaGetLastError(), "the decode kernel launch");
}

}  // namespace

// One request's CUDA objects at a time; see cuda_transfer.hpp.
struct CopyLane {
  cudaStream_t load_copy = nullptr, load_kernel = nullptr, save_kernel = nullptr,
               save_copy = nullptr;
  cudaEvent_t engine = nullptr, uploaded = nullptr;
  // Per layer: the scatter done (the layer is loaded), the staged pieces copied in, the gather
  // done (the pages were read), the staged pieces copied out.
  std::vector<cudaEvent_t> loaded, copied, gathered, saved;
  DeviceBuffer load_staging[2], save_staging[2], tables;
  std::byte *upload = nullptr;  // page-locked
  uint64_t upload_size = 0;
  bool batch_ok = true;
  std::vector<PieceCopy> copies;  // scratch for copy_pieces
  std::vector<CopyRun> runs;
  std::vector<uint32_t> order;
  std::vector<void *> dst;
  std::vector<const void *> src;
  std::vector<size_t> sizes;

  explicit CopyLane(int lo_priority, int hi_priority) {
    try {
      auto stream = [](cudaStream_t *s, int priority) {
        check_cuda(cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, priority),
                   "cudaStreamCreateWithPriority");
      };
      stream(&load_copy, hi_priority);
      stream(&load_kernel, hi_priority);
      stream(&save_kernel, lo_priority);
      stream(&save_copy, lo_priority);
      check_cuda(cudaEventCreateWithFlags(&engine, cudaEventDisableTiming), "cudaEventCreate");
      check_cuda(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming), "cudaEventCreate");
    } catch (...) {
      destroy();
      throw;
    }
  }
  ~CopyLane() { destroy(); }
  CopyLane(const CopyLane &) = delete;
  CopyLane &operator=(const CopyLane &) = delete;

  void ensure_layers(uint32_t layers) {
    for (std::vector<cudaEvent_t> *v : {&loaded, &copied, &gathered, &saved}) {
      while (v->size() < layers) {
        cudaEvent_t e = nullptr;
        check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
        v->push_back(e);
      }
    }
  }
  void ensure_upload(uint64_t bytes) {
    if (bytes <= upload_size) return;
    if (upload != nullptr) (void)cudaFreeHost(upload);
    upload = nullptr;
    upload_size = 0;
    check_cuda(cudaMallocHost(&upload, bytes), "cudaMallocHost (copy tables)");
    upload_size = bytes;
  }
  // Waits for everything on the lane; false after a device error.
  bool drain() noexcept {
    bool ok = true;
    for (cudaStream_t s : {load_copy, load_kernel, save_kernel, save_copy}) {
      if (s != nullptr && cudaStreamSynchronize(s) != cudaSuccess) ok = false;
    }
    if (!ok) (void)cudaGetLastError();
    return ok;
  }
  void destroy() noexcept {
    drain();
    for (std::vector<cudaEvent_t> *v : {&loaded, &copied, &gathered, &saved}) {
      for (cudaEvent_t e : *v) (void)cudaEventDestroy(e);
      v->clear();
    }
    for (cudaEvent_t *e : {&engine, &uploaded}) {
      if (*e != nullptr) (void)cudaEventDestroy(*e);
      *e = nullptr;
    }
    for (cudaStream_t *s : {&load_copy, &load_kernel, &save_kernel, &save_copy}) {
      if (*s != nullptr) (void)cudaStreamDestroy(*s);
      *s = nullptr;
    }
    for (DeviceBuffer *b :
         {&load_staging[0], &load_staging[1], &save_staging[0], &save_staging[1], &tables}) {
      b->release();
    }
    if (upload != nullptr) (void)cudaFreeHost(upload);
    upload = nullptr;
  }
};

class DeviceLanes {
 public:
  explicit DeviceLanes(int32_t device)
      : device_(device), copy_(make_launch(device, copy_kernel_choice())) {
    DeviceGuard guard(device_);
    check_cuda(cudaDeviceGetStreamPriorityRange(&lo_, &hi_), "cudaDeviceGetStreamPriorityRange");
  }
  ~DeviceLanes() {
    try {
      DeviceGuard guard(device_);
      free_.clear();
      for (auto &[size, p] : pinned_free_) (void)cudaFreeHost(p);
    } catch (...) {
      // The device is gone: what it held goes with the process.
    }
  }
  DeviceLanes(const DeviceLanes &) = delete;
  DeviceLanes &operator=(const DeviceLanes &) = delete;

  int32_t device() const noexcept { return device_; }
  const CopyLaunch &copy_launch() const noexcept { return copy_; }

  // Under a DeviceGuard of the device.
  std::unique_ptr<CopyLane> take() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        std::unique_ptr<CopyLane> l = std::move(free_.back());
        free_.pop_back();
        return l;
      }
    }
    return std::make_unique<CopyLane>(lo_, hi_);
  }
  void give(std::unique_ptr<CopyLane> lane) noexcept {
    std::lock_guard lock(mu_);
    try {
      free_.push_back(std::move(lane));
    } catch (...) {
      // No memory to keep it: destroyed here.
    }
  }

  std::byte *take_pinned(uint64_t bytes) {
    {
      std::lock_guard lock(mu_);
      auto it = pinned_free_.lower_bound(bytes);
      if (it != pinned_free_.end() && it->first <= 2 * bytes) {
        std::byte *p = it->second;
        pinned_cached_ -= it->first;
        pinned_free_.erase(it);
        return p;
      }
    }
    DeviceGuard guard(device_);
    void *p = nullptr;
    check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc (staging)");
    std::lock_guard lock(mu_);
    try {
      pinned_alloc_[static_cast<std::byte *>(p)] = bytes;
    } catch (...) {
      (void)cudaFreeHost(p);
      throw;
    }
    return static_cast<std::byte *>(p);
  }
  void give_pinned(std::byte *p) noexcept {
    std::lock_guard lock(mu_);
    auto it = pinned_alloc_.find(p);
    if (it == pinned_alloc_.end()) return;
    const uint64_t size = it->second;
    if (pinned_cached_ + size <= kPinnedCacheBytes) {
      try {
        pinned_free_.emplace(size, p);
        pinned_cached_ += size;
        return;
      } catch (...) {
        // Freed below.
      }
    }
    pinned_alloc_.erase(it);
    (void)cudaFreeHost(p);
  }

  bool reads_in_place(int32_t memory_device) {
    if (memory_device == device_) return true;
    if (memory_device < 0) return false;
    std::lock_guard lock(mu_);
    auto it = peer_.find(memory_device);
    if (it != peer_.end()) return it->second;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device_, memory_device) != cudaSuccess) {
      (void)cudaGetLastError();
      can = 0;
    }
    peer_[memory_device] = can != 0;
    return can != 0;
  }

 private:
  static CopyLaunch make_launch(int32_t device, CopyKernel kernel) {
    DeviceGuard guard(device);
    return CopyLaunch(device, kernel);
  }

  const int32_t device_;
  const CopyLaunch copy_;  // SWIFTKV_COPY_KERNEL, read as the lanes are made
  int lo_ = 0, hi_ = 0;
  std::mutex mu_;
  std::vector<std::unique_ptr<CopyLane>> free_;
  std::multimap<uint64_t, std::byte *> pinned_free_;  // by allocated size
  std::map<std::byte *, uint64_t> pinned_alloc_;      // every buffer: its allocated size
  uint64_t pinned_cached_ = 0;
  std::map<int32_t, bool> peer_;
};

std::shared_ptr<DeviceLanes> make_device_lanes(int32_t device) {
  check_device(device);
  return std::make_shared<DeviceLanes>(device);
}

bool reads_in_place(DeviceLanes &lanes, int32_t memory_device) {
  return lanes.reads_in_place(memory_device);
}

PinnedBuffer::~PinnedBuffer() {
  if (p_ != nullptr) owner_->give_pinned(p_);
}

PinnedBuffer take_pinned(const std::shared_ptr<DeviceLanes> &lanes, uint64_t bytes) {
  if (bytes == 0) return {};
  return PinnedBuffer(lanes, lanes->take_pinned(bytes), bytes);
}

void refuse_capture(void *stream, const char *call) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status),
             "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusNone) {
    fail(SWIFTKV_EUNSUPPORTED,
         std::string(call) +
             " on a stream that is capturing a CUDA graph: the connector's calls "
             "cannot be captured (each request copies its own chunks); call them "
             "outside the capture");
  }
}

namespace {

class CudaTransfer final : public DeviceTransfer {
 public:
  CudaTransfer(std::shared_ptr<DeviceLanes> lanes, uint32_t layers, uint64_t piece_bytes,
               DeviceSide load, DeviceSide save)
      : lanes_(std::move(lanes)),
        piece_bytes_(piece_bytes),
        load_(std::move(load)),
        save_(std::move(save)) {
    DeviceGuard guard(lanes_->device());
    lane_ = lanes_->take();
    try {
      CopyLane &l = *lane_;
      l.ensure_layers(layers);
      for (int b = 0; b < 2; ++b) {
        if (load_.staged_bytes != 0) l.load_staging[b].ensure(load_.staged_bytes, "staging");
        if (save_.staged_bytes != 0) l.save_staging[b].ensure(save_.staged_bytes, "staging");
      }
      // The four tables in one buffer, one asynchronous copy from page-locked memory.
      const uint64_t sizes[4] = {round16(load_.items.size() * sizeof(CopyItem)),
                                 round16(load_.chunks.size() * sizeof(ChunkSource)),
                                 round16(save_.items.size() * sizeof(CopyItem)),
                                 round16(save_.chunks.size() * sizeof(ChunkSource))};
      const uint64_t total = sizes[0] + sizes[1] + sizes[2] + sizes[3];
      if (total != 0) {
        l.tables.ensure(total, "copy tables");
        l.ensure_upload(total);
        const void *from[4] = {load_.items.data(), load_.chunks.data(), save_.items.data(),
                               save_.chunks.data()};
        const uint64_t used[4] = {
            load_.items.size() * sizeof(CopyItem), load_.chunks.size() * sizeof(ChunkSource),
            save_.items.size() * sizeof(CopyItem), save_.chunks.size() * sizeof(ChunkSource)};
        uint64_t at = 0;
        for (int i = 0; i < 4; ++i) {
          if (used[i] != 0) std::memcpy(l.upload + at, from[i], used[i]);
          table_at_[i] = at;
          at += sizes[i];
        }
        check_cuda(
            cudaMemcpyAsync(l.tables.p, l.upload, total, cudaMemcpyHostToDevice, l.load_kernel),
            "cudaMemcpyAsync (copy tables)");
        record(l.uploaded, l.load_kernel);
        wait(l.save_kernel, l.uploaded);
      }
    } catch (...) {
      give_back();
      throw;
    }
  }

  ~CudaTransfer() override {
    try {
      DeviceGuard guard(lanes_->device());
      give_back();
    } catch (...) {
      // The device is gone (a sticky error): the lane is destroyed with this object.
    }
  }

  void after(void *stream) override {
    DeviceGuard guard(lanes_->device());
    CopyLane &l = *lane_;
    record(l.engine, static_cast<cudaStream_t>(stream));
    wait(l.load_kernel, l.engine);
  }

  void enqueue_load(uint32_t layer, const std::vector<const std::byte *> &sources, uint32_t chunks,
                    std::byte *layer_base, int after_save_layer) override {
    DeviceGuard guard(lanes_->device());
    CopyLane &l = *lane_;
    const int b = static_cast<int>(layer % 2);
    l.copies.clear();
    for (uint32_t i = 0; i < chunks; ++i) {
      const ChunkSource &c = load_.chunks[i];
      if (c.direct != 0) continue;
      l.copies.push_back({reinterpret_cast<std::byte *>(l.load_staging[b].p) + c.staged_at,
                          sources[i] + uint64_t{layer} * load_.layer_bytes[i],
                          load_.layer_bytes[i]});
    }
    if (!l.copies.empty()) {
      // The buffer's last reader was the scatter of layer - 2.
      if (layer >= 2) wait(l.load_copy, l.loaded[layer - 2]);
      copy_pieces(l.load_copy);
      record(l.copied[layer], l.load_copy);
      wait(l.load_kernel, l.copied[layer]);
    }
    if (after_save_layer >= 0) wait(l.load_kernel, l.gathered[after_save_layer]);
    launch(0, load_.items_before[chunks], uint64_t{layer} * piece_bytes_, l.load_staging[b].p,
           reinterpret_cast<unsigned char *>(layer_base), true, l.load_kernel);
    if (load_.any_encoded) {
      launch_decode(load_.items_before[chunks], l.load_staging[b].p,
                    reinterpret_cast<unsigned char *>(layer_base), l.load_kernel);
    }
    record(l.loaded[layer], l.load_kernel);
  }

  void stream_wait_load(uint32_t layer, void *stream) override {
    DeviceGuard guard(lanes_->device());
    wait(static_cast<cudaStream_t>(stream), lane_->loaded[layer]);
  }

  void stream_wait_save(uint32_t layer, void *stream) override {
    DeviceGuard guard(lanes_->device());
    wait(static_cast<cudaStream_t>(stream), lane_->gathered[layer]);
  }

  void sync_load(uint32_t layer) override {
    DeviceGuard guard(lanes_->device());
    check_cuda(cudaEventSynchronize(lane_->loaded[layer]), "cudaEventSynchronize");
  }

  void enqueue_save(uint32_t layer, void *stream, const std::byte *layer_base,
                    const std::vector<std::byte *> &dsts) override {
    DeviceGuard guard(lanes_->device());
    CopyLane &l = *lane_;
    const int b = static_cast<int>(layer % 2);
    record(l.engine, static_cast<cudaStream_t>(stream));
    wait(l.save_kernel, l.engine);
    const bool staged = save_.staged_bytes != 0;
    // The buffer's last reader was the copy out of layer - 2.
    if (staged && layer >= 2) wait(l.save_kernel, l.saved[layer - 2]);
    launch(2, save_.items_before.back(), uint64_t{layer} * piece_bytes_, l.save_staging[b].p,
           const_cast<unsigned char *>(reinterpret_cast<const unsigned char *>(layer_base)), false,
           l.save_kernel);
    record(l.gathered[layer], l.save_kernel);
    if (!staged) return;
    wait(l.save_copy, l.gathered[layer]);
    l.copies.clear();
    for (size_t i = 0; i < save_.chunks.size(); ++i) {
      const ChunkSource &c = save_.chunks[i];
      if (c.direct != 0) continue;
      l.copies.push_back({dsts[i] + uint64_t{layer} * piece_bytes_,
                          reinterpret_cast<const std::byte *>(l.save_staging[b].p) + c.staged_at,
                          piece_bytes_});
    }
    copy_pieces(l.save_copy);
    record(l.saved[layer], l.save_copy);
  }

  void sync_saves() override {
    DeviceGuard guard(lanes_->device());
    check_cuda(cudaStreamSynchronize(lane_->save_kernel), "cudaStreamSynchronize");
    check_cuda(cudaStreamSynchronize(lane_->save_copy), "cudaStreamSynchronize");
  }

 private:
  // Once its work is done the lane serves the next request; after a device error it is
  // destroyed with this object instead.
  void give_back() noexcept {
    if (lane_->drain()) lanes_->give(std::move(lane_));
  }

  // The lane's copies: each run of pieces a chunk apart in host memory and side by side in
  // staging as one 2D copy (copy_runs.hpp), the rest in a single batched call where the runtime
  // has one (the driver then picks the copy engines), else one cudaMemcpyAsync each.
  void copy_pieces(cudaStream_t s) {
    CopyLane &l = *lane_;
    if (l.copies.empty()) return;
    copy_runs(l.copies.data(), l.copies.size(), l.runs, l.order);
    l.dst.clear();
    l.src.clear();
    l.sizes.clear();
    for (const CopyRun &r : l.runs) {
      if (r.rows > 1) {
        if (cudaMemcpy2DAsync(r.dst, r.dst_pitch, r.src, r.src_pitch, r.width, r.rows,
                              cudaMemcpyDefault, s) == cudaSuccess) {
          continue;
        }
        (void)cudaGetLastError();  // refused (a pitch past the device's limit): row by row
      }
      for (uint64_t row = 0; row < r.rows; ++row) {
        l.dst.push_back(r.dst + row * r.dst_pitch);
        l.src.push_back(r.src + row * r.src_pitch);
        l.sizes.push_back(r.width);
      }
    }
    if (l.dst.empty()) return;
#if CUDART_VERSION >= 13000
    if (l.batch_ok) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      const cudaError_t err = cudaMemcpyBatchAsync(l.dst.data(), l.src.data(), l.sizes.data(),
                                                   l.dst.size(), &attr, &first, 1, s);
      if (err == cudaSuccess) return;
      // A driver without batched copies: the plain path from now on.
      (void)cudaGetLastError();
      l.batch_ok = false;
    }
#endif
    for (size_t i = 0; i < l.dst.size(); ++i) {
      check_cuda(cudaMemcpyAsync(l.dst[i], l.src[i], l.sizes[i], cudaMemcpyDefault, s),
                 "cudaMemcpyAsync (a chunk's layer piece)");
    }
  }

  // table 0: the load side's items (its chunks at table 1); 2: the save side's.
  void launch(int table, uint32_t n, uint64_t layer_offset, unsigned char *staging,
              unsigned char *pages, bool scatter, cudaStream_t s) {
    const auto *items = reinterpret_cast<const CopyItem *>(lane_->tables.p + table_at_[table]);
    const auto *chunks =
        reinterpret_cast<const ChunkSource *>(lane_->tables.p + table_at_[table + 1]);
    launch_kernel(lanes_->copy_launch(), items, n, chunks, layer_offset, staging, pages, scatter,
                  s);
  }

  // The decode kernel over the load side's first n items (those of encoded chunks).
  void launch_decode(uint32_t n, const unsigned char *staging, unsigned char *pages,
                     cudaStream_t s) {
    const auto *items = reinterpret_cast<const CopyItem *>(lane_->tables.p + table_at_[0]);
    const auto *chunks = reinterpret_cast<const ChunkSource *>(lane_->tables.p + table_at_[1]);
    launch_decode_kernel(lanes_->copy_launch(), items, n, chunks, staging, pages, load_.shape, s);
  }

  std::shared_ptr<DeviceLanes> lanes_;
  std::unique_ptr<CopyLane> lane_;
  uint64_t piece_bytes_;
  DeviceSide load_, save_;
  uint64_t table_at_[4] = {};
};

}  // namespace

void launch_copy_items(int32_t device, const CopyItem *items, uint32_t n, const ChunkSource *chunks,
                       uint64_t layer_offset, std::byte *staging, std::byte *pages, bool scatter,
                       void *stream, CopyKernel kernel) {
  check_device(device);
  DeviceGuard guard(device);
  launch_kernel(CopyLaunch(device, kernel), items, n, chunks, layer_offset,
                reinterpret_cast<unsigned char *>(staging),
                reinterpret_cast<unsigned char *>(pages), scatter,
                static_cast<cudaStream_t>(stream));
}

void launch_decode_items(int32_t device, const CopyItem *items, uint32_t n,
                         const ChunkSource *chunks, const std::byte *staging, std::byte *pages,
                         const codec::LayerShape &shape, void *stream, CopyKernel kernel) {
  check_device(device);
  DeviceGuard guard(device);
  launch_decode_kernel(CopyLaunch(device, kernel), items, n, chunks,
                       reinterpret_cast<const unsigned char *>(staging),
                       reinterpret_cast<unsigned char *>(pages), shape,
                       static_cast<cudaStream_t>(stream));
}

std::unique_ptr<DeviceTransfer> DeviceTransfer::create(const std::shared_ptr<DeviceLanes> &lanes,
                                                       uint32_t layers, uint64_t piece_bytes,
                                                       DeviceSide load, DeviceSide save) {
  return std::make_unique<CudaTransfer>(lanes, layers, piece_bytes, std::move(load),
                                        std::move(save));
}

}  // namespace swiftkv
