// The log-structured disk tier: segment files of records, each a 128-byte header (magic, format,
// type, model, key, position, sizes, segment generation, sequence, checksums) and its payload;
// commit records that vouch for what was synced before them; appends, reads that check they
// found the record the index expects, group commit, recovery and cleaning.
#include "core/tiers/disk_tier.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "core/common/checked_math.hpp"
#include "core/common/clock.hpp"
#include "core/common/error.hpp"
#include "core/common/log.hpp"

namespace swiftkv {

namespace {

constexpr char kSegMagic[8] = {'S', 'W', 'K', 'V', 'S', 'E', 'G', '\0'};
constexpr char kRecMagic[8] = {'S', 'W', 'K', 'V', 'R', 'E', 'C', '\0'};
constexpr uint32_t kChunkRecord = 1;
constexpr uint32_t kCommitRecord = 2;
constexpr uint32_t kDeadMark = 0x44414544;     // "DEAD": the record was freed
constexpr char kLockName[] = ".swiftkv.lock";  // the directory's owner, by flock and pid
constexpr char kSegPrefix[] = "seg-";
constexpr char kSegSuffix[] = ".kvlog";
// A header, one record of an empty payload and room for a commit record.
constexpr uint64_t kMinSegmentBytes = 4 * DiskTier::kHeaderBytes;
// A payload larger than this is read or written in pieces of it, checksummed on a second thread
// while the next piece is read or written.
constexpr uint64_t kPiece = uint64_t{4} << 20;
// Once this many record bytes are written to a segment, the kernel is asked to start writing
// them back (without waiting), so a group commit finds most pages already on their way and the
// disk is busy while the engine stores. Smaller kicks would split the writes into small I/Os.
constexpr uint64_t kKickBytes = uint64_t{8} << 20;

struct SegmentHeader {
  char magic[8];
  uint32_t format;
  uint32_t header_bytes;
  uint64_t segment_bytes;
  uint64_t generation;  // bumped each time the segment is reused
  uint64_t created_ns;  // CLOCK_REALTIME
  uint64_t reserved[10];
  uint64_t checksum;  // XXH3-64 of every byte above
};
static_assert(sizeof(SegmentHeader) == DiskTier::kHeaderBytes);

struct RecordHeader {
  char magic[8];
  uint32_t format;
  uint32_t header_bytes;
  uint32_t type;
  uint32_t dead;  // kDeadMark once freed; the only field written in place, left out of the checksum
  uint32_t position;
  uint32_t tokens;
  uint64_t key_lo, key_hi;
  uint64_t model_lo, model_hi;
  uint64_t payload_bytes;
  uint64_t generation;        // the segment's, when the record was written
  uint64_t sequence;          // order of writes; the newest copy of a key wins at recovery
  uint64_t written_ns;        // CLOCK_REALTIME
  uint64_t covered_to;        // a commit record: records below this offset were synced
  uint64_t payload_checksum;  // XXH3-64 of the payload
  uint32_t encoding;          // ChunkMeta::encoding; 0: the payload is the chunk's own bytes
  uint32_t raw_per_token;     // an encoded payload: the chunk's decoded bytes per token; else 0
  uint64_t checksum;  // XXH3-64 of every byte above with `dead` as 0: header and payload both
};
static_assert(sizeof(RecordHeader) == DiskTier::kHeaderBytes);
constexpr size_t kDeadOffset = offsetof(RecordHeader, dead);

uint64_t segment_checksum(const SegmentHeader &h) {
  return XXH3_64bits(&h, offsetof(SegmentHeader, checksum));
}

// What a chunk record's header says of its chunk.
ChunkMeta record_meta(const RecordHeader &h) {
  ChunkMeta m{ChunkKey{h.model_lo, h.model_hi}, h.position, h.tokens, h.payload_bytes};
  m.encoding = h.encoding;
  if (m.encoded()) {
    m.bytes = uint64_t{h.tokens} * h.raw_per_token;
    m.stored_bytes = h.payload_bytes;
  }
  return m;
}

uint64_t record_checksum(RecordHeader h) {
  h.dead = 0;
  return XXH3_64bits(&h, offsetof(RecordHeader, checksum));
}

uint64_t realtime_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

std::string errno_text(int e) { return std::string(std::strerror(e)); }

// Moves past `done` bytes of an iovec array after a short read or write.
void consume(iovec *&iov, int &n, size_t done) {
  while (n > 0 && done >= iov->iov_len) {
    done -= iov->iov_len;
    ++iov;
    --n;
  }
  if (n > 0) {
    iov->iov_base = static_cast<char *>(iov->iov_base) + done;
    iov->iov_len -= done;
  }
}

// Writes all of iov at off; throws Error(EIO) naming `what`.
void pwrite_all(int fd, iovec *iov, int n, uint64_t off, const std::string &what) {
  while (n > 0) {
    const ssize_t w = ::pwritev(fd, iov, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      fail(SWIFTKV_EIO, "writing " + what + " failed: " + errno_text(w < 0 ? errno : EIO));
    off += static_cast<uint64_t>(w);
    consume(iov, n, static_cast<size_t>(w));
  }
}

// Reads all of iov at off: false when the file ends first; throws Error(EIO) on an I/O error.
bool pread_all(int fd, iovec *iov, int n, uint64_t off, const std::string &what) {
  while (n > 0) {
    const ssize_t r = ::preadv(fd, iov, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(SWIFTKV_EIO, "reading " + what + " failed: " + errno_text(errno));
    if (r == 0) return false;
    off += static_cast<uint64_t>(r);
    consume(iov, n, static_cast<size_t>(r));
  }
  return true;
}

bool pread_one(int fd, void *p, size_t len, uint64_t off, const std::string &what) {
  iovec v{p, len};
  return pread_all(fd, &v, 1, off, what);
}

// A record header that is whole and of this format (the payload is not looked at).
bool header_ok(const RecordHeader &h) {
  return std::memcmp(h.magic, kRecMagic, sizeof kRecMagic) == 0 && h.format == DiskTier::kFormat &&
         h.header_bytes == sizeof(RecordHeader) && record_checksum(h) == h.checksum &&
         (h.type == kChunkRecord || h.type == kCommitRecord);
}

// XXH3-64 of a buffer that another thread fills (reads) or drains (writes) piece by piece: a
// second thread hashes the bytes already published while the caller works on the next piece,
// so the checksum costs little beside the I/O. Without a thread to be had, it hashes at the end.
class PieceHasher {
 public:
  PieceHasher(const std::byte *p, uint64_t bytes) : p_(p), bytes_(bytes), st_(XXH3_createState()) {
    if (st_ == nullptr || XXH3_64bits_reset(st_) != XXH_OK) {
      XXH3_freeState(st_);
      fail(SWIFTKV_ENOMEM, "no memory for a checksum");
    }
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error &) {
      // No thread: digest() hashes everything.
    }
  }
  ~PieceHasher() {
    stop();
    XXH3_freeState(st_);
  }
  PieceHasher(const PieceHasher &) = delete;
  PieceHasher &operator=(const PieceHasher &) = delete;
  // Bytes [0, upto) are ready.
  void publish(uint64_t upto) {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      ready_ = upto;
    }
    cv_.notify_one();
  }
  // The checksum of all the bytes, every one published.
  uint64_t digest() {
    const bool threaded = thread_.joinable();
    stop();
    if (!threaded) XXH3_64bits_update(st_, p_, bytes_);
    return XXH3_64bits_digest(st_);
  }

 private:
  void run() {
    uint64_t done = 0;
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return ready_ > done || stop_; });
      const uint64_t upto = ready_;
      if (upto == done) return;  // stopped
      lock.unlock();
      XXH3_64bits_update(st_, p_ + done, upto - done);
      done = upto;
      lock.lock();
    }
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  const std::byte *p_;
  const uint64_t bytes_;
  XXH3_state_t *st_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t ready_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// The segment number of a file name seg-<8 hex digits>.kvlog.
std::optional<uint32_t> segment_number(const std::string &name) {
  const size_t p = sizeof kSegPrefix - 1, s = sizeof kSegSuffix - 1;
  if (name.size() != p + 8 + s || name.compare(0, p, kSegPrefix) != 0 ||
      name.compare(p + 8, s, kSegSuffix) != 0) {
    return std::nullopt;
  }
  uint32_t n = 0;
  for (size_t i = p; i < p + 8; ++i) {
    const char c = name[i];
    uint32_t d = 0;
    if (c >= '0' && c <= '9')
      d = static_cast<uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<uint32_t>(c - 'a' + 10);
    else
      return std::nullopt;
    n = n * 16 + d;
  }
  return n;
}

}  // namespace

uint64_t DiskTier::record_bytes(uint64_t payload) noexcept {
  return (kHeaderBytes + payload + kAlign - 1) / kAlign * kAlign;
}

uint64_t DiskTier::segment_for(uint64_t payload) noexcept {
  // The segment's header, the record, and room for a commit record.
  return 2 * kHeaderBytes + record_bytes(payload);
}

uint64_t DiskTier::budget_for(uint64_t records, uint64_t payload) noexcept {
  // One segment more than the records: the one kept free for cleaning.
  return (std::max<uint64_t>(records, 1) + 1) * segment_for(payload);
}

DiskTier::DiskTier(DiskOptions options) : options_(std::move(options)) {
  dir_.reset(::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_) {
    fail(SWIFTKV_EIO, "disk_path " + options_.dir + " is not a directory: " + errno_text(errno));
  }
  if (::faccessat(dir_.get(), ".", R_OK | W_OK | X_OK, 0) != 0) {
    fail(SWIFTKV_EIO, "disk_path " + options_.dir + " is not writable: " + errno_text(errno));
  }
  // Two tiers on one directory would each take the whole budget and recover each other's
  // segments as their own: one owner at a time, the other refused. The lock is the directory's
  // own (flock holds per open file, so a second context in the same process is refused too,
  // and the kernel releases a dead owner's lock): removing or renaming the lock file, or the
  // directory, does not let a second owner in.
  const std::string lock_path = options_.dir + "/" + kLockName;
  const auto holder = [&] {
    char pid[32] = {};
    UniqueFd f(::openat(dir_.get(), kLockName, O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    const ssize_t n = f ? ::pread(f.get(), pid, sizeof pid - 1, 0) : -1;
    return n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string("unknown");
  };
  const auto refuse = [&] {
    fail(SWIFTKV_EBUSY, "disk_path " + options_.dir + " is in use by another context (pid " +
                            holder() + " holds it; " + lock_path + " names it)");
  };
  if (::flock(dir_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e != EWOULDBLOCK) fail(SWIFTKV_EIO, "cannot lock " + options_.dir + ": " + errno_text(e));
    refuse();
  }
  lock_.reset(::openat(dir_.get(), kLockName, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!lock_) fail(SWIFTKV_EIO, "cannot open " + lock_path + ": " + errno_text(errno));
  if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    if (e != EWOULDBLOCK) fail(SWIFTKV_EIO, "cannot lock " + lock_path + ": " + errno_text(e));
    refuse();  // an earlier version of the library holds the file
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(lock_.get(), 0) != 0 ||
      ::pwrite(lock_.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    log_warn("disk tier: could not write this pid into " + lock_path + ": " + errno_text(errno));
  }
  // At least two segments (one stays free for cleaning); by default at least four.
  const uint64_t wanted =
      options_.segment_bytes != 0 ? options_.segment_bytes : kDefaultSegmentBytes;
  const uint64_t cap = options_.budget_bytes / (options_.segment_bytes != 0 ? 2 : 4);
  segment_bytes_ = std::min(wanted, cap) / kAlign * kAlign;
  if (segment_bytes_ < kMinSegmentBytes) segment_bytes_ = 0;  // the budget holds nothing
  max_segments_ = segment_bytes_ == 0 ? 0 : options_.budget_bytes / segment_bytes_;
  budget_segments_ = max_segments_;
  counters_.segment_bytes = segment_bytes_;
}

DiskTier::~DiskTier() {
  try {
    sync();
  } catch (...) {
    // Nothing to report to: what was not synced is what a crash would lose.
  }
}

std::string DiskTier::name_of(uint32_t number) {
  char name[32];
  std::snprintf(name, sizeof name, "%s%08x%s", kSegPrefix, number, kSegSuffix);
  return name;
}

std::string DiskTier::path_of(uint32_t number) const {
  return options_.dir + "/" + name_of(number);
}

uint64_t DiskTier::capacity_bytes(const ChunkKey &) const {
  // Each segment holds records in all but its header and the room kept for a commit record.
  return max_segments_ < 2 ? 0 : (max_segments_ - 1) * (segment_bytes_ - 2 * kHeaderBytes);
}

uint64_t DiskTier::records_that_fit(uint64_t payload) const noexcept {
  if (max_segments_ < 2) return 0;
  return (max_segments_ - 1) * ((segment_bytes_ - 2 * kHeaderBytes) / record_bytes(payload));
}

uint64_t DiskTier::free_bytes(const ChunkKey &) const {
  std::lock_guard lock(mu_);
  return free_bytes_locked();
}

uint64_t DiskTier::free_bytes_locked() const {
  if (max_segments_ < 2) return 0;
  // The open segment's room, the free segments but one (kept for cleaning), and what cleaning
  // the cleanable ones gives back; never more than the capacity leaves. Cleaning needs an open
  // or a free segment to copy into: after a restart that found every segment holding records
  // there is neither, and the policy must first empty a segment whole.
  const uint64_t free_segments =
      free_segments_ + (max_segments_ - std::min(max_segments_, segment_files_));
  uint64_t n = open_ != nullptr || free_segments != 0 ? cleanable_gain_ : 0;
  if (open_ != nullptr) n += open_->size - open_->write_at - kHeaderBytes;
  if (free_segments > 1) n += (free_segments - 1) * (segment_bytes_ - 2 * kHeaderBytes);
  const uint64_t cap = capacity_bytes({});
  return std::min(n, cap > live_ ? cap - live_ : 0);
}

void DiskTier::recount_locked(Segment &s) {
  const bool is_free = s.state == SegState::free && s.reusable;
  if (is_free != s.counted_free) {
    free_segments_ += is_free ? 1 : ~uint64_t{0};
    s.counted_free = is_free;
  }
  if (s.counted_clean) {
    cleanable_.erase({s.counted_live, s.index});
    cleanable_gain_ -= s.size - 2 * kHeaderBytes - s.counted_live;
    s.counted_clean = false;
  }
  if (s.state == SegState::sealed && s.reusable && !s.cleaning && s.pending.empty() &&
      s.live * 8 <= s.size) {
    cleanable_.emplace(s.live, s.index);
    cleanable_gain_ += s.size - 2 * kHeaderBytes - s.live;
    s.counted_clean = true;
    s.counted_live = s.live;
  }
}

uint64_t DiskTier::reserve_slot_locked() {
  if (!free_slots_.empty()) {
    const uint64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  records_.emplace_back();
  return records_.size() - 1;
}

DiskTier::Segment *DiskTier::new_segment_locked() {
  if (max_segments_ == 0 || segment_files_ >= max_segments_) return nullptr;
  auto seg = std::make_unique<Segment>();
  std::string path;
  for (int tries = 0;; ++tries) {
    path = path_of(next_number_);
    seg->fd.reset(::openat(dir_.get(), name_of(next_number_++).c_str(),
                           O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (seg->fd) break;
    if (errno != EEXIST || tries > 64) {
      const int e = errno;
      const std::string what = "cannot create " + path + ": " + errno_text(e);
      if (e == ENOSPC || e == EDQUOT) {
        disk_full_locked(what);
      } else {
        full_log_.warn("disk tier: " + what);  // not the disk's room (no fds, say): asked again
      }
      return nullptr;
    }
  }
  seg->number = next_number_ - 1;
  // The whole segment is allocated now: the budget counts it, and a full disk shows here, not
  // in the middle of a record.
  const int e = ::posix_fallocate(seg->fd.get(), 0, static_cast<off_t>(segment_bytes_));
  if (e != 0) {
    (void)::unlinkat(dir_.get(), name_of(seg->number).c_str(), 0);
    --next_number_;  // the number is free again: a full disk does not use up names
    const std::string what = "cannot allocate " + std::to_string(segment_bytes_) + " bytes for " +
                             path + ": " + errno_text(e);
    if (e == ENOSPC || e == EDQUOT || e == EFBIG) {
      disk_full_locked(what);
    } else {
      full_log_.warn("disk tier: " + what);
    }
    return nullptr;
  }
  seg->size = segment_bytes_;
  seg->generation = 0;
  seg->index = segments_.size();
  seg->state = SegState::free;
  segments_.push_back(std::move(seg));
  ++segment_files_;
  allocated_ += segment_bytes_;
  Segment &s = *segments_.back();
  recount_locked(s);
  return &s;
}

void DiskTier::disk_full_locked(const std::string &what) {
  ++counters_.full_refusals;
  max_segments_ = std::min(max_segments_, segment_files_);
  const bool was_due = due_locked() != 0;
  full_since_ns_ = std::max<uint64_t>(1, monotonic_ns());
  if (!was_due && on_due_) on_due_();
  full_log_.warn("disk tier: " + what + "; the tier keeps to the " +
                 std::to_string(segment_files_) + " segments it has (" +
                 std::to_string(capacity_bytes({})) + " bytes of records) and asks again in " +
                 std::to_string(kFullRetryNs / 1'000'000'000ull) + " s");
}

void DiskTier::open_segment_locked(Segment &s) {
  // A new generation: records of the segment's earlier lives no longer count.
  SegmentHeader h{};
  std::memcpy(h.magic, kSegMagic, sizeof kSegMagic);
  h.format = kFormat;
  h.header_bytes = sizeof h;
  h.segment_bytes = s.size;
  h.generation = s.generation + 1;
  h.created_ns = realtime_ns();
  h.checksum = segment_checksum(h);
  iovec v{&h, sizeof h};
  pwrite_all(s.fd.get(), &v, 1, 0, path_of(s.number));
  s.generation = h.generation;
  s.state = SegState::open;
  s.write_at = kHeaderBytes;
  s.synced_to = kHeaderBytes;
  s.kicked_to = 0;
  s.unkicked = 0;
  s.live = 0;
  s.pending.clear();
  s.slots.clear();
  dirty_locked(s);  // the header
  recount_locked(s);
  open_ = &s;
}

void DiskTier::seal_locked(Segment &s) {
  s.state = SegState::sealed;
  if (open_ == &s) open_ = nullptr;
  recount_locked(s);
  maybe_release_locked(s);
}

void DiskTier::maybe_release_locked(Segment &s) {
  if ((s.state != SegState::sealed && s.state != SegState::draining) || s.live != 0 ||
      !s.pending.empty() || s.cleaning) {
    return;
  }
  if (s.readers != 0) {
    s.state = SegState::draining;  // freed by its last reader
  } else if (s.reusable) {
    s.state = SegState::free;
  } else {
    (void)::unlinkat(dir_.get(), name_of(s.number).c_str(), 0);
    s.fd.reset();
    allocated_ -= s.size;
    --segment_files_;
    s.state = SegState::gone;
  }
  recount_locked(s);
}

DiskTier::Segment *DiskTier::room_locked(std::unique_lock<std::mutex> &lock, uint64_t r) {
  if (segment_bytes_ == 0 || r + 2 * kHeaderBytes > segment_bytes_) return nullptr;
  auto take_free = [&]() -> Segment * {
    for (const auto &x : segments_) {
      if (x->state == SegState::free && x->reusable) return x.get();
    }
    return new_segment_locked();
  };
  auto free_count = [&] {
    return free_segments_ + (max_segments_ - std::min(max_segments_, segment_files_));
  };
  for (int guard = 0; guard < 256; ++guard) {
    if (open_ != nullptr && open_->size - open_->write_at >= r + kHeaderBytes) return open_;
    if (free_count() >= 2) {
      Segment *f = take_free();
      if (f == nullptr) return nullptr;  // the file could not be made (disk full)
      if (open_ != nullptr) seal_locked(*open_);
      open_segment_locked(*f);
      continue;
    }
    if (cleanable_.empty()) return nullptr;
    Segment &c = *segments_[cleanable_.begin()->second];
    // Its live records go to the open segment, or to the free segment kept for this.
    if (open_ == nullptr || open_->size - open_->write_at < c.live + kHeaderBytes) {
      if (free_count() == 0) return nullptr;
      Segment *f = take_free();
      if (f == nullptr) return nullptr;
      if (open_ != nullptr) seal_locked(*open_);
      open_segment_locked(*f);
    }
    clean_locked(lock, c);
  }
  return nullptr;
}

void DiskTier::clean_locked(std::unique_lock<std::mutex> &lock, Segment &c) {
  Segment &d = *open_;
  std::vector<Relocation> moves = plan_moves_locked(c, d);
  const int src = c.fd.get(), dst = d.fd.get();
  const uint64_t src_gen = c.generation, dst_gen = d.generation;
  const std::string src_path = path_of(c.number), dst_path = path_of(d.number);
  lock.unlock();
  std::vector<std::byte> buf;
  for (Relocation &m : moves) {
    try {
      m.ok = copy_record(src, src_gen, src_path, dst, dst_gen, dst_path, m, buf);
    } catch (const Error &e) {
      log_warn("disk tier: moving a record out of " + src_path + ": " + e.what());
    }
  }
  lock.lock();
  settle_moves_locked(c, d, moves);
}

std::vector<DiskTier::Relocation> DiskTier::plan_moves_locked(Segment &c, Segment &d) {
  std::vector<Relocation> moves;
  for (uint64_t slot : c.slots) {
    const Record &r = records_[slot];
    if (r.state != RecState::live || r.seg != c.index) continue;
    moves.push_back(Relocation{slot, r.off, d.write_at, r.len});
    d.pending.insert(d.write_at);
    d.write_at += r.len;
    d.live += r.len;
  }
  c.cleaning = true;
  ++c.readers;  // not reused while its records are copied out
  ++d.readers;
  recount_locked(c);
  recount_locked(d);
  return moves;
}

bool DiskTier::copy_record(int src, uint64_t src_gen, const std::string &src_path, int dst,
                           uint64_t dst_gen, const std::string &dst_path, const Relocation &m,
                           std::vector<std::byte> &buf) {
  buf.resize(m.len);
  if (!pread_one(src, buf.data(), m.len, m.from, src_path)) return false;
  RecordHeader h{};
  std::memcpy(&h, buf.data(), sizeof h);
  if (!header_ok(h) || h.type != kChunkRecord || h.generation != src_gen ||
      h.payload_bytes + kHeaderBytes > m.len ||
      XXH3_64bits(buf.data() + kHeaderBytes, h.payload_bytes) != h.payload_checksum) {
    return false;  // a bad record stays where it is: its read fails and the cache drops it
  }
  h.generation = dst_gen;
  h.dead = 0;
  h.checksum = record_checksum(h);
  std::memcpy(buf.data(), &h, sizeof h);
  iovec v{buf.data(), kHeaderBytes + h.payload_bytes};
  pwrite_all(dst, &v, 1, m.to, dst_path);
  return true;
}

void DiskTier::settle_moves_locked(Segment &c, Segment &d, const std::vector<Relocation> &moves) {
  uint64_t moved = 0;
  for (const Relocation &m : moves) {
    d.pending.erase(m.to);
    Record &r = records_[m.slot];
    if (m.ok && r.state == RecState::live && r.seg == c.index && r.off == m.from) {
      r.seg = static_cast<uint32_t>(d.index);
      r.off = m.to;
      d.slots.push_back(m.slot);
      c.live -= m.len;
      moved += m.len;
    } else {
      // Freed meanwhile, or not copied: the copy is dead space (marked, so that recovery does
      // not bring it back).
      d.live -= m.len;
      if (m.ok) {
        const uint32_t mark = kDeadMark;
        (void)::pwrite(d.fd.get(), &mark, sizeof mark, static_cast<off_t>(m.to + kDeadOffset));
      }
    }
  }
  dirty_locked(d);
  --c.readers;
  --d.readers;
  c.cleaning = false;
  counters_.bytes_relocated += moved;
  if (c.live == 0) ++counters_.segments_cleaned;
  recount_locked(d);
  recount_locked(c);
  maybe_release_locked(c);
  if (c.live != 0) {
    // Some record could not move (it fails its checks): the segment waits for the cache to
    // drop it; it is not chosen again before then.
    if (c.counted_clean) {
      cleanable_.erase({c.counted_live, c.index});
      cleanable_gain_ -= c.size - 2 * kHeaderBytes - c.counted_live;
      c.counted_clean = false;
    }
  }
}

std::optional<uint64_t> DiskTier::allocate(const ChunkKey &key, const ChunkMeta &meta) {
  const uint64_t r = record_bytes(meta.stored());
  std::unique_lock lock(mu_);
  if (live_ + r > capacity_bytes({})) return std::nullopt;
  Segment *s = room_locked(lock, r);
  if (s == nullptr) return std::nullopt;
  const uint64_t slot = reserve_slot_locked();
  Record &rec = records_[slot];
  rec.seg = static_cast<uint32_t>(s->index);
  rec.off = s->write_at;
  rec.len = r;
  rec.key = key;
  rec.meta = meta;
  rec.state = RecState::reserved;
  s->pending.insert(rec.off);
  s->slots.push_back(slot);
  s->write_at += r;
  s->live += r;
  live_ += r;
  recount_locked(*s);
  return slot;
}

void DiskTier::mark_dead_locked(const Record &r) noexcept {
  const Segment &s = *segments_[r.seg];
  const uint32_t mark = kDeadMark;
  // Under the lock: the segment cannot be reused (and its bytes rewritten) meanwhile.
  (void)::pwrite(s.fd.get(), &mark, sizeof mark, static_cast<off_t>(r.off + kDeadOffset));
}

void DiskTier::write_filler_locked(const Segment &s, const Record &r) noexcept {
  // A dead record header over the room, so that a walk of the log goes past it: without one,
  // the zeros (or an earlier generation's bytes) of a room never written end the log there at
  // the next start, and every record after it in the segment is lost.
  RecordHeader h{};
  std::memcpy(h.magic, kRecMagic, sizeof kRecMagic);
  h.format = kFormat;
  h.header_bytes = sizeof h;
  h.type = kChunkRecord;
  h.dead = kDeadMark;
  h.generation = s.generation;
  h.payload_bytes = r.len - kHeaderBytes;
  h.written_ns = realtime_ns();
  h.checksum = record_checksum(h);
  (void)::pwrite(s.fd.get(), &h, sizeof h, static_cast<off_t>(r.off));
}

void DiskTier::free(uint64_t slot) noexcept {
  std::lock_guard lock(mu_);
  if (slot >= records_.size()) return;
  Record &r = records_[slot];
  if (r.state == RecState::free) return;
  Segment &s = *segments_[r.seg];
  if (r.state == RecState::live) mark_dead_locked(r);
  if (r.state == RecState::reserved) {
    s.pending.erase(r.off);
    write_filler_locked(s, r);
  }
  s.live -= r.len;
  live_ -= r.len;
  r.state = RecState::free;
  try {
    free_slots_.push_back(slot);
  } catch (...) {
    // Out of memory: the slot number is not used again.
  }
  recount_locked(s);
  maybe_release_locked(s);
}

void DiskTier::write(uint64_t slot, const ChunkKey &key, const ChunkMeta &meta,
                     const std::byte *src) {
  RecordHeader h{};
  int fd = -1;
  uint64_t off = 0;
  std::string path;
  {
    std::lock_guard lock(mu_);
    const Record &r = records_.at(slot);
    if (r.state != RecState::reserved || !(r.key == key) || r.meta.stored() != meta.stored()) {
      fail(SWIFTKV_EINTERNAL,
           "disk slot " + std::to_string(slot) + " was not reserved for this chunk");
    }
    const Segment &s = *segments_[r.seg];
    fd = s.fd.get();
    off = r.off;
    path = path_of(s.number);
    h.generation = s.generation;
    h.sequence = sequence_++;
  }
  std::memcpy(h.magic, kRecMagic, sizeof kRecMagic);
  h.format = kFormat;
  h.header_bytes = sizeof h;
  h.type = kChunkRecord;
  h.position = meta.position;
  h.tokens = meta.tokens;
  h.key_lo = key.lo;
  h.key_hi = key.hi;
  h.model_lo = meta.model.lo;
  h.model_hi = meta.model.hi;
  const uint64_t payload = meta.stored();
  h.payload_bytes = payload;
  h.encoding = meta.encoding;
  h.raw_per_token =
      meta.encoded() && meta.tokens != 0 ? static_cast<uint32_t>(meta.bytes / meta.tokens) : 0;
  h.written_ns = realtime_ns();
  if (payload <= kPiece) {
    h.payload_checksum = XXH3_64bits(src, payload);
    h.checksum = record_checksum(h);
    // One call for header and payload. A record cut short by a crash is caught at recovery: its
    // payload fails its checksum unless a commit record says it was synced whole.
    iovec v[2] = {{&h, sizeof h}, {const_cast<std::byte *>(src), payload}};
    pwrite_all(fd, v, 2, off, path);
  } else {
    // The payload first, piece by piece, checksummed behind on a second thread; the header
    // last, once the checksum is known. Until the header is written the record does not exist.
    PieceHasher hash(src, payload);
    hash.publish(0);
    for (uint64_t at = 0; at < payload;) {
      const uint64_t len = std::min(payload - at, kPiece);
      hash.publish(at + len);  // the hasher reads what this thread writes: both only read src
      iovec v{const_cast<std::byte *>(src) + at, len};
      pwrite_all(fd, &v, 1, off + kHeaderBytes + at, path);
      at += len;
    }
    h.payload_checksum = hash.digest();
    h.checksum = record_checksum(h);
    iovec v{&h, sizeof h};
    pwrite_all(fd, &v, 1, off, path);
  }
  start_writeback(slot);
  std::lock_guard lock(mu_);
  Record &r = records_[slot];
  Segment &s = *segments_[r.seg];
  s.pending.erase(r.off);
  r.state = RecState::live;
  r.sequence = h.sequence;
  r.written_ns = h.written_ns;
  dirty_locked(s);
  recount_locked(s);
}

void DiskTier::start_writeback(uint64_t slot) {
  int fd = -1;
  uint64_t from = 0, to = 0;
  {
    std::lock_guard lock(mu_);
    const Record &r = records_.at(slot);
    Segment &s = *segments_[r.seg];
    s.unkicked += r.len;
    if (s.unkicked < kKickBytes) return;
    // Up to the end of the appends: a record still being written by another thread is started
    // partly, and the rest of it goes with the next kick or the sync.
    from = s.kicked_to;
    to = s.write_at;
    s.kicked_to = to;
    s.unkicked = 0;
    fd = s.fd.get();
  }
  // The segment cannot go while this thread's record is reserved in it. No wait and no error:
  // this only starts I/O early; a failed write shows at the sync, which reports it.
  if (to > from) {
    (void)::sync_file_range(fd, static_cast<off_t>(from), static_cast<off_t>(to - from),
                            SYNC_FILE_RANGE_WRITE);
  }
}

void DiskTier::read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) {
  int fd = -1;
  uint64_t off = 0, gen = 0;
  ChunkKey key;
  std::string path;
  Segment *seg = nullptr;
  {
    std::lock_guard lock(mu_);
    if (slot >= records_.size() || records_[slot].state != RecState::live) {
      fail(SWIFTKV_EIO, "disk slot " + std::to_string(slot) + " holds no record");
    }
    const Record &r = records_[slot];
    seg = segments_[r.seg].get();
    ++seg->readers;  // the segment is not reused while this reads it
    fd = seg->fd.get();
    off = r.off;
    gen = seg->generation;
    key = r.key;
    path = path_of(seg->number);
  }
  struct Unpin {
    DiskTier &t;
    Segment &s;
    ~Unpin() {
      std::lock_guard lock(t.mu_);
      --s.readers;
      t.maybe_release_locked(s);
    }
  } unpin{*this, *seg};
  // The header and the payload's first piece in one call; then piece by piece, each piece's
  // checksum computed while the kernel reads the next (asked for ahead), so the check costs
  // little beyond the read.
  RecordHeader h{};
  const uint64_t payload = meta.stored();
  const uint64_t first = std::min(payload, kPiece);
  iovec v[2] = {{&h, sizeof h}, {dst, first}};
  if (!pread_all(fd, v, 2, off, path)) fail(SWIFTKV_EIO, path + " ends inside a record");
  const bool same = header_ok(h) && h.type == kChunkRecord && h.generation == gen &&
                    h.key_lo == key.lo && h.key_hi == key.hi && h.model_lo == meta.model.lo &&
                    h.model_hi == meta.model.hi && h.position == meta.position &&
                    h.tokens == meta.tokens && h.payload_bytes == payload &&
                    h.encoding == meta.encoding && encoding_consistent(h.encoding);
  if (!same) {
    std::lock_guard lock(mu_);
    ++counters_.records_mismatched;
    fail(SWIFTKV_EIO, path + " at " + std::to_string(off) +
                          " holds another record than the index says (overwritten or moved)");
  }
  uint64_t sum = 0;
  if (first == payload) {
    sum = XXH3_64bits(dst, payload);
  } else {
    sum = checked_read_rest(fd, off + kHeaderBytes, payload, first, dst, path);
  }
  if (sum != h.payload_checksum) {
    fail(SWIFTKV_EIO, path + " at " + std::to_string(off) + ": the record fails its checksum");
  }
}

void DiskTier::read_many(std::span<const SlotRead> reads, std::span<uint8_t> ok) {
  uint64_t bytes = 0;
  for (const SlotRead &r : reads) bytes += r.meta->stored();
  const auto streams = static_cast<unsigned>(std::min<size_t>(kReadStreams, reads.size()));
  if (streams < 2 || bytes < kParallelReadBytes) {
    TierStore::read_many(reads, ok);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr failed;  // the first exception other than a failed check
  std::mutex failed_mu;
  auto work = [&]() noexcept {
    for (size_t i = next++; i < reads.size(); i = next++) {
      try {
        read(reads[i].slot, *reads[i].meta, reads[i].dst);
        ok[i] = 1;
      } catch (const Error &) {
        ok[i] = 0;
      } catch (...) {
        ok[i] = 0;
        std::lock_guard lock(failed_mu);
        if (!failed) failed = std::current_exception();
      }
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (unsigned t = 1; t < streams; ++t) helpers.emplace_back(work);
  } catch (const std::system_error &) {
    // No thread to be had: the ones started and this one read everything.
  }
  work();
  for (std::thread &t : helpers) t.join();
  if (failed) std::rethrow_exception(failed);
}

uint64_t DiskTier::checked_read_rest(int fd, uint64_t payload_at, uint64_t bytes, uint64_t first,
                                     std::byte *dst, const std::string &path) {
  PieceHasher hash(dst, bytes);
  hash.publish(first);
  for (uint64_t at = first; at < bytes;) {
    const uint64_t len = std::min(bytes - at, kPiece);
    if (!pread_one(fd, dst + at, len, payload_at + at, path)) {
      fail(SWIFTKV_EIO, path + " ends inside a record");
    }
    at += len;
    hash.publish(at);
  }
  return hash.digest();
}

void DiskTier::append_commit_locked(Segment &s, uint64_t covered) {
  if (s.state != SegState::open && s.state != SegState::sealed) return;
  if (s.size - s.write_at < kHeaderBytes) return;  // cannot happen: appends leave this room
  RecordHeader h{};
  std::memcpy(h.magic, kRecMagic, sizeof kRecMagic);
  h.format = kFormat;
  h.header_bytes = sizeof h;
  h.type = kCommitRecord;
  h.generation = s.generation;
  h.sequence = sequence_++;
  h.written_ns = realtime_ns();
  h.covered_to = covered;
  h.checksum = record_checksum(h);
  iovec v{&h, sizeof h};
  try {
    pwrite_all(s.fd.get(), &v, 1, s.write_at, path_of(s.number));
  } catch (const Error &e) {
    log_warn(std::string("disk tier: ") + e.what());
    return;
  }
  s.write_at += kHeaderBytes;
  // A sealed segment keeps its commit record inside the room it left; an open one re-checks
  // its room at the next append.
  recount_locked(s);
}

void DiskTier::sync() {
  struct Job {
    Segment *s;
    uint64_t covered, generation;
    bool ok = false;
  };
  std::vector<Job> jobs;
  {
    std::lock_guard lock(mu_);
    commit_due_ns_ = 0;  // what was written so far is in the jobs; a later write starts the clock
    for (const auto &s : segments_) {
      if (!s->dirty || s->state == SegState::gone || !s->fd) continue;
      s->dirty = false;
      ++s->readers;  // kept (not reused, not deleted) while it syncs
      jobs.push_back(
          Job{s.get(), s->pending.empty() ? s->write_at : *s->pending.begin(), s->generation});
    }
  }
  for (Job &j : jobs) j.ok = ::fdatasync(j.s->fd.get()) == 0;
  std::lock_guard lock(mu_);
  for (Job &j : jobs) {
    Segment &s = *j.s;
    if (!j.ok) {
      log_warn("disk tier: syncing " + path_of(s.number) + " failed: " + errno_text(errno));
      dirty_locked(s);  // tried again at the next commit
    } else if (s.generation == j.generation && j.covered > s.synced_to) {
      s.synced_to = j.covered;
      append_commit_locked(s, j.covered);
    }
    --s.readers;
    maybe_release_locked(s);
  }
  ++counters_.syncs;
}

void DiskTier::maintain(uint64_t now_ns) {
  {
    std::lock_guard lock(mu_);
    if (full_since_ns_ != 0 && now_ns >= full_since_ns_ + kFullRetryNs) {
      full_since_ns_ = 0;
      max_segments_ =
          budget_segments_;  // the next segment asked for tells whether it is still full
    }
    if (commit_due_ns_ == 0 || now_ns < commit_due_ns_) return;
  }
  sync();
}

uint64_t DiskTier::due_locked() const noexcept {
  const uint64_t retry = full_since_ns_ == 0 ? 0 : full_since_ns_ + kFullRetryNs;
  if (commit_due_ns_ == 0) return retry;
  return retry == 0 ? commit_due_ns_ : std::min(retry, commit_due_ns_);
}

uint64_t DiskTier::due_ns() const {
  std::lock_guard lock(mu_);
  return due_locked();
}

void DiskTier::on_due(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  on_due_ = std::move(fn);
}

void DiskTier::dirty_locked(Segment &s) {
  s.dirty = true;
  if (options_.sync_ns == 0 || commit_due_ns_ != 0) return;
  const bool was_due = due_locked() != 0;
  commit_due_ns_ = monotonic_ns() + options_.sync_ns;
  if (!was_due && on_due_) on_due_();
}

void DiskTier::rebuild(const std::function<void(const Found &)> &found) {
  Recovery rec;
  const auto names = segment_files(rec);
  std::vector<Found> out;
  {
    std::lock_guard lock(mu_);
    for (const auto &[number, name] : names) recover_segment_locked(number, name, rec);
    const std::vector<size_t> order = newest_copies_locked(rec);
    out = admit_locked(order, rec);
    for (const auto &s : segments_) {
      recount_locked(*s);
      maybe_release_locked(*s);
    }
    counters_.files_skipped += rec.skipped;
    counters_.records_dropped += rec.dropped;
  }
  if (rec.inconsistent != 0) {
    log_warn("disk tier: " + std::to_string(rec.inconsistent) + " record(s) in " + options_.dir +
             " name a lossy codec without the lossy mark (a record the library never writes): "
             "dropped as corrupt");
  }
  for (const Found &f : out) found(f);
}

std::vector<std::pair<uint32_t, std::string>> DiskTier::segment_files(Recovery &rec) const {
  // A description of its own (fdopendir takes it, and reads from its own offset).
  const int fd = ::openat(dir_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd < 0 ? nullptr : ::fdopendir(fd);
  if (d == nullptr) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    fail(SWIFTKV_EIO, "cannot read disk_path " + options_.dir + ": " + errno_text(e));
  }
  std::vector<std::pair<uint32_t, std::string>> names;
  while (const dirent *e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == ".." || name == kLockName) continue;
    const std::optional<uint32_t> n = segment_number(name);
    if (!n) {
      ++rec.skipped;  // not ours: left alone
      continue;
    }
    names.emplace_back(*n, name);
  }
  ::closedir(d);
  // The newest segments first, so that a budget smaller than last time keeps the newest data.
  std::sort(names.begin(), names.end(),
            [](const auto &a, const auto &b) { return a.first > b.first; });
  return names;
}

void DiskTier::recover_segment_locked(uint32_t number, const std::string &name, Recovery &rec) {
  next_number_ = std::max(next_number_, number + 1);
  const std::string path = options_.dir + "/" + name;
  // Opened without following links or blocking (a FIFO would), then checked before any read.
  UniqueFd fd(::openat(dir_.get(), name.c_str(), O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    ++rec.skipped;
    return;
  }
  (void)::fcntl(fd.get(), F_SETFL, 0);
  const auto size = static_cast<uint64_t>(st.st_size);
  SegmentHeader sh{};
  bool readable = false;
  try {
    readable = size >= 2 * kHeaderBytes && pread_one(fd.get(), &sh, sizeof sh, 0, path);
  } catch (const Error &) {
    readable = false;
  }
  const bool whole = readable && std::memcmp(sh.magic, kSegMagic, sizeof kSegMagic) == 0 &&
                     sh.header_bytes == sizeof sh && segment_checksum(sh) == sh.checksum;
  const bool ours = whole && sh.format == kFormat && sh.segment_bytes == size;
  const bool fits = segment_bytes_ != 0 && allocated_ + size <= options_.budget_bytes;
  const bool torn_new = !whole && readable && size == segment_bytes_ && fits;
  if (!torn_new && !ours) {
    ++rec.skipped;  // another format, or another size than its header says: left alone
    return;
  }
  if (!torn_new && !fits) {
    // A smaller budget than last time: the oldest segments go.
    (void)::unlinkat(dir_.get(), name.c_str(), 0);
    return;
  }
  auto seg = std::make_unique<Segment>();
  seg->number = number;
  seg->fd = std::move(fd);
  seg->size = size;
  seg->index = segments_.size();
  if (torn_new) {
    // Our name and size, but a header never written whole (made just before a crash): an
    // empty segment to reuse.
    seg->state = SegState::free;
  } else {
    seg->generation = sh.generation;
    seg->state = SegState::sealed;  // recovered segments take no appends
    seg->reusable = size == segment_bytes_;
    scan_records_locked(*seg, path, rec);
  }
  allocated_ += size;
  ++segment_files_;
  segments_.push_back(std::move(seg));
}

void DiskTier::scan_records_locked(Segment &seg, const std::string &path, Recovery &rec) {
  // Walk the record headers; a commit record vouches for every record before it.
  uint64_t off = kHeaderBytes, covered = kHeaderBytes;
  const size_t first = rec.cands.size();
  while (off + kHeaderBytes <= seg.size) {
    RecordHeader h{};
    try {
      if (!pread_one(seg.fd.get(), &h, sizeof h, off, path)) break;
    } catch (const Error &) {
      break;
    }
    if (std::memcmp(h.magic, kRecMagic, sizeof kRecMagic) != 0) break;  // the end of the log
    const uint64_t len = h.type == kCommitRecord ? kHeaderBytes : record_bytes(h.payload_bytes);
    if (!header_ok(h) || h.generation != seg.generation || off + len > seg.size) {
      // A record of an earlier life of the segment, or a torn header: the log ends here.
      if (header_ok(h) && h.generation == seg.generation) ++rec.dropped;
      break;
    }
    if (h.type == kCommitRecord) {
      covered = std::max(covered, std::min(h.covered_to, off));
    } else if (!encoding_consistent(h.encoding)) {
      // A whole header whose encoding the library never writes (a lossy codec without the
      // lossy bit, an unknown codec): corrupt. Only this record is dropped; the log goes on.
      if (h.dead != kDeadMark) {
        ++rec.dropped;
        ++rec.inconsistent;
      }
    } else if (h.dead != kDeadMark) {
      rec.cands.push_back(Candidate{seg.index, off, len, h.sequence, h.written_ns,
                                    ChunkKey{h.key_lo, h.key_hi}, record_meta(h)});
    }
    sequence_ = std::max(sequence_, h.sequence + 1);
    off += len;
  }
  seg.write_at = off;
  seg.kicked_to = off;
  seg.synced_to = covered;
  // Records past the last commit may be torn: their payloads are read and checked.
  for (size_t i = first; i < rec.cands.size();) {
    const Candidate &c = rec.cands[i];
    bool ok = c.off < covered;
    if (!ok) {
      RecordHeader h{};
      rec.payload.resize(c.meta.stored());
      iovec v[2] = {{&h, sizeof h}, {rec.payload.data(), c.meta.stored()}};
      try {
        ok = pread_all(seg.fd.get(), v, 2, c.off, path) &&
             XXH3_64bits(rec.payload.data(), c.meta.stored()) == h.payload_checksum;
      } catch (const Error &) {
        ok = false;
      }
    }
    if (ok) {
      ++i;
    } else {
      ++rec.dropped;
      rec.cands.erase(rec.cands.begin() + static_cast<long>(i));
    }
  }
}

std::vector<size_t> DiskTier::newest_copies_locked(Recovery &rec) {
  const std::vector<Candidate> &cands = rec.cands;
  std::unordered_map<ChunkKey, size_t, ChunkKeyHash> newest;
  std::vector<bool> keep(cands.size(), true);
  for (size_t i = 0; i < cands.size(); ++i) {
    const auto [it, fresh] = newest.emplace(cands[i].key, i);
    if (fresh) continue;
    const bool newer = cands[i].sequence > cands[it->second].sequence;
    keep[newer ? it->second : i] = false;
    if (newer) it->second = i;
    ++rec.dropped;
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (keep[i]) {
      order.push_back(i);
    } else {
      Record dead;
      dead.seg = static_cast<uint32_t>(cands[i].seg);
      dead.off = cands[i].off;
      mark_dead_locked(dead);
    }
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return cands[a].written_ns > cands[b].written_ns; });
  return order;
}

std::vector<DiskTier::Found> DiskTier::admit_locked(const std::vector<size_t> &order,
                                                    Recovery &rec) {
  std::vector<Found> out;
  for (size_t i : order) {
    const Candidate &c = rec.cands[i];
    Segment &s = *segments_[c.seg];
    // Over the capacity (a smaller budget than the segments held): the oldest records go.
    if (live_ + c.len > capacity_bytes({})) {
      Record dead;
      dead.seg = static_cast<uint32_t>(c.seg);
      dead.off = c.off;
      mark_dead_locked(dead);
      ++rec.dropped;
      continue;
    }
    const uint64_t slot = reserve_slot_locked();
    Record &r = records_[slot];
    r.seg = static_cast<uint32_t>(c.seg);
    r.off = c.off;
    r.len = c.len;
    r.key = c.key;
    r.meta = c.meta;
    r.sequence = c.sequence;
    r.written_ns = c.written_ns;
    r.state = RecState::live;
    s.slots.push_back(slot);
    s.live += c.len;
    live_ += c.len;
    out.push_back(Found{slot, c.key, c.meta, c.written_ns});
  }
  // Oldest first: the order the cache's eviction order takes them in at no cost.
  std::reverse(out.begin(), out.end());
  return out;
}

DiskStats DiskTier::stats() const {
  std::lock_guard lock(mu_);
  DiskStats s = counters_;
  s.segments = segment_files_;
  s.allocated_bytes = allocated_;
  s.live_bytes = live_;
  return s;
}

DiskTier::Location DiskTier::location_of(uint64_t slot) const {
  std::lock_guard lock(mu_);
  if (slot >= records_.size() || records_[slot].state == RecState::free) return {};
  const Record &r = records_[slot];
  return Location{path_of(segments_[r.seg]->number), r.off, r.len};
}

}  // namespace swiftkv
