// The CUDA device query (core/memory/cuda_device_query.cu) against the emulated runtime: one
// device.
#include "core/memory/cuda_device_query.cu"
