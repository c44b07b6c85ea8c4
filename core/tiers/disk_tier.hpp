// The disk tier: a log of chunk records in preallocated segment files under a directory and a
// byte budget, an in-memory index from slot to record, group commit instead of a sync per
// chunk, recovery by walking record headers, and cleaning of segments whose live data fell low.
// docs/disk-format.md describes the files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/common/defaults.hpp"
#include "core/common/log.hpp"
#include "core/common/unique_fd.hpp"
#include "core/tiers/tier_store.hpp"

namespace swiftkv {

struct DiskOptions {
  std::string dir;
  uint64_t budget_bytes = 0;
  // Bytes of one segment file, rounded down to kAlign; 0: kDefaultSegmentBytes, at most a
  // quarter of the budget. A given size is capped at half the budget: one segment stays free
  // for cleaning.
  uint64_t segment_bytes = 0;
  // Group commit: written records are made durable (fdatasync, then a commit record) at most
  // this long after they are written, by maintain(); 0: only when a segment fills and at close.
  uint64_t sync_ns = defaults::ns_of_ms(defaults::kCtx.disk_sync_ms);
};

struct DiskStats {
  uint64_t segment_bytes = 0;    // bytes of one segment
  uint64_t segments = 0;         // segment files held
  uint64_t allocated_bytes = 0;  // their bytes on disk: what the budget counts
  uint64_t live_bytes = 0;       // bytes of live records
  uint64_t files_skipped = 0;    // directory entries left alone: not ours, not regular, unreadable,
                                 // of another size or a newer format
  uint64_t records_dropped = 0;  // records dropped at recovery: torn, failing a check, duplicate,
                                 // or over the budget
  uint64_t records_mismatched = 0;  // reads that found another record than the index expected
  uint64_t segments_cleaned = 0;    // segments whose live records moved so they could be reused
  uint64_t bytes_relocated = 0;     // record bytes those moves copied
  uint64_t syncs = 0;               // group commits
  uint64_t full_refusals = 0;       // segments the filesystem could not give (a full disk): each
                                    // shrinks the tier to the segments it has
};

// Thread-safe: mu_ guards the segment and record tables and every segment's append point,
// counts and state; record bytes are written and read without it by whoever holds the slot
// (a reader pins its segment so that it is not reused under it). Cleaning copies records outside
// the lock and switches them under it.
class DiskTier final : public TierStore {
 public:
  static constexpr uint64_t kDefaultSegmentBytes = uint64_t{1} << 30;
  static constexpr uint32_t kFormat = 2;
  static constexpr uint64_t kHeaderBytes = 128;  // of a segment and of a record
  static constexpr uint64_t kAlign = 64;         // records start at multiples of this

  // A chunk found in the directory by rebuild().
  struct Found {
    uint64_t slot;
    ChunkKey key;
    ChunkMeta meta;
    uint64_t written_ns;  // when it was stored, on CLOCK_REALTIME
  };

  // Checks that `dir` is a directory this process can write (Error EIO otherwise).
  explicit DiskTier(DiskOptions options);
  // Makes everything written durable.
  ~DiskTier() override;
  DiskTier(const DiskTier &) = delete;
  DiskTier &operator=(const DiskTier &) = delete;

  // Recovery, once before any other use: walks every segment file's record headers, keeps each
  // complete record (the payload checked too where no commit record vouches for it), drops a
  // torn tail and what fails a check, and hands the live records to `found`, oldest first, the
  // newest copy of a key only. Nothing in the directory makes it fail or hang: what is not a
  // segment of this format and size is skipped, opened without blocking and checked by fstat
  // before any read.
  void rebuild(const std::function<void(const Found &)> &found);

  Tier tier() const noexcept override { return Tier::disk; }
  std::optional<uint64_t> allocate(const ChunkKey &key, const ChunkMeta &meta) override;
  void free(uint64_t slot) noexcept override;
  std::byte *address(uint64_t, int32_t *) noexcept override { return nullptr; }
  // Appends the record (one pwritev into the space allocate() reserved). Error(EIO).
  void write(uint64_t slot, const ChunkKey &key, const ChunkMeta &meta,
             const std::byte *src) override;
  // Reads the record and checks it is the one the index expects (key, model, position, sizes,
  // segment generation) and its checksum; Error(EIO) otherwise (a record that is not the chunk
  // is counted as mismatched).
  void read(uint64_t slot, const ChunkMeta &meta, std::byte *dst) override;
  // Up to kReadStreams records read at once (the caller and helper threads taking the next
  // record in turn), so the disk has several requests in flight; a batch of one record, or of
  // less than kParallelReadBytes in all, is read on the caller's thread.
  void read_many(std::span<const SlotRead> reads, std::span<uint8_t> ok) override;
  static constexpr unsigned kReadStreams = 4;
  static constexpr uint64_t kParallelReadBytes = uint64_t{8} << 20;
  // Room for records: the budget less the segment kept free for cleaning.
  uint64_t capacity_bytes(const ChunkKey &) const override;
  // What allocate() can provide now, cleaning included.
  uint64_t free_bytes(const ChunkKey &) const override;

  // Group commit when it is due, and the retry for more segments after the filesystem refused
  // one (now_ns on CLOCK_MONOTONIC); sync() at once.
  void maintain(uint64_t now_ns);
  // When maintain() next has work, on CLOCK_MONOTONIC: the group commit of the records written
  // since the last one (sync_ns after the first of them), or the retry after a refusal, the
  // earlier; 0 when neither is pending, and nothing comes due until a record is written or a
  // segment is refused.
  uint64_t due_ns() const;
  // Called when due_ns() goes from 0 to a time (the first record written after a group commit,
  // a refusal), so that an owner whose thread sleeps with nothing due knows to wait for it.
  // Called under the tier's lock: it may take no lock that is held while calling the tier.
  void on_due(std::function<void()> fn);
  void sync();
  DiskStats stats() const;
  uint64_t segment_bytes() const noexcept { return segment_bytes_; }

  // The bytes a record of `payload` bytes takes in a segment.
  static uint64_t record_bytes(uint64_t payload) noexcept;
  // How many records of `payload` bytes the tier holds when full (whole records per segment).
  uint64_t records_that_fit(uint64_t payload) const noexcept;
  // A budget whose segments hold exactly `records` records of `payload` bytes, one record per
  // segment (segment_bytes = segment_for(payload)); for tests and sizing.
  static uint64_t segment_for(uint64_t payload) noexcept;
  static uint64_t budget_for(uint64_t records, uint64_t payload) noexcept;

  // Where a slot's record is (tests corrupt it on purpose): the file, the record's offset and
  // its length; an empty path when the slot holds no record.
  struct Location {
    std::string path;
    uint64_t offset = 0, length = 0;
  };
  Location location_of(uint64_t slot) const;

 private:
  enum class SegState : uint8_t { free, open, sealed, draining, gone };
  struct Segment {
    uint32_t number = 0;  // its file: seg-<number as 8 hex digits>.kvlog
    UniqueFd fd;
    uint64_t size = 0;
    uint64_t generation = 0;
    SegState state = SegState::free;
    bool reusable = true;   // false for a segment recovered with another size: deleted when empty
    bool cleaning = false;  // its live records are being copied out
    uint64_t write_at = kHeaderBytes;  // the next append
    uint64_t live = 0;                 // bytes of records reserved or live
    uint32_t readers = 0;
    std::set<uint64_t> pending;   // offsets of reservations not yet written
    uint64_t synced_to = 0;       // records below are durable
    bool dirty = false;           // written since the last sync
    uint64_t kicked_to = 0;       // writeback was started for the bytes below
    uint64_t unkicked = 0;        // record bytes written since the last start of writeback
    std::vector<uint64_t> slots;  // slots placed here (some since freed or moved)
    uint64_t index = 0;           // in segments_
    bool counted_free = false;    // in free_segments_
    bool counted_clean = false;   // in cleanable_, with the live bytes below
    uint64_t counted_live = 0;
  };
  enum class RecState : uint8_t { free, reserved, live };
  struct Record {
    uint32_t seg = 0;
    uint64_t off = 0, len = 0;
    ChunkKey key;
    ChunkMeta meta;
    uint64_t sequence = 0, written_ns = 0;
    RecState state = RecState::free;
  };

  // After a record is written: asks the kernel to start writing back the segment's appends
  // once kKickBytes have gathered since the last time.
  void start_writeback(uint64_t slot);
  std::string path_of(uint32_t number) const;   // for messages: the path as given
  static std::string name_of(uint32_t number);  // the segment's name in dir_
  // A segment ready to append r bytes, making one (a new file) or cleaning one if needed;
  // nullptr when neither can. Call with mu_ held; may release it while cleaning.
  Segment *room_locked(std::unique_lock<std::mutex> &lock, uint64_t r);
  Segment *new_segment_locked();
  void open_segment_locked(Segment &s);
  void seal_locked(Segment &s);
  // Keeps free_segments_ and cleanable_ true to a segment's state; call after every change to
  // it. A segment is cleanable when sealed, reusable, not being cleaned, with nothing pending
  // and at most an eighth of it live.
  void recount_locked(Segment &s);
  void clean_locked(std::unique_lock<std::mutex> &lock, Segment &s);
  // clean_locked()'s stages: the live records of c get places in d (the open segment); each is
  // copied with the lock released (false: it fails its checks and stays); then the index
  // follows the copies that are still wanted and the rest are marked dead.
  struct Relocation {
    uint64_t slot, from, to, len;
    bool ok = false;
  };
  std::vector<Relocation> plan_moves_locked(Segment &c, Segment &d);
  static bool copy_record(int src, uint64_t src_gen, const std::string &src_path, int dst,
                          uint64_t dst_gen, const std::string &dst_path, const Relocation &m,
                          std::vector<std::byte> &buf);
  void settle_moves_locked(Segment &c, Segment &d, const std::vector<Relocation> &moves);
  // A segment with no live record goes back to free (or is deleted when not reusable).
  void maybe_release_locked(Segment &s);
  uint64_t reserve_slot_locked();
  void append_commit_locked(Segment &s, uint64_t covered);
  void mark_dead_locked(const Record &r) noexcept;
  // Reads the rest of a payload whose first `first` bytes are at dst, piece by piece, each
  // checksummed while the next is read; returns the payload's XXH3-64.
  static uint64_t checked_read_rest(int fd, uint64_t payload_at, uint64_t bytes, uint64_t first,
                                    std::byte *dst, const std::string &path);
  uint64_t free_bytes_locked() const;

  // rebuild()'s stages. A record found in a segment, before the newest copy of each key is
  // chosen and the capacity applied.
  struct Candidate {
    uint64_t seg, off, len, sequence, written_ns;
    ChunkKey key;
    ChunkMeta meta;
  };
  struct Recovery {
    std::vector<Candidate> cands;
    uint64_t skipped = 0;            // files left alone
    uint64_t dropped = 0;            // records not kept
    uint64_t inconsistent = 0;       // of those, records whose encoding contradicts itself
    std::vector<std::byte> payload;  // scratch for checking uncommitted records
  };
  // The directory's segment files, newest first; other entries are counted as skipped.
  std::vector<std::pair<uint32_t, std::string>> segment_files(Recovery &rec) const;
  // Opens one file and, when it is a segment of ours within the budget, adds it with its
  // records; anything else is skipped (left alone) or, over the budget, deleted.
  void recover_segment_locked(uint32_t number, const std::string &name, Recovery &rec);
  // Walks a recovered segment's record headers to the end of its log, then checks the payload
  // of every record past its last commit record.
  void scan_records_locked(Segment &seg, const std::string &path, Recovery &rec);
  // The candidates kept (the newest copy of each key), newest first; the others marked dead.
  std::vector<size_t> newest_copies_locked(Recovery &rec);
  // Gives the kept candidates slots while the capacity lasts, oldest first in the result.
  std::vector<Found> admit_locked(const std::vector<size_t> &order, Recovery &rec);

  const DiskOptions options_;
  // The directory, opened once: every segment is made, opened and removed relative to it, so
  // a disk_path renamed, or a link swapped to another directory, does not move the tier. Its
  // flock makes one tier at a time its owner (the kernel lets go when the owner dies).
  UniqueFd dir_;
  // kLockName in it: the owner's pid, for the message that refuses another; flock'ed too, as
  // earlier versions of the library lock it.
  UniqueFd lock_;
  uint64_t segment_bytes_ = 0;
  uint64_t max_segments_ = 0;     // budget / segment_bytes_, or fewer while the disk is full
  uint64_t budget_segments_ = 0;  // budget / segment_bytes_
  // While the filesystem refuses new segments: the tier makes do with the ones it has, and asks
  // for more again only after kFullRetryNs (its warning at most once per 10 s).
  static constexpr uint64_t kFullRetryNs = 30'000'000'000ull;
  uint64_t full_since_ns_ = 0;  // 0: not full
  LogLimiter full_log_;
  // Writes a dead record over a reserved room that is given up unwritten.
  void write_filler_locked(const Segment &s, const Record &r) noexcept;
  // The filesystem refused a segment: the budget shrinks to the segments held.
  void disk_full_locked(const std::string &what);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Segment>> segments_;  // by index; a segment keeps its index
  std::vector<Record> records_;                     // by slot
  std::vector<uint64_t> free_slots_;
  Segment *open_ = nullptr;
  uint64_t allocated_ = 0;  // bytes of segment files
  uint64_t live_ = 0;
  uint64_t segment_files_ = 0;                         // files of segments_ (not gone)
  uint64_t free_segments_ = 0;                         // reusable free segments
  std::set<std::pair<uint64_t, uint64_t>> cleanable_;  // (live, index), least live first
  uint64_t cleanable_gain_ = 0;  // the bytes cleaning them all would give back
  uint32_t next_number_ = 0;
  uint64_t sequence_ = 1;
  // sync_ns after the first record written since the last group commit; 0: nothing to commit.
  uint64_t commit_due_ns_ = 0;
  std::function<void()> on_due_;
  uint64_t due_locked() const noexcept;
  // Marks a segment written since the last sync, and starts the group commit's clock.
  void dirty_locked(Segment &s);
  DiskStats counters_;
};

}  // namespace swiftkv
