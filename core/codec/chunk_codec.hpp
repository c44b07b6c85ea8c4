// Chunk codecs (AdaptCache's compression methods): a chunk's block-major bytes, layers x (K, V) x
// tokens x heads x dim elements of f16 or bf16, encoded into one self-describing frame and
// decoded back. docs/codecs.md gives the frame format byte by byte and each codec's error bound.
//
//  - raw:  the bytes as they are (a frame around them).
//  - zstd: lossless, libzstd over the bytes, or over their byte planes (every element's low bytes,
//          then its high bytes), which groups the exponents of 16-bit floats.
//  - kivi: KIVI-style asymmetric quantisation to 8, 4 or 2 bits: keys per channel (a min and a
//          scale for each head and dim over each group of `group` tokens), values per token (over
//          each group of `group` channels of one token and head). Lossy, bounded per element.
//  - fp8:  FP8 E4M3 with one float scale per token of each layer's K and V (its largest
//          magnitude maps to 448). Lossy, bounded per element.
//
// This is the CPU twin and the reference: CUDA decoders, when they come, follow it bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/attention/half_float.hpp"
#include "swiftkv/swiftkv.h"

namespace swiftkv::codec {

enum class Codec : uint8_t { raw = 0, zstd = 1, kivi = 2, fp8 = 3 };
const char *codec_name(Codec c) noexcept;

// How a chunk is encoded. Checked by check_params (EINVAL for a combination that is not one).
struct CodecParams {
  Codec codec = Codec::raw;
  uint32_t bits = 0;         // kivi: 8, 4 or 2
  uint32_t group = 0;        // kivi: 8..256, a power of two
  bool byte_planes = false;  // zstd: split 16-bit elements into byte planes first
  int zstd_level = 1;        // zstd: the encoder's level (1..19); not part of the format
};

// The chunk the bytes are: layers x 2 x tokens x heads x dim elements, block-major.
struct ChunkShape {
  uint32_t layers = 0;
  uint32_t tokens = 0;
  uint32_t heads = 0;
  uint32_t dim = 0;
  swiftkv_dtype dtype = SWIFTKV_DTYPE_F16;
  uint64_t elements() const noexcept { return uint64_t{layers} * 2 * tokens * heads * dim; }
  uint64_t bytes() const noexcept { return elements() * 2; }
};

// A chunk element (f16 or bf16 bits) as a float, and back with rounding to nearest even.
inline float element_to_float(uint16_t v, swiftkv_dtype t) {
  return t == SWIFTKV_DTYPE_BF16 ? bf16_to_float(v) : half_to_float(v);
}
inline uint16_t float_to_element(float f, swiftkv_dtype t) {
  return t == SWIFTKV_DTYPE_BF16 ? float_to_bf16(f) : float_to_half(f);
}

inline constexpr uint32_t kFrameMagic = 0x43564b53;  // "SKVC" read as little-endian bytes
inline constexpr uint16_t kFrameFormat = 1;
inline constexpr size_t kFrameHeaderBytes = 48;

// EINVAL for a shape or parameters no codec takes (only f16 and bf16 elements; sizes that fit);
// EUNSUPPORTED for zstd in a build without libzstd.
void check_params(const ChunkShape &shape, const CodecParams &params);
bool lossless(Codec c) noexcept;
bool zstd_available() noexcept;

// The frame of `raw` (shape.bytes() of them) under `params`.
std::vector<std::byte> encode(const ChunkShape &shape, const CodecParams &params,
                              std::span<const std::byte> raw);

// What a frame says about itself, checked against the expected shape: EIO when the frame is
// malformed, truncated, of another format version or of another shape.
struct FrameInfo {
  CodecParams params;
  uint64_t raw_bytes = 0;
  uint64_t payload_bytes = 0;
};
FrameInfo read_frame_header(std::span<const std::byte> frame, const ChunkShape &shape);

// One fp8 record (a float scale, then `row` one-byte codes): its scale, or EIO for a scale
// that is not finite and >= 0 or a NaN code (which no encoder writes). The decoder's check, and
// the device path's before the record leaves the host.
float fp8_checked_scale(const uint8_t *record, uint64_t row);

// n kivi (lo, scale) pairs of 16-bit `dtype` elements: EIO where a half is a NaN or an infinity
// (no encoder writes one: the chunks it takes are finite). With finite pairs every decoded element
// is finite or a rounded overflow, the same bits on every device; a NaN's sign and payload are
// the arithmetic's own (an x86 host's and a GPU's differ). The decoder's check, and the device
// path's before the frame leaves the host.
void kivi_check_pairs(const uint8_t *pairs, uint64_t n, swiftkv_dtype dtype);

// Decodes a frame into out (shape.bytes()). EIO for a frame that is not a valid encoding of a
// chunk of this shape; out's contents are then unspecified.
void decode(std::span<const std::byte> frame, const ChunkShape &shape, std::span<std::byte> out);

}  // namespace swiftkv::codec
