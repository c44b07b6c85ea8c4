// Copy plans between a chunk's per-layer piece and an engine's pages, and the CPU twin of the
// gather/scatter kernel that runs them. A plan is built once per chunk of a request and reused by
// every layer: only the two base addresses change with the layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/pool/page_layout.hpp"

namespace swiftkv {

// One contiguous copy: `bytes` at `page_offset` from a layer's base in the pool and at
// `piece_offset` in the chunk's piece of that layer.
struct CopySegment {
  uint64_t page_offset;
  uint64_t piece_offset;
  uint64_t bytes;
};

// The segments of one chunk. A chunk's layer piece is (2, chunk_tokens, H, D) elements, K before
// V; `pages` are the pool pages of its chunk_tokens / page_tokens blocks, in order. Runs that are
// contiguous on both sides are merged, so a layout with whole contiguous pages needs one segment
// per page and K or V, and consecutive pages of vLLM's layout merge further. Each page is walked
// in its memory's order: a page's tokens of one head at a time where a head's tokens lie next to
// each other in it (HND), else a token's heads at a time. Tokens before
// `first_token` (a load that starts inside the chunk) have no segments: their pages are not
// touched.
std::vector<CopySegment> chunk_copy_plan(const PageLayout &layout, std::span<const int32_t> pages,
                                         uint32_t chunk_tokens, uint32_t first_token = 0);

// Chunk piece -> pages of one layer, and back. The CPU twin of the gather/scatter kernel. With
// `nontemporal` each segment is a nontemporal_copy (its stores bypass the caches; the host copy
// engine's choice for a request's large layers, nontemporal_pays), fenced once at the end, so
// that another thread that learns of the copy through a lock or an atomic sees every byte; else
// a memcpy.
void scatter_piece(std::span<const CopySegment> plan, const std::byte *piece, std::byte *layer_base,
                   bool nontemporal = false) noexcept;
void gather_piece(std::span<const CopySegment> plan, const std::byte *layer_base, std::byte *piece,
                  bool nontemporal = false) noexcept;

}  // namespace swiftkv
