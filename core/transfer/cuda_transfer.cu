// The CUDA executor of one request (see cuda_transfer.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/memory/cuda_check.hpp"
#include "core/transfer/cuda_transfer.hpp"
#include "kernels/segment_copy.cuh"

namespace swiftkv {

namespace {

static_assert(sizeof(StagedSegment) == sizeof(kernels::DeviceSegment),
              "StagedSegment and DeviceSegment are the same three words");

constexpr int kThreads = 256;

class CudaTransfer final : public DeviceTransfer {
 public:
  CudaTransfer(int32_t device, uint32_t layers, uint64_t piece_bytes,
               const std::vector<StagedSegment> &load_segments,
               const std::vector<uint32_t> &load_prefix,
               const std::vector<StagedSegment> &save_segments,
               const std::vector<uint32_t> &save_prefix)
      : device_(device), piece_bytes_(piece_bytes), load_prefix_(load_prefix),
        save_prefix_(save_prefix) {
    DeviceGuard guard(device_);
    try {
      int lo = 0, hi = 0;
      check_cuda(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
      // The load stream has the highest priority there is. That orders kernels only (the
      // load's scatter kernel is scheduled on the SMs before the save's gather); copy engines
      // take DMA work in the order it was issued, whatever the stream's priority, so a save
      // issued first still goes first on the link.
      check_cuda(cudaStreamCreateWithPriority(&load_stream_, cudaStreamNonBlocking, hi),
                 "cudaStreamCreateWithPriority (loads)");
      check_cuda(cudaStreamCreateWithPriority(&save_stream_, cudaStreamNonBlocking, lo),
                 "cudaStreamCreateWithPriority (saves)");
      load_events_.assign(layers, nullptr);
      save_events_.assign(layers, nullptr);
      for (uint32_t l = 0; l < layers; ++l) {
        check_cuda(cudaEventCreateWithFlags(&load_events_[l], cudaEventDisableTiming),
                   "cudaEventCreate");
        check_cuda(cudaEventCreateWithFlags(&save_events_[l], cudaEventDisableTiming),
                   "cudaEventCreate");
      }
      check_cuda(cudaEventCreateWithFlags(&engine_event_, cudaEventDisableTiming),
                 "cudaEventCreate");
      upload(load_segments, &load_segments_);
      upload(save_segments, &save_segments_);
      const uint64_t load_chunks = load_prefix_.empty() ? 0 : load_prefix_.size() - 1;
      const uint64_t save_chunks = save_prefix_.empty() ? 0 : save_prefix_.size() - 1;
      if (load_chunks != 0) {
        check_cuda(cudaMalloc(&load_staging_, load_chunks * piece_bytes_), "cudaMalloc (staging)");
      }
      if (save_chunks != 0) {
        check_cuda(cudaMalloc(&save_staging_, save_chunks * piece_bytes_), "cudaMalloc (staging)");
      }
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaTransfer() override {
    try {
      DeviceGuard guard(device_, false);
      if (load_stream_ != nullptr) (void)cudaStreamSynchronize(load_stream_);
      if (save_stream_ != nullptr) (void)cudaStreamSynchronize(save_stream_);
      release();
    } catch (...) {
      // The device is gone (a sticky error): nothing queued can still run; let the rest leak.
    }
  }

  void after(void *stream) override {
    DeviceGuard guard(device_);
    check_cuda(cudaEventRecord(engine_event_, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(load_stream_, engine_event_, 0), "cudaStreamWaitEvent");
  }

  void enqueue_load(uint32_t layer, const std::vector<const std::byte *> &sources,
                    uint32_t chunks, std::byte *layer_base, int after_save_layer) override {
    DeviceGuard guard(device_);
    if (after_save_layer >= 0) {
      check_cuda(cudaStreamWaitEvent(load_stream_, save_events_[after_save_layer], 0),
                 "cudaStreamWaitEvent");
    }
    std::vector<void *> dst(chunks);
    std::vector<const void *> src(chunks);
    for (uint32_t i = 0; i < chunks; ++i) {
      dst[i] = load_staging_ + i * piece_bytes_;
      src[i] = sources[i] + layer * piece_bytes_;
    }
    copy_pieces(dst, src, load_stream_);
    launch(load_segments_, load_prefix_[chunks], load_staging_,
           reinterpret_cast<unsigned char *>(layer_base), true, load_stream_);
    check_cuda(cudaEventRecord(load_events_[layer], load_stream_), "cudaEventRecord");
  }

  void stream_wait_load(uint32_t layer, void *stream) override {
    DeviceGuard guard(device_);
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), load_events_[layer], 0),
               "cudaStreamWaitEvent");
  }

  void sync_load(uint32_t layer) override {
    DeviceGuard guard(device_);
    check_cuda(cudaEventSynchronize(load_events_[layer]), "cudaEventSynchronize");
  }

  void enqueue_save(uint32_t layer, void *stream, const std::byte *layer_base,
                    const std::vector<std::byte *> &dsts) override {
    DeviceGuard guard(device_);
    check_cuda(cudaEventRecord(engine_event_, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(save_stream_, engine_event_, 0), "cudaStreamWaitEvent");
    const uint32_t chunks = static_cast<uint32_t>(dsts.size());
    launch(save_segments_, save_prefix_[chunks],
           reinterpret_cast<const unsigned char *>(layer_base), save_staging_, false, save_stream_);
    std::vector<void *> dst(chunks);
    std::vector<const void *> src(chunks);
    for (uint32_t i = 0; i < chunks; ++i) {
      dst[i] = dsts[i] + layer * piece_bytes_;
      src[i] = save_staging_ + i * piece_bytes_;
    }
    copy_pieces(dst, src, save_stream_);
    check_cuda(cudaEventRecord(save_events_[layer], save_stream_), "cudaEventRecord");
  }

  void sync_saves() override {
    DeviceGuard guard(device_);
    check_cuda(cudaStreamSynchronize(save_stream_), "cudaStreamSynchronize");
  }

 private:
  void upload(const std::vector<StagedSegment> &segs, kernels::DeviceSegment **out) {
    if (segs.empty()) return;
    check_cuda(cudaMalloc(out, segs.size() * sizeof(StagedSegment)), "cudaMalloc (copy plan)");
    check_cuda(cudaMemcpy(*out, segs.data(), segs.size() * sizeof(StagedSegment),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy (copy plan)");
  }

  // One piece_bytes copy per chunk: a single batched call where the runtime has one (the
  // driver then picks the copy engines), else one cudaMemcpyAsync per chunk.
  void copy_pieces(const std::vector<void *> &dst, const std::vector<const void *> &src,
                   cudaStream_t s) {
    if (dst.empty()) return;
#if CUDART_VERSION >= 13000
    if (batch_ok_) {
      std::vector<size_t> sizes(dst.size(), piece_bytes_);
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      const cudaError_t err = cudaMemcpyBatchAsync(dst.data(), src.data(), sizes.data(),
                                                   dst.size(), &attr, &first, 1, s);
      if (err == cudaSuccess) return;
      // A driver without batched copies: the plain path from now on.
      (void)cudaGetLastError();
      batch_ok_ = false;
    }
#endif
    for (size_t i = 0; i < dst.size(); ++i) {
      check_cuda(cudaMemcpyAsync(dst[i], src[i], piece_bytes_, cudaMemcpyDefault, s),
                 "cudaMemcpyAsync (a chunk's layer piece)");
    }
  }

  void launch(const kernels::DeviceSegment *segs, uint32_t n, const unsigned char *src,
              unsigned char *dst, bool scatter, cudaStream_t s) {
    if (n == 0) return;
    const unsigned blocks = std::min<uint32_t>(n, 65535);
    kernels::copy_segments<<<blocks, kThreads, 0, s>>>(segs, n, src, dst, scatter ? 1 : 0);
    check_cuda(cudaGetLastError(), "the gather/scatter kernel launch");
  }

  void release() noexcept {
    for (cudaEvent_t e : load_events_) if (e != nullptr) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : save_events_) if (e != nullptr) (void)cudaEventDestroy(e);
    load_events_.clear();
    save_events_.clear();
    if (engine_event_ != nullptr) (void)cudaEventDestroy(engine_event_);
    if (load_stream_ != nullptr) (void)cudaStreamDestroy(load_stream_);
    if (save_stream_ != nullptr) (void)cudaStreamDestroy(save_stream_);
    (void)cudaFree(load_segments_);
    (void)cudaFree(save_segments_);
    (void)cudaFree(load_staging_);
    (void)cudaFree(save_staging_);
    engine_event_ = nullptr;
    load_stream_ = save_stream_ = nullptr;
    load_segments_ = save_segments_ = nullptr;
    load_staging_ = save_staging_ = nullptr;
  }

  int32_t device_;
  uint64_t piece_bytes_;
  std::vector<uint32_t> load_prefix_, save_prefix_;
  cudaStream_t load_stream_ = nullptr, save_stream_ = nullptr;
  cudaEvent_t engine_event_ = nullptr;
  std::vector<cudaEvent_t> load_events_, save_events_;
  kernels::DeviceSegment *load_segments_ = nullptr, *save_segments_ = nullptr;
  unsigned char *load_staging_ = nullptr, *save_staging_ = nullptr;
  bool batch_ok_ = true;
};

}  // namespace

std::unique_ptr<DeviceTransfer> DeviceTransfer::create(
    int32_t device, uint32_t layers, uint64_t piece_bytes,
    const std::vector<StagedSegment> &load_segments, const std::vector<uint32_t> &load_prefix,
    const std::vector<StagedSegment> &save_segments, const std::vector<uint32_t> &save_prefix) {
  check_device(device);
  return std::make_unique<CudaTransfer>(device, layers, piece_bytes, load_segments, load_prefix,
                                        save_segments, save_prefix);
}

}  // namespace swiftkv
