// libFuzzer target: the disk tier's recovery over a mutated segment file. The input is the bytes
// of seg-00000000.kvlog in an otherwise empty disk directory; a context opens it, and a chunk it
// then finds must have exactly the bytes that were stored for it (a mutated record is dropped,
// never served), and the tier must go on storing and finding chunks, across a second opening.
//
// SWIFTKV_FUZZ_WRITE_SEEDS=DIR writes the seed (a segment holding two sequences of two chunks,
// synced and committed) to DIR and exits: the committed seed corpus (fuzz/seeds/disk) is made so.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.hpp"
#include "swiftkv/swiftkv.h"

namespace {

// 2 layers, 1 KV head of 8, F16, 4-token blocks, 8-token chunks: 512-byte chunks, 640-byte
// records, 6 records in a 4 KiB segment; the budget is 4 segments (3 hold records).
constexpr uint32_t kChunkTokens = 8;
constexpr size_t kChunkBytes = 512;
constexpr uint64_t kSegmentBytes = 4096;
constexpr uint32_t kSeeded = 2;  // sequences in the seed, 2 chunks each
constexpr uint32_t kChunksPerSeq = 2;
constexpr char kSegment[] = "seg-00000000.kvlog";

void check(bool ok, const char *what) { swiftkv::fuzz::check(ok, "fuzz_disk", what); }

std::vector<uint32_t> tokens_of(uint32_t seq) {
  std::vector<uint32_t> t(kChunksPerSeq * kChunkTokens);
  for (size_t i = 0; i < t.size(); ++i) t[i] = seq * 1000u + static_cast<uint32_t>(i);
  return t;
}

std::vector<unsigned char> kv_of(uint32_t seq) {
  std::vector<unsigned char> kv(kChunksPerSeq * kChunkBytes);
  for (size_t i = 0; i < kv.size(); ++i)
    kv[i] = static_cast<unsigned char>(seq * 37u + i * 11u + (i >> 7));
  return kv;
}

struct Open {
  swiftkv_ctx *ctx = nullptr;
  uint32_t model = 0;
  explicit Open(const std::string &dir) {
    swiftkv_ctx_config c = SWIFTKV_CTX_CONFIG_INIT;
    c.disk_path = dir.c_str();
    c.disk_budget_bytes = 4 * kSegmentBytes;
    c.disk_segment_bytes = kSegmentBytes;
    c.disk_sync_ms = 0;
    c.demote_free_percent = 0;
    check(swiftkv_ctx_create(&ctx, &c) == SWIFTKV_OK, "ctx_create");
    swiftkv_model_desc d = SWIFTKV_MODEL_DESC_INIT;
    d.name = "fuzz-disk";
    d.num_layers = 2;
    d.num_kv_heads = 1;
    d.head_dim = 8;
    d.block_tokens = 4;
    d.chunk_tokens = kChunkTokens;
    swiftkv_model_config mc = SWIFTKV_MODEL_CONFIG_INIT;
    mc.desc = &d;
    check(swiftkv_model_register(&model, ctx, &mc) == SWIFTKV_OK, "model_register");
  }
  ~Open() { swiftkv_ctx_destroy(ctx); }
  Open(const Open &) = delete;
  Open &operator=(const Open &) = delete;

  uint64_t store(uint32_t seq) const {
    const std::vector<uint32_t> t = tokens_of(seq);
    const std::vector<unsigned char> kv = kv_of(seq);
    uint64_t cached = 0;
    check(
        swiftkv_store(&cached, ctx, model, t.data(), t.size(), kv.data(), kv.size()) == SWIFTKV_OK,
        "store");
    return cached;
  }

  // The tokens of seq found cached; their bytes must be the stored ones.
  uint64_t found(uint32_t seq) const {
    const std::vector<uint32_t> t = tokens_of(seq);
    swiftkv_lookup_result r = SWIFTKV_LOOKUP_RESULT_INIT;
    uint8_t where[kChunksPerSeq];
    check(swiftkv_lookup(&r, where, kChunksPerSeq, ctx, model, t.data(), t.size()) == SWIFTKV_OK,
          "lookup");
    check(r.prefix_tokens <= t.size(), "lookup count");
    const std::vector<unsigned char> want = kv_of(seq);
    std::vector<unsigned char> got(want.size(), 0xEE);
    uint64_t loaded = 0;
    check(swiftkv_retrieve(&loaded, ctx, model, t.data(), t.size(), 0, got.data(), got.size()) ==
              SWIFTKV_OK,
          "retrieve");
    // Tokens past `loaded` are a miss (a record dropped meanwhile); the loaded ones are exact.
    check(loaded <= t.size() && loaded % kChunkTokens == 0, "retrieve count");
    const size_t bytes = loaded / kChunkTokens * kChunkBytes;
    // Chunk bytes are (L, 2, chunk_tokens, H, D) per chunk: compare chunk by chunk.
    check(std::memcmp(got.data(), want.data(), bytes) == 0, "a found chunk has other bytes");
    return loaded;
  }
};

void empty_dir(const std::string &dir) {
  if (DIR *d = ::opendir(dir.c_str())) {
    while (const dirent *e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        ::unlink((dir + "/" + e->d_name).c_str());
      }
    }
    ::closedir(d);
  }
}

const std::string &work_dir() {
  static const std::string dir = [] {
    std::string d = "/tmp/swiftkv-fuzz-disk-" + std::to_string(::getpid());
    ::mkdir(d.c_str(), 0700);
    return d;
  }();
  return dir;
}

void write_seed(const std::string &out_dir) {
  const std::string &dir = work_dir();
  empty_dir(dir);
  {
    Open o(dir);
    for (uint32_t s = 0; s < kSeeded; ++s)
      check(o.store(s) == kChunksPerSeq * kChunkTokens, "seed");
  }
  const std::string from = dir + "/" + kSegment, to = out_dir + "/two-sequences";
  FILE *in = std::fopen(from.c_str(), "rb");
  FILE *out = std::fopen(to.c_str(), "wb");
  check(in != nullptr && out != nullptr, "seed files");
  std::vector<char> buf(kSegmentBytes);
  const size_t n = std::fread(buf.data(), 1, buf.size(), in);
  check(std::fwrite(buf.data(), 1, n, out) == n, "seed write");
  std::fclose(in);
  std::fclose(out);
  empty_dir(dir);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  if (const char *dir = std::getenv("SWIFTKV_FUZZ_WRITE_SEEDS")) {
    write_seed(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string &dir = work_dir();
  empty_dir(dir);
  FILE *f = std::fopen((dir + "/" + kSegment).c_str(), "wb");
  check(f != nullptr, "segment file");
  if (size != 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  const uint32_t fresh = kSeeded;  // a sequence the input cannot hold
  {
    Open o(dir);
    for (uint32_t s = 0; s < kSeeded; ++s) {
      const uint64_t n = o.found(s);
      if (std::getenv("SWIFTKV_FUZZ_VERBOSE") != nullptr) {
        std::fprintf(stderr, "fuzz_disk: sequence %u: %llu tokens found\n", s,
                     static_cast<unsigned long long>(n));
      }
    }
    check(o.found(fresh) == 0, "a chunk never stored was found");
    // The tier goes on working over what it recovered: three of its four segments are free.
    check(o.store(fresh) == kChunksPerSeq * kChunkTokens, "a store after recovery");
    check(o.found(fresh) == kChunksPerSeq * kChunkTokens, "a stored chunk was not found");
  }
  {
    Open again(dir);  // what the first opening kept and wrote opens again, intact
    for (uint32_t s = 0; s <= fresh; ++s) again.found(s);
  }
  empty_dir(dir);
  return 0;
}
