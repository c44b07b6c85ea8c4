// One layer of a kivi or fp8 frame decoded element by element: the same code runs on the host
// (the CPU twin, layer_decode.cpp) and in the CUDA decode kernel (kernels/segment_copy.cuh),
// which decodes a chunk's compressed layer after it crossed the link, straight into the engine's
// pages. The formulas are chunk_codec.cpp's (docs/codecs.md): an element is bit for bit what
// codec::decode gives.
//
// A layer's payload is the frame's payload from 48 + layer * layer_payload_bytes():
//  - kivi: key codes, key (lo, scale) pairs, value codes, value pairs;
//  - fp8: per (K or V, token) a 4-byte float scale and heads * dim one-byte codes.
// Element e of the decoded layer is in block order: K (token, head, channel), then V.
//
// C++17 with no library beyond <cstdint>, so that nvcc compiles it into device code.
#pragma once

#include <cstdint>

#include <cstring>

#include "core/attention/half_float.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define SWIFTKV_HD __host__ __device__ __forceinline__
#else
#define SWIFTKV_HD inline
#endif
// Loops over a group's eight elements: unrolled on the device, so that Fetched8's words stay in
// registers.
#if defined(__CUDA_ARCH__) && !defined(SWIFTKV_CUDA_EMULATION)
#define SWIFTKV_UNROLL_8 _Pragma("unroll")
#else
#define SWIFTKV_UNROLL_8
#endif

namespace swiftkv::codec {

// Division by a divisor fixed for a launch, as a multiply-high, an add and a shift: exact for
// every 32-bit dividend and divisor (the round-up method of Granlund and Montgomery, "Division by
// invariant integers using multiplication", PLDI 1994, section 4: with l = ceil(log2 d) and
// magic = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(magic, n) + n) >> l). The decoder finds
// each group's token and head by dividing by the layer's row and channel counts; a division by a
// variable is 15 to 30 instructions on a GPU (its reciprocal recomputed wherever the compiler
// cannot hoist it), this is four, with magic and l read from the kernel's parameters.
struct Divisor {
  uint32_t d = 0;  // 0: never divided by (a shape with no elements)
  uint32_t magic = 0;
  uint32_t shift = 0;
};
SWIFTKV_HD Divisor divisor_of(uint32_t d) {
  if (d == 0) return Divisor{};
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  // (2^l - d) < 2^31, so the product fits 64 bits; magic < 2^32 as 2^(l-1) < d.
  const uint64_t magic = (((uint64_t{1} << l) - d) << 32) / d + 1;
  return Divisor{d, static_cast<uint32_t>(magic), l};
}
SWIFTKV_HD uint32_t mul_high(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
}
SWIFTKV_HD uint32_t quotient(uint32_t n, const Divisor &v) {
  return static_cast<uint32_t>((uint64_t{mul_high(n, v.magic)} + n) >> v.shift);
}
// The same for n < 2^31 and d <= 2^31 (a shift under 32), in 32 bits: mulhi(magic, n) < n, so the
// sum stays under 2^32 (on a device a 32-bit add and shift, where the general form carries into a
// 64-bit shift). A device's layer is under 2^31 elements, so are its indices and divisors.
SWIFTKV_HD uint32_t quotient_31(uint32_t n, const Divisor &v) {
  return (mul_high(n, v.magic) + n) >> v.shift;
}

// A chunk's shape as the decoder needs it, a kernel parameter (40 bytes). The divisors are made
// from the first four fields by the constructor: change a field by making a new LayerShape.
struct LayerShape {
  uint32_t tokens = 0;
  uint32_t heads = 0;
  uint32_t dim = 0;
  uint32_t bf16 = 0;  // 1: bf16 elements, 0: f16
  Divisor row;        // by heads x dim, where that fits 32 bits (else 0: the host's 64-bit path)
  Divisor channels;   // by dim

  LayerShape() = default;
  SWIFTKV_HD LayerShape(uint32_t tokens_, uint32_t heads_, uint32_t dim_, uint32_t bf16_)
      : tokens(tokens_), heads(heads_), dim(dim_), bf16(bf16_), channels(divisor_of(dim_)) {
    const uint64_t r = uint64_t{heads_} * dim_;
    if (r <= UINT32_MAX) row = divisor_of(static_cast<uint32_t>(r));
  }
};

// A chunk's encoding as the decoder needs it (the index's encoding field, chunk_index.hpp):
// bits 0-7 the codec (2 kivi, 3 fp8), 8-15 kivi's bits, 16-23 log2 of kivi's group.
SWIFTKV_HD uint32_t layer_codec(uint32_t encoding) { return encoding & 0xffu; }
SWIFTKV_HD uint32_t layer_bits(uint32_t encoding) { return (encoding >> 8) & 0xffu; }
SWIFTKV_HD uint32_t layer_group_log2(uint32_t encoding) { return (encoding >> 16) & 0x1fu; }
inline constexpr uint32_t kLayerKivi = 2;
inline constexpr uint32_t kLayerFp8 = 3;

// Elements of one tensor (K or V) of one layer.
SWIFTKV_HD uint64_t layer_tensor_elements(const LayerShape &s) {
  return uint64_t{s.tokens} * s.heads * s.dim;
}

// Whether layers of this shape decode on a device: the device's index arithmetic is 32-bit, so
// a layer's two tensors hold at most 2^32 - 1 elements together (8 GiB of 16-bit elements, far
// past any model's chunk; ChunkCache::device_decodable leaves a larger one to the host).
SWIFTKV_HD bool layer_fits_device(const LayerShape &s) {
  // 2 * tokens * heads * dim <= 2^32 - 1, without overflowing on the way.
  return s.dim == 0 || uint64_t{s.tokens} * s.heads <= (UINT32_MAX / 2) / s.dim;
}

// Bytes of one layer's kivi codes of one tensor, and of its key and value (lo, scale) pairs.
SWIFTKV_HD uint64_t kivi_code_bytes(const LayerShape &s, uint32_t bits) {
  return (layer_tensor_elements(s) * bits + 7) / 8;
}
SWIFTKV_HD uint64_t kivi_key_pair_bytes(const LayerShape &s, uint32_t group) {
  return (uint64_t{s.tokens} + group - 1) / group * s.heads * s.dim * 4;
}
SWIFTKV_HD uint64_t kivi_value_pair_bytes(const LayerShape &s, uint32_t group) {
  return uint64_t{s.tokens} * s.heads * ((uint64_t{s.dim} + group - 1) / group) * 4;
}

// Bytes of one layer's payload under `encoding` (0 for a codec that is not layer by layer).
SWIFTKV_HD uint64_t layer_payload_bytes(const LayerShape &s, uint32_t encoding) {
  if (layer_codec(encoding) == kLayerKivi) {
    const uint32_t bits = layer_bits(encoding);
    const uint32_t group = 1u << layer_group_log2(encoding);
    return 2 * kivi_code_bytes(s, bits) + kivi_key_pair_bytes(s, group) +
           kivi_value_pair_bytes(s, group);
  }
  if (layer_codec(encoding) == kLayerFp8) {
    return 2 * uint64_t{s.tokens} * (4 + uint64_t{s.heads} * s.dim);
  }
  return 0;
}

// --- The arithmetic, identical on both sides --------------------------------------------------

SWIFTKV_HD float layer_bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
#endif
}

// The value of 16-bit element bits, of the type kBf16 says (as a compile-time constant, so that
// a decoder's inner loop has no branch on it) or bf16 says.
template <bool kBf16>
SWIFTKV_HD float element_value_as(uint32_t v) {
  if (kBf16) return layer_bits_to_float(v << 16);
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(v)));
#else
  return half_to_float(static_cast<uint16_t>(v));
#endif
}
SWIFTKV_HD float element_value(uint32_t v, uint32_t bf16) {
  return bf16 != 0 ? element_value_as<true>(v) : element_value_as<false>(v);
}

// Rounded to the element type, to nearest even (overflow to infinity).
template <bool kBf16>
SWIFTKV_HD uint16_t element_bits_as(float f) {
#if defined(__CUDA_ARCH__)
  if (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  return __half_as_ushort(__float2half_rn(f));
#else
  return kBf16 ? float_to_bf16(f) : float_to_half(f);
#endif
}
SWIFTKV_HD uint16_t element_bits(float f, uint32_t bf16) {
  return bf16 != 0 ? element_bits_as<true>(f) : element_bits_as<false>(f);
}

// A rounded product and a rounded sum, never fused (the host side is compiled with
// -ffp-contract=off, chunk_codec.cpp's formula).
SWIFTKV_HD float mul_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SWIFTKV_HD float add_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// An FP8 E4M3 ("FN") code's value, exactly. 0x7f and 0xff (NaN, which no encoder writes) give
// NaN; the host checks frames for them before they go to the device (check_layer_values).
SWIFTKV_HD float e4m3_value(uint32_t c) {
  const uint32_t ex = (c >> 3) & 0xfu, m = c & 0x7u;
  float v;
  if (ex == 0) {
    v = static_cast<float>(m) * (1.0f / 512.0f);
  } else if (ex == 15 && m == 7) {
    v = layer_bits_to_float(0x7fc00000u);
  } else {
    v = layer_bits_to_float(((ex + 120) << 23) | (m << 20));
  }
  return (c & 0x80u) != 0 ? -v : v;
}

SWIFTKV_HD uint32_t load_u16(const uint8_t *p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }
SWIFTKV_HD uint32_t load_u32(const uint8_t *p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
// The same values, in one load on the device where the address allows it (the eight-element
// path's words are aligned in every layout, the element path's need not be); on the host the
// compiler makes one load of the bytes.
SWIFTKV_HD uint32_t load_word(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 3u) == 0) return *reinterpret_cast<const uint32_t *>(p);
#endif
  return load_u32(p);
}
SWIFTKV_HD uint32_t load_half(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 1u) == 0) return *reinterpret_cast<const uint16_t *>(p);
#endif
  return load_u16(p);
}

// The type of an element's index in a layer and of the indices made from it (a kivi pair's, a
// group's code byte): 32 bits on a device, where every decoded layer fits (layer_fits_device: both
// tensors together under 2^32 elements, so each index is under 2^31 and a product with a part's
// element size widens once, one instruction), 64 on the host, which also decodes larger layers.
// The emulator (tests/emu) compiles the device's form for the host, against the host's form.
#if defined(__CUDA_ARCH__)
using LayerIndex = uint32_t;
#else
using LayerIndex = uint64_t;
#endif
// A quotient of such indices: in 32 bits on a device; the host's rows and head dims may pass 2^31.
SWIFTKV_HD uint32_t index_quotient(uint32_t n, const Divisor &v) {
#if defined(__CUDA_ARCH__)
  return quotient_31(n, v);
#else
  return quotient(n, v);
#endif
}

// Where element e of a layer is: K (kv 0) or V (1), its index i in that tensor, its token t and
// its index j in the token's heads x dim row.
struct LayerPos {
  uint32_t kv;
  uint32_t t;
  uint32_t j;
  LayerIndex i;
};
// kKv: 0 or 1 where the caller knows that e is a K or a V element (the decode kernel splits a row
// at the boundary), so nothing depends on the comparison; -1 where it does not.
template <int kKv = -1>
SWIFTKV_HD LayerPos layer_pos(const LayerShape &s, uint64_t e) {
  // 32-bit arithmetic and the row's Divisor where both tensors' elements fit 32 bits: on a device
  // always, as only layers that fit are decoded there (layer_fits_device). The host decodes a
  // larger layer with 64-bit divisions.
#if !defined(__CUDA_ARCH__)
  const uint64_t n64 = layer_tensor_elements(s);
  if (n64 > UINT32_MAX / 2) {
    const uint32_t kv = kKv >= 0 ? static_cast<uint32_t>(kKv) : (e >= n64 ? 1u : 0u);
    const uint64_t i = e - kv * n64, row = uint64_t{s.heads} * s.dim;
    return {kv, static_cast<uint32_t>(i / row), static_cast<uint32_t>(i % row), i};
  }
#endif
  const uint32_t n = s.tokens * s.heads * s.dim, e32 = static_cast<uint32_t>(e);
  const uint32_t kv = kKv >= 0 ? static_cast<uint32_t>(kKv) : (e32 >= n ? 1u : 0u);
  const uint32_t i = e32 - (kv != 0 ? n : 0u);
  const uint32_t t = index_quotient(i, s.row);
  return {kv, t, i - t * s.row.d, i};
}

// fp8: the record (scale, codes) of the element's token.
SWIFTKV_HD const uint8_t *fp8_record(const uint8_t *p, const LayerShape &s, const LayerPos &at) {
  // A record's index is under 2 x tokens and its size under 2^31 + 4: one widening product.
  return p + uint64_t{LayerIndex{at.kv} * s.tokens + at.t} * (4 + LayerIndex{s.heads} * s.dim);
}
SWIFTKV_HD uint16_t fp8_element(uint32_t code, float scale, uint32_t bf16) {
  return element_bits(mul_rounded(e4m3_value(code), scale), bf16);
}
template <bool kBf16>
SWIFTKV_HD uint16_t fp8_element_as(uint32_t code, float scale) {
  return element_bits_as<kBf16>(mul_rounded(e4m3_value(code), scale));
}

// kivi: where a layer's parts are, and the (lo, scale) pair of an element.
struct KiviParts {
  uint32_t bits, glog;
  uint64_t codes, key_pairs;
};
SWIFTKV_HD KiviParts kivi_parts(const LayerShape &s, uint32_t encoding) {
  const uint32_t bits = layer_bits(encoding), glog = layer_group_log2(encoding);
  // kivi_key_pair_bytes with the group's power of two as a shift: the decoder makes these parts
  // once per 8 elements, and a 64-bit division by a variable is a long routine on a GPU.
  const uint64_t key_groups = (uint64_t{s.tokens} + (1u << glog) - 1) >> glog;
  return {bits, glog, kivi_code_bytes(s, bits), key_groups * s.heads * s.dim * 4};
}
SWIFTKV_HD const uint8_t *kivi_codes(const uint8_t *p, const KiviParts &k, const LayerPos &at) {
  return p + (at.kv != 0 ? k.codes + k.key_pairs : 0);
}
// The pair's index is under the tensor's elements: for keys (t >> glog) x row + j <= i, for values
// (t x heads + h + 1) x vgroups <= tokens x heads x dim.
SWIFTKV_HD const uint8_t *kivi_pair(const uint8_t *p, const LayerShape &s, const KiviParts &k,
                                    const LayerPos &at) {
  if (at.kv == 0) {
    return p + k.codes + uint64_t{LayerIndex{at.t >> k.glog} * s.heads * s.dim + at.j} * 4;
  }
  const uint32_t h = index_quotient(at.j, s.channels), d = at.j - h * s.dim;
  const LayerIndex vgroups = (LayerIndex{s.dim} + (1u << k.glog) - 1) >> k.glog;
  return p + 2 * k.codes + k.key_pairs +
         uint64_t{(LayerIndex{at.t} * s.heads + h) * vgroups + (d >> k.glog)} * 4;
}
// Code q under the pair (lo, scale), and under the pair word w: lo in its low half, then scale.
template <bool kBf16>
SWIFTKV_HD uint16_t kivi_value_as(uint32_t q, float lo, float scale) {
  return element_bits_as<kBf16>(add_rounded(lo, mul_rounded(static_cast<float>(q), scale)));
}
SWIFTKV_HD uint16_t kivi_value(uint32_t q, uint32_t w, uint32_t bf16) {
  if (bf16 != 0) {
    return kivi_value_as<true>(q, element_value_as<true>(w & 0xffffu),
                               element_value_as<true>(w >> 16));
  }
  return kivi_value_as<false>(q, element_value_as<false>(w & 0xffffu),
                              element_value_as<false>(w >> 16));
}
SWIFTKV_HD uint16_t kivi_element(uint32_t q, const uint8_t *pair, uint32_t bf16) {
  return kivi_value(q, load_word(pair), bf16);
}

// Element e (in [0, 2 x layer_tensor_elements)) of the layer whose payload is at p.
SWIFTKV_HD uint16_t decode_layer_element(const uint8_t *p, const LayerShape &s, uint32_t encoding,
                                         uint64_t e) {
  const LayerPos at = layer_pos(s, e);
  if (layer_codec(encoding) == kLayerFp8) {
    const uint8_t *rec = fp8_record(p, s, at);
    return fp8_element(rec[4 + at.j], layer_bits_to_float(load_word(rec)), s.bf16);
  }
  const KiviParts k = kivi_parts(s, encoding);
  const uint64_t bit = uint64_t{at.i} * k.bits;
  const uint32_t q = (uint32_t{kivi_codes(p, k, at)[bit / 8]} >> (bit % 8)) & ((1u << k.bits) - 1);
  return kivi_element(q, kivi_pair(p, s, k, at), s.bf16);
}

// What the decoder reads for elements [e, e + 8), where e % 8 == 0 and dim % 8 == 0: the eight
// share a token and a head (and, for values, a group: groups are at least 8 channels), and their
// codes are whole bytes. Fetching is apart from decoding so that a kernel can have the reads of
// several such groups in flight before it decodes the first (decode_items).
struct Fetched8 {
  uint64_t codes;     // the eight codes, low bits first (fp8: a byte each; kivi: `bits` each)
  uint32_t words[8];  // fp8: [0] the token's scale; kivi keys: the (lo, scale) pair of each
                      // channel; kivi values: [0] the one pair of the eight (the rest unset)
  uint32_t keys;      // kivi: 1 for keys (a pair a channel), 0 for values
};

// Whether every word fetch_layer_8 reads from a layer of this shape and encoding lies at a
// multiple of its size when the payload is 16-byte aligned (as staging holds it): kivi's codes
// (2, 4 or 8 bytes at e * bits / 8), a key group's eight pairs (32 bytes), a value pair and fp8's
// scale and codes (4 bytes each). For kivi that takes codes of whole 16-byte multiples (so the
// pairs after them start aligned); fp8's records are 4 + heads * dim bytes. Then a kernel reads
// them as words of their size (fetch_layer_8<true>) rather than testing each address.
SWIFTKV_HD bool layer_words_aligned(const LayerShape &s, uint32_t encoding) {
  if (s.dim % 8 != 0) return false;
  if (layer_codec(encoding) == kLayerKivi) {
    return kivi_code_bytes(s, layer_bits(encoding)) % 16 == 0;
  }
  return layer_codec(encoding) == kLayerFp8;
}

// kAligned: the payload is 16-byte aligned and layer_words_aligned holds; each word is then read
// in one load of its size (on a device; the host reads bytes either way).
template <bool kAligned>
SWIFTKV_HD uint32_t fetch_word(const uint8_t *p) {
#if defined(__CUDA_ARCH__)
  if (kAligned) return *reinterpret_cast<const uint32_t *>(p);
#endif
  return load_word(p);
}

// kKv as layer_pos's: the eight are K's (0) or V's (1), or either (-1).
template <bool kAligned = false, int kKv = -1>
SWIFTKV_HD void fetch_layer_8(const uint8_t *p, const LayerShape &s, uint32_t encoding, uint64_t e,
                              Fetched8 &f) {
  const LayerPos at = layer_pos<kKv>(s, e);
  f.keys = 0;
  if (layer_codec(encoding) == kLayerFp8) {
    const uint8_t *rec = fp8_record(p, s, at);
    f.words[0] = fetch_word<kAligned>(rec);
    f.codes = uint64_t{fetch_word<kAligned>(rec + 4 + at.j)} |
              (uint64_t{fetch_word<kAligned>(rec + 8 + at.j)} << 32);
    return;
  }
  const KiviParts kp = kivi_parts(s, encoding);
  // i is a multiple of 8: its codes start at byte (i / 8) x bits, under the tensor's elements.
  const uint8_t *code_at = kivi_codes(p, kp, at) + uint64_t{(at.i >> 3) * kp.bits};
  // `bits` bytes of codes (8, 4 or 2).
#if defined(__CUDA_ARCH__)
  if (kAligned) {
    f.codes = kp.bits == 8   ? *reinterpret_cast<const uint64_t *>(code_at)
              : kp.bits == 4 ? uint64_t{*reinterpret_cast<const uint32_t *>(code_at)}
                             : uint64_t{*reinterpret_cast<const uint16_t *>(code_at)};
  } else
#endif
  {
    f.codes = kp.bits == 2 ? load_half(code_at) : load_word(code_at);
    if (kp.bits == 8) f.codes |= uint64_t{load_word(code_at + 4)} << 32;
  }
  // Keys: a pair per channel, consecutive; values: one pair for the eight.
  const uint8_t *pair = kivi_pair(p, s, kp, at);
  if (at.kv != 0) {
    f.words[0] = fetch_word<kAligned>(pair);
    return;
  }
  f.keys = 1;
#if defined(__CUDA_ARCH__)
  if (kAligned) {
    const uint4 a = reinterpret_cast<const uint4 *>(pair)[0];
    const uint4 b = reinterpret_cast<const uint4 *>(pair)[1];
    f.words[0] = a.x, f.words[1] = a.y, f.words[2] = a.z, f.words[3] = a.w;
    f.words[4] = b.x, f.words[5] = b.y, f.words[6] = b.z, f.words[7] = b.w;
  } else
#endif
  {
    SWIFTKV_UNROLL_8
    for (uint32_t k = 0; k < 8; ++k) f.words[k] = load_word(pair + 4 * k);
  }
}

// The eight elements of a fetched group, of the element type kBf16 says.
template <bool kBf16>
SWIFTKV_HD void decode_fetched_8_as(const Fetched8 &f, uint32_t encoding, uint16_t out[8]) {
  if (layer_codec(encoding) == kLayerFp8) {
    const float scale = layer_bits_to_float(f.words[0]);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // The device's own conversion, two codes an instruction (sm_89 on): every e4m3 value is an f16
    // value, so the pair is exact, and equal to e4m3_value's (NaN codes never reach a device).
    SWIFTKV_UNROLL_8
    for (uint32_t k = 0; k < 8; k += 2) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(f.codes >> (8 * k));
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
      out[k] = element_bits_as<kBf16>(mul_rounded(element_value_as<false>(h.x), scale));
      out[k + 1] = element_bits_as<kBf16>(mul_rounded(element_value_as<false>(h.y), scale));
    }
#else
    SWIFTKV_UNROLL_8
    for (uint32_t k = 0; k < 8; ++k) {
      out[k] = fp8_element_as<kBf16>(static_cast<uint32_t>(f.codes >> (8 * k)) & 0xffu, scale);
    }
#endif
    return;
  }
  const uint32_t bits = layer_bits(encoding), mask = (1u << bits) - 1;
  if (f.keys == 0) {  // one pair for the eight: its halves made floats once
    const float lo = element_value_as<kBf16>(f.words[0] & 0xffffu);
    const float scale = element_value_as<kBf16>(f.words[0] >> 16);
    SWIFTKV_UNROLL_8
    for (uint32_t k = 0; k < 8; ++k) {
      out[k] = kivi_value_as<kBf16>(static_cast<uint32_t>(f.codes >> (k * bits)) & mask, lo, scale);
    }
    return;
  }
  SWIFTKV_UNROLL_8
  for (uint32_t k = 0; k < 8; ++k) {
    out[k] = kivi_value_as<kBf16>(static_cast<uint32_t>(f.codes >> (k * bits)) & mask,
                                  element_value_as<kBf16>(f.words[k] & 0xffffu),
                                  element_value_as<kBf16>(f.words[k] >> 16));
  }
}
SWIFTKV_HD void decode_fetched_8(const Fetched8 &f, const LayerShape &s, uint32_t encoding,
                                 uint16_t out[8]) {
  if (s.bf16 != 0) {
    decode_fetched_8_as<true>(f, encoding, out);
  } else {
    decode_fetched_8_as<false>(f, encoding, out);
  }
}

// Elements [e, e + 8) at once (fetch_layer_8's conditions). out[k] is element e + k.
SWIFTKV_HD void decode_layer_8(const uint8_t *p, const LayerShape &s, uint32_t encoding, uint64_t e,
                               uint16_t out[8]) {
  Fetched8 f;
  fetch_layer_8(p, s, encoding, e, f);
  decode_fetched_8(f, s, encoding, out);
}

}  // namespace swiftkv::codec

#if !defined(__CUDACC__)
#include <cstddef>
#include <span>

namespace swiftkv::codec {

struct ChunkShape;
struct CodecParams;

LayerShape layer_shape_of(const ChunkShape &s) noexcept;
// Whether frames of these parameters decode layer by layer (kivi, fp8), on the device too.
bool decodes_by_layer(const CodecParams &p) noexcept;

// Elements [first, first + count) of the layer whose payload is at `payload`, as the CUDA decoder
// writes them (little-endian 16-bit elements) into out: the decoder's CPU twin.
void decode_layer_cpu(const std::byte *payload, const LayerShape &s, uint32_t encoding,
                      uint64_t first, uint64_t count, std::byte *out) noexcept;

// For a frame whose header was checked (under `params`, of this shape): EIO where
// codec::decode would refuse its values (fp8: a scale that is not finite and >= 0, a NaN code;
// kivi: a (lo, scale) pair with a NaN or infinite half), EINTERNAL for a codec that does not decode
// layer by layer. What a frame passes before its layers are decoded on the device, where nothing
// can be refused.
void check_layer_values(std::span<const std::byte> frame, const ChunkShape &shape,
                        const CodecParams &params);

}  // namespace swiftkv::codec
#endif
