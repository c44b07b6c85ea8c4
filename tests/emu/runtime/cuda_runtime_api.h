// Stand-in for the CUDA runtime's API in the host emulation of the transfer engine's streams
// (tests/unit/test_transfer_emulated.cpp): what core/transfer/cuda_transfer.cu and
// core/memory/cuda_host_memory.cu call, on the host. One device (0) whose memory is host memory (or
// more: set_devices); each stream a thread that runs its work in order; an event marks a point of
// its stream's work, and a stream that waits on it runs nothing after the wait until that point has
// run. Every piece of work may first sleep for a random moment (swiftkv_emu_rt::set_jitter), so
// that work of different streams with no wait between them runs in varying order: a missing wait
// shows as wrong bytes, not only on a device. Kernel launches are not here: cuda_transfer.cu, built
// with SWIFTKV_TRANSFER_EMULATION, hands them to swiftkv_emu_rt::enqueue, which runs the kernels'
// CPU emulation (tests/emu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#define CUDART_VERSION 13000

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorStubLibrary = 34,
  cudaErrorNotSupported = 801,
};
using cudaError = cudaError_t;

struct EmuStream;
struct EmuEvent;
using cudaStream_t = EmuStream *;
using cudaEvent_t = EmuEvent *;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrHostNumaId = 134 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1 };
enum cudaMemcpySrcAccessOrder { cudaMemcpySrcAccessOrderStream = 1 };
struct cudaMemcpyAttributes {
  cudaMemcpySrcAccessOrder srcAccessOrder;
  unsigned flags;
};

constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaHostAllocPortable = 1;
constexpr unsigned cudaHostRegisterPortable = 1;

const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError();
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest);
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer);
template <class Kernel>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, Kernel, int, size_t) {
  *blocks = 2;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T **p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void **>(p), bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T **p, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void **>(p), bytes);
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void *p);

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned flags, int priority);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);

// Copies at once on the calling thread: as the legacy default stream, it is not ordered against
// the library's streams (all made non-blocking).
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemcpyBatchAsync(void **dsts, const void **srcs, const size_t *sizes, size_t count,
                                 cudaMemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs,
                                 cudaStream_t s);

namespace swiftkv_emu_rt {

// Work for `s` (null: the engine's default stream, one of its own), run in order with the
// stream's other work, as device work: it may touch device memory.
void enqueue(cudaStream_t s, std::function<void()> work);
// Runs `work` on the calling thread as device work (a lender's own writes to its device memory,
// a test's look at device memory), one at a time with the streams' copies and kernels. Neither
// it nor an enqueued work may call this runtime (under ASan that waits on itself).
void as_device(const std::function<void()> &work);
// Whether device memory is guarded in this build (ASan): the host touching cudaMalloc's memory or
// memory add_device_memory names, outside device work, stops the process with ASan's
// use-after-poison, as a device's memory faults.
bool guarded();
// Each piece of work sleeps up to max_us microseconds first (0: none), drawn from `seed`.
void set_jitter(uint32_t max_us, uint64_t seed);
// `count` devices (1 unless set), all of host memory; with `peer_access` each may read the
// others' memory in place (cudaDeviceCanAccessPeer).
void set_devices(int count, bool peer_access);
// Marks [p, p + bytes) as memory of `device` (host memory here, as all of it): a kernel of
// another device may read or write it in place only with peer access, which the kernels'
// emulated launches check for every chunk they take in place. Memory not marked is any device's.
// Marked memory is guarded as cudaMalloc's is (guarded()) until remove_device_memory, which must
// come before the memory is freed or unmapped.
void add_device_memory(const void *p, size_t bytes, int device);
void remove_device_memory(const void *p);
bool reachable(int device, const void *p);
// Refuses every 2D copy (as a runtime does for a pitch past the device's limit) and every batched
// copy (as a driver without them does) while set; copies_refused() counts those refused so far.
void refuse_copies(bool two_d, bool batched);
int64_t copies_refused();
// The n-th cudaMemcpyAsync from now (1: the next) fails with cudaErrorInvalidValue and copies
// nothing; 0 disarms. Returns whether a failure armed before was still to come.
bool fail_copy(int64_t n);
// Streams and events alive: what a test checks is given back.
int64_t streams_alive();
int64_t events_alive();

}  // namespace swiftkv_emu_rt
