// Copies whose stores bypass the CPU's caches, for the host data path's copies (a layer's pieces
// into an engine's pages and back, a few hundred bytes to megabytes each). A memcpy of such a
// size reads each destination line before writing it (a read for ownership) and leaves it in the
// cache, displacing what the engine works on; non-temporal stores write whole lines without
// reading them. On the development VM (bench_transfer's host rows, 16 chunks of 8 MiB) a layer's
// pages copied by memcpy moved 4.7 GB/s against 9.1 for one large memcpy of the same bytes.
#pragma once

#include <cstddef>

namespace swiftkv {

// Copies n bytes from src to dst (the two must not overlap). On x86-64 the destination's whole
// 64-byte lines are written by non-temporal stores (AVX2 where the CPU has it, else SSE2), and
// the partial lines at either end, and copies under kNontemporalMin bytes, by memcpy; elsewhere
// it is memcpy. Non-temporal stores are weakly ordered: a thread that hands dst to another
// (through a lock, an atomic, a condition variable) calls nontemporal_fence() first, once after
// all its copies.
void nontemporal_copy(void *dst, const void *src, size_t n) noexcept;

// Orders every nontemporal_copy of this thread before its later stores (x86-64: sfence; elsewhere
// nothing is needed).
void nontemporal_fence() noexcept;

constexpr size_t kNontemporalMin = 256;

// Whether copies of `bytes_per_thread` (one copy thread's share of a request's layer) should go
// around the cache: when they are more than the core's L2 cache holds (2 MiB where the system
// does not say). Below that the destination lines a memcpy brings in are likely still cached
// when they are read or written again, and a memcpy was the faster (bench_transfer's loads, 2
// chunks of 1 MiB a layer on one thread with a 2 MiB L2: 7.2-10.0 GB/s by memcpy, 5.7-7.8
// non-temporal; at 3 chunks 5.1-5.6 against 5.7-6.1, at 16 chunks 4.7-5.8 against 6.7-8.1).
bool nontemporal_pays(size_t bytes_per_thread) noexcept;

// How the host copy engine writes a request's pages and chunks: SWIFTKV_HOST_STORES, read as a
// request on a host pool begins. `auto` (unset or empty: the default) takes non-temporal stores
// for a layer where nontemporal_pays says so, else memcpy; `cached` always memcpy; `nontemporal`
// always non-temporal stores. Another value fails with SWIFTKV_EINVAL, naming it.
enum class HostStores { automatic, cached, nontemporal };
HostStores host_stores_choice();

// The instructions nontemporal_copy writes lines with: the best this CPU has. The tests run each
// one the CPU has through nontemporal_copy_with.
enum class NontemporalStores { none, sse2, avx2 };
NontemporalStores nontemporal_stores() noexcept;
bool nontemporal_stores_available(NontemporalStores stores) noexcept;
// nontemporal_copy with `stores` (one that is available); none is memcpy.
void nontemporal_copy_with(NontemporalStores stores, void *dst, const void *src, size_t n) noexcept;

}  // namespace swiftkv
