// The no-CUDA stand-in of the CUDA attention launcher for builds without CUDA: there is no device,
// which is SWIFTKV_ENODEV for every caller, as DESIGN.md asks of GPU-only calls.
#include "core/attention/cuda_attention.hpp"
#include "core/common/error.hpp"

namespace swiftkv {

namespace {
[[noreturn]] void no_cuda(int32_t device) {
  fail(SWIFTKV_ENODEV, "attention on CUDA device " + std::to_string(device) +
                           " needs a libswiftkv built with CUDA");
}
}  // namespace

uint32_t attention_device_parallelism(int32_t device) { no_cuda(device); }

void attention_copy_plan(int32_t device, void *, const void *, uint64_t, void *) {
  no_cuda(device);
}

void attention_run_cuda(const AttentionShape &shape, const AttentionParams &, void *) {
  no_cuda(shape.device);
}

bool flashinfer_built() { return false; }

void attention_run_flashinfer(const AttentionShape &shape, const FlashInferLaunch &, void *) {
  no_cuda(shape.device);
}

}  // namespace swiftkv
