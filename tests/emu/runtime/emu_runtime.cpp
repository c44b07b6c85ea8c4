// The host emulation of the CUDA runtime's streams, events and copies (cuda_runtime_api.h).
#include <cuda_runtime_api.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

namespace {

// One lock for every stream's queue and every point's state: the emulation is for correctness.
// Never destroyed: a failed test leaves its streams' threads waiting on them as the process
// exits.
std::mutex &g_mu = *new std::mutex;
std::condition_variable &g_cv = *new std::condition_variable;
std::atomic<uint32_t> g_jitter_us{0};
std::atomic<uint64_t> g_seed{1};
std::atomic<int64_t> g_streams{0}, g_events{0};
std::atomic<int> g_devices{1};
std::atomic<bool> g_peer_access{false};
std::atomic<bool> g_refuse_2d{false}, g_refuse_batch{false};
std::atomic<int64_t> g_refused{0};
std::atomic<int64_t> g_fail_in{0};  // cudaMemcpyAsync calls until one fails; 0: none
struct DeviceRange {
  const char *begin;
  size_t bytes;
  int device;
};
std::vector<DeviceRange> &g_ranges = *new std::vector<DeviceRange>;  // under g_mu
thread_local int t_device = 0;

// Device memory the host must not touch. Under ASan, every byte of cudaMalloc's memory and of
// the ranges add_device_memory names is poisoned except while device work runs (a copy, a
// kernel, an engine's work: DeviceAccess), which holds g_device_mu: a host thread that reads or
// writes device memory itself, as a real device's memory would fault on, stops there with
// ASan's use-after-poison and the host's stack. Work of different streams runs one at a time
// (the streams still run their work in any order the waits allow); host code that touches device
// memory while a device's work runs goes unseen. Elsewhere nothing is poisoned and nothing held.
struct Guarded {
  const void *begin;
  size_t bytes;
};
std::mutex &g_device_mu = *new std::mutex;
std::vector<Guarded> &g_guarded = *new std::vector<Guarded>;  // under g_device_mu

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kGuard = true;
void poison(const Guarded &g, bool on) {
  if (on) {
    ASAN_POISON_MEMORY_REGION(g.begin, g.bytes);
  } else {
    ASAN_UNPOISON_MEMORY_REGION(g.begin, g.bytes);
  }
}
#else
constexpr bool kGuard = false;
void poison(const Guarded &, bool) {}
#endif

// Device work's access to every device's memory, for its lifetime.
class DeviceAccess {
 public:
  DeviceAccess() {
    if (!kGuard) return;
    g_device_mu.lock();
    for (const Guarded &g : g_guarded) poison(g, false);
  }
  ~DeviceAccess() {
    if (!kGuard) return;
    for (const Guarded &g : g_guarded) poison(g, true);
    g_device_mu.unlock();
  }
  DeviceAccess(const DeviceAccess &) = delete;
  DeviceAccess &operator=(const DeviceAccess &) = delete;
};

void guard(const void *p, size_t bytes) {
  if (!kGuard || bytes == 0) return;
  std::lock_guard lock(g_device_mu);
  g_guarded.push_back({p, bytes});
  poison(g_guarded.back(), true);
}
// Gives the range back to the host (for a free or an unmap) if it was guarded.
void unguard(const void *p) {
  if (!kGuard) return;
  std::lock_guard lock(g_device_mu);
  std::erase_if(g_guarded, [&](const Guarded &g) {
    if (g.begin != p) return false;
    poison(g, false);
    return true;
  });
}

// A point in a stream's work: done once the work enqueued before it has run.
struct Point {
  bool done = false;  // under g_mu
};

}  // namespace

struct EmuStream {
  std::deque<std::function<void()>> work;  // under g_mu
  bool stop = false;                       // under g_mu
  std::thread thread;

  explicit EmuStream(uint64_t seed) {
    thread = std::thread([this, seed] {
      std::mt19937_64 rng(seed);
      const uint64_t pace = 1 + rng() % 4;  // this stream's slowness, 1 to 4 times
      std::unique_lock lock(g_mu);
      for (;;) {
        g_cv.wait(lock, [this] { return stop || !work.empty(); });
        if (work.empty()) return;  // stopped, and drained
        std::function<void()> w = std::move(work.front());
        work.pop_front();
        lock.unlock();
        // Mostly short, now and then eight times as long, on a slow stream up to four times
        // more: a stream that falls far behind the others.
        const uint32_t jitter = g_jitter_us.load();
        if (jitter != 0) {
          const uint64_t us = rng() % jitter * pace * (rng() % 8 == 0 ? 8 : 1);
          std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
        w();
        lock.lock();
        g_cv.notify_all();  // a point may be done
      }
    });
    g_streams.fetch_add(1);
  }
  ~EmuStream() {
    {
      std::lock_guard lock(g_mu);
      stop = true;
      g_cv.notify_all();
    }
    thread.join();
    g_streams.fetch_sub(1);
  }
  void push(std::function<void()> w) {
    std::lock_guard lock(g_mu);
    work.push_back(std::move(w));
    g_cv.notify_all();
  }
  // A point after everything enqueued so far.
  std::shared_ptr<Point> mark() {
    auto p = std::make_shared<Point>();
    push([p] {
      std::lock_guard lock(g_mu);
      p->done = true;
    });
    return p;
  }
};

struct EmuEvent {
  std::shared_ptr<Point> latest;  // under g_mu; null until recorded
};

namespace {

EmuStream &default_stream() {
  static EmuStream s(0x5eed);
  return s;
}

EmuStream &stream_of(cudaStream_t s) { return s != nullptr ? *s : default_stream(); }

void wait_for(const std::shared_ptr<Point> &p) {
  if (!p) return;
  std::unique_lock lock(g_mu);
  g_cv.wait(lock, [&] { return p->done; });
}

void *aligned(size_t bytes) {
  return std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
}

}  // namespace

const char *cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}
const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "an error of the emulated runtime";
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *count) {
  *count = g_devices.load();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *device) {
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= g_devices.load()) return cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrHostNumaId ? -1 : 4;  // no NUMA node; 4 multiprocessors
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer) {
  *can = device != peer && g_peer_access.load() ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = aligned(bytes);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  guard(*p, bytes);
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
  unguard(p);
  std::free(p);
  return cudaSuccess;
}
// Pinned host memory: the host's to touch.
cudaError_t cudaMallocHost(void **p, size_t bytes) {
  *p = aligned(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned) { return cudaMallocHost(p, bytes); }
cudaError_t cudaFreeHost(void *p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void *, size_t, unsigned) { return cudaSuccess; }
cudaError_t cudaHostUnregister(void *) { return cudaSuccess; }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned, int) {
  static std::atomic<uint64_t> n{0};
  *s = new EmuStream(g_seed.load() * 0x9E3779B97F4A7C15ull + n.fetch_add(1));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;  // its work runs first
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  wait_for(stream_of(s).mark());
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  std::shared_ptr<Point> p;
  {
    std::lock_guard lock(g_mu);
    p = e->latest;  // the event's latest record as of this call
  }
  if (p) stream_of(s).push([p] { wait_for(p); });
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
  *e = new EmuEvent;
  g_events.fetch_add(1);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  g_events.fetch_sub(1);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::shared_ptr<Point> p = stream_of(s).mark();
  std::lock_guard lock(g_mu);
  e->latest = std::move(p);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::shared_ptr<Point> p;
  {
    std::lock_guard lock(g_mu);
    p = e->latest;
  }
  wait_for(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind) {
  DeviceAccess device;
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t s) {
  int64_t n = g_fail_in.load();
  while (n > 0 && !g_fail_in.compare_exchange_weak(n, n - 1)) {
  }
  if (n == 1) return cudaErrorInvalidValue;
  stream_of(s).push([=] {
    DeviceAccess device;
    std::memcpy(dst, src, bytes);
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind, cudaStream_t s) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  if (g_refuse_2d.load()) {
    g_refused.fetch_add(1);
    return cudaErrorInvalidValue;
  }
  stream_of(s).push([=] {
    DeviceAccess device;
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char *>(dst) + r * dpitch,
                  static_cast<const char *>(src) + r * spitch, width);
    }
  });
  return cudaSuccess;
}
cudaError_t cudaMemcpyBatchAsync(void **dsts, const void **srcs, const size_t *sizes, size_t count,
                                 cudaMemcpyAttributes *, size_t *, size_t, cudaStream_t s) {
  if (g_refuse_batch.load()) {
    g_refused.fetch_add(1);
    return cudaErrorNotSupported;
  }
  std::vector<void *> d(dsts, dsts + count);
  std::vector<const void *> f(srcs, srcs + count);
  std::vector<size_t> n(sizes, sizes + count);
  stream_of(s).push([d = std::move(d), f = std::move(f), n = std::move(n)] {
    DeviceAccess device;
    for (size_t i = 0; i < d.size(); ++i) std::memcpy(d[i], f[i], n[i]);
  });
  return cudaSuccess;
}

namespace swiftkv_emu_rt {

void enqueue(cudaStream_t s, std::function<void()> work) {
  stream_of(s).push([work = std::move(work)] {
    DeviceAccess device;
    work();
  });
}
void as_device(const std::function<void()> &work) {
  DeviceAccess device;
  work();
}
bool guarded() { return kGuard; }
void set_jitter(uint32_t max_us, uint64_t seed) {
  g_jitter_us = max_us;
  g_seed = seed;
}
void set_devices(int count, bool peer_access) {
  g_devices = count;
  g_peer_access = peer_access;
}
void add_device_memory(const void *p, size_t bytes, int device) {
  {
    std::lock_guard lock(g_mu);
    g_ranges.push_back({static_cast<const char *>(p), bytes, device});
  }
  guard(p, bytes);
}
void remove_device_memory(const void *p) {
  unguard(p);
  std::lock_guard lock(g_mu);
  std::erase_if(g_ranges, [&](const DeviceRange &r) { return r.begin == p; });
}
bool reachable(int device, const void *p) {
  const auto *c = static_cast<const char *>(p);
  std::lock_guard lock(g_mu);
  for (const DeviceRange &r : g_ranges) {
    if (c >= r.begin && c < r.begin + r.bytes) {
      return r.device == device || g_peer_access.load();
    }
  }
  return true;
}
void refuse_copies(bool two_d, bool batched) {
  g_refuse_2d = two_d;
  g_refuse_batch = batched;
}
int64_t copies_refused() { return g_refused.load(); }
bool fail_copy(int64_t n) { return g_fail_in.exchange(n) != 0; }
int64_t streams_alive() { return g_streams.load(); }
int64_t events_alive() { return g_events.load(); }

}  // namespace swiftkv_emu_rt
