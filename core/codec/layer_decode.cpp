// The CPU twin of the CUDA layer decoder (layer_decode.hpp), and the checks a frame passes before
// it goes to the device. Compiled with -ffp-contract=off, as chunk_codec.cpp is.
#include "core/codec/layer_decode.hpp"

#include <string>

#include "core/codec/chunk_codec.hpp"
#include "core/common/error.hpp"

namespace swiftkv::codec {

LayerShape layer_shape_of(const ChunkShape &s) noexcept {
  return LayerShape{s.tokens, s.heads, s.dim, s.dtype == SWIFTKV_DTYPE_BF16 ? 1u : 0u};
}

bool decodes_by_layer(const CodecParams &p) noexcept {
  return p.codec == Codec::kivi || p.codec == Codec::fp8;
}

void decode_layer_cpu(const std::byte *payload, const LayerShape &s, uint32_t encoding,
                      uint64_t first, uint64_t count, std::byte *out) noexcept {
  const auto *p = reinterpret_cast<const uint8_t *>(payload);
  uint64_t e = first;
  const uint64_t end = first + count;
  uint16_t eight[8];
  while (e < end) {
    uint16_t v;
    if (s.dim % 8 == 0 && e % 8 == 0 && end - e >= 8) {
      decode_layer_8(p, s, encoding, e, eight);
      std::memcpy(out + (e - first) * 2, eight, sizeof eight);
      e += 8;
      continue;
    }
    v = decode_layer_element(p, s, encoding, e);
    std::memcpy(out + (e - first) * 2, &v, 2);
    ++e;
  }
}

void check_layer_values(std::span<const std::byte> frame, const ChunkShape &shape,
                        const CodecParams &params) {
  if (!decodes_by_layer(params)) {
    fail(SWIFTKV_EINTERNAL,
         std::string("a ") + codec_name(params.codec) + " frame does not decode layer by layer");
  }
  const auto *payload = reinterpret_cast<const uint8_t *>(frame.data() + kFrameHeaderBytes);
  if (params.codec == Codec::kivi) {
    // What the kivi decoder refuses: a non-finite pair, layer by layer by the same check.
    const LayerShape ls = layer_shape_of(shape);
    const uint64_t codes = kivi_code_bytes(ls, params.bits);
    const uint64_t keys = kivi_key_pair_bytes(ls, params.group);
    const uint64_t values = kivi_value_pair_bytes(ls, params.group);
    const uint64_t layer = 2 * codes + keys + values;
    for (uint32_t l = 0; l < shape.layers; ++l) {
      const uint8_t *p = payload + l * layer;
      kivi_check_pairs(p + codes, keys / 4, shape.dtype);
      kivi_check_pairs(p + 2 * codes + keys, values / 4, shape.dtype);
    }
    return;
  }
  // What the fp8 decoder refuses, refused here too, row by row by the same check.
  const uint64_t row = uint64_t{shape.heads} * shape.dim;
  const uint64_t rows = uint64_t{shape.layers} * 2 * shape.tokens;
  const uint8_t *p = payload;
  for (uint64_t r = 0; r < rows; ++r, p += 4 + row) (void)fp8_checked_scale(p, row);
}

}  // namespace swiftkv::codec
