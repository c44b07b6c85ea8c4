// Chunk files: a fixed 96-byte header (magic, format, key, model, position, sizes, checksums)
// followed by the chunk's bytes. The header has its own checksum so a torn header is told apart
// from a chunk whose bytes went bad.
#include "core/tiers/disk_tier.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/common/error.hpp"
#include "core/common/unique_fd.hpp"

namespace swiftkv {

namespace {

constexpr char kMagic[8] = {'S', 'W', 'K', 'V', 'C', 'H', 'K', '1'};
constexpr uint32_t kFormat = 1;
constexpr char kSuffix[] = ".kvc";
constexpr char kTempPrefix[] = ".tmp-";

struct FileHeader {
  char magic[8];
  uint32_t format;
  uint32_t header_bytes;
  uint64_t key_lo, key_hi;
  uint64_t model_lo, model_hi;
  uint32_t position;
  uint32_t tokens;
  uint64_t payload_bytes;
  uint64_t payload_checksum;  // XXH3-64 of the payload
  uint64_t reserved[2];
  uint64_t header_checksum;   // XXH3-64 of every byte above
};
static_assert(sizeof(FileHeader) == 96);
constexpr size_t kHeaderChecked = offsetof(FileHeader, header_checksum);

std::string errno_text(int e) { return std::string(std::strerror(e)); }

void write_all(int fd, const void *p, size_t n, uint64_t off, const std::string &path) {
  const char *c = static_cast<const char *>(p);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, c, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(SWIFTKV_EIO, "writing " + path + " failed: " + errno_text(errno));
    c += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

// False on a short file; throws on an I/O error.
bool read_all(int fd, void *p, size_t n, uint64_t off, const std::string &path) {
  char *c = static_cast<char *>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, c, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(SWIFTKV_EIO, "reading " + path + " failed: " + errno_text(errno));
    if (r == 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

bool header_valid(const FileHeader &h, uint64_t file_size) {
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.format == kFormat &&
         h.header_bytes == sizeof(FileHeader) &&
         XXH3_64bits(&h, kHeaderChecked) == h.header_checksum &&
         h.payload_bytes == file_size - sizeof(FileHeader) && file_size >= sizeof(FileHeader);
}

bool ends_with(const std::string &s, const char *suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

DiskTier::DiskTier(std::string dir, uint64_t budget_bytes)
    : dir_(std::move(dir)), budget_(budget_bytes) {}

uint64_t DiskTier::file_bytes(uint64_t payload) noexcept { return payload + sizeof(FileHeader); }

std::string DiskTier::path_of(uint64_t slot) const {
  std::lock_guard lock(mu_);
  const auto it = files_.find(slot);
  return it == files_.end() || it->second.name.empty() ? std::string() : dir_ + "/" + it->second.name;
}

uint64_t DiskTier::rebuild(const std::function<void(const Found &)> &found) {
  DIR *d = ::opendir(dir_.c_str());
  if (d == nullptr) fail(SWIFTKV_EIO, "cannot read disk_path " + dir_ + ": " + errno_text(errno));
  std::vector<std::string> names;
  while (const dirent *e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);

  uint64_t removed = 0;
  auto remove = [&](const std::string &name) {
    if (::unlink((dir_ + "/" + name).c_str()) == 0) ++removed;
  };
  for (const std::string &name : names) {
    if (name.rfind(kTempPrefix, 0) == 0) {  // a write that never finished
      remove(name);
      continue;
    }
    if (!ends_with(name, kSuffix)) continue;  // not ours: left alone
    const std::string path = dir_ + "/" + name;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    FileHeader h{};
    if (!fd || ::fstat(fd.get(), &st) != 0 ||
        !read_all(fd.get(), &h, sizeof h, 0, path) ||
        !header_valid(h, static_cast<uint64_t>(st.st_size))) {
      remove(name);
      continue;
    }
    const uint64_t bytes = file_bytes(h.payload_bytes);
    uint64_t slot = 0;
    {
      std::lock_guard lock(mu_);
      if (used_ + bytes > budget_) {  // a smaller budget than last time: the cache sheds the rest
        remove(name);
        continue;
      }
      slot = next_slot_++;
      files_.emplace(slot, File{name, bytes});
      used_ += bytes;
    }
    Found f;
    f.slot = slot;
    f.key = ChunkKey{h.key_lo, h.key_hi};
    f.meta = ChunkMeta{ChunkKey{h.model_lo, h.model_hi}, h.position, h.tokens, h.payload_bytes};
    f.mtime_ns = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u +
                 static_cast<uint64_t>(st.st_mtim.tv_nsec);
    found(f);
  }
  return removed;
}

std::optional<uint64_t> DiskTier::allocate(const ChunkKey &, const ChunkMeta &meta) {
  const uint64_t bytes = file_bytes(meta.bytes);
  std::lock_guard lock(mu_);
  if (bytes > budget_ || used_ > budget_ - bytes) return std::nullopt;
  const uint64_t slot = next_slot_++;
  files_.emplace(slot, File{std::string(), bytes});
  used_ += bytes;
  return slot;
}

void DiskTier::free(uint64_t slot) noexcept {
  std::string name;
  {
    std::lock_guard lock(mu_);
    const auto it = files_.find(slot);
    if (it == files_.end()) return;
    name = std::move(it->second.name);
    used_ -= it->second.bytes;
    files_.erase(it);
  }
  if (!name.empty()) (void)::unlink((dir_ + "/" + name).c_str());
}

void DiskTier::write(uint64_t slot, const ChunkKey &key, const ChunkMeta &meta,
                     const std::byte *src) {
  // The slot number makes the name unique even while an older file of the same key is still
  // being read or removed.
  const std::string name = to_hex(key) + "-" + std::to_string(slot) + "-" +
                           std::to_string(::getpid()) + kSuffix;
  const std::string temp = dir_ + "/" + kTempPrefix + name;
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.format = kFormat;
  h.header_bytes = sizeof(FileHeader);
  h.key_lo = key.lo;
  h.key_hi = key.hi;
  h.model_lo = meta.model.lo;
  h.model_hi = meta.model.hi;
  h.position = meta.position;
  h.tokens = meta.tokens;
  h.payload_bytes = meta.bytes;
  h.payload_checksum = XXH3_64bits(src, meta.bytes);
  h.header_checksum = XXH3_64bits(&h, kHeaderChecked);
  {
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) fail(SWIFTKV_EIO, "cannot create " + temp + ": " + errno_text(errno));
    try {
      write_all(fd.get(), &h, sizeof h, 0, temp);
      write_all(fd.get(), src, meta.bytes, sizeof h, temp);
      if (::fdatasync(fd.get()) != 0) fail(SWIFTKV_EIO, "syncing " + temp + ": " + errno_text(errno));
    } catch (...) {
      (void)::unlink(temp.c_str());
      throw;
    }
  }
  if (::rename(temp.c_str(), (dir_ + "/" + name).c_str()) != 0) {
    const int e = errno;
    (void)::unlink(temp.c_str());
    fail(SWIFTKV_EIO, "renaming " + temp + " failed: " + errno_text(e));
  }
  std::lock_guard lock(mu_);
  files_.at(slot).name = name;
}

void DiskTier::read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) {
  const std::string path = path_of(slot);
  if (path.empty()) fail(SWIFTKV_EIO, "disk slot " + std::to_string(slot) + " has no file");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) fail(SWIFTKV_EIO, "cannot open " + path + ": " + errno_text(errno));
  struct stat st {};
  FileHeader h{};
  if (::fstat(fd.get(), &st) != 0 || !read_all(fd.get(), &h, sizeof h, 0, path) ||
      !header_valid(h, static_cast<uint64_t>(st.st_size))) {
    fail(SWIFTKV_EIO, path + " has a torn or corrupt header");
  }
  if (h.payload_bytes != meta.bytes || h.model_lo != meta.model.lo ||
      h.model_hi != meta.model.hi) {
    fail(SWIFTKV_EIO, path + " holds another chunk than the index says");
  }
  if (!read_all(fd.get(), dst, meta.bytes, sizeof h, path)) fail(SWIFTKV_EIO, path + " is short");
  if (XXH3_64bits(dst, meta.bytes) != h.payload_checksum) {
    fail(SWIFTKV_EIO, path + " fails its checksum");
  }
}

uint64_t DiskTier::free_bytes(const ChunkKey &) const {
  std::lock_guard lock(mu_);
  return budget_ - used_;
}

}  // namespace swiftkv
