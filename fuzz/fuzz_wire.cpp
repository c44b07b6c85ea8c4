// libFuzzer target: the coordinator's wire decoder, with a re-encode oracle. Whatever bytes a
// peer sends, decode() either names what is wrong or gives a message whose encoding is exactly
// those bytes (the format has one encoding per message), and that encoding decodes again to
// the same message.
//
// SWIFTKV_FUZZ_WRITE_SEEDS=DIR writes one encoded message of every type to DIR and exits: the
// committed seed corpus (fuzz/seeds/wire) is made that way.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>

#include "core/coord/wire.hpp"

namespace co = swiftkv::coord;

namespace {

template <size_t I = 0>
void write_seeds(const std::string &dir) {
  if constexpr (I < std::variant_size_v<co::Payload>) {
    co::Message m;
    m.seq = I + 1;
    m.epoch = I;
    m.payload.emplace<I>();
    const std::vector<uint8_t> bytes = co::encode(m);
    const std::string path = dir + "/type-" + std::to_string(I);
    FILE *f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
    std::fclose(f);
    write_seeds<I + 1>(dir);
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
  const co::Decoded d = co::decode({data, size});
  if (!d.message) {
    if (d.error.empty()) std::abort();  // a refusal always says why
    return 0;
  }
  const std::vector<uint8_t> again = co::encode(*d.message);
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  const co::Decoded twice = co::decode(again);
  if (!twice.message || co::encode(*twice.message) != again) std::abort();
  return 0;
}
