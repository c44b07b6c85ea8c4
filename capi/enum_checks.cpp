// The core's enums are cast to and from the public ones at the ABI (cache_api.cpp,
// context_api.cpp, elastic_api.cpp): each value is checked here to be the public number, so a
// change on either side fails the build instead of mislabelling a tier or a policy.
#include "core/index/chunk_index.hpp"
#include "core/memory/memory_region.hpp"
#include "core/policy/eviction_policy.hpp"
#include "core/tiers/chunk_cache.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv::capi {
namespace {

template <typename Core>
constexpr bool same(Core core, long public_value) {
  return static_cast<long>(core) == public_value;
}

static_assert(tier_code(Tier::peer) == SWIFTKV_TIER_PEER);
static_assert(tier_code(Tier::host) == SWIFTKV_TIER_HOST);
static_assert(tier_code(Tier::disk) == SWIFTKV_TIER_DISK);
static_assert(tier_code(Tier::remote) == SWIFTKV_TIER_REMOTE);
static_assert(*tier_of_code(SWIFTKV_TIER_REMOTE) == Tier::remote &&
              !tier_of_code(SWIFTKV_TIER_DROPPED));
// Arrays indexed by Tier hold peer, host and disk where the public arrays do.
static_assert(same(Tier::peer, SWIFTKV_TIER_PEER) && same(Tier::host, SWIFTKV_TIER_HOST) &&
              same(Tier::disk, SWIFTKV_TIER_DISK));
static_assert(kTierCount == 4 &&
                  SWIFTKV_TIERS_ALL ==
                      (SWIFTKV_TIER_BIT(SWIFTKV_TIER_PEER) | SWIFTKV_TIER_BIT(SWIFTKV_TIER_HOST) |
                       SWIFTKV_TIER_BIT(SWIFTKV_TIER_DISK) | SWIFTKV_TIER_BIT(SWIFTKV_TIER_REMOTE)),
              "the public tier mask covers every tier");
static_assert(ChunkCache::kDropped == SWIFTKV_TIER_DROPPED);
static_assert(same(EvictionPolicy::lru, SWIFTKV_EVICT_LRU));
static_assert(same(EvictionPolicy::retention, SWIFTKV_EVICT_RETENTION));
static_assert(same(ChunkEventReason::policy, SWIFTKV_CHUNK_EVICTED));
static_assert(same(ChunkEventReason::revoked, SWIFTKV_CHUNK_REVOKED));
static_assert(same(ChunkEventReason::corrupt, SWIFTKV_CHUNK_CORRUPT));
static_assert(same(codec::Codec::raw, SWIFTKV_CODEC_RAW));
static_assert(same(codec::Codec::zstd, SWIFTKV_CODEC_ZSTD));
static_assert(same(codec::Codec::kivi, SWIFTKV_CODEC_KIVI));
static_assert(same(codec::Codec::fp8, SWIFTKV_CODEC_FP8));
static_assert(kCodecCount == 4, "swiftkv_codec_stats has a row per codec");
static_assert(same(MemoryKind::host_memfd, SWIFTKV_MEMORY_HOST_MEMFD));
static_assert(same(MemoryKind::cuda_vmm, SWIFTKV_MEMORY_CUDA_VMM));
static_assert(same(MemoryKind::cuda_ipc, SWIFTKV_MEMORY_CUDA_IPC));

}  // namespace
}  // namespace swiftkv::capi
