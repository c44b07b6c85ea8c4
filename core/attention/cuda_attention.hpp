// The CUDA half of paged attention as the rest of the library sees it. Two implementations provide
// it: cuda_attention.cu (CUDA builds) and cuda_attention_nocuda.cpp (SWIFTKV_ENODEV otherwise).
#pragma once

#include <cstdint>

#include "core/attention/attention_plan.hpp"
#include "kernels/attention_work.h"

namespace swiftkv {

// How many work items keep `device` busy (two blocks per multiprocessor). ENODEV for a device
// this process cannot use; EUNSUPPORTED below compute capability 8.0.
uint32_t attention_device_parallelism(int32_t device);

// Copies a serialised plan (host, `bytes`) into the device workspace on `stream`.
void attention_copy_plan(int32_t device, void *workspace, const void *plan, uint64_t bytes,
                         void *stream);

// Launches the work items, then the merges, on `stream`. No allocation, no synchronisation:
// capturable in a CUDA graph.
void attention_run_cuda(const AttentionShape &shape, const AttentionParams &p, bool vectorised,
                        void *stream);

}  // namespace swiftkv
