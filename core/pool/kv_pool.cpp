// Pools: checking an engine's tensors, and making host pools whose stream pages are one memfd
// range mapped into every layer, so that each layer looks like an ordinary paged tensor.
#include "core/pool/kv_pool.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <string>

#include "core/common/error.hpp"
#include "core/memory/host_region.hpp"
#include "core/transfer/copy_items.hpp"

namespace swiftkv {

namespace {

[[noreturn]] void fail_sys(swiftkv_status status, const std::string &what) {
  fail(status, "creating a pool: " + what + ": " + std::strerror(errno));
}

}  // namespace

KvPool::KvPool(const ModelGeometry &g, PageLayout layout)
    : geometry_(g), layout_(std::move(layout)) {
  check_page_layout(layout_, g, "desc");
  // Its requests launch the gather/scatter kernel as SWIFTKV_COPY_KERNEL says: refused here, not
  // at the first request.
  if (layout_.device != SWIFTKV_DEVICE_HOST) (void)copy_kernel_choice();
}

const std::shared_ptr<DeviceLanes> &KvPool::device_lanes() const {
  std::lock_guard lock(lanes_mu_);
  if (!lanes_) lanes_ = make_device_lanes(layout_.device);
  return lanes_;
}

std::unique_ptr<KvPool> KvPool::create_host(const ModelGeometry &g, uint32_t regular,
                                            uint32_t stream) {
  const uint64_t os_page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t page_bytes =
      uint64_t{2} * g.block_tokens * g.num_kv_heads * g.head_dim * dtype_size(g.dtype);
  // Regular pages in whole memory pages, so the stream range can be mapped right after them.
  const uint64_t step = os_page / std::gcd(os_page, page_bytes);
  const uint64_t regular_pages = (uint64_t{regular} + step - 1) / step * step;
  if (regular_pages + stream > UINT32_MAX || regular_pages + stream == 0) {
    fail_invalid("regular_pages + stream_pages must be 1 to 2^32-1 pages");
  }
  const uint64_t regular_bytes = regular_pages * page_bytes;
  const uint64_t stream_bytes = (stream * page_bytes + os_page - 1) / os_page * os_page;
  auto pool = std::unique_ptr<KvPool>(new KvPool());
  pool->geometry_ = g;
  pool->layout_ = nhd_layout(g, static_cast<uint32_t>(regular_pages + stream));
  pool->layout_.stream_first = static_cast<uint32_t>(regular_pages);
  pool->layout_.stream_pages = stream;
  pool->fd_.reset(::memfd_create("swiftkv-pool", MFD_CLOEXEC));
  if (!pool->fd_) fail_sys(SWIFTKV_ENOMEM, "memfd_create");
  const uint64_t file_bytes = g.num_layers * regular_bytes + stream_bytes;
  if (::ftruncate(pool->fd_.get(), static_cast<off_t>(file_bytes)) != 0) {
    fail_sys(SWIFTKV_ENOMEM, "ftruncate of the pool's memfd to " + std::to_string(file_bytes));
  }
  pool->mapped_bytes_ = regular_bytes + stream_bytes;
  pool->layout_.layer_base.assign(g.num_layers, nullptr);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    void *base =
        ::mmap(nullptr, pool->mapped_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) fail_sys(SWIFTKV_ENOMEM, "reserving layer " + std::to_string(l));
    pool->layout_.layer_base[l] = static_cast<std::byte *>(base);  // unmapped by the destructor
    auto *b = static_cast<std::byte *>(base);
    if (regular_bytes != 0 &&
        ::mmap(b, regular_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, pool->fd_.get(),
               static_cast<off_t>(l * regular_bytes)) == MAP_FAILED) {
      fail_sys(SWIFTKV_ENOMEM, "mapping the regular pages of layer " + std::to_string(l));
    }
    if (stream_bytes != 0 &&
        ::mmap(b + regular_bytes, stream_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
               pool->fd_.get(), static_cast<off_t>(g.num_layers * regular_bytes)) == MAP_FAILED) {
      fail_sys(SWIFTKV_ENOMEM, "mapping the stream pages into layer " + std::to_string(l));
    }
  }
  // Allocated and mapped now: running out of memory is a status here and never a SIGBUS later,
  // and the engine's first touch of a page (or the first save reading it) takes no page fault.
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    std::byte *b = pool->layout_.layer_base[l];
    populate_memfd(pool->fd_.get(), l * regular_bytes, b, regular_bytes, -1);
    if (stream_bytes != 0) {  // one file range in every layer: made once, mapped in each
      populate_memfd(pool->fd_.get(), g.num_layers * regular_bytes, b + regular_bytes, stream_bytes,
                     -1);
    }
  }
  check_page_layout(pool->layout_, g, "the pool");
  return pool;
}

std::unique_ptr<KvPool> KvPool::create_device(const ModelGeometry &g, uint32_t regular,
                                              uint32_t stream) {
  (void)copy_kernel_choice();  // as in the constructor
  const uint64_t granule = cuda_vmm_granule(g.device);
  const uint64_t page_bytes =
      uint64_t{2} * g.block_tokens * g.num_kv_heads * g.head_dim * dtype_size(g.dtype);
  const uint64_t step = granule / std::gcd(granule, page_bytes);
  const uint64_t regular_pages = (uint64_t{regular} + step - 1) / step * step;
  if (regular_pages + stream > UINT32_MAX || regular_pages + stream == 0) {
    fail_invalid("regular_pages + stream_pages must be 1 to 2^32-1 pages");
  }
  const uint64_t stream_bytes = (stream * page_bytes + granule - 1) / granule * granule;
  auto pool = std::unique_ptr<KvPool>(new KvPool());
  pool->geometry_ = g;
  pool->layout_ = nhd_layout(g, static_cast<uint32_t>(regular_pages + stream));
  pool->layout_.stream_first = static_cast<uint32_t>(regular_pages);
  pool->layout_.stream_pages = stream;
  pool->device_memory_ =
      create_aliased_layers(g.device, g.num_layers, regular_pages * page_bytes, stream_bytes);
  pool->layout_.layer_base.assign(g.num_layers, nullptr);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    pool->layout_.layer_base[l] = pool->device_memory_->layer(l);
  }
  check_page_layout(pool->layout_, g, "the pool");
  return pool;
}

KvPool::~KvPool() {
  if (fd_.get() < 0) return;  // device memory goes with device_memory_
  for (std::byte *b : layout_.layer_base) {
    if (b != nullptr) ::munmap(b, mapped_bytes_);
  }
}

}  // namespace swiftkv
