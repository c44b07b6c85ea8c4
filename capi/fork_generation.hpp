// Which process a handle is used in. A context (and each region made in it) belongs to the
// process that made it: after fork() the child has copies of its memory and fds but none of its
// threads, and a call there would write into memory the parent shares (host slabs, segments)
// or wait on conditions only the parent's threads signal. Each fork adds one to the generation
// (a pthread_atfork handler, so the check costs a load); a handle remembers its creator's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace swiftkv::capi {

struct ProcessOwner {
  uint64_t generation;  // fork_generation() when the handle was made
  pid_t pid;            // the process that made it, for messages
};

uint64_t fork_generation() noexcept;
ProcessOwner this_process() noexcept;

// Whether `owner` is this process (not a fork of it).
inline bool owned_here(const ProcessOwner &owner) noexcept {
  return owner.generation == fork_generation();
}

// Throws ESTATE for a handle `arg` used in a fork of the process that made it.
void fail_forked(const ProcessOwner &owner, const char *arg);

// For a *_destroy call, which returns nothing: true when the handle was made by the process this
// one is a fork of, and must release nothing; the refusal is then the thread's last error.
bool destroy_refused_in_fork(const ProcessOwner &owner, const char *function,
                             const char *arg) noexcept;

}  // namespace swiftkv::capi
