// Kernels that spin on the GPU's global timer for a given time. bench_transfer's pipeline uses
// one block as the engine's per-layer compute on its stream, the timer's values at its start and
// end written out so that the gaps between layers can be read afterwards; test_gpu_connector fills
// every block slot of the device with them, so that a kernel the library launches next on another
// stream runs late while the copy engines do not wait, and a missing stream wait between the
// library's kernels and the engine's copies shows as wrong bytes every time.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace {

// stamps, where not null: the global timer (ns) at the start and at the end, by one thread.
__global__ void spin(uint64_t ns, uint64_t *stamps) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (stamps != nullptr && threadIdx.x == 0 && blockIdx.x == 0) {
    stamps[0] = start;
    stamps[1] = now;
  }
}

}  // namespace

// Enqueues `seconds` of spinning on `stream`; `stamps` (device memory, or null): where the
// kernel writes the global timer at its start and end. False when the launch failed.
bool bench_spin_on_stream(double seconds, void *stream, uint64_t *stamps) {
  spin<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint64_t>(seconds * 1e9),
                                                       stamps);
  return cudaGetLastError() == cudaSuccess;
}

// Fills every block slot of every multiprocessor of the current device for `seconds` on
// `stream`; false on failure.
bool bench_occupy_device(double seconds, void *stream) {
  int device = 0, sms = 0, slots = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&slots, cudaDevAttrMaxBlocksPerMultiprocessor, device) !=
          cudaSuccess) {
    return false;
  }
  spin<<<sms * slots, 32, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint64_t>(seconds * 1e9), nullptr);
  return cudaGetLastError() == cudaSuccess;
}
