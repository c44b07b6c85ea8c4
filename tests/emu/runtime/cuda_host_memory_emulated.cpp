// The CUDA build's host memory and copies (core/memory/cuda_host_memory.cu) against the emulated
// runtime: copy_bytes to and from the device's memory (host memory here) as a CUDA build does.
#include "core/memory/cuda_host_memory.cu"
