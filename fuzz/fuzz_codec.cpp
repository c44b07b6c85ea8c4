// libFuzzer target: the chunk codecs' decoder over any bytes. The input is a frame for a small
// chunk shape (the first byte picks one of five shapes, the rest is the frame). Whatever the bytes,
// decode() either gives a chunk or says SWIFTKV_EIO; it never reads outside the frame or writes
// outside the chunk (ASan), and a frame it accepts decodes to the same bytes twice.
//
// kivi and fp8 frames are also decoded layer by layer, as a device decodes them (the device
// decoder's CPU twin, codec::decode_layer_cpu, the same code as the kernel's): a frame passes
// check_layer_values (what the host checks before a frame goes to a device, where nothing can be
// refused) exactly when decode() takes it, and then each layer, whole and from an element that is
// not a group's first, is the bytes decode() gave.
//
// SWIFTKV_FUZZ_WRITE_SEEDS=DIR writes one frame of every codec for every shape to DIR and exits:
// the committed seed corpus (fuzz/seeds/codec) is made that way.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/codec/chunk_codec.hpp"
#include "core/codec/layer_decode.hpp"
#include "core/common/error.hpp"
#include "core/tiers/chunk_encoding.hpp"

namespace {

namespace cd = swiftkv::codec;

const cd::ChunkShape kShapes[] = {
    {1, 8, 1, 8, SWIFTKV_DTYPE_F16},   {2, 3, 2, 16, SWIFTKV_DTYPE_BF16},
    {1, 16, 1, 32, SWIFTKV_DTYPE_F16}, {1, 5, 3, 8, SWIFTKV_DTYPE_BF16},
    {2, 7, 3, 24, SWIFTKV_DTYPE_F16},  // rows and channels of no power of two (the divisors)
};
constexpr uint8_t kShapeCount = std::size(kShapes);

void write_seeds(const std::string &dir) {
  const cd::CodecParams ps[] = {
      {cd::Codec::raw},        {cd::Codec::zstd, 0, 0, false, 1}, {cd::Codec::zstd, 0, 0, true, 1},
      {cd::Codec::kivi, 8, 8}, {cd::Codec::kivi, 4, 16},          {cd::Codec::kivi, 2, 8},
      {cd::Codec::fp8}};
  int n = 0;
  for (uint8_t si = 0; si < kShapeCount; ++si) {
    const cd::ChunkShape &s = kShapes[si];
    std::vector<std::byte> raw(s.bytes());
    for (uint64_t i = 0; i < s.elements(); ++i) {
      const uint16_t v = static_cast<uint16_t>(0x3c00 + (i * 37) % 512);  // finite in both types
      std::memcpy(&raw[i * 2], &v, 2);
    }
    for (const cd::CodecParams &p : ps) {
      if (p.codec == cd::Codec::zstd && !cd::zstd_available()) continue;
      std::vector<std::byte> f = cd::encode(s, p, raw);
      const std::string path = dir + "/frame-" + std::to_string(n++);
      FILE *out = std::fopen(path.c_str(), "wb");
      if (out == nullptr || std::fwrite(&si, 1, 1, out) != 1 ||
          std::fwrite(f.data(), 1, f.size(), out) != f.size()) {
        std::abort();
      }
      std::fclose(out);
    }
  }
}

// The header's parameters where the header holds for this shape and names a codec that decodes
// layer by layer; else none.
std::optional<cd::CodecParams> layer_params(const std::vector<std::byte> &frame,
                                            const cd::ChunkShape &s) {
  try {
    const cd::FrameInfo fi = cd::read_frame_header(frame, s);
    if (cd::decodes_by_layer(fi.params)) return fi.params;
  } catch (const swiftkv::Error &) {
  }
  return std::nullopt;
}

// A frame decode() took, layer by layer as a device decodes it, against its bytes `want`.
void check_layers(const std::vector<std::byte> &frame, const cd::ChunkShape &s,
                  const cd::CodecParams &p, const std::vector<std::byte> &want) {
  try {
    cd::check_layer_values(frame, s, p);
  } catch (const swiftkv::Error &) {
    std::abort();  // the host would keep from a device a frame the CPU decodes
  }
  const cd::LayerShape ls = cd::layer_shape_of(s);
  const uint32_t encoding = swiftkv::encoding_of(p, true);
  const uint64_t layer_bytes = cd::layer_payload_bytes(ls, encoding);
  const uint64_t elements = 2 * cd::layer_tensor_elements(ls), piece = 2 * elements;
  if (frame.size() != cd::kFrameHeaderBytes + s.layers * layer_bytes) std::abort();
  std::vector<std::byte> got(piece);
  for (uint32_t l = 0; l < s.layers; ++l) {
    const std::byte *payload = frame.data() + cd::kFrameHeaderBytes + l * layer_bytes;
    const std::byte *layer = want.data() + l * piece;
    cd::decode_layer_cpu(payload, ls, encoding, 0, elements, got.data());
    if (std::memcmp(got.data(), layer, piece) != 0) std::abort();
    // From element 3 on: single elements up to the next multiple of 8, then groups.
    cd::decode_layer_cpu(payload, ls, encoding, 3, elements - 3, got.data());
    if (std::memcmp(got.data(), layer + 6, piece - 6) != 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  if (const char *dir = std::getenv("SWIFTKV_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const cd::ChunkShape &s = kShapes[data[0] % kShapeCount];
  const std::vector<std::byte> frame(reinterpret_cast<const std::byte *>(data) + 1,
                                     reinterpret_cast<const std::byte *>(data) + size);
  std::vector<std::byte> a(s.bytes()), b(s.bytes(), std::byte{0x5a});
  const std::optional<cd::CodecParams> by_layer = layer_params(frame, s);
  try {
    cd::decode(frame, s, a);
  } catch (const swiftkv::Error &e) {
    if (e.status() != SWIFTKV_EIO && e.status() != SWIFTKV_EUNSUPPORTED) std::abort();
    if (by_layer) {
      // A frame of good header that decode() refuses never reaches a device either.
      try {
        cd::check_layer_values(frame, s, *by_layer);
      } catch (const swiftkv::Error &refused) {
        if (refused.status() != SWIFTKV_EIO) std::abort();
        return 0;
      }
      std::abort();
    }
    return 0;
  }
  cd::decode(frame, s, b);
  if (a != b) std::abort();  // decoding is a function of the frame
  if (by_layer) check_layers(frame, s, *by_layer, a);
  return 0;
}
