// The memory limit a process runs under: the tightest of its memory cgroup's limits and its
// ancestors' (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`), with what that cgroup uses
// now. A container's processes are killed, not refused, past it: a budget of host memory that
// cannot fit beside what is used is refused at the context's creation instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace swiftkv {

struct MemoryLimit {
  std::string cgroup;   // the limiting cgroup's directory
  uint64_t limit = 0;   // its limit, bytes
  uint64_t in_use = 0;  // what it uses that the kernel cannot take back: usage less the
                        // inactive file cache (the working set), bytes
  uint64_t left() const noexcept { return in_use < limit ? limit - in_use : 0; }
};

// The limit over this process, if any cgroup above it has one. Reads `proc_self` (the
// process's /proc/self directory: its `cgroup` and `mountinfo`); files that cannot be read mean
// no limit is known (none is then enforced here).
std::optional<MemoryLimit> memory_limit(const std::string &proc_self = "/proc/self");

}  // namespace swiftkv
