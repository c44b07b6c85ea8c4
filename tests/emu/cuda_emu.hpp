// The CUDA execution model on the CPU, enough of it to run the project's kernels from their own
// source (kernels/*.cuh) in a test on a machine without a GPU. It is not a simulator of timing or
// of the memory system; it is there to run the kernels' index arithmetic, barriers, warp
// collectives, shared-memory layout and tensor-core fragment layouts, so that a wrong lane, a
// missing barrier or a misread fragment shows up as a wrong result before a device is at hand.
//
// - Every GPU thread of a block is a fiber on the calling thread; one block at a time. A fiber
//   starts through ucontext and switches with _setjmp/_longjmp, which leave the signal mask
//   alone (swapcontext's system call per switch was half the run time). Under ASan it switches
//   with swapcontext and ASan's fiber annotations (ASan's longjmp handling made it slower still).
// - A fiber runs until it reaches a barrier or a warp collective, then the next one runs, in an
//   order shuffled by the schedule's seed. Warps whose lanes all met are released together
//   (lockstep) or one at a time, the same warp first for as long as it can go (greedy warps):
//   one warp then runs a whole stage ahead of the others, as a device may run it, and a read of
//   shared memory that no barrier orders after its write sees another value.
// - cp.async writes shared memory either at the cp.async.wait_group that covers it or at once
//   when issued; both are what a device may do, and each hides a different missing wait or
//   barrier, so the tests run both.
// - __syncthreads waits for every live thread of the block, __syncwarp and the collectives for
//   the 32 lanes of the warp. A collective that a lane of the warp has left, or a barrier that
//   can never complete, is a fatal error (a hang or undefined behaviour on a device).
// - Shared memory is filled with 0xff (NaN in f16, bf16 and f32) before each block, so a read of
//   what nobody wrote poisons the result. Dynamic shared memory over the H100's 227 KiB per
//   block, more than 1024 threads, or a launch with more threads than __launch_bounds__ would
//   allow is refused, as a device refuses the launch.
// - The PTX instructions the FlashAttention-2 style kernel issues through inline assembly
//   (ldmatrix, mma.sync m16n8k16, cp.async) are functions here with the fragment layouts of the
//   PTX ISA (9.7.13.4.8, 9.7.13.4.15), written from the manual, not from the kernel. Addresses
//   are checked for the alignment the instructions need.
//
// Compiled with SWIFTKV_CUDA_EMULATION, __CUDACC__ and __CUDA_ARCH__ defined, through the stub
// headers in tests/emu/include. A failed check prints what and where and aborts the test.
#pragma once

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <type_traits>
#include <vector>

#include "core/attention/half_float.hpp"
// Schedule. emu_kernels.cpp includes it first, outside the unnamed namespace this file is in.
#include "emu_kernels.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SWIFTKV_EMU_ASAN 1
#endif

// --- The language's keywords ---------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

// --- Built-in types and variables ----------------------------------------------------------------
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
using dim3 = uint3;
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

inline uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace swiftkv_emu {

[[noreturn]] inline void fatal(const char *what) {
  std::fprintf(stderr, "cuda emulation: %s (block %u, thread %u)\n", what, blockIdx.x, threadIdx.x);
  std::fflush(stderr);
  std::abort();
}

// --- The scheduler -------------------------------------------------------------------------------
constexpr size_t kMaxSharedBytes = 227 * 1024;  // an H100's opt-in limit per block
constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kGuardBytes = 4096;

enum class FiberState { ready, block_barrier, warp_barrier, done };

struct CopyRecord {  // one cp.async, its bytes read at issue
  unsigned char *dst;
  unsigned char bytes[16];
};

struct Fiber {
  ucontext_t ctx{};
  jmp_buf jb;
  bool started = false;
  unsigned char *stack = nullptr;  // kStackBytes of g_stacks
  unsigned tid = 0;
  FiberState state = FiberState::ready;
  std::vector<std::vector<CopyRecord>> committed;  // cp.async groups, oldest first
  std::vector<CopyRecord> open;                    // not yet committed
#if defined(SWIFTKV_EMU_ASAN)
  void *fake_stack = nullptr;
#endif
};

// Exchange space of one warp's collectives: what each lane brings.
struct WarpSlots {
  uint32_t word[32][8];
  float value[32];
};

// How the fibers of a launch are interleaved (see the top of this file).
using Schedule = kernel_emulation::Schedule;

struct Launch {
  std::function<void()> body;
  Schedule schedule;
  std::vector<unsigned> warp_rank;  // greedy warps: lower runs first
  unsigned char *smem = nullptr;
  size_t smem_bytes = 0;
  std::vector<Fiber> fibers;
  std::vector<WarpSlots> warps;
  Fiber *current = nullptr;
  ucontext_t scheduler{};  // under ASan
  jmp_buf scheduler_jb;
#if defined(SWIFTKV_EMU_ASAN)
  const void *main_stack = nullptr;
  size_t main_stack_size = 0;
#endif
};

inline Launch *g_launch = nullptr;

// Fiber stacks, kept from launch to launch, each above a page that is never mapped (an overflow
// faults instead of writing into its neighbour). Small: ASan's swapcontext clears the shadow of
// the whole stack at every switch.
struct FiberStack {
  unsigned char *base = nullptr;  // the guard page, then kStackBytes
  FiberStack() {
    void *p = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(p, kGuardBytes, PROT_NONE) != 0) {
      std::fprintf(stderr, "cuda emulation: no memory for a fiber stack\n");
      std::abort();
    }
    base = static_cast<unsigned char *>(p);
  }
  ~FiberStack() { munmap(base, kGuardBytes + kStackBytes); }
  FiberStack(const FiberStack &) = delete;
  FiberStack &operator=(const FiberStack &) = delete;
  unsigned char *stack() const { return base + kGuardBytes; }
};
inline std::vector<std::unique_ptr<FiberStack>> g_stacks;

inline unsigned char *fiber_stack(size_t i) {
  while (g_stacks.size() <= i) g_stacks.push_back(std::make_unique<FiberStack>());
  return g_stacks[i]->stack();
}

inline Fiber &me() { return *g_launch->current; }
inline unsigned my_lane() { return me().tid % 32; }
inline unsigned my_warp() { return me().tid / 32; }

// Back to the scheduler until the barrier this fiber waits at is released.
inline void yield_to_scheduler() {
  Launch &l = *g_launch;
  Fiber &f = me();
#if defined(SWIFTKV_EMU_ASAN)
  __sanitizer_start_switch_fiber(&f.fake_stack, l.main_stack, l.main_stack_size);
  swapcontext(&f.ctx, &l.scheduler);
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#else
  if (_setjmp(f.jb) == 0) _longjmp(l.scheduler_jb, 1);
#endif
}

inline void block_barrier() {
  me().state = FiberState::block_barrier;
  yield_to_scheduler();
}

// The warp's lanes meet here; every one of the 32 must still be running.
inline void warp_barrier() {
  me().state = FiberState::warp_barrier;
  yield_to_scheduler();
}

inline void fiber_main() {
  Launch &l = *g_launch;
#if defined(SWIFTKV_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &l.main_stack, &l.main_stack_size);
#endif
  l.body();
  Fiber &f = me();
  if (!f.open.empty() || !f.committed.empty()) {
    fatal("a thread ended with cp.async copies it never waited for");
  }
  f.state = FiberState::done;
#if defined(SWIFTKV_EMU_ASAN)
  __sanitizer_start_switch_fiber(nullptr, l.main_stack, l.main_stack_size);
  setcontext(&l.scheduler);
#else
  _longjmp(l.scheduler_jb, 1);
#endif
}

// Runs f until it waits or ends (out of line: _setjmp returns twice).
__attribute__((noinline)) inline void resume(Launch &l, Fiber &f) {
#if defined(SWIFTKV_EMU_ASAN)
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
  swapcontext(&l.scheduler, &f.ctx);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  if (_setjmp(l.scheduler_jb) == 0) {
    if (!f.started) {
      f.started = true;
      setcontext(&f.ctx);
    }
    _longjmp(f.jb, 1);
  }
#endif
}

// Releases whatever barrier is complete; false when nothing can move (a hang on a device).
inline bool release_barriers(Launch &l) {
  const unsigned n = static_cast<unsigned>(l.fibers.size());
  bool moved = false;
  // Warps first: a lane waits inside a collective.
  unsigned best = n;
  for (unsigned w0 = 0; w0 < n; w0 += 32) {
    unsigned waiting = 0, done = 0, lanes = std::min(32u, n - w0);
    for (unsigned i = w0; i < w0 + lanes; ++i) {
      waiting += l.fibers[i].state == FiberState::warp_barrier;
      done += l.fibers[i].state == FiberState::done;
    }
    if (waiting == 0) continue;
    if (lanes != 32) fatal("a warp collective in a block that is not whole warps");
    if (done != 0) fatal("a warp collective or __syncwarp after a lane of the warp returned");
    if (waiting != lanes) continue;
    if (l.schedule.greedy_warps) {
      if (best == n || l.warp_rank[w0 / 32] < l.warp_rank[best / 32]) best = w0;
    } else {
      for (unsigned i = w0; i < w0 + lanes; ++i) l.fibers[i].state = FiberState::ready;
      moved = true;
    }
  }
  if (best != n) {
    for (unsigned i = best; i < best + 32; ++i) l.fibers[i].state = FiberState::ready;
    moved = true;
  }
  if (moved) return true;
  unsigned at_block = 0, done = 0;
  for (const Fiber &f : l.fibers) {
    at_block += f.state == FiberState::block_barrier;
    done += f.state == FiberState::done;
  }
  if (at_block > 0 && at_block + done == n) {
    for (Fiber &f : l.fibers) {
      if (f.state == FiberState::block_barrier) f.state = FiberState::ready;
    }
    return true;
  }
  return false;
}

// A fresh context at fiber_main on f's stack (out of line: getcontext returns twice).
__attribute__((noinline)) inline void start_fiber(Fiber &f, unsigned tid) {
  f.tid = tid;
  f.state = FiberState::ready;
  f.started = false;
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_main, 0);
}

// Runs body once per thread of every block of the grid. max_threads: the kernel's
// __launch_bounds__.
inline void launch(unsigned grid, unsigned block, size_t smem_bytes, unsigned char *smem,
                   unsigned max_threads, const Schedule &schedule, std::function<void()> body) {
  if (block == 0 || block > 1024 || block > max_threads) fatal("block size refused at launch");
  if (smem_bytes > kMaxSharedBytes) fatal("dynamic shared memory over the device's limit");
  if (grid == 0) fatal("an empty grid is an invalid launch");
  Launch l;
  l.body = std::move(body);
  l.schedule = schedule;
  l.smem = smem;
  l.smem_bytes = smem_bytes;
  l.fibers.resize(block);
  l.warps.resize((block + 31) / 32);
  for (size_t i = 0; i < l.fibers.size(); ++i) l.fibers[i].stack = fiber_stack(i);
  g_launch = &l;
  std::mt19937_64 rng(schedule.seed);
  std::vector<unsigned> order;  // the ready fibers of a step, shuffled
  l.warp_rank.resize(l.warps.size());
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    std::memset(smem, 0xff, smem_bytes);
#if defined(SWIFTKV_EMU_ASAN)
    ASAN_POISON_MEMORY_REGION(smem + smem_bytes, kMaxSharedBytes - smem_bytes);
#endif
    blockIdx = {b, 0, 0};
    for (unsigned w = 0; w < l.warp_rank.size(); ++w) l.warp_rank[w] = w;
    std::shuffle(l.warp_rank.begin(), l.warp_rank.end(), rng);
    for (unsigned t = 0; t < block; ++t) start_fiber(l.fibers[t], t);
    for (;;) {
      order.clear();
      for (unsigned t = 0; t < block; ++t) {
        if (l.fibers[t].state == FiberState::ready) order.push_back(t);
      }
      if (order.empty()) {
        bool all_done = true;
        for (const Fiber &f : l.fibers) all_done = all_done && f.state == FiberState::done;
        if (all_done) break;
        if (!release_barriers(l)) fatal("the block can never leave a barrier (a hang)");
        continue;
      }
      std::shuffle(order.begin(), order.end(), rng);
      for (unsigned t : order) {
        l.current = &l.fibers[t];
        threadIdx = {t, 0, 0};
        resume(l, l.fibers[t]);
      }
    }
#if defined(SWIFTKV_EMU_ASAN)
    ASAN_UNPOISON_MEMORY_REGION(smem + smem_bytes, kMaxSharedBytes - smem_bytes);
#endif
  }
  g_launch = nullptr;
}

inline void check_shared(const void *p, size_t bytes, size_t align, const char *what) {
  const auto *c = static_cast<const unsigned char *>(p);
  const Launch &l = *g_launch;
  if (c < l.smem || c + bytes > l.smem + l.smem_bytes) fatal(what);
  if (reinterpret_cast<uintptr_t>(c) % align != 0) fatal(what);
}

}  // namespace swiftkv_emu

// --- Barriers and shuffles -----------------------------------------------------------------------
inline void __syncthreads() { swiftkv_emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) swiftkv_emu::fatal("__syncwarp with a partial mask");
  swiftkv_emu::warp_barrier();
}
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32) {
  using namespace swiftkv_emu;
  if (mask != 0xffffffffu || width != 32) fatal("__shfl_xor_sync with a partial mask or width");
  WarpSlots &s = g_launch->warps[my_warp()];
  const unsigned lane = my_lane();
  s.value[lane] = v;
  warp_barrier();
  const float r = s.value[(lane ^ static_cast<unsigned>(lane_mask)) % 32];
  warp_barrier();  // every lane has read before any lane brings its next value
  return r;
}
[[noreturn]] inline void __trap() { swiftkv_emu::fatal("__trap"); }

// --- Arithmetic and conversions ------------------------------------------------------------------
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

struct __half {
  uint16_t bits;
};
using half = __half;
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half2 {
  __half x, y;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
static_assert(sizeof(__half2) == 4 && sizeof(__nv_bfloat162) == 4);

inline float __half2float(__half h) { return swiftkv::half_to_float(h.bits); }
inline __half __float2half_rn(float f) { return {swiftkv::float_to_half(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return swiftkv::bf16_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {swiftkv::float_to_bf16(f)}; }
inline __half2 __floats2half2_rn(float lo, float hi) {
  return {__float2half_rn(lo), __float2half_rn(hi)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
inline float __uint_as_float(unsigned b) { return swiftkv::bits_to_float(b); }
inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
// cuda_fp8.h's pair conversion, as PTX's cvt.rn.f16x2.e4m3x2 defines it: the low byte's value in
// the low half. Written from the E4M3 format (1 sign, 4 exponent bits of bias 7, 3 mantissa bits,
// no infinities, S.1111.111 NaN), not from the decoder's e4m3_value; E5M2 is not emulated.
using __nv_fp8x2_storage_t = unsigned short;
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
struct __half2_raw {
  unsigned short x, y;
};
inline unsigned short emu_e4m3_to_half(unsigned c) {
  const unsigned sign = (c & 0x80u) << 8, ex = (c >> 3) & 0xfu, m = c & 0x7u;
  if (ex == 0xf && m == 0x7) return 0x7fff;
  // (8 + m) x 2^(ex - 10) for a normal code, m x 2^-9 for a subnormal one: exact in a float,
  // and in an f16 (whose subnormals reach 2^-24).
  const float v = ex != 0 ? std::ldexp(static_cast<float>(8 + m), static_cast<int>(ex) - 10)
                          : std::ldexp(static_cast<float>(m), -9);
  return static_cast<unsigned short>(sign | swiftkv::float_to_half(v));
}
inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t x,
                                              __nv_fp8_interpretation_t kind) {
  if (kind != __NV_E4M3) swiftkv_emu::fatal("only E4M3 is emulated");
  return {emu_e4m3_to_half(x & 0xffu), emu_e4m3_to_half(x >> 8)};
}
inline int __ffs(int x) {  // the least significant set bit's position from 1; 0 for none
  return x == 0 ? 0 : __builtin_ctz(static_cast<unsigned>(x)) + 1;
}
// The device's fast division is within 2 ulp of the quotient: here always 2 ulp toward zero,
// the side where a quotient truncated to an integer goes wrong.
inline float __fdividef(float a, float b) {
  return std::nextafter(std::nextafter(a / b, 0.0f), 0.0f);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

template <class T>
inline T __ldg(const T *p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) swiftkv_emu::fatal("misaligned __ldg");
  return *p;
}

inline size_t __cvta_generic_to_shared(const void *p) {
  swiftkv_emu::check_shared(p, 1, 1, "a shared-memory address outside the block's shared memory");
  return static_cast<size_t>(static_cast<const unsigned char *>(p) - swiftkv_emu::g_launch->smem);
}

// --- PTX instructions (the FlashAttention-2 style kernel's inline assembly) ----------------------
namespace swiftkv_emu {

inline uint16_t shared_b16(uint32_t addr, unsigned col) {
  uint16_t v;
  const unsigned char *p = g_launch->smem + addr + 2 * col;
  std::memcpy(&v, p, 2);
  return v;
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the row addresses of
// matrix i; lane l receives in r[i] the elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of
// matrix i, or with .trans those of its transpose: (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
  Launch &l = *g_launch;
  WarpSlots &s = l.warps[my_warp()];
  const unsigned lane = my_lane();
  check_shared(l.smem + addr, 16, 16,
               "ldmatrix: a row address not 16-byte aligned in shared memory");
  s.word[lane][7] = addr;
  warp_barrier();
  const unsigned g = lane / 4, t = lane % 4;
  for (unsigned i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const uint32_t row = s.word[8 * i + g][7];
      lo = shared_b16(row, 2 * t);
      hi = shared_b16(row, 2 * t + 1);
    } else {
      lo = shared_b16(s.word[8 * i + 2 * t][7], g);
      hi = shared_b16(s.word[8 * i + 2 * t + 1][7], g);
    }
    r[i] = uint32_t{lo} | (uint32_t{hi} << 16);
  }
  warp_barrier();
}

template <class T>
inline float b16_value(uint32_t bits) {
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, __nv_bfloat16>) {
    return swiftkv::bf16_to_float(static_cast<uint16_t>(bits));
  } else {
    return swiftkv::half_to_float(static_cast<uint16_t>(bits));
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, d += a . b. With g = lane / 4
// and t = lane % 4: A (16 x 16) a0 = rows g, cols 2t, 2t+1; a1 = row g+8, same cols; a2 = row g,
// cols 2t+8, 2t+9; a3 = row g+8, those cols (low half first). B (16 x 8): b0 = k 2t, 2t+1 of col
// g; b1 = k 2t+8, 2t+9. C/D (16 x 8): d0, d1 = row g, cols 2t, 2t+1; d2, d3 = row g+8.
template <class T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  Launch &l = *g_launch;
  WarpSlots &s = l.warps[my_warp()];
  const unsigned lane = my_lane();
  for (int i = 0; i < 4; ++i) s.word[lane][i] = a[i];
  s.word[lane][4] = b0;
  s.word[lane][5] = b1;
  warp_barrier();
  // Element (r, k) of A and (k, n) of B, from the lane and register the layouts put them in.
  const auto half_of = [](uint32_t w, unsigned k) { return b16_value<T>(w >> (16 * (k % 2))); };
  const auto A = [&](unsigned r, unsigned k) {
    return half_of(s.word[(r % 8) * 4 + (k % 8) / 2][(r / 8) + 2 * (k / 8)], k);
  };
  const auto B = [&](unsigned k, unsigned n) {
    return half_of(s.word[n * 4 + (k % 8) / 2][4 + k / 8], k);
  };
  const unsigned g = lane / 4, t = lane % 4;
  float out[4];
  for (unsigned e = 0; e < 4; ++e) {
    const unsigned row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float acc = 0.0f;
    for (unsigned k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    out[e] = acc;
  }
  warp_barrier();  // every lane has read the others' fragments
  for (unsigned e = 0; e < 4; ++e) d[e] += out[e];
}

// cp.async.cg.shared.global [dst], [src], 16, src_size: src_size 16 copies, 0 writes zeros and
// reads nothing. The shared bytes change only at the wait that covers the copy's group.
inline void cp_async16(uint32_t dst, const void *src, int src_size) {
  Launch &l = *g_launch;
  check_shared(l.smem + dst, 16, 16,
               "cp.async: a destination not 16-byte aligned in shared memory");
  CopyRecord c{};
  c.dst = l.smem + dst;
  if (src_size == 16) {
    if (reinterpret_cast<uintptr_t>(src) % 16 != 0) fatal("cp.async: a source not 16-byte aligned");
    std::memcpy(c.bytes, src, 16);
  } else if (src_size != 0) {
    fatal("cp.async: a source size the kernel never uses");
  }
  if (l.schedule.copies_land_at_issue) {
    std::memcpy(c.dst, c.bytes, 16);
  } else {
    me().open.push_back(c);
  }
}

inline void cp_async_commit() {
  Fiber &f = me();
  f.committed.push_back(std::move(f.open));
  f.open.clear();
}

// cp.async.wait_group n: every committed group but the n newest is complete.
inline void cp_async_wait(int n) {
  Fiber &f = me();
  while (f.committed.size() > static_cast<size_t>(n)) {
    for (const CopyRecord &c : f.committed.front()) std::memcpy(c.dst, c.bytes, 16);
    f.committed.erase(f.committed.begin());
  }
}

}  // namespace swiftkv_emu
