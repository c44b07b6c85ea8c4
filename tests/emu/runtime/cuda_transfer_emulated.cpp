// The CUDA executor of the transfer engine (core/transfer/cuda_transfer.cu), its own source,
// built for the host against the emulated runtime (cuda_runtime_api.h here).
#include "core/transfer/cuda_transfer.cu"
