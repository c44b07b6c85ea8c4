// The CUDA backend. VMM regions reserve one address range and map one physical allocation per
// granule, each exportable as a POSIX fd; the fallback is one cudaMalloc and a CUDA IPC handle.
// The driver API is reached through the runtime's cudaGetDriverEntryPointByVersion, which opens
// the driver at run time: the library has no link-time dependency on libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/common/checked_math.hpp"
#include "core/common/error.hpp"
#include "core/memory/cuda_check.hpp"
#include "core/memory/cuda_region.hpp"
#include "core/memory/device_query.hpp"
#include "core/memory/granule_holds.hpp"
#include "core/memory/region_registry.hpp"

namespace swiftkv {

namespace {

// The driver entry points the VMM path needs, resolved once. `ok` is false when the driver is
// missing or too old; the backend then falls back to cudaMalloc (or says EUNSUPPORTED).
struct Driver {
  bool ok = false;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
};

template <class Fn>
bool resolve(const char *symbol, Fn &out) {
  void *p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  // 12000: the ABI of each symbol as of CUDA 12.0, which every driver this library runs on has.
  if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  out = reinterpret_cast<Fn>(p);
  return true;
}

const Driver &driver() {
  static const Driver d = [] {
    Driver r;
    if (usable_cuda_devices() == 0) return r;
    r.ok = resolve("cuDeviceGet", r.device_get) &&
           resolve("cuDeviceGetAttribute", r.device_get_attribute) &&
           resolve("cuGetErrorName", r.get_error_name) &&
           resolve("cuMemGetAllocationGranularity", r.granularity) &&
           resolve("cuMemAddressReserve", r.address_reserve) &&
           resolve("cuMemAddressFree", r.address_free) && resolve("cuMemCreate", r.create) &&
           resolve("cuMemRelease", r.release) && resolve("cuMemMap", r.map) &&
           resolve("cuMemUnmap", r.unmap) && resolve("cuMemSetAccess", r.set_access) &&
           resolve("cuMemExportToShareableHandle", r.export_handle) &&
           resolve("cuMemImportFromShareableHandle", r.import_handle);
    return r;
  }();
  return d;
}

[[noreturn]] void fail_cu(CUresult res, const std::string &what) {
  const char *name = nullptr;
  if (driver().get_error_name == nullptr || driver().get_error_name(res, &name) != CUDA_SUCCESS) {
    name = "unknown CUresult";
  }
  fail(res == CUDA_ERROR_OUT_OF_MEMORY ? SWIFTKV_ENOMEM : SWIFTKV_ECUDA,
       what + " failed: " + name + " (" + std::to_string(static_cast<int>(res)) + ")");
}

void check_cu(CUresult res, const std::string &what) {
  if (res != CUDA_SUCCESS) fail_cu(res, what);
}

CUmemAllocationProp vmm_prop(int32_t device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

CUmemAccessDesc read_write_on(int32_t device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

// One granule's physical allocation as mapped in some process.
struct Granule {
  CUmemGenericAllocationHandle handle = 0;  // 0: nothing mapped
  uint64_t generation = 0;
};

// Unmaps and releases one mapped granule; used by owners and importers alike.
void unmap_granule(CUdeviceptr base, uint64_t index, uint64_t granule, Granule &g) noexcept {
  if (g.handle == 0) return;
  // cuMemUnmap waits for nothing: callers unmap only memory no queued work still reads.
  (void)driver().unmap(base + index * granule, granule);
  (void)driver().release(g.handle);
  g = Granule{};
}

// Maps `h` at granule `index` and records it in `g`; on failure releases `h`, leaving g empty.
void map_granule(CUdeviceptr base, uint64_t index, uint64_t granule, int32_t device,
                 CUmemGenericAllocationHandle h, uint64_t generation, Granule &g) {
  const CUdeviceptr at = base + index * granule;
  CUresult res = driver().map(at, granule, 0, h, 0);
  if (res != CUDA_SUCCESS) {
    (void)driver().release(h);
    fail_cu(res, "cuMemMap");
  }
  const CUmemAccessDesc access = read_write_on(device);
  res = driver().set_access(at, granule, &access, 1);
  if (res != CUDA_SUCCESS) {
    (void)driver().unmap(at, granule);
    (void)driver().release(h);
    fail_cu(res, "cuMemSetAccess");
  }
  g.handle = h;
  g.generation = generation;
}

// The owner of a VMM region. mu_ guards granules_ and committed_; the address range itself is
// immutable, so data() needs no lock.
class VmmRegion final : public MemoryRegion {
 public:
  VmmRegion(int32_t device, uint64_t size) : device_(device) {
    DeviceGuard guard(device_);
    const CUmemAllocationProp prop = vmm_prop(device_);
    size_t g = 0;
    check_cu(driver().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             "cuMemGetAllocationGranularity");
    granule_ = g;
    size_ = checked_mul(ceil_div(size, granule_), granule_, "CUDA VMM region size");
    check_cu(driver().address_reserve(&base_, size_, 0, 0, 0),
             "cuMemAddressReserve of " + std::to_string(size_) + " bytes");
    granules_.resize(size_ / granule_);
    identity_ = random_region_identity("cuda_vmm");
  }
  ~VmmRegion() override {
    for (uint64_t i = 0; i < granules_.size(); ++i) unmap_granule(base_, i, granule_, granules_[i]);
    (void)driver().address_free(base_, size_);
  }

  const std::string &identity() const noexcept { return identity_; }
  std::byte *data() const noexcept override { return reinterpret_cast<std::byte *>(base_); }
  uint64_t size() const noexcept override { return size_; }
  MemoryKind kind() const noexcept override { return MemoryKind::cuda_vmm; }
  int32_t device() const noexcept override { return device_; }
  void adopt(const RegionExport &) override {}
  uint64_t commit_granule() const noexcept override { return granule_; }

  void commit(uint64_t offset, uint64_t size) override {
    std::lock_guard lock(mu_);
    DeviceGuard guard(device_);
    const CUmemAllocationProp prop = vmm_prop(device_);
    for (uint64_t i = offset / granule_; i < ceil_div(offset + size, granule_); ++i) {
      Granule &g = granules_.at(i);
      if (g.handle != 0) continue;
      CUmemGenericAllocationHandle h = 0;
      check_cu(driver().create(&h, granule_, &prop, 0), "cuMemCreate of one granule");
      map_granule(base_, i, granule_, device_, h, next_generation_ + 1, g);
      ++next_generation_;
      committed_ += granule_;
    }
  }

  void decommit(uint64_t offset, uint64_t size) noexcept override {
    std::lock_guard lock(mu_);
    for (uint64_t i = offset / granule_; i < ceil_div(offset + size, granule_); ++i) {
      if (i >= granules_.size() || granules_[i].handle == 0) continue;
      unmap_granule(base_, i, granule_, granules_[i]);
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
    e.kind = MemoryKind::cuda_vmm;
    e.device = device_;
    e.size = size_;
    e.identity = identity_;
    for (uint64_t i = offset / granule_; i < ceil_div(offset + size, granule_); ++i) {
      const Granule &g = granules_.at(i);
      if (g.handle == 0) continue;
      int fd = -1;
      check_cu(driver().export_handle(&fd, g.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               "cuMemExportToShareableHandle");
      ExportedPiece p;
      p.offset = i * granule_;
      p.size = granule_;
      p.generation = g.generation;
      p.fd.reset(fd);
      e.pieces.push_back(std::move(p));
    }
    return e;
  }

 private:
  int32_t device_;
  uint64_t granule_ = 0;
  uint64_t size_ = 0;
  CUdeviceptr base_ = 0;
  std::string identity_;
  mutable std::mutex mu_;
  std::vector<Granule> granules_;  // guarded by mu_
  uint64_t committed_ = 0;         // guarded by mu_
  uint64_t next_generation_ = 0;   // guarded by mu_
};

// An importer's mapping of another process's VMM region, read-write for the importer's device.
class ImportedVmmRegion final : public RegionMapping {
 public:
  ImportedVmmRegion(const RegionExport &e, int32_t device) : device_(device), size_(e.size) {
    DeviceGuard guard(device_);
    if (e.pieces.empty()) fail_invalid("a CUDA VMM export carries no pieces");
    granule_ = e.pieces.front().size;
    if (granule_ == 0 || size_ % granule_ != 0) {
      fail_invalid("a CUDA VMM export's pieces do not tile its size");
    }
    check_cu(driver().address_reserve(&base_, size_, 0, 0, 0), "cuMemAddressReserve (import)");
    granules_.resize(size_ / granule_);
    holds_ = GranuleHolds(size_, granule_);
    try {
      adopt(e);
    } catch (...) {
      release_all();
      throw;
    }
  }
  ~ImportedVmmRegion() override { release_all(); }

  std::byte *data() const noexcept override { return reinterpret_cast<std::byte *>(base_); }
  uint64_t size() const noexcept override { return size_; }
  MemoryKind kind() const noexcept override { return MemoryKind::cuda_vmm; }
  int32_t device() const noexcept override { return device_; }

  void hold(uint64_t offset, uint64_t size) override {
    std::lock_guard lock(mu_);
    holds_.hold(offset, size, [&](uint64_t i) { return granules_[i].handle != 0; });
  }

  void drop(uint64_t offset, uint64_t size) noexcept override {
    std::lock_guard lock(mu_);
    try {
      DeviceGuard guard(device_);
      holds_.drop(offset, size,
                  [&](uint64_t i) { unmap_granule(base_, i, granule_, granules_[i]); });
    } catch (...) {
      // The device is gone: its mappings went with it.
    }
  }

  void adopt(const RegionExport &e) override {
    std::lock_guard lock(mu_);
    DeviceGuard guard(device_);
    for (const ExportedPiece &p : e.pieces) {
      if (p.size != granule_ || p.offset % granule_ != 0 || p.offset >= size_ || !p.fd) {
        fail_invalid("a CUDA VMM export piece at offset " + std::to_string(p.offset) +
                     " does not match the region's granules");
      }
      const uint64_t i = p.offset / granule_;
      Granule &g = granules_[i];
      if (g.handle != 0 && g.generation == p.generation) continue;
      unmap_granule(base_, i, granule_, g);  // the owner replaced it: drop the old pages
      CUmemGenericAllocationHandle h = 0;
      check_cu(
          driver().import_handle(&h, reinterpret_cast<void *>(static_cast<intptr_t>(p.fd.get())),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
          "cuMemImportFromShareableHandle");
      map_granule(base_, i, granule_, device_, h, p.generation, g);
    }
  }

 private:
  void release_all() noexcept {
    for (uint64_t i = 0; i < granules_.size(); ++i) unmap_granule(base_, i, granule_, granules_[i]);
    if (base_ != 0) (void)driver().address_free(base_, size_);
    base_ = 0;
  }

  int device_ = 0;
  uint64_t size_;
  uint64_t granule_ = 0;
  CUdeviceptr base_ = 0;
  std::mutex mu_;
  std::vector<Granule> granules_;  // guarded by mu_
  GranuleHolds holds_;             // guarded by mu_: leases on each granule
};

// The fallback owner: one cudaMalloc, committed whole, shared by an IPC handle.
class IpcRegion final : public MemoryRegion {
 public:
  IpcRegion(int32_t device, uint64_t size) : device_(device), size_(size) {
    DeviceGuard guard(device_);
    void *p = nullptr;
    check_cuda(cudaMalloc(&p, size_), "cudaMalloc of " + std::to_string(size_) + " bytes");
    data_ = static_cast<std::byte *>(p);
    const cudaError_t err = cudaIpcGetMemHandle(&handle_, p);
    if (err != cudaSuccess) {
      (void)cudaFree(p);
      check_cuda(err, "cudaIpcGetMemHandle");
    }
    static_assert(sizeof(handle_) == 64);
    identity_ = "cuda_ipc:";
    const auto *b = reinterpret_cast<const unsigned char *>(&handle_);
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof handle_; ++i) {
      identity_ += hex[b[i] >> 4];
      identity_ += hex[b[i] & 15];
    }
  }
  ~IpcRegion() override {
    // cudaFree synchronises the device: the region ends only after work that used it.
    if (cudaFree(data_) != cudaSuccess) (void)cudaGetLastError();
  }

  const std::string &identity() const noexcept { return identity_; }
  std::byte *data() const noexcept override { return data_; }
  uint64_t size() const noexcept override { return size_; }
  MemoryKind kind() const noexcept override { return MemoryKind::cuda_ipc; }
  int32_t device() const noexcept override { return device_; }
  void adopt(const RegionExport &) override {}
  uint64_t commit_granule() const noexcept override { return 0; }
  void commit(uint64_t, uint64_t) override {}
  void decommit(uint64_t, uint64_t) noexcept override {}
  uint64_t committed_bytes() const noexcept override { return size_; }

  RegionExport export_range(uint64_t, uint64_t) const override {
    RegionExport e;
    e.kind = MemoryKind::cuda_ipc;
    e.device = device_;
    e.size = size_;
    e.identity = identity_;
    std::memcpy(e.ipc_handle.data(), &handle_, sizeof handle_);
    return e;
  }

 private:
  int32_t device_;
  uint64_t size_;
  std::byte *data_ = nullptr;
  cudaIpcMemHandle_t handle_{};
  std::string identity_;
};

// An importer's mapping of another process's cudaMalloc, opened in the importer's device's
// context.
class ImportedIpcRegion final : public RegionMapping {
 public:
  ImportedIpcRegion(const RegionExport &e, int32_t device) : device_(device), size_(e.size) {
    DeviceGuard guard(device_);
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, e.ipc_handle.data(), sizeof h);
    void *p = nullptr;
    check_cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    data_ = static_cast<std::byte *>(p);
  }
  ~ImportedIpcRegion() override {
    try {
      DeviceGuard guard(device_);
      if (cudaIpcCloseMemHandle(data_) != cudaSuccess) (void)cudaGetLastError();
    } catch (...) {
      // The device is gone: its mappings went with it.
    }
  }
  std::byte *data() const noexcept override { return data_; }
  uint64_t size() const noexcept override { return size_; }
  MemoryKind kind() const noexcept override { return MemoryKind::cuda_ipc; }
  int32_t device() const noexcept override { return device_; }
  void adopt(const RegionExport &) override {}

 private:
  int device_ = 0;
  uint64_t size_;
  std::byte *data_ = nullptr;
};

}  // namespace

bool cuda_vmm_supported(int32_t device) {
  check_device(device);
  const Driver &d = driver();
  if (!d.ok) return false;
  CUdevice dev = 0;
  if (d.device_get(&dev, device) != CUDA_SUCCESS) return false;
  int vmm = 0;
  int fd_handles = 0;
  if (d.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      d.device_get_attribute(&fd_handles,
                             CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                             dev) != CUDA_SUCCESS) {
    return false;
  }
  return vmm != 0 && fd_handles != 0;
}

uint64_t cuda_vmm_granule(int32_t device) {
  if (!cuda_vmm_supported(device)) {
    fail(SWIFTKV_EUNSUPPORTED,
         "CUDA device " + std::to_string(device) + " or its driver lacks VMM");
  }
  DeviceGuard guard(device);
  const CUmemAllocationProp prop = vmm_prop(device);
  size_t g = 0;
  check_cu(driver().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
           "cuMemGetAllocationGranularity");
  return g;
}

namespace {

// One reservation for every layer; per layer its own regular allocation, and the one stream
// allocation mapped again at the end of each layer's range.
class VmmAliasedLayers final : public AliasedLayers {
 public:
  VmmAliasedLayers(int32_t device, uint32_t layers, uint64_t regular, uint64_t stream)
      : device_(device),
        layers_(layers),
        regular_(regular),
        stream_(stream),
        layer_bytes_(regular + stream) {
    DeviceGuard guard(device_);
    const uint64_t total = checked_mul(layer_bytes_, layers_, "pool bytes");
    check_cu(driver().address_reserve(&base_, total, 0, 0, 0),
             "cuMemAddressReserve of " + std::to_string(total) + " bytes");
    try {
      const CUmemAllocationProp prop = vmm_prop(device_);
      const CUmemAccessDesc access = read_write_on(device_);
      if (stream_ != 0)
        check_cu(driver().create(&stream_handle_, stream_, &prop, 0), "cuMemCreate");
      regular_handles_.assign(layers_, 0);
      for (uint32_t l = 0; l < layers_; ++l) {
        const CUdeviceptr at = base_ + l * layer_bytes_;
        if (regular_ != 0) {
          check_cu(driver().create(&regular_handles_[l], regular_, &prop, 0), "cuMemCreate");
          check_cu(driver().map(at, regular_, 0, regular_handles_[l], 0), "cuMemMap");
          mapped_.emplace_back(at, regular_);
          check_cu(driver().set_access(at, regular_, &access, 1), "cuMemSetAccess");
        }
        if (stream_ != 0) {
          check_cu(driver().map(at + regular_, stream_, 0, stream_handle_, 0), "cuMemMap (stream)");
          mapped_.emplace_back(at + regular_, stream_);
          check_cu(driver().set_access(at + regular_, stream_, &access, 1), "cuMemSetAccess");
        }
      }
    } catch (...) {
      release_all();
      throw;
    }
  }
  ~VmmAliasedLayers() override { release_all(); }

  std::byte *layer(uint32_t l) const noexcept override {
    return reinterpret_cast<std::byte *>(base_ + l * layer_bytes_);
  }

 private:
  void release_all() noexcept {
    for (const auto &[at, n] : mapped_) (void)driver().unmap(at, n);
    mapped_.clear();
    for (CUmemGenericAllocationHandle h : regular_handles_) {
      if (h != 0) (void)driver().release(h);
    }
    regular_handles_.clear();
    if (stream_handle_ != 0) (void)driver().release(stream_handle_);
    stream_handle_ = 0;
    if (base_ != 0) (void)driver().address_free(base_, layer_bytes_ * layers_);
    base_ = 0;
  }

  int32_t device_;
  uint32_t layers_;
  uint64_t regular_, stream_, layer_bytes_;
  CUdeviceptr base_ = 0;
  CUmemGenericAllocationHandle stream_handle_ = 0;
  std::vector<CUmemGenericAllocationHandle> regular_handles_;
  std::vector<std::pair<CUdeviceptr, uint64_t>> mapped_;
};

}  // namespace

std::unique_ptr<AliasedLayers> create_aliased_layers(int32_t device, uint32_t layers,
                                                     uint64_t regular_bytes,
                                                     uint64_t stream_bytes) {
  const uint64_t g = cuda_vmm_granule(device);
  if (layers == 0 || regular_bytes % g != 0 || stream_bytes % g != 0 ||
      regular_bytes + stream_bytes == 0) {
    fail_invalid("a device pool's sizes must be whole VMM granules of " + std::to_string(g) +
                 " bytes");
  }
  return std::make_unique<VmmAliasedLayers>(device, layers, regular_bytes, stream_bytes);
}

std::shared_ptr<MemoryRegion> create_cuda_region(const CudaRegionOptions &o) {
  check_device(o.device);
  if (o.size == 0) fail_invalid("CUDA region size is 0");
  bool use_vmm = false;
  switch (o.allocation) {
    case CudaAllocation::automatic: use_vmm = cuda_vmm_supported(o.device); break;
    case CudaAllocation::vmm:
      if (!cuda_vmm_supported(o.device)) {
        fail(SWIFTKV_EUNSUPPORTED, "CUDA device " + std::to_string(o.device) +
                                       " or its driver lacks VMM with POSIX fd handles");
      }
      use_vmm = true;
      break;
    case CudaAllocation::malloc: break;
  }
  if (use_vmm) {
    auto r = std::make_shared<VmmRegion>(o.device, o.size);
    register_region(r->identity(), r);
    return r;
  }
  auto r = std::make_shared<IpcRegion>(o.device, o.size);
  register_region(r->identity(), r);
  return r;
}

std::shared_ptr<RegionMapping> open_cuda_region(const RegionExport &e, int32_t device) {
  if (usable_cuda_devices() == 0) {
    fail(SWIFTKV_ENODEV, "opening CUDA device memory needs a usable CUDA device");
  }
  if (device < 0) check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_device(device);
  std::shared_ptr<RegionMapping> m;
  if (e.kind == MemoryKind::cuda_vmm) {
    if (!driver().ok) fail(SWIFTKV_EUNSUPPORTED, "the CUDA driver lacks the VMM entry points");
    m = find_or_open_region(e.identity,
                            [&] { return std::make_shared<ImportedVmmRegion>(e, device); });
  } else {
    m = find_or_open_region(e.identity,
                            [&] { return std::make_shared<ImportedIpcRegion>(e, device); });
  }
  if (m->device() != device) {
    fail_invalid("the lent memory " + e.identity + " is already mapped for CUDA device " +
                 std::to_string(m->device()) + " of this process, not device " +
                 std::to_string(device) + "; a borrower on another device needs its own lender");
  }
  if (e.kind == MemoryKind::cuda_vmm) m->adopt(e);
  return m;
}

}  // namespace swiftkv
