// Host regions: a memfd sized to the region, mapped shared. Commit allocates the file's pages and
// maps them (MADV_POPULATE_WRITE, on several threads for a large range), decommit punches them
// out, so physical memory follows what the region uses. Or private anonymous memory, committed
// and decommitted the same way, for what no other process maps. Or, granular: one memfd per granule
// mapped into a reserved range, committed and passed to other processes granule by granule, the
// host twin of VMM device memory.
#include "core/memory/host_region.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#if defined(SWIFTKV_HAVE_NUMA)
#include <numa.h>
#include <numaif.h>
#endif

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"
#include "core/memory/granule_holds.hpp"
#include "core/memory/host_memory.hpp"
#include "core/memory/large_pages.hpp"
#include "core/memory/region_registry.hpp"

namespace swiftkv {

namespace {

uint64_t page_size() noexcept { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

[[noreturn]] void fail_errno(swiftkv_status status, const std::string &what) {
  const int e = errno;
  fail(status, what + ": " + std::strerror(e));
}

// Memory another process maps is sealed against shrinking and growing (and against new seals):
// a process that could cut a memfd short under another's mapping would kill it with SIGBUS at
// its next touch of the pages past the new end. The memfd of `size` bytes, sealed.
UniqueFd sealed_memfd(const std::string &name, uint64_t size) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) fail_errno(SWIFTKV_ENOMEM, "memfd_create");
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    fail_errno(SWIFTKV_ENOMEM, "ftruncate of a memfd to " + std::to_string(size) + " bytes");
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fail_errno(SWIFTKV_EUNSUPPORTED, "sealing a memfd against shrinking and growing");
  }
  return fd;
}

// The checks of a memfd another process passed, before it is mapped here: a regular file of at
// least `size` bytes, sealed so that nobody can shrink or grow it. Any other fd is the peer's
// fault (EPEER), named as `what`.
void check_passed_memfd(int fd, uint64_t size, const std::string &what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < size) {
    fail(SWIFTKV_EPEER, what + " is not a memfd of at least " + std::to_string(size) + " bytes");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  constexpr int kNeeded = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & kNeeded) != kNeeded) {
    fail(SWIFTKV_EPEER, what + " is not sealed against shrinking and growing (its owner could " +
                            "cut it short under this process's mapping)");
  }
}

// Binds the mapping [p, p + size) to NUMA node `node` (-1: nothing). mbind on a shared mapping
// sets the memfd's own policy, so pages allocated through any mapping of it (an importer's too)
// come from `node`; on private memory, the mapping's.
void bind_to_node(void *p, uint64_t size, int32_t node) {
  if (node < 0) return;
#if defined(SWIFTKV_HAVE_NUMA)
  if (numa_available() < 0) return;
  unsigned long mask = 0;
  if (node >= static_cast<int32_t>(8 * sizeof mask)) {
    fail(SWIFTKV_EUNSUPPORTED, "NUMA node " + std::to_string(node) + " is beyond node 63");
  }
  mask = 1UL << node;
  if (::mbind(p, size, MPOL_BIND, &mask, 8 * sizeof mask, 0) != 0) {
    fail_errno(SWIFTKV_EINVAL, "binding host region memory to NUMA node " + std::to_string(node));
  }
#else
  (void)p;
  (void)size;
#endif
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

// Whether this machine has one NUMA node online, so that the thread that first touches a page
// does not decide where it lives. Read once; a kernel without NUMA has one node.
bool one_numa_node() noexcept {
  static const bool one = [] {
    FILE *f = std::fopen("/sys/devices/system/node/online", "r");
    if (f == nullptr) return true;
    char buf[64] = {};
    const bool read = std::fgets(buf, sizeof buf, f) != nullptr;
    std::fclose(f);
    return !read || std::strcmp(buf, "0\n") == 0 || std::strcmp(buf, "0") == 0;
  }();
  return one;
}

// How many threads make the pages of a range of `bytes`: one per 8 MiB, at most one per core
// and at most 8. The kernel zeroes every page it hands out, about 2 GB/s a thread.
unsigned populate_threads(uint64_t bytes) noexcept {
  constexpr uint64_t kPerThread = uint64_t{8} << 20;
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(
      std::max<uint64_t>(1, std::min({bytes / kPerThread, cores, uint64_t{8}})));
}

// Makes and maps the pages of [at, at + bytes) (MADV_POPULATE_WRITE), in pieces on several
// threads for a large range. 0, EINVAL where the kernel lacks MADV_POPULATE_WRITE (nothing
// done), or the error.
int populate_range(std::byte *at, uint64_t bytes, int32_t numa_node) {
  const uint64_t page = page_size();
  // Threads place pages where they run unless a binding or a single node decides.
  const bool parallel = numa_node >= 0 || one_numa_node();
  const unsigned n = parallel ? populate_threads(bytes) : 1;
  const uint64_t piece = ceil_div(ceil_div(bytes, n), page) * page;
  std::vector<int> errors(n, 0);
  auto populate = [&](unsigned i) {
    const uint64_t from = i * piece;
    if (from >= bytes) return;
    const uint64_t len = std::min(piece, bytes - from);
    if (::madvise(at + from, len, MADV_POPULATE_WRITE) != 0) errors[i] = errno;
  };
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < n; ++i) {
    try {
      threads.emplace_back(populate, i);
    } catch (const std::system_error &) {
      populate(i);  // no thread to be had: this one does the piece
    }
  }
  populate(0);
  for (std::thread &t : threads) t.join();
  int error = 0;
  for (int e : errors) error = e != 0 && e != EINVAL ? e : error;
  if (error != 0) return error;
  return std::any_of(errors.begin(), errors.end(), [](int e) { return e == EINVAL; }) ? EINVAL : 0;
}

[[noreturn]] void fail_populate(uint64_t bytes, int error) {
  fail(SWIFTKV_ENOMEM,
       "allocating " + std::to_string(bytes) + " bytes of host memory: " + std::strerror(error));
}

// populate_memfd for private anonymous memory: a kernel without MADV_POPULATE_WRITE gets each
// page written (a fresh page reads as zeros, so a zero keeps it as it is).
void populate_private(std::byte *at, uint64_t bytes, int32_t numa_node) {
  int error = populate_range(at, bytes, numa_node);
  if (error == EINVAL) {
    const uint64_t page = page_size();
    for (uint64_t o = 0; o < bytes; o += page) {
      *static_cast<volatile std::byte *>(at + o) = std::byte{0};
    }
    error = 0;
  }
  if (error == 0) return;
  (void)::madvise(at, bytes, MADV_DONTNEED);  // what was made goes back: the range stays empty
  fail_populate(bytes, error);
}

}  // namespace

void populate_memfd(int fd, uint64_t file_offset, std::byte *at, uint64_t bytes,
                    int32_t numa_node) {
  int error = populate_range(at, bytes, numa_node);
  if (error == EINVAL) {
    error = ::fallocate(fd, 0, static_cast<off_t>(file_offset), static_cast<off_t>(bytes)) != 0
                ? errno
                : 0;
  }
  if (error == 0) return;
  // What was allocated before the failure goes back, so the range stays uncommitted.
  (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(file_offset),
                    static_cast<off_t>(bytes));
  fail_populate(bytes, error);
}

namespace {

// The mapping of a memfd's whole file, shared. Both owners and importers hold one.
class MemfdMapping {
 public:
  MemfdMapping(int fd, uint64_t size, bool huge_pages = false) : size_(size) {
    void *p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
      fail_errno(SWIFTKV_ENOMEM, "mmap of a " + std::to_string(size) + "-byte memfd region");
    // Advice only, before any page is made: where shared memory has no huge pages it is 4 KiB.
    if (huge_pages) (void)::madvise(p, size, MADV_HUGEPAGE);
    data_ = static_cast<std::byte *>(p);
  }
  MemfdMapping(const MemfdMapping &) = delete;
  MemfdMapping &operator=(const MemfdMapping &) = delete;
  ~MemfdMapping() { ::munmap(data_, size_); }

  std::byte *data() const noexcept { return data_; }
  uint64_t size() const noexcept { return size_; }

 private:
  std::byte *data_ = nullptr;
  uint64_t size_;
};

// Private anonymous memory of `size` bytes (whole pages) that a fork's child does not inherit.
// Asked for huge pages, from 2 MiB on it starts on a 2 MiB boundary (allocate_large), so that
// all of it can be whole huge pages.
class PrivateMapping {
 public:
  PrivateMapping(uint64_t size, bool huge_pages)
      : size_(size), large_(huge_pages && size >= kLargePageBytes) {
    void *p = nullptr;
    if (large_) {
      try {
        p = allocate_large(size);
      } catch (const std::bad_alloc &) {
        p = MAP_FAILED;
      }
    } else {
      p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    }
    if (p == MAP_FAILED) {
      fail(SWIFTKV_ENOMEM, "mapping " + std::to_string(size) + " bytes of private host memory");
    }
    data_ = static_cast<std::byte *>(p);
    // The child of a fork can make no call on the parent's context (ESTATE): without the pages
    // it costs the fork nothing, and the parent's writes while the child lives copy no page.
    (void)::madvise(p, size, MADV_DONTFORK);
  }
  PrivateMapping(const PrivateMapping &) = delete;
  PrivateMapping &operator=(const PrivateMapping &) = delete;
  ~PrivateMapping() {
    if (large_) {
      free_large(data_, size_);
    } else {
      ::munmap(data_, size_);
    }
  }

  std::byte *data() const noexcept { return data_; }

 private:
  std::byte *data_ = nullptr;
  uint64_t size_;
  bool large_;
};

// The owner of a region in one piece: a memfd mapped shared, or private memory (o.shared false).
// Locking: commit/decommit/export take mu_; data() and size() are immutable.
// A page-locked region is never decommitted: the GPU's DMA mapping holds the physical pages,
// and punching them out would leave the GPU and the CPU on different pages.
class HostRegion final : public MemoryRegion {
 public:
  explicit HostRegion(const HostRegionOptions &o) {
    if (o.size == 0) fail_invalid("host region size is 0");
    const uint64_t page = page_size();
    size_ = checked_mul(ceil_div(o.size, page), page, "host region size");
    if (o.shared) {
      fd_ = sealed_memfd(o.name, size_);
      map_ = std::make_unique<MemfdMapping>(fd_.get(), size_, o.huge_pages);
      data_ = map_->data();
      identity_ = memfd_identity(fd_.get());
    } else {
      // No identity: nobody registers or opens a private region.
      private_ = std::make_unique<PrivateMapping>(size_, o.huge_pages);
      data_ = private_->data();
    }
    bind_to_node(data_, size_, o.numa_node);
    numa_node_ = o.numa_node;
    committed_.assign(size_ / page, 0);
    if (o.page_lock) {
      commit(0, size_);  // cudaHostRegister faults every page in anyway; account for it
      locked_ = page_lock(data_, size_);
    }
  }

  ~HostRegion() override {
    if (locked_) page_unlock(data_);
  }

  const std::string &identity() const noexcept { return identity_; }

  std::byte *data() const noexcept override { return data_; }
  uint64_t size() const noexcept override { return size_; }
  MemoryKind kind() const noexcept override {
    return private_ ? MemoryKind::host_private : MemoryKind::host_memfd;
  }
  int32_t device() const noexcept override { return -1; }
  void adopt(const RegionExport &) override {}

  uint64_t commit_granule() const noexcept override { return locked_ ? 0 : page_size(); }

  void commit(uint64_t offset, uint64_t size) override {
    std::lock_guard lock(mu_);
    for_each_run(offset, size, 0, [&](uint64_t first, uint64_t n) {
      const uint64_t page = page_size();
      if (private_) {
        populate_private(data_ + first * page, n * page, numa_node_);
      } else {
        populate_memfd(fd_.get(), first * page, data_ + first * page, n * page, numa_node_);
      }
      mark(first, n, 1);
    });
  }

  void decommit(uint64_t offset, uint64_t size) noexcept override {
    if (locked_) return;
    std::lock_guard lock(mu_);
    for_each_run(offset, size, 1, [&](uint64_t first, uint64_t n) {
      const uint64_t page = page_size();
      // A failed punch only keeps memory that is no longer needed; the region stays correct.
      const bool gone =
          private_
              ? ::madvise(data_ + first * page, n * page, MADV_DONTNEED) == 0
              : ::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                            static_cast<off_t>(first * page), static_cast<off_t>(n * page)) == 0;
      if (gone) mark(first, n, 0);
    });
  }

  uint64_t committed_bytes() const noexcept override {
    std::lock_guard lock(mu_);
    return committed_pages_ * page_size();
  }

  RegionExport export_range(uint64_t, uint64_t) const override {
    if (private_) fail_invalid("a private host region is never exported: only its process maps it");
    RegionExport e;
    e.kind = MemoryKind::host_memfd;
    e.device = -1;
    e.size = size();
    e.identity = identity_;
    ExportedPiece piece;
    piece.offset = 0;
    piece.size = size();
    piece.fd.reset(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
    if (!piece.fd) fail_errno(SWIFTKV_ENOMEM, "duplicating the region's memfd");
    e.pieces.push_back(std::move(piece));
    return e;
  }

 private:
  // Calls fn(first_page, n_pages) for each maximal run of pages in the range whose committed
  // flag equals `want`. The range must be page-aligned or end at the region's end.
  template <class Fn>
  void for_each_run(uint64_t offset, uint64_t size, uint8_t want, Fn fn) {
    const uint64_t page = page_size();
    if (offset % page != 0 || offset > size_ || size > size_ - offset) {
      fail(SWIFTKV_EINTERNAL, "host region range [" + std::to_string(offset) + ", +" +
                                  std::to_string(size) + ") is not page-aligned or inside");
    }
    const uint64_t first = offset / page;
    const uint64_t end = ceil_div(offset + size, page);
    uint64_t p = first;
    while (p < end) {
      while (p < end && committed_[p] != want) ++p;
      const uint64_t run = p;
      while (p < end && committed_[p] == want) ++p;
      if (p > run) fn(run, p - run);
    }
  }

  void mark(uint64_t first, uint64_t n, uint8_t v) {
    for (uint64_t i = first; i < first + n; ++i) committed_[i] = v;
    committed_pages_ = v ? committed_pages_ + n : committed_pages_ - n;
  }

  UniqueFd fd_;  // shared: the memfd and its mapping
  std::unique_ptr<MemfdMapping> map_;
  std::unique_ptr<PrivateMapping> private_;  // or private memory
  std::byte *data_ = nullptr;
  uint64_t size_ = 0;
  std::string identity_;
  bool locked_ = false;
  int32_t numa_node_ = -1;
  mutable std::mutex mu_;
  std::vector<uint8_t> committed_;  // one flag per page; guarded by mu_
  uint64_t committed_pages_ = 0;    // guarded by mu_
};

// An importer's view of another region's memfd.
class ImportedHostRegion final : public RegionMapping {
 public:
  ImportedHostRegion(int fd, uint64_t size) : map_(fd, size) {}
  std::byte *data() const noexcept override { return map_.data(); }
  uint64_t size() const noexcept override { return map_.size(); }
  MemoryKind kind() const noexcept override { return MemoryKind::host_memfd; }
  int32_t device() const noexcept override { return -1; }
  void adopt(const RegionExport &) override {}  // the whole file is mapped already

 private:
  MemfdMapping map_;
};

// An address range reserved with no access and no memory behind it; granules are mapped into it
// in place (MAP_FIXED) and unmapped by mapping the reservation back over them.
class Reservation {
 public:
  explicit Reservation(uint64_t size) : size_(size) {
    void *p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      fail_errno(SWIFTKV_ENOMEM, "reserving " + std::to_string(size) + " bytes of address space");
    }
    base_ = static_cast<std::byte *>(p);
  }
  Reservation(const Reservation &) = delete;
  Reservation &operator=(const Reservation &) = delete;
  ~Reservation() { ::munmap(base_, size_); }

  std::byte *data() const noexcept { return base_; }
  uint64_t size() const noexcept { return size_; }

  // Maps `fd`'s first n bytes shared at `offset`, replacing whatever was mapped there.
  void map(uint64_t offset, uint64_t n, int fd) {
    void *p = ::mmap(base_ + offset, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
      fail_errno(SWIFTKV_ENOMEM, "mapping a granule of " + std::to_string(n) + " bytes");
    }
  }
  // Puts the reservation back over [offset, offset + n): the granule's memory is no longer
  // reachable here, and goes once nobody else maps it.
  void unmap(uint64_t offset, uint64_t n) noexcept {
    (void)::mmap(base_ + offset, n, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  }

 private:
  std::byte *base_ = nullptr;
  uint64_t size_;
};

// The owner of a granular region: each committed granule is a memfd of its own, mapped at its
// place in the range. Locking: mu_ guards fds_, generations_, locked_ and the counts; the range
// itself is immutable, so data() needs no lock.
class GranularHostRegion final : public MemoryRegion {
 public:
  explicit GranularHostRegion(const HostRegionOptions &o)
      : granule_(o.granule),
        range_(checked_mul(ceil_div(o.size, o.granule), o.granule, "host region size")),
        numa_node_(o.numa_node),
        page_lock_(o.page_lock),
        name_(o.name),
        fds_(range_.size() / granule_),
        generations_(fds_.size(), 0),
        locked_(fds_.size(), 0),
        identity_(random_region_identity("host_granules")) {}

  ~GranularHostRegion() override {
    for (uint64_t i = 0; i < fds_.size(); ++i) {
      if (locked_[i]) page_unlock(range_.data() + i * granule_);
    }
  }

  const std::string &identity() const noexcept { return identity_; }
  std::byte *data() const noexcept override { return range_.data(); }
  uint64_t size() const noexcept override { return range_.size(); }
  MemoryKind kind() const noexcept override { return MemoryKind::host_granules; }
  int32_t device() const noexcept override { return -1; }
  void adopt(const RegionExport &) override {}
  uint64_t commit_granule() const noexcept override { return granule_; }

  void commit(uint64_t offset, uint64_t size) override {
    std::lock_guard lock(mu_);
    const auto [first, end] = granules(offset, size);
    for (uint64_t i = first; i < end; ++i) {
      if (fds_[i]) continue;
      UniqueFd fd = sealed_memfd(name_, granule_);
      const uint64_t at = i * granule_;
      range_.map(at, granule_, fd.get());
      try {
        bind_to_node(range_.data() + at, granule_, numa_node_);
        // Allocated now, under the binding: running out of memory is an error here, not a
        // SIGBUS on first touch.
        if (::fallocate(fd.get(), 0, 0, static_cast<off_t>(granule_)) != 0) {
          fail_errno(SWIFTKV_ENOMEM, "allocating a " + std::to_string(granule_) +
                                         "-byte granule of host region memory");
        }
        locked_[i] = page_lock_ && page_lock(range_.data() + at, granule_);
      } catch (...) {
        range_.unmap(at, granule_);
        throw;
      }
      fds_[i] = std::move(fd);
      generations_[i] = ++next_generation_;
      committed_ += granule_;
    }
  }

  void decommit(uint64_t offset, uint64_t size) noexcept override {
    std::lock_guard lock(mu_);
    const auto [first, end] = granules(offset, size);
    for (uint64_t i = first; i < end; ++i) {
      if (!fds_[i]) continue;
      if (locked_[i]) page_unlock(range_.data() + i * granule_);
      locked_[i] = 0;
      range_.unmap(i * granule_, granule_);
      fds_[i].reset();  // the memory lives on in importers that still map it
      committed_ -= granule_;
    }
  }

  uint64_t committed_bytes() const noexcept override {
    std::lock_guard lock(mu_);
    return committed_;
  }

  RegionExport export_range(uint64_t offset, uint64_t size) const override {
    std::lock_guard lock(mu_);
    RegionExport e;
    e.kind = MemoryKind::host_granules;
    e.device = -1;
    e.size = range_.size();
    e.identity = identity_;
    const auto [first, end] = granules(offset, size);
    for (uint64_t i = first; i < end; ++i) {
      if (!fds_[i]) continue;
      ExportedPiece p;
      p.offset = i * granule_;
      p.size = granule_;
      p.generation = generations_[i];
      p.fd.reset(::fcntl(fds_[i].get(), F_DUPFD_CLOEXEC, 0));
      if (!p.fd) fail_errno(SWIFTKV_ENOMEM, "duplicating a granule's memfd");
      e.pieces.push_back(std::move(p));
    }
    return e;
  }

 private:
  // The granules [first, end) that [offset, offset + size) touches, clipped to the region.
  std::pair<uint64_t, uint64_t> granules(uint64_t offset, uint64_t size) const {
    if (offset > range_.size() || size > range_.size() - offset) {
      fail(SWIFTKV_EINTERNAL, "host region range [" + std::to_string(offset) + ", +" +
                                  std::to_string(size) + ") is not inside");
    }
    return {offset / granule_, ceil_div(offset + size, granule_)};
  }

  const uint64_t granule_;
  Reservation range_;
  const int32_t numa_node_;
  const bool page_lock_;
  const std::string name_;
  mutable std::mutex mu_;
  std::vector<UniqueFd> fds_;          // guarded by mu_: one per committed granule
  std::vector<uint64_t> generations_;  // guarded by mu_
  std::vector<uint8_t> locked_;        // guarded by mu_: page-locked granules
  uint64_t committed_ = 0;             // guarded by mu_
  uint64_t next_generation_ = 0;       // guarded by mu_
  const std::string identity_;
};

// An importer's view of a granular region: the granules it was given, mapped at their places in
// a range of its own, each unmapped once no lease holds it. mu_ guards the table and the holds.
class ImportedGranularHostRegion final : public RegionMapping {
 public:
  explicit ImportedGranularHostRegion(const RegionExport &e) : range_(checked_size(e)) {
    granule_ = e.pieces.front().size;
    generations_.assign(range_.size() / granule_, 0);
    holds_ = GranuleHolds(range_.size(), granule_);
    adopt(e);
  }

  std::byte *data() const noexcept override { return range_.data(); }
  uint64_t size() const noexcept override { return range_.size(); }
  MemoryKind kind() const noexcept override { return MemoryKind::host_granules; }
  int32_t device() const noexcept override { return -1; }

  void adopt(const RegionExport &e) override {
    std::lock_guard lock(mu_);
    for (const ExportedPiece &p : e.pieces) {
      if (p.size != granule_ || p.offset % granule_ != 0 || p.offset >= range_.size() || !p.fd ||
          p.generation == 0) {
        fail_invalid("a host granule export piece at offset " + std::to_string(p.offset) +
                     " does not match the region's granules");
      }
      check_passed_memfd(p.fd.get(), granule_,
                         "the fd passed for the granule at offset " + std::to_string(p.offset));
      uint64_t &g = generations_[p.offset / granule_];
      if (g == p.generation) continue;
      range_.map(p.offset, granule_, p.fd.get());  // replaces an older generation in place
      g = p.generation;
    }
  }

  void hold(uint64_t offset, uint64_t size) override {
    std::lock_guard lock(mu_);
    holds_.hold(offset, size, [&](uint64_t i) { return generations_[i] != 0; });
  }

  void drop(uint64_t offset, uint64_t size) noexcept override {
    std::lock_guard lock(mu_);
    holds_.drop(offset, size, [&](uint64_t i) {
      range_.unmap(i * granule_, granule_);
      generations_[i] = 0;
    });
  }

 private:
  static uint64_t checked_size(const RegionExport &e) {
    if (e.pieces.empty()) fail_invalid("a host granule export carries no pieces");
    const uint64_t g = e.pieces.front().size;
    if (g == 0 || g % page_size() != 0 || e.size == 0 || e.size % g != 0) {
      fail_invalid("a host granule export's pieces do not tile its size");
    }
    return e.size;
  }

  Reservation range_;
  uint64_t granule_ = 0;
  std::mutex mu_;
  std::vector<uint64_t> generations_;  // guarded by mu_: 0 where nothing is mapped
  GranuleHolds holds_;                 // guarded by mu_
};
}  // namespace

std::string memfd_identity(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(SWIFTKV_EINVAL, "fstat of an exported region's fd");
  return "memfd:" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

std::shared_ptr<MemoryRegion> create_host_region(const HostRegionOptions &o) {
  if (!o.shared) {
    if (o.granule != 0) fail_invalid("a private host region has no granules (it is never shared)");
    return std::make_shared<HostRegion>(o);  // nobody opens it: not in the registry
  }
  if (o.granule == 0) {
    auto r = std::make_shared<HostRegion>(o);
    register_region(r->identity(), r);
    return r;
  }
  if (o.size == 0) fail_invalid("host region size is 0");
  if (o.granule % page_size() != 0) {
    fail_invalid("a host granule of " + std::to_string(o.granule) +
                 " bytes is not a multiple of the page size (" + std::to_string(page_size()) + ")");
  }
  auto r = std::make_shared<GranularHostRegion>(o);
  register_region(r->identity(), r);
  return r;
}

std::shared_ptr<RegionMapping> open_host_region(const RegionExport &e) {
  if (e.kind == MemoryKind::host_granules) {
    std::shared_ptr<RegionMapping> m = find_or_open_region(
        e.identity, [&] { return std::make_shared<ImportedGranularHostRegion>(e); });
    if (m->kind() != MemoryKind::host_granules || m->size() != e.size) {
      fail_invalid("the export names a region open here as another kind or size");
    }
    m->adopt(e);  // a mapping opened before gets this export's granules too
    return m;
  }
  if (e.pieces.size() != 1 || !e.pieces[0].fd) {
    fail_invalid("a host region export must carry exactly one open memfd");
  }
  const int fd = e.pieces[0].fd.get();
  if (e.size == 0) fail_invalid("a host region export of 0 bytes");
  check_passed_memfd(fd, e.size, "the fd passed for the region");
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail_errno(SWIFTKV_EPEER, "fstat of the fd passed for the region");
  return find_or_open_region(memfd_identity(fd), [&] {
    return std::make_shared<ImportedHostRegion>(fd, static_cast<uint64_t>(st.st_size));
  });
}

int32_t numa_node_of(const void *p) noexcept {
#if defined(SWIFTKV_HAVE_NUMA)
  int node = -1;
  if (::get_mempolicy(&node, nullptr, 0, const_cast<void *>(p), MPOL_F_NODE | MPOL_F_ADDR) == 0) {
    return node;
  }
#else
  (void)p;
#endif
  return -1;
}

}  // namespace swiftkv
