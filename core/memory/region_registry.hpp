// The process-wide table of live region mappings by identity, which makes opening a region a
// second time (or opening one's own export) reuse the mapping already there.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/memory/memory_region.hpp"

namespace swiftkv {

// Registers an owner's mapping so that importers in this process find it. The table holds only
// a weak reference: the entry dies with the region.
void register_region(const std::string &identity, const std::shared_ptr<RegionMapping> &m);

// The live mapping under `identity`, or the one `open` makes (and registers). One lock covers
// the lookup and the open, so two threads opening the same region get one mapping.
std::shared_ptr<RegionMapping> find_or_open_region(
    const std::string &identity, const std::function<std::shared_ptr<RegionMapping>()> &open);

// The backends' own openers, behind open_region().
std::shared_ptr<RegionMapping> open_host_region(const RegionExport &e);
std::shared_ptr<RegionMapping> open_cuda_region(const RegionExport &e, int32_t device);
// A fresh identity for a region that has no name in the kernel to derive one from: `prefix`
// and 128 random bits.
std::string random_region_identity(const char *prefix);
// The identity under which an exported memfd's mapping is registered (its device and inode).
std::string memfd_identity(int fd);

}  // namespace swiftkv
