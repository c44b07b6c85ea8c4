#include "core/codec/chunk_codec.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#if defined(SWIFTKV_HAVE_ZSTD)
#include <zstd.h>
#endif

#include "core/codec/layer_decode.hpp"
#include "core/common/error.hpp"

namespace swiftkv::codec {

float fp8_checked_scale(const uint8_t *record, uint64_t row) {
  float scale;
  std::memcpy(&scale, record, 4);
  if (!std::isfinite(scale) || scale < 0.0f) fail(SWIFTKV_EIO, "an fp8 frame has a bad scale");
  const uint8_t *codes = record + 4;
  uint32_t nan = 0;
  for (uint64_t i = 0; i < row; ++i) nan |= static_cast<uint32_t>((codes[i] & 0x7fu) == 0x7fu);
  if (nan != 0) fail(SWIFTKV_EIO, "an fp8 frame holds a NaN code");
  return scale;
}

void kivi_check_pairs(const uint8_t *pairs, uint64_t n, swiftkv_dtype dtype) {
  // A half is not finite when its exponent is all ones: 5 bits in f16, 8 in bf16. A device load
  // runs this over every kivi chunk before the request starts, so four halves are tested at a
  // time (a lane of (w & ones) ^ ones is zero exactly where the exponent is all ones; the borrow
  // test finds whether any lane is zero): about four times the speed of one half at a time.
  const uint32_t ones = dtype == SWIFTKV_DTYPE_BF16 ? 0x7f80u : 0x7c00u;
  const uint64_t bytes = 4 * n;
  uint64_t i = 0, zero_lanes = 0;
  if constexpr (std::endian::native == std::endian::little) {
    const uint64_t m = ones * 0x0001000100010001ull;
    for (; i + 8 <= bytes; i += 8) {
      uint64_t w;
      std::memcpy(&w, pairs + i, 8);
      const uint64_t t = (w & m) ^ m;
      zero_lanes |= (t - 0x0001000100010001ull) & ~t & 0x8000800080008000ull;
    }
  }
  uint32_t bad = zero_lanes != 0 ? 1u : 0u;
  for (; i < bytes; i += 2) {
    const uint32_t v = uint32_t{pairs[i]} | (uint32_t{pairs[i + 1]} << 8);
    bad |= static_cast<uint32_t>((v & ones) == ones);
  }
  if (bad != 0) fail(SWIFTKV_EIO, "a kivi frame holds a NaN or infinite (lo, scale) pair");
}

namespace {

// --- 16-bit floats: the chunk's own element type ------------------------------------------------

// The next 16-bit float above v (both formats are sign and magnitude).
uint16_t next_up(uint16_t v) {
  if (v == 0x8000u) return 0x0001u;
  return (v & 0x8000u) != 0 ? static_cast<uint16_t>(v - 1) : static_cast<uint16_t>(v + 1);
}
// f rounded up to the element type (never below f).
uint16_t round_up(float f, swiftkv_dtype t) {
  uint16_t v = float_to_element(f, t);
  if (element_to_float(v, t) < f) v = next_up(v);
  return v;
}

uint16_t load16(const std::byte *p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store16(std::byte *p, uint16_t v) { std::memcpy(p, &v, 2); }

// n floats to elements at out, each exactly as float_to_element rounds it. f16: a branch-free
// path for values whose f16 is normal (what the compiler can vectorise), then the others (zero,
// subnormal, overflow, NaN) converted again one by one; bf16: branch-free unless a NaN.
void to_elements(const float *x, size_t n, swiftkv_dtype t, std::byte *out) {
  constexpr size_t kBlock = 256;
  uint16_t tmp[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    if (t == SWIFTKV_DTYPE_BF16) {
      uint32_t nan = 0;
      for (size_t i = 0; i < m; ++i) {
        const uint32_t v = float_to_bits(x[b + i]);
        nan |= static_cast<uint32_t>((v & 0x7fffffffu) > 0x7f800000u);
        tmp[i] = static_cast<uint16_t>((v + 0x7fffu + ((v >> 16) & 1u)) >> 16);
      }
      if (nan != 0) {
        for (size_t i = 0; i < m; ++i) tmp[i] = float_to_bf16(x[b + i]);
      }
    } else {
      uint8_t other[kBlock];
      uint32_t any = 0;
      for (size_t i = 0; i < m; ++i) {
        const uint32_t v = float_to_bits(x[b + i]);
        const uint32_t abs = v & 0x7fffffffu;
        // Normal as a half, and not rounding to infinity: [2^-14, 65520).
        const uint32_t o = static_cast<uint32_t>(abs - 0x38800000u >= 0x477ff000u - 0x38800000u);
        other[i] = static_cast<uint8_t>(o);
        any |= o;
        uint32_t r = (abs >> 13) - (112u << 10);
        const uint32_t rest = abs & 0x1fffu;
        r += static_cast<uint32_t>(rest > 0x1000u) | (static_cast<uint32_t>(rest == 0x1000u) & r);
        tmp[i] = static_cast<uint16_t>(((v >> 16) & 0x8000u) | (r & 0xffffu));
      }
      if (any != 0) {
        for (size_t i = 0; i < m; ++i) {
          if (other[i] != 0) tmp[i] = float_to_half(x[b + i]);
        }
      }
    }
    std::memcpy(out + b * 2, tmp, m * 2);
  }
}

// --- The frame header ---------------------------------------------------------------------------

void put(std::byte *p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t get(const std::byte *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void write_header(std::byte *h, const ChunkShape &s, const CodecParams &c, uint64_t payload) {
  put(h + 0, kFrameMagic, 4);
  put(h + 4, kFrameFormat, 2);
  put(h + 6, static_cast<uint8_t>(c.codec), 1);
  put(h + 7, c.codec == Codec::kivi ? c.bits : 0, 1);
  put(h + 8, c.codec == Codec::kivi ? c.group : 0, 2);
  put(h + 10, c.codec == Codec::zstd && c.byte_planes ? 1 : 0, 2);
  put(h + 12, static_cast<uint32_t>(s.dtype), 4);
  put(h + 16, s.layers, 4);
  put(h + 20, s.tokens, 4);
  put(h + 24, s.heads, 4);
  put(h + 28, s.dim, 4);
  put(h + 32, s.bytes(), 8);
  put(h + 40, payload, 8);
}

// --- KIVI
// -----------------------------------------------------------------------------------------

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Bytes of n codes of `bits` bits, packed from the least significant bit of each byte up.
uint64_t packed_bytes(uint64_t n, uint32_t bits) { return ceil_div(n * bits, 8); }

struct KiviLayout {
  uint64_t codes;       // bytes of one tensor's (K's or V's) codes
  uint64_t key_params;  // bytes of K's (min, scale) pairs
  uint64_t val_params;  // bytes of V's
  uint64_t layer() const { return 2 * codes + key_params + val_params; }
};

KiviLayout kivi_layout(const ChunkShape &s, const CodecParams &c) {
  const uint64_t n = uint64_t{s.tokens} * s.heads * s.dim;
  KiviLayout k;
  k.codes = packed_bytes(n, c.bits);
  k.key_params = ceil_div(s.tokens, c.group) * s.heads * s.dim * 4;
  k.val_params = uint64_t{s.tokens} * s.heads * ceil_div(s.dim, c.group) * 4;
  return k;
}

// One quantisation group: its min (exact: an element) and its scale (rounded up), as stored.
struct Group {
  uint16_t lo = 0, scale = 0;
};

Group make_group(float mn, float mx, uint32_t bits, swiftkv_dtype t) {
  Group g;
  g.lo = float_to_element(mn, t);  // exact: mn is one of the elements
  const float levels = static_cast<float>((1u << bits) - 1);
  g.scale =
      mx > mn ? round_up((mx - element_to_float(g.lo, t)) / levels, t) : float_to_element(0.0f, t);
  return g;
}

uint32_t quantise(float x, float lo, float scale, uint32_t bits) {
  if (!(scale > 0.0f)) return 0;
  const float q = std::nearbyint((x - lo) / scale);
  const float top = static_cast<float>((1u << bits) - 1);
  return static_cast<uint32_t>(std::clamp(q, 0.0f, top));
}

// The one dequantisation formula: a product, then a sum, each rounded (this file is compiled
// with -ffp-contract=off, and the CUDA decoder uses __fmul_rn and __fadd_rn).
float dequantise(uint32_t q, float lo, float scale) { return lo + static_cast<float>(q) * scale; }

class BitWriter {
 public:
  BitWriter(std::byte *out, uint32_t bits) : out_(out), bits_(bits) {}
  void push(uint32_t q) {
    acc_ |= static_cast<uint64_t>(q) << fill_;
    fill_ += bits_;
    while (fill_ >= 8) {
      *out_++ = static_cast<std::byte>(acc_ & 0xffu);
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  void flush() {
    if (fill_ > 0) *out_++ = static_cast<std::byte>(acc_ & 0xffu);
    acc_ = 0;
    fill_ = 0;
  }

 private:
  std::byte *out_;
  uint32_t bits_;
  uint64_t acc_ = 0;
  uint32_t fill_ = 0;
};

uint32_t code_at(const std::byte *codes, uint64_t i, uint32_t bits) {
  const uint64_t bit = i * bits;
  const auto byte = static_cast<uint32_t>(codes[bit / 8]);
  return (byte >> (bit % 8)) & ((1u << bits) - 1);
}

// Element (t, h, d) of one tensor (K or V of one layer) in its block-major bytes.
struct Tensor {
  const std::byte *base;
  uint32_t heads, dim;
  float at(uint32_t t, uint32_t h, uint32_t d, swiftkv_dtype dt) const {
    return element_to_float(load16(base + ((uint64_t{t} * heads + h) * dim + d) * 2), dt);
  }
};

void check_finite(float x) {
  if (!std::isfinite(x))
    fail_invalid("the chunk holds a NaN or an infinity: kivi cannot encode it");
}

// The group of the n elements at(0..n): their range (finite, else EINVAL), as stored.
template <class At>
Group fit_group(uint32_t n, At at, uint32_t bits, swiftkv_dtype t) {
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  for (uint32_t i = 0; i < n; ++i) {
    const float x = at(i);
    check_finite(x);
    mn = std::min(mn, x);
    mx = std::max(mx, x);
  }
  check_finite(mx - mn);
  return make_group(mn, mx, bits, t);
}

void store_group(std::byte *p, const Group &g) {
  store16(p, g.lo);
  store16(p + 2, g.scale);
}

// Keys: per channel (h, d), over groups of `group` tokens. Params in (token group, h, d) order.
void kivi_keys(const ChunkShape &s, const CodecParams &c, const Tensor &k, std::byte *codes,
               std::byte *params) {
  const uint32_t groups = static_cast<uint32_t>(ceil_div(s.tokens, c.group));
  std::vector<Group> g(uint64_t{groups} * s.heads * s.dim);
  for (uint32_t gi = 0; gi < groups; ++gi) {
    const uint32_t t0 = gi * c.group, t1 = std::min(s.tokens, t0 + c.group);
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (uint32_t d = 0; d < s.dim; ++d) {
        const uint64_t at = (uint64_t{gi} * s.heads + h) * s.dim + d;
        g[at] = fit_group(
            t1 - t0, [&](uint32_t i) { return k.at(t0 + i, h, d, s.dtype); }, c.bits, s.dtype);
        store_group(params + at * 4, g[at]);
      }
    }
  }
  BitWriter w(codes, c.bits);
  for (uint32_t t = 0; t < s.tokens; ++t) {
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (uint32_t d = 0; d < s.dim; ++d) {
        const Group &gr = g[(uint64_t{t / c.group} * s.heads + h) * s.dim + d];
        w.push(quantise(k.at(t, h, d, s.dtype), element_to_float(gr.lo, s.dtype),
                        element_to_float(gr.scale, s.dtype), c.bits));
      }
    }
  }
  w.flush();
}

// Values: per token and head, over groups of `group` channels. Params in (t, h, channel group).
void kivi_values(const ChunkShape &s, const CodecParams &c, const Tensor &v, std::byte *codes,
                 std::byte *params) {
  const uint32_t groups = static_cast<uint32_t>(ceil_div(s.dim, c.group));
  BitWriter w(codes, c.bits);
  for (uint32_t t = 0; t < s.tokens; ++t) {
    for (uint32_t h = 0; h < s.heads; ++h) {
      for (uint32_t gj = 0; gj < groups; ++gj) {
        const uint32_t d0 = gj * c.group, d1 = std::min(s.dim, d0 + c.group);
        const Group gr = fit_group(
            d1 - d0, [&](uint32_t i) { return v.at(t, h, d0 + i, s.dtype); }, c.bits, s.dtype);
        store_group(params + ((uint64_t{t} * s.heads + h) * groups + gj) * 4, gr);
        for (uint32_t d = d0; d < d1; ++d) {
          w.push(quantise(v.at(t, h, d, s.dtype), element_to_float(gr.lo, s.dtype),
                          element_to_float(gr.scale, s.dtype), c.bits));
        }
      }
    }
  }
  w.flush();
}

void kivi_encode(const ChunkShape &s, const CodecParams &c, const std::byte *raw, std::byte *out) {
  const KiviLayout k = kivi_layout(s, c);
  const uint64_t tensor = uint64_t{s.tokens} * s.heads * s.dim * 2;
  for (uint32_t l = 0; l < s.layers; ++l) {
    std::byte *o = out + l * k.layer();
    const Tensor key{raw + (2 * uint64_t{l}) * tensor, s.heads, s.dim};
    const Tensor val{raw + (2 * uint64_t{l} + 1) * tensor, s.heads, s.dim};
    kivi_keys(s, c, key, o, o + k.codes);
    kivi_values(s, c, val, o + k.codes + k.key_params, o + 2 * k.codes + k.key_params);
  }
}

// Codes [first, first + n) of a packed run into q. Whole bytes when the run starts on one (8 /
// bits codes a byte, low bits first), else code by code.
void unpack_codes(const std::byte *codes, uint64_t first, size_t n, uint32_t bits, uint8_t *q) {
  if ((first * bits) % 8 != 0) {
    for (size_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(code_at(codes, first + i, bits));
    return;
  }
  const auto *p = reinterpret_cast<const uint8_t *>(codes) + first * bits / 8;
  const uint32_t mask = (1u << bits) - 1, per_byte = 8 / bits;
  size_t i = 0;
  if (bits == 8) {
    std::memcpy(q, p, n);
    return;
  }
  for (; i + per_byte <= n; i += per_byte, ++p) {
    for (uint32_t k = 0; k < per_byte; ++k)
      q[i + k] = static_cast<uint8_t>((*p >> (k * bits)) & mask);
  }
  for (uint32_t k = 0; i < n; ++i, ++k) q[i] = static_cast<uint8_t>((*p >> (k * bits)) & mask);
}

// Token by token: a row of heads x dim codes unpacked, dequantised against per-element (lo,
// scale) arrays (keys': reloaded at each token group; values': per token), then converted in
// bulk. The same formula and rounding as element by element.
void kivi_decode(const ChunkShape &s, const CodecParams &c, const std::byte *in, std::byte *out) {
  const KiviLayout k = kivi_layout(s, c);
  const uint64_t row = uint64_t{s.heads} * s.dim;
  const uint64_t tensor = uint64_t{s.tokens} * row * 2;
  const uint32_t vgroups = static_cast<uint32_t>(ceil_div(s.dim, c.group));
  std::vector<float> klo(row), ksc(row), vlo(row), vsc(row), x(row);
  std::vector<uint8_t> q(row);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::byte *kc = in + l * k.layer();
    const std::byte *kp = kc + k.codes;
    const std::byte *vc = kp + k.key_params;
    const std::byte *vp = vc + k.codes;
    kivi_check_pairs(reinterpret_cast<const uint8_t *>(kp), k.key_params / 4, s.dtype);
    kivi_check_pairs(reinterpret_cast<const uint8_t *>(vp), k.val_params / 4, s.dtype);
    std::byte *ko = out + (2 * uint64_t{l}) * tensor;
    std::byte *vo = out + (2 * uint64_t{l} + 1) * tensor;
    for (uint32_t t = 0; t < s.tokens; ++t) {
      if (t % c.group == 0) {
        const std::byte *pk = kp + uint64_t{t / c.group} * row * 4;
        for (uint64_t j = 0; j < row; ++j) {
          klo[j] = element_to_float(load16(pk + j * 4), s.dtype);
          ksc[j] = element_to_float(load16(pk + j * 4 + 2), s.dtype);
        }
      }
      unpack_codes(kc, t * row, row, c.bits, q.data());
      for (uint64_t j = 0; j < row; ++j) x[j] = dequantise(q[j], klo[j], ksc[j]);
      to_elements(x.data(), row, s.dtype, ko + t * row * 2);

      const std::byte *pv = vp + uint64_t{t} * s.heads * vgroups * 4;
      for (uint32_t h = 0; h < s.heads; ++h) {
        for (uint32_t gj = 0; gj < vgroups; ++gj) {
          const std::byte *g = pv + (uint64_t{h} * vgroups + gj) * 4;
          const float lo = element_to_float(load16(g), s.dtype);
          const float sc = element_to_float(load16(g + 2), s.dtype);
          const uint64_t d0 = uint64_t{h} * s.dim + uint64_t{gj} * c.group;
          const uint64_t d1 = uint64_t{h} * s.dim + std::min<uint64_t>(s.dim, (gj + 1) * c.group);
          std::fill(vlo.begin() + static_cast<ptrdiff_t>(d0),
                    vlo.begin() + static_cast<ptrdiff_t>(d1), lo);
          std::fill(vsc.begin() + static_cast<ptrdiff_t>(d0),
                    vsc.begin() + static_cast<ptrdiff_t>(d1), sc);
        }
      }
      unpack_codes(vc, t * row, row, c.bits, q.data());
      for (uint64_t j = 0; j < row; ++j) x[j] = dequantise(q[j], vlo[j], vsc[j]);
      to_elements(x.data(), row, s.dtype, vo + t * row * 2);
    }
  }
}

// --- FP8 E4M3
// -------------------------------------------------------------------------------------

constexpr float kE4m3Max = 448.0f;

// Round to nearest even, saturating at +-448 (E4M3 has no infinity).
uint8_t to_e4m3(float y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  float a = std::fabs(y);
  if (!(a < 464.0f)) return sign | 0x7e;  // 464 and above (and NaN) saturate to 448
  if (a < 0.015625f) {                    // below 2^-6: subnormal, steps of 2^-9
    const auto m = static_cast<uint32_t>(std::nearbyint(a * 512.0f));
    return static_cast<uint8_t>(sign | m);  // m == 8 is the smallest normal's code
  }
  int e = 0;
  const float f = std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  auto m = static_cast<uint32_t>(std::nearbyint((f * 2.0f - 1.0f) * 8.0f));
  int exp = e - 1 + 7;
  if (m == 8) {
    m = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && m == 7)) return sign | 0x7e;
  return static_cast<uint8_t>(sign | (exp << 3) | m);
}

uint64_t fp8_row(const ChunkShape &s) { return 4 + uint64_t{s.heads} * s.dim; }

void fp8_encode(const ChunkShape &s, const std::byte *raw, std::byte *out) {
  const uint64_t row = uint64_t{s.heads} * s.dim;
  const uint64_t rows = uint64_t{s.layers} * 2 * s.tokens;
  for (uint64_t r = 0; r < rows; ++r) {
    const std::byte *in = raw + r * row * 2;
    std::byte *o = out + r * fp8_row(s);
    float amax = 0.0f;
    for (uint64_t i = 0; i < row; ++i) {
      const float x = element_to_float(load16(in + i * 2), s.dtype);
      if (!std::isfinite(x))
        fail_invalid("the chunk holds a NaN or an infinity: fp8 cannot encode it");
      amax = std::max(amax, std::fabs(x));
    }
    const float scale = amax / kE4m3Max;
    std::memcpy(o, &scale, 4);
    for (uint64_t i = 0; i < row; ++i) {
      const float x = element_to_float(load16(in + i * 2), s.dtype);
      o[4 + i] = static_cast<std::byte>(scale > 0.0f ? to_e4m3(x / scale) : 0);
    }
  }
}

// Row by row (one token's K or V of one layer): every code's element under the row's scale is
// made once (256 of them, when the row is longer than that) and the row is a lookup; shorter
// rows convert element by element in bulk. Either way each element is the code's value times
// the scale, rounded to float, then to the element type.
void fp8_decode(const ChunkShape &s, const std::byte *in, std::byte *out) {
  std::array<float, 256> table{};
  for (uint32_t v = 0; v < 256; ++v) table[v] = e4m3_value(v);
  const uint64_t row = uint64_t{s.heads} * s.dim;
  const uint64_t rows = uint64_t{s.layers} * 2 * s.tokens;
  const bool lookup = row > 256;
  std::vector<float> x(lookup ? 256 : row);
  std::array<uint16_t, 256> elements{};
  for (uint64_t r = 0; r < rows; ++r) {
    const auto *p = reinterpret_cast<const uint8_t *>(in + r * fp8_row(s));
    const float scale = fp8_checked_scale(p, row);
    const uint8_t *codes = p + 4;
    std::byte *o = out + r * row * 2;
    if (lookup) {
      for (size_t v = 0; v < 256; ++v) x[v] = table[v] * scale;
      to_elements(x.data(), 256, s.dtype, reinterpret_cast<std::byte *>(elements.data()));
      for (uint64_t i = 0; i < row; ++i) std::memcpy(o + i * 2, &elements[codes[i]], 2);
    } else {
      for (uint64_t i = 0; i < row; ++i) x[i] = table[codes[i]] * scale;
      to_elements(x.data(), row, s.dtype, o);
    }
  }
}

// --- zstd
// -----------------------------------------------------------------------------------------

#if defined(SWIFTKV_HAVE_ZSTD)
// Every element's low byte, then every element's high byte.
void split_planes(const std::byte *in, uint64_t n, std::byte *out) {
  for (uint64_t i = 0; i < n; ++i) {
    out[i] = in[2 * i];
    out[n + i] = in[2 * i + 1];
  }
}
void join_planes(const std::byte *in, uint64_t n, std::byte *out) {
  for (uint64_t i = 0; i < n; ++i) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[n + i];
  }
}
#endif

uint64_t expected_payload(const ChunkShape &s, const CodecParams &c) {
  switch (c.codec) {
    case Codec::raw: return s.bytes();
    case Codec::kivi: return kivi_layout(s, c).layer() * s.layers;
    case Codec::fp8: return fp8_row(s) * s.layers * 2 * s.tokens;
    case Codec::zstd: return 0;  // whatever the encoder made
  }
  return 0;
}

bool power_of_two(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

const char *codec_name(Codec c) noexcept {
  switch (c) {
    case Codec::raw: return "raw";
    case Codec::zstd: return "zstd";
    case Codec::kivi: return "kivi";
    case Codec::fp8: return "fp8";
  }
  return "unknown";
}

bool lossless(Codec c) noexcept { return c == Codec::raw || c == Codec::zstd; }

bool zstd_available() noexcept {
#if defined(SWIFTKV_HAVE_ZSTD)
  return true;
#else
  return false;
#endif
}

void check_params(const ChunkShape &s, const CodecParams &c) {
  if (s.dtype != SWIFTKV_DTYPE_F16 && s.dtype != SWIFTKV_DTYPE_BF16) {
    fail_invalid("codecs take f16 or bf16 chunks, not dtype " + std::to_string(s.dtype));
  }
  if (s.layers == 0 || s.tokens == 0 || s.heads == 0 || s.dim == 0) {
    fail_invalid("a chunk shape has no zero sizes");
  }
  if (s.elements() > (uint64_t{1} << 40)) fail_invalid("a chunk of over 2^40 elements");
  switch (c.codec) {
    case Codec::raw:
    case Codec::fp8: break;
    case Codec::zstd:
      if (c.zstd_level < 1 || c.zstd_level > 19) {
        fail_invalid("zstd level " + std::to_string(c.zstd_level) + " is not in 1..19");
      }
      if (!zstd_available()) fail(SWIFTKV_EUNSUPPORTED, "this build has no libzstd");
      break;
    case Codec::kivi:
      if (c.bits != 8 && c.bits != 4 && c.bits != 2) {
        fail_invalid("kivi bits " + std::to_string(c.bits) + " is not 8, 4 or 2");
      }
      if (c.group < 8 || c.group > 256 || !power_of_two(c.group)) {
        fail_invalid("kivi group " + std::to_string(c.group) + " is not a power of two in 8..256");
      }
      break;
    default:
      fail_invalid("codec " + std::to_string(static_cast<unsigned>(c.codec)) + " is not one");
  }
}

std::vector<std::byte> encode(const ChunkShape &s, const CodecParams &c,
                              std::span<const std::byte> raw) {
  check_params(s, c);
  if (raw.size() != s.bytes()) {
    fail_invalid("the chunk is " + std::to_string(raw.size()) + " bytes; its shape says " +
                 std::to_string(s.bytes()));
  }
  std::vector<std::byte> out;
  if (c.codec == Codec::zstd) {
#if defined(SWIFTKV_HAVE_ZSTD)
    std::vector<std::byte> planes;
    const std::byte *src = raw.data();
    if (c.byte_planes) {
      planes.resize(raw.size());
      split_planes(raw.data(), raw.size() / 2, planes.data());
      src = planes.data();
    }
    out.resize(kFrameHeaderBytes + ZSTD_compressBound(raw.size()));
    const size_t n = ZSTD_compress(out.data() + kFrameHeaderBytes, out.size() - kFrameHeaderBytes,
                                   src, raw.size(), c.zstd_level);
    if (ZSTD_isError(n)) fail(SWIFTKV_EINTERNAL, std::string("zstd: ") + ZSTD_getErrorName(n));
    out.resize(kFrameHeaderBytes + n);
#endif
  } else {
    out.resize(kFrameHeaderBytes + expected_payload(s, c));
    std::byte *p = out.data() + kFrameHeaderBytes;
    switch (c.codec) {
      case Codec::raw: std::memcpy(p, raw.data(), raw.size()); break;
      case Codec::kivi: kivi_encode(s, c, raw.data(), p); break;
      case Codec::fp8: fp8_encode(s, raw.data(), p); break;
      case Codec::zstd: break;
    }
  }
  write_header(out.data(), s, c, out.size() - kFrameHeaderBytes);
  return out;
}

FrameInfo read_frame_header(std::span<const std::byte> f, const ChunkShape &s) {
  if (f.size() < kFrameHeaderBytes) fail(SWIFTKV_EIO, "a codec frame shorter than its header");
  const std::byte *h = f.data();
  if (get(h, 4) != kFrameMagic) fail(SWIFTKV_EIO, "not a codec frame (bad magic)");
  if (get(h + 4, 2) != kFrameFormat) {
    fail(SWIFTKV_EIO, "a codec frame of format " + std::to_string(get(h + 4, 2)) +
                          "; this library reads format " + std::to_string(kFrameFormat));
  }
  FrameInfo fi;
  const uint64_t codec = get(h + 6, 1);
  if (codec > static_cast<uint64_t>(Codec::fp8)) fail(SWIFTKV_EIO, "a frame of an unknown codec");
  fi.params.codec = static_cast<Codec>(codec);
  fi.params.bits = static_cast<uint32_t>(get(h + 7, 1));
  fi.params.group = static_cast<uint32_t>(get(h + 8, 2));
  const uint64_t flags = get(h + 10, 2);
  fi.params.byte_planes = (flags & 1) != 0;
  fi.raw_bytes = get(h + 32, 8);
  fi.payload_bytes = get(h + 40, 8);
  const bool same_shape = get(h + 12, 4) == static_cast<uint32_t>(s.dtype) &&
                          get(h + 16, 4) == s.layers && get(h + 20, 4) == s.tokens &&
                          get(h + 24, 4) == s.heads && get(h + 28, 4) == s.dim &&
                          fi.raw_bytes == s.bytes();
  if (!same_shape) fail(SWIFTKV_EIO, "a codec frame of another chunk shape");
  const bool kivi = fi.params.codec == Codec::kivi;
  if ((flags & ~uint64_t{1}) != 0 || (fi.params.byte_planes && fi.params.codec != Codec::zstd) ||
      (!kivi && (fi.params.bits != 0 || fi.params.group != 0))) {
    fail(SWIFTKV_EIO, "a codec frame with fields its codec does not use");
  }
  try {
    check_params(s, fi.params);
  } catch (const Error &e) {
    if (e.status() == SWIFTKV_EUNSUPPORTED) throw;
    fail(SWIFTKV_EIO, std::string("a codec frame with bad parameters: ") + e.what());
  }
  if (fi.payload_bytes != f.size() - kFrameHeaderBytes) {
    fail(SWIFTKV_EIO, "a codec frame's payload length is not its size");
  }
  const uint64_t want = expected_payload(s, fi.params);
  if (fi.params.codec != Codec::zstd && fi.payload_bytes != want) {
    fail(SWIFTKV_EIO, "a " + std::string(codec_name(fi.params.codec)) +
                          " frame's payload is not the size its shape gives");
  }
  return fi;
}

void decode(std::span<const std::byte> f, const ChunkShape &s, std::span<std::byte> out) {
  const FrameInfo fi = read_frame_header(f, s);
  if (out.size() != s.bytes()) {
    fail_invalid("the output is " + std::to_string(out.size()) + " bytes; the chunk is " +
                 std::to_string(s.bytes()));
  }
  const std::byte *p = f.data() + kFrameHeaderBytes;
  switch (fi.params.codec) {
    case Codec::raw: std::memcpy(out.data(), p, out.size()); return;
    case Codec::kivi: kivi_decode(s, fi.params, p, out.data()); return;
    case Codec::fp8: fp8_decode(s, p, out.data()); return;
    case Codec::zstd: {
#if defined(SWIFTKV_HAVE_ZSTD)
      const unsigned long long size = ZSTD_getFrameContentSize(p, fi.payload_bytes);
      if (size != out.size()) fail(SWIFTKV_EIO, "a zstd frame of another content size");
      std::vector<std::byte> planes;
      std::byte *dst = out.data();
      if (fi.params.byte_planes) {
        planes.resize(out.size());
        dst = planes.data();
      }
      const size_t n = ZSTD_decompress(dst, out.size(), p, fi.payload_bytes);
      if (ZSTD_isError(n) || n != out.size()) {
        fail(SWIFTKV_EIO, std::string("a zstd frame that does not decode: ") +
                              (ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short"));
      }
      if (fi.params.byte_planes) join_planes(planes.data(), out.size() / 2, out.data());
#endif
      return;
    }
  }
}

}  // namespace swiftkv::codec
