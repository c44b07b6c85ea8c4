// The chunk codecs: lossless ones give back every byte; KIVI and FP8 stay within their error
// bounds for every element (computed here from the input, not read from the frame); frame sizes
// are the formulas of docs/codecs.md; the formats are pinned by golden bytes; bad parameters are
// EINVAL and bad frames EIO, and no corruption of a frame crashes the decoder.
#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/attention/half_float.hpp"
#include "core/codec/chunk_codec.hpp"
#include "core/codec/layer_decode.hpp"
#include "core/common/error.hpp"
#include "synthetic_kv.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

namespace cd = swiftkv::codec;
using swiftkv::Error;

float to_f(uint16_t v, swiftkv_dtype t) { return cd::element_to_float(v, t); }

// Half the spacing of the element type at |x|: the most rounding to it can move x.
float half_ulp(float x, swiftkv_dtype t) {
  const int mant = t == SWIFTKV_DTYPE_BF16 ? 7 : 10;
  const int min_exp = t == SWIFTKV_DTYPE_BF16 ? -126 : -14;
  int e = 0;
  std::frexp(std::fabs(x), &e);
  return std::ldexp(1.0f, std::max(e - 1, min_exp) - mant - 1);
}

// Any finite 16-bit pattern.
std::vector<std::byte> random_kv(const cd::ChunkShape &s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(s.bytes());
  for (uint64_t i = 0; i < s.elements(); ++i) {
    uint16_t v = 0;
    do {
      v = static_cast<uint16_t>(rng());
    } while (!std::isfinite(to_f(v, s.dtype)));
    std::memcpy(&out[i * 2], &v, 2);
  }
  return out;
}

float element(const std::vector<std::byte> &b, uint64_t i, swiftkv_dtype t) {
  uint16_t v;
  std::memcpy(&v, &b[i * 2], 2);
  return to_f(v, t);
}

uint64_t index_of(const cd::ChunkShape &s, uint32_t l, uint32_t kv, uint32_t t, uint32_t h,
                  uint32_t d) {
  return ((((uint64_t{l} * 2 + kv) * s.tokens + t) * s.heads + h) * s.dim) + d;
}

const cd::ChunkShape kShapes[] = {
    {2, 64, 2, 64, SWIFTKV_DTYPE_F16},
    {1, 40, 3, 96, SWIFTKV_DTYPE_BF16},  // groups that do not divide tokens or dim
    {2, 256, 8, 128, SWIFTKV_DTYPE_F16},
};

void lossless_round_trips(void **) {
  for (const cd::ChunkShape &s : kShapes) {
    for (int data = 0; data < 2; ++data) {
      const auto raw = data == 0 ? synthetic_kv(s, 1) : random_kv(s, 2);
      std::vector<cd::CodecParams> ps = {{cd::Codec::raw}};
      if (cd::zstd_available()) {
        ps.push_back({cd::Codec::zstd, 0, 0, false, 1});
        ps.push_back({cd::Codec::zstd, 0, 0, true, 3});
      }
      for (const cd::CodecParams &p : ps) {
        const auto frame = cd::encode(s, p, raw);
        std::vector<std::byte> back(raw.size(), std::byte{0x5a});
        cd::decode(frame, s, back);
        assert_true(back == raw);
      }
    }
  }
}

// KIVI: each element within half its group's scale (the range over 2^bits - 1 levels, rounded
// up to the element type) plus the element type's rounding of the result.
void kivi_within_its_bound(void **) {
  for (const cd::ChunkShape &s : kShapes) {
    const auto raw = synthetic_kv(s, 3);
    double mean[3][2] = {};  // by bits (8, 4, 2) and group (32, 64)
    for (uint32_t bits : {8u, 4u, 2u}) {
      for (uint32_t group : {32u, 64u}) {
        const cd::CodecParams p{cd::Codec::kivi, bits, group};
        const auto frame = cd::encode(s, p, raw);
        std::vector<std::byte> back(raw.size());
        cd::decode(frame, s, back);
        const float levels = static_cast<float>((1u << bits) - 1);
        const float rel = s.dtype == SWIFTKV_DTYPE_BF16 ? 1.0f / 128 : 1.0f / 1024;
        double err_sum = 0;
        for (uint32_t l = 0; l < s.layers; ++l) {
          for (uint32_t kv = 0; kv < 2; ++kv) {
            for (uint32_t t = 0; t < s.tokens; ++t) {
              for (uint32_t h = 0; h < s.heads; ++h) {
                for (uint32_t d = 0; d < s.dim; ++d) {
                  // The group: keys over `group` tokens of one channel; values over `group`
                  // channels of one token.
                  float mn = INFINITY, mx = -INFINITY;
                  if (kv == 0) {
                    const uint32_t t0 = t / group * group;
                    for (uint32_t u = t0; u < std::min(s.tokens, t0 + group); ++u) {
                      const float x = element(raw, index_of(s, l, 0, u, h, d), s.dtype);
                      mn = std::min(mn, x);
                      mx = std::max(mx, x);
                    }
                  } else {
                    const uint32_t d0 = d / group * group;
                    for (uint32_t e = d0; e < std::min(s.dim, d0 + group); ++e) {
                      const float x = element(raw, index_of(s, l, 1, t, h, e), s.dtype);
                      mn = std::min(mn, x);
                      mx = std::max(mx, x);
                    }
                  }
                  const uint64_t i = index_of(s, l, kv, t, h, d);
                  const float x = element(raw, i, s.dtype), y = element(back, i, s.dtype);
                  const float scale = (mx - mn) / levels * (1.0f + 2 * rel);
                  const float bound = scale / 2 + half_ulp(y, s.dtype) + 1e-6f * std::fabs(x);
                  if (!(std::fabs(x - y) <= bound)) {
                    fail_msg("kivi %u bits group %u: element %llu is %g, decoded %g (bound %g)",
                             bits, group, static_cast<unsigned long long>(i), x, y, bound);
                  }
                  err_sum += std::fabs(x - y);
                }
              }
            }
          }
        }
        // Fewer bits, more error (a bound that holds is not enough: the codes must be used).
        print_message("kivi %u bits, group %u, %ux%ux%ux%u: mean |error| %.5f\n", bits, group,
                      s.layers, s.tokens, s.heads, s.dim,
                      err_sum / static_cast<double>(s.elements()));
        mean[bits == 8   ? 0
             : bits == 4 ? 1
                         : 2][group == 32 ? 0 : 1] = err_sum / static_cast<double>(s.elements());
      }
    }
    // The codes are used: fewer bits or larger groups, more error.
    for (int g = 0; g < 2; ++g) {
      assert_true(mean[0][g] < 0.02);
      assert_true(mean[0][g] < mean[1][g] && mean[1][g] < mean[2][g]);
    }
    for (int b = 0; b < 3; ++b) assert_true(mean[b][0] < mean[b][1]);
  }
}

// FP8 E4M3 with a scale per token: relative error 2^-4 for normal codes, 2^-10 of the scale
// below them, plus the element type's rounding.
void fp8_within_its_bound(void **) {
  for (const cd::ChunkShape &s : kShapes) {
    const auto raw = synthetic_kv(s, 4);
    const auto frame = cd::encode(s, {cd::Codec::fp8}, raw);
    std::vector<std::byte> back(raw.size());
    cd::decode(frame, s, back);
    const uint64_t row = uint64_t{s.heads} * s.dim;
    for (uint64_t r = 0; r < s.elements() / row; ++r) {
      float amax = 0;
      for (uint64_t i = 0; i < row; ++i)
        amax = std::max(amax, std::fabs(element(raw, r * row + i, s.dtype)));
      const float scale = amax / 448.0f;
      for (uint64_t i = r * row; i < (r + 1) * row; ++i) {
        const float x = element(raw, i, s.dtype), y = element(back, i, s.dtype);
        const float bound =
            std::max(std::fabs(x) / 16, scale / 1024) * (1 + 1e-5f) + half_ulp(y, s.dtype);
        if (!(std::fabs(x - y) <= bound)) {
          fail_msg("fp8: element %llu is %g, decoded %g (bound %g)",
                   static_cast<unsigned long long>(i), x, y, bound);
        }
      }
    }
  }
}

// Frame sizes are the formulas of docs/codecs.md.
void frame_sizes_are_the_formulas(void **) {
  const cd::ChunkShape s{2, 256, 8, 128, SWIFTKV_DTYPE_F16};
  const auto raw = synthetic_kv(s, 5);
  assert_int_equal(cd::encode(s, {cd::Codec::raw}, raw).size(), 48 + 2 * 2 * 256 * 8 * 128 * 2);
  // Per layer: two code tensors (T*H*D*bits/8) and (min, scale) pairs of 4 bytes: keys per
  // channel per token group, values per token per channel group.
  auto kivi = [&](uint32_t bits, uint32_t group) {
    const uint64_t codes = 256 * 8 * 128 * bits / 8;
    const uint64_t kp = (256 / group) * 8 * 128 * 4, vp = 256 * 8 * (128 / group) * 4;
    return 48 + 2 * (2 * codes + kp + vp);
  };
  assert_int_equal(cd::encode(s, {cd::Codec::kivi, 2, 32}, raw).size(), kivi(2, 32));
  assert_int_equal(kivi(2, 32), 48 + 393216);
  assert_int_equal(cd::encode(s, {cd::Codec::kivi, 4, 64}, raw).size(), kivi(4, 64));
  assert_int_equal(cd::encode(s, {cd::Codec::kivi, 8, 128}, raw).size(), kivi(8, 128));
  // FP8: a 4-byte scale and H*D codes per token of each layer's K and V.
  assert_int_equal(cd::encode(s, {cd::Codec::fp8}, raw).size(), 48 + 2 * 2 * 256 * (4 + 1024));
  // Codes that do not fill a byte round the tensor up: 1 layer, 3 tokens, 1 head, 8 dim, 2 bits
  // is 24 codes, 6 bytes per tensor; groups of 8 over 3 tokens give one key group.
  const cd::ChunkShape tiny{1, 3, 1, 8, SWIFTKV_DTYPE_F16};
  assert_int_equal(cd::encode(tiny, {cd::Codec::kivi, 2, 8}, synthetic_kv(tiny, 6)).size(),
                   48 + 2 * 6 + 1 * 8 * 4 + 3 * 1 * 4);
}

uint64_t fnv1a(const std::vector<std::byte> &b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::byte x : b) h = (h ^ static_cast<uint8_t>(x)) * 0x100000001b3ull;
  return h;
}

// The formats are pinned: these frames are the bytes format 1 has always had. A change here
// makes every stored chunk unreadable; it needs a new format version.
void formats_are_pinned(void **) {
  const cd::ChunkShape s{1, 4, 1, 8, SWIFTKV_DTYPE_F16};
  std::vector<std::byte> raw(s.bytes());
  for (uint64_t i = 0; i < s.elements(); ++i) {
    const uint16_t v = swiftkv::float_to_half(static_cast<float>(i) * 0.25f - 3.0f);
    std::memcpy(&raw[i * 2], &v, 2);
  }
  const auto r = cd::encode(s, {cd::Codec::raw}, raw);
  const uint8_t header[] = {0x53, 0x4b, 0x56, 0x43, 1, 0, 0, 0,   // magic, format 1, raw
                            0,    0,    0,    0,    0, 0, 0, 0,   // group, flags, dtype f16 (0)
                            1,    0,    0,    0,    4, 0, 0, 0,   // layers, tokens
                            1,    0,    0,    0,    8, 0, 0, 0,   // heads, dim
                            128,  0,    0,    0,    0, 0, 0, 0,   // raw bytes
                            128,  0,    0,    0,    0, 0, 0, 0};  // payload bytes
  assert_memory_equal(r.data(), header, sizeof header);
  const uint64_t got[] = {fnv1a(cd::encode(s, {cd::Codec::kivi, 4, 8}, raw)),
                          fnv1a(cd::encode(s, {cd::Codec::kivi, 2, 16}, raw)),
                          fnv1a(cd::encode(s, {cd::Codec::fp8}, raw))};
  const uint64_t want[] = {0xb0a84731f3f87324ull, 0xbbab218837f3acf6ull, 0x5572f841937b2b69ull};
  assert_memory_equal(got, want, sizeof want);
}

// The decoders against the formulas of docs/codecs.md applied here element by element to the
// frame's own bytes: every element equal, bit for bit. Shapes whose rows are shorter and longer
// than 256 elements (FP8 decodes a long row by lookup), whose 2-bit codes start mid-byte, and
// any finite 16-bit input (zeros, subnormals, the largest values).
float e4m3(uint8_t v) {
  const int exp = (v >> 3) & 0xf, m = v & 7;
  const float a = exp == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, exp - 7);
  return (v & 0x80) != 0 ? -a : a;
}
uint16_t rd16(const std::byte *p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

std::vector<std::byte> reference_decode(const std::vector<std::byte> &frame,
                                        const cd::ChunkShape &s, const cd::CodecParams &p) {
  std::vector<std::byte> out(s.bytes());
  const std::byte *in = frame.data() + cd::kFrameHeaderBytes;
  const uint64_t row = uint64_t{s.heads} * s.dim, n = s.tokens * row;
  auto put = [&](uint64_t i, float x) {
    const uint16_t v = cd::float_to_element(x, s.dtype);
    std::memcpy(&out[i * 2], &v, 2);
  };
  if (p.codec == cd::Codec::fp8) {
    for (uint64_t r = 0; r < s.elements() / row; ++r) {
      const std::byte *q = in + r * (4 + row);
      float scale;
      std::memcpy(&scale, q, 4);
      for (uint64_t i = 0; i < row; ++i) {
        const volatile float y = e4m3(static_cast<uint8_t>(q[4 + i])) * scale;
        put(r * row + i, y);
      }
    }
    return out;
  }
  const uint64_t codes = (n * p.bits + 7) / 8;
  const uint64_t kgroups = (s.tokens + p.group - 1) / p.group,
                 vgroups = (s.dim + p.group - 1) / p.group;
  const uint64_t key_params = kgroups * row * 4, val_params = s.tokens * s.heads * vgroups * 4;
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::byte *kc = in + l * (2 * codes + key_params + val_params);
    const std::byte *kp = kc + codes, *vc = kp + key_params, *vp = vc + codes;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t t = i / row, h = i % row / s.dim, d = i % s.dim;
      for (int kv = 0; kv < 2; ++kv) {
        const std::byte *c = kv == 0 ? kc : vc;
        const uint64_t bit = i * p.bits;
        const uint32_t q = (static_cast<uint32_t>(c[bit / 8]) >> (bit % 8)) & ((1u << p.bits) - 1);
        const std::byte *g = kv == 0 ? kp + ((t / p.group) * row + h * s.dim + d) * 4
                                     : vp + ((t * s.heads + h) * vgroups + d / p.group) * 4;
        const float lo = to_f(rd16(g), s.dtype), scale = to_f(rd16(g + 2), s.dtype);
        const volatile float prod = static_cast<float>(q) * scale;
        put(index_of(s, l, kv, static_cast<uint32_t>(t), static_cast<uint32_t>(h),
                     static_cast<uint32_t>(d)),
            lo + prod);
      }
    }
  }
  return out;
}

void decoders_are_the_formulas(void **) {
  const cd::ChunkShape shapes[] = {{1, 16, 1, 8, SWIFTKV_DTYPE_F16},
                                   {2, 33, 3, 5, SWIFTKV_DTYPE_F16},
                                   {1, 40, 4, 96, SWIFTKV_DTYPE_BF16},
                                   {2, 9, 3, 128, SWIFTKV_DTYPE_F16}};
  const cd::CodecParams params[] = {{cd::Codec::kivi, 8, 8},
                                    {cd::Codec::kivi, 4, 16},
                                    {cd::Codec::kivi, 2, 32},
                                    {cd::Codec::kivi, 2, 8},
                                    {cd::Codec::fp8}};
  for (const cd::ChunkShape &s : shapes) {
    for (int data = 0; data < 2; ++data) {
      // Any 16-bit pattern below 1024 in magnitude (KIVI refuses a range that overflows).
      auto raw = data == 0 ? synthetic_kv(s, 9) : random_kv(s, 10);
      for (uint64_t i = 0; data == 1 && i < s.elements(); ++i) {
        if (std::fabs(element(raw, i, s.dtype)) >= 1024) raw[i * 2 + 1] = std::byte{0};
      }
      for (const cd::CodecParams &p : params) {
        const auto frame = cd::encode(s, p, raw);
        std::vector<std::byte> back(raw.size());
        cd::decode(frame, s, back);
        const auto want = reference_decode(frame, s, p);
        for (uint64_t i = 0; i < s.elements(); ++i) {
          if (std::memcmp(&back[i * 2], &want[i * 2], 2) != 0) {
            fail_msg(
                "%s %u bits, shape %ux%ux%ux%u, data %d: element %llu is %04x, the formula "
                "gives %04x",
                cd::codec_name(p.codec), p.bits, s.layers, s.tokens, s.heads, s.dim, data,
                static_cast<unsigned long long>(i), rd16(&back[i * 2]), rd16(&want[i * 2]));
          }
        }
      }
    }
  }
}

template <class F>
swiftkv_status status_of(F &&f) {
  try {
    f();
  } catch (const Error &e) {
    return e.status();
  }
  return SWIFTKV_OK;
}

void bad_input_is_refused(void **) {
  const cd::ChunkShape s{1, 16, 2, 32, SWIFTKV_DTYPE_F16};
  const auto raw = synthetic_kv(s, 7);
  auto enc = [&](cd::ChunkShape sh, cd::CodecParams p) {
    return status_of([&] { cd::encode(sh, p, raw); });
  };
  assert_int_equal(enc(s, {cd::Codec::kivi, 3, 32}), SWIFTKV_EINVAL);
  assert_int_equal(enc(s, {cd::Codec::kivi, 4, 12}), SWIFTKV_EINVAL);
  assert_int_equal(enc(s, {cd::Codec::kivi, 4, 512}), SWIFTKV_EINVAL);
  assert_int_equal(enc(s, {static_cast<cd::Codec>(9)}), SWIFTKV_EINVAL);
  cd::ChunkShape f32 = s;
  f32.dtype = SWIFTKV_DTYPE_F32;
  assert_int_equal(enc(f32, {cd::Codec::raw}), SWIFTKV_EINVAL);
  cd::ChunkShape bigger = s;
  bigger.tokens = 32;
  assert_int_equal(enc(bigger, {cd::Codec::raw}), SWIFTKV_EINVAL);  // raw is not that size
  if (cd::zstd_available()) {
    assert_int_equal(enc(s, {cd::Codec::zstd, 0, 0, false, 0}), SWIFTKV_EINVAL);
  } else {
    assert_int_equal(enc(s, {cd::Codec::zstd}), SWIFTKV_EUNSUPPORTED);
  }
  std::vector<std::byte> nan = raw;
  const uint16_t q_nan = 0x7e00;
  std::memcpy(&nan[10], &q_nan, 2);
  assert_int_equal(status_of([&] {
                     cd::encode(s, {cd::Codec::kivi, 4, 16}, nan);
                   }),
                   SWIFTKV_EINVAL);
  assert_int_equal(status_of([&] { cd::encode(s, {cd::Codec::fp8}, nan); }), SWIFTKV_EINVAL);

  // Frames: truncated, of another shape, with a wrong length, or a flipped codec are EIO.
  const auto frame = cd::encode(s, {cd::Codec::kivi, 4, 16}, raw);
  std::vector<std::byte> out(raw.size());
  auto dec = [&](const std::vector<std::byte> &f, const cd::ChunkShape &sh) {
    return status_of([&] { cd::decode(f, sh, out); });
  };
  assert_int_equal(dec(frame, s), SWIFTKV_OK);
  for (size_t n : {size_t{0}, size_t{47}, size_t{48}, frame.size() - 1}) {
    assert_int_equal(dec(std::vector<std::byte>(frame.begin(), frame.begin() + n), s), SWIFTKV_EIO);
  }
  cd::ChunkShape other = s;
  other.heads = 1;
  other.dim = 64;  // the same bytes in another shape
  assert_int_equal(dec(frame, other), SWIFTKV_EIO);
  auto patched = [&](size_t at, uint8_t v) {
    std::vector<std::byte> f = frame;
    f[at] = std::byte{v};
    return f;
  };
  assert_int_equal(dec(patched(0, 0), s), SWIFTKV_EIO);   // magic
  assert_int_equal(dec(patched(4, 2), s), SWIFTKV_EIO);   // format 2
  assert_int_equal(dec(patched(6, 9), s), SWIFTKV_EIO);   // codec
  assert_int_equal(dec(patched(7, 2), s), SWIFTKV_EIO);   // bits: another payload size
  assert_int_equal(dec(patched(10, 1), s), SWIFTKV_EIO);  // byte planes on kivi
  assert_int_equal(dec(patched(40, 1), s), SWIFTKV_EIO);  // payload length
  if (cd::zstd_available()) {
    auto z = cd::encode(s, {cd::Codec::zstd}, raw);
    z[z.size() / 2] ^= std::byte{0xff};
    const swiftkv_status st = dec(z, s);
    assert_true(st == SWIFTKV_EIO || st == SWIFTKV_OK);  // zstd has no checksum of its own here
  }
}

// Values no encoder writes (the chunks it takes are finite) are refused with EIO by the decoder
// and, the same, by check_layer_values, which keeps them from a device: kivi pairs with a NaN or
// infinite half (decoded, their NaNs' bits would differ between a host and a GPU), fp8 scales
// that are not finite and >= 0, fp8 NaN codes. The largest finite values pass both.
void values_no_encoder_writes_are_refused(void **) {
  for (const swiftkv_dtype dt : {SWIFTKV_DTYPE_F16, SWIFTKV_DTYPE_BF16}) {
    const cd::ChunkShape s{2, 16, 2, 32, dt};
    const auto raw = synthetic_kv(s, 11);
    std::vector<std::byte> out(raw.size());
    const auto both = [&](const std::vector<std::byte> &f, const cd::CodecParams &p) {
      const swiftkv_status d = status_of([&] { cd::decode(f, s, out); });
      const swiftkv_status c = status_of([&] { cd::check_layer_values(f, s, p); });
      assert_int_equal(d, c);
      return d;
    };
    const auto with16 = [](std::vector<std::byte> f, uint64_t at, uint16_t v) {
      std::memcpy(&f[at], &v, 2);
      return f;
    };
    const uint16_t inf = dt == SWIFTKV_DTYPE_BF16 ? 0x7f80 : 0x7c00;
    const uint16_t nan = dt == SWIFTKV_DTYPE_BF16 ? 0xffc1 : 0xfe01;
    const uint16_t top = dt == SWIFTKV_DTYPE_BF16 ? 0x7f7f : 0x7bff;  // the largest finite

    const cd::CodecParams kivi{cd::Codec::kivi, 4, 16};
    const auto frame = cd::encode(s, kivi, raw);
    assert_int_equal(both(frame, kivi), SWIFTKV_OK);
    const cd::LayerShape ls = cd::layer_shape_of(s);
    const uint64_t codes = cd::kivi_code_bytes(ls, 4), keys = cd::kivi_key_pair_bytes(ls, 16);
    const uint64_t layer = cd::layer_payload_bytes(ls, cd::kLayerKivi | (4u << 8) | (4u << 16));
    // Layer 1's first key pair's lo; layer 0's last value pair's scale.
    const uint64_t key_lo = cd::kFrameHeaderBytes + layer + codes;
    const uint64_t value_scale = cd::kFrameHeaderBytes + layer - 2;
    assert_int_equal(value_scale, cd::kFrameHeaderBytes + 2 * codes + keys +
                                      cd::kivi_value_pair_bytes(ls, 16) - 2);
    for (const uint16_t v : {inf, static_cast<uint16_t>(inf | 0x8000), nan}) {
      assert_int_equal(both(with16(frame, key_lo, v), kivi), SWIFTKV_EIO);
      assert_int_equal(both(with16(frame, value_scale, v), kivi), SWIFTKV_EIO);
    }
    assert_int_equal(both(with16(frame, key_lo, top), kivi), SWIFTKV_OK);
    assert_int_equal(both(with16(frame, value_scale, top), kivi), SWIFTKV_OK);

    const cd::CodecParams fp8{cd::Codec::fp8};
    auto f8 = cd::encode(s, fp8, raw);
    assert_int_equal(both(f8, fp8), SWIFTKV_OK);
    const uint64_t record = cd::kFrameHeaderBytes + 5 * (4 + 2 * 32);  // the sixth token's
    for (const float bad : {std::numeric_limits<float>::infinity(), std::nanf(""), -1.0f}) {
      auto f = f8;
      std::memcpy(&f[record], &bad, 4);
      assert_int_equal(both(f, fp8), SWIFTKV_EIO);
    }
    for (const uint8_t code : {0x7f, 0xff}) {
      auto f = f8;
      f[record + 4 + 7] = std::byte{code};
      assert_int_equal(both(f, fp8), SWIFTKV_EIO);
    }
    f8[record + 4 + 7] = std::byte{0x7e};  // 448
    assert_int_equal(both(f8, fp8), SWIFTKV_OK);
  }
}

// No change to a frame crashes the decoder or reads outside it: it decodes or says EIO.
void corruption_never_crashes(void **) {
  const cd::ChunkShape s{1, 16, 2, 32, SWIFTKV_DTYPE_BF16};
  const auto raw = synthetic_kv(s, 8);
  std::mt19937_64 rng(9);
  std::vector<std::byte> out(raw.size());
  std::vector<cd::CodecParams> ps = {{cd::Codec::raw}, {cd::Codec::kivi, 2, 8}, {cd::Codec::fp8}};
  if (cd::zstd_available()) ps.push_back({cd::Codec::zstd, 0, 0, true, 1});
  for (const cd::CodecParams &p : ps) {
    const auto frame = cd::encode(s, p, raw);
    for (int i = 0; i < 3000; ++i) {
      std::vector<std::byte> f = frame;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k)
        f[rng() % f.size()] ^= static_cast<std::byte>(1 + rng() % 255);
      const swiftkv_status st = status_of([&] { cd::decode(f, s, out); });
      assert_true(st == SWIFTKV_OK || st == SWIFTKV_EIO);
    }
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(lossless_round_trips),
      cmocka_unit_test(kivi_within_its_bound),
      cmocka_unit_test(fp8_within_its_bound),
      cmocka_unit_test(frame_sizes_are_the_formulas),
      cmocka_unit_test(formats_are_pinned),
      cmocka_unit_test(bad_input_is_refused),
      cmocka_unit_test(corruption_never_crashes),
      cmocka_unit_test(decoders_are_the_formulas),
      cmocka_unit_test(values_no_encoder_writes_are_refused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
