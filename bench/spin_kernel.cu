// The engine's per-layer compute for bench_transfer's pipeline on the GPU: one block that spins
// on the GPU's global timer for a given time, on the engine's stream.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace {

__global__ void spin(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

// Enqueues `seconds` of spinning on `stream`; false when the launch failed.
bool bench_spin_on_stream(double seconds, void *stream) {
  spin<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<uint64_t>(seconds * 1e9));
  return cudaGetLastError() == cudaSuccess;
}
