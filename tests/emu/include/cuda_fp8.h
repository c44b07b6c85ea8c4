// Stand-in for the CUDA header of this name in the CPU emulation (tests/emu/cuda_emu.hpp).
#pragma once
#include "cuda_emu.hpp"
