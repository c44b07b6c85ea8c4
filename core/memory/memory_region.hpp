// The memory the backends hand out: one contiguous virtual range in this process, committed to
// physical memory in granules, and an export another process can open. The host backend
// (memfd) and the CUDA backend (VMM or cudaMalloc) implement it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/common/unique_fd.hpp"

namespace swiftkv {

// The numbers are those of the public swiftkv_memory_kind, but for host_private: the library's
// own, a region no other process maps, never exported, so its number never leaves the process.
enum class MemoryKind : int32_t {
  host_memfd = 0,  // host pages of a memfd; shared by passing the fd
  cuda_vmm = 1,    // device memory through cuMemCreate/cuMemMap; shared by one POSIX fd per granule
  cuda_ipc = 2,    // one cudaMalloc; shared by a cudaIpcMemHandle; never released before the end
  host_granules = 3,   // host pages in granules of one memfd each; shared by one fd per granule
  host_private = 256,  // private anonymous host pages (a host tier's slabs); never shared
};

const char *memory_kind_name(MemoryKind kind) noexcept;

// Whether a region of this kind passes its memory with each lease, granule by granule (only what
// the lease covers), rather than once whole at the handshake.
constexpr bool passed_per_lease(MemoryKind kind) noexcept {
  return kind == MemoryKind::cuda_vmm || kind == MemoryKind::host_granules;
}

// One piece of physical memory behind a range of the region. `generation` changes every time the
// owner creates new physical memory at that offset, so an importer knows to remap.
struct ExportedPiece {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t generation = 0;
  UniqueFd fd;
};

// Everything another process needs to map a region (given the fds, which travel separately:
// inherited, or passed over a Unix socket). `identity` is unique per region and process boot.
struct RegionExport {
  MemoryKind kind = MemoryKind::host_memfd;
  int32_t device = -1;  // CUDA ordinal in the exporting process; -1 for host memory
  uint64_t size = 0;
  std::string identity;
  std::vector<ExportedPiece> pieces;           // memfd: one piece, the whole file; granular
                                               // kinds: one per granule asked for and committed
  std::array<unsigned char, 64> ipc_handle{};  // cuda_ipc: the cudaIpcMemHandle_t bytes
};

// A mapping of a region's bytes in this process. Owners and importers both are one; every
// opener of the same region in one process gets the same mapping (see open_region).
class RegionMapping {
 public:
  virtual ~RegionMapping() = default;
  virtual std::byte *data() const noexcept = 0;
  virtual uint64_t size() const noexcept = 0;
  virtual MemoryKind kind() const noexcept = 0;
  virtual int32_t device() const noexcept = 0;  // -1: host memory
  // Maps pieces of `e` this mapping lacks or holds in an older generation. Owners ignore it.
  virtual void adopt(const RegionExport &e) = 0;
  // An importer's lease on [offset, offset + size), after adopt() brought its pieces: hold()
  // checks they are mapped (EPEER otherwise) and counts the lease on them; drop() uncounts it
  // and unmaps what no lease holds any more, so a released lease leaves no mapping of the
  // lender's memory behind. Only memory no queued work still reads may be dropped. Mappings
  // whose memory is fixed (host, IPC, owners) ignore both.
  virtual void hold(uint64_t, uint64_t) {}
  virtual void drop(uint64_t, uint64_t) noexcept {}
};

// The owner's side: decides which granules hold physical memory and exports them. Every range
// argument must be granule-aligned (the last granule may be cut by the region's end).
class MemoryRegion : public RegionMapping {
 public:
  // Bytes per commit step; 0 when the physical memory is fixed for the region's life.
  virtual uint64_t commit_granule() const noexcept = 0;
  virtual void commit(uint64_t offset, uint64_t size) = 0;
  virtual void decommit(uint64_t offset, uint64_t size) noexcept = 0;
  virtual uint64_t committed_bytes() const noexcept = 0;
  // The pieces covering [offset, offset + size) that hold memory now.
  virtual RegionExport export_range(uint64_t offset, uint64_t size) const = 0;
};

// Opens an exported region in this process. The same region opened again, or opened by its own
// process, yields the same mapping (extended by adopt()) while any holder keeps it alive.
// Device memory is imported for `device`, the CUDA device of this process that will read it
// (-1: the calling thread's current device); a mapping already open for another device is
// EINVAL. Host memory ignores `device`.
std::shared_ptr<RegionMapping> open_region(const RegionExport &e, int32_t device = -1);

}  // namespace swiftkv
