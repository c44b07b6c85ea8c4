// An importer's leases counted per granule of a region passed granule by granule (VMM device
// memory, host memory in granules): hold() finds every granule of a lease mapped and counts the
// lease on it; drop() uncounts it and unmaps a granule no lease holds any more. The owner of the
// table locks around it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.hpp"

namespace swiftkv {

class GranuleHolds {
 public:
  GranuleHolds() = default;
  GranuleHolds(uint64_t size, uint64_t granule)
      : size_(size), granule_(granule), holds_(granule == 0 ? 0 : size / granule, 0) {}

  // The granules [first, end) that [offset, offset + size) touches, clipped to the region.
  std::pair<uint64_t, uint64_t> granules_of(uint64_t offset, uint64_t size) const noexcept {
    const uint64_t end = std::min(size_, offset + size);
    if (offset >= end) return {0, 0};
    return {offset / granule_, (end + granule_ - 1) / granule_};
  }

  // EPEER when a granule of the range is not mapped (mapped(i) is false); else counts the lease.
  template <class Mapped>
  void hold(uint64_t offset, uint64_t size, Mapped mapped) {
    const auto [first, end] = granules_of(offset, size);
    for (uint64_t i = first; i < end; ++i) {
      if (!mapped(i)) {
        fail(SWIFTKV_EPEER, "the lender granted bytes at " + std::to_string(offset) +
                                " without passing the memory behind granule " + std::to_string(i));
      }
    }
    for (uint64_t i = first; i < end; ++i) ++holds_[i];
  }

  // Uncounts the lease; unmap(i) for each granule it was the last to hold.
  template <class Unmap>
  void drop(uint64_t offset, uint64_t size, Unmap unmap) noexcept {
    const auto [first, end] = granules_of(offset, size);
    for (uint64_t i = first; i < end; ++i) {
      if (holds_[i] > 0 && --holds_[i] == 0) unmap(i);
    }
  }

 private:
  uint64_t size_ = 0;
  uint64_t granule_ = 0;
  std::vector<uint32_t> holds_;
};

}  // namespace swiftkv
