#include "capi/fork_generation.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

#include "capi/capi_guard.hpp"
#include "core/common/error.hpp"

namespace swiftkv::capi {

namespace {

std::atomic<uint64_t> g_generation{0};

void after_fork_in_child() noexcept { g_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered when the library is loaded, before any handle can exist.
const int g_registered = ::pthread_atfork(nullptr, nullptr, after_fork_in_child);

}  // namespace

uint64_t fork_generation() noexcept {
  (void)g_registered;
  return g_generation.load(std::memory_order_relaxed);
}

ProcessOwner this_process() noexcept { return {fork_generation(), ::getpid()}; }

namespace {

std::string forked_message(const ProcessOwner &owner, const char *arg) {
  return std::string(arg) + " was made by process " + std::to_string(owner.pid) +
         " and this is process " + std::to_string(::getpid()) +
         ", a fork of it: a context and its regions belong to the process that made them (make a " +
         "new context in the child)";
}

}  // namespace

void fail_forked(const ProcessOwner &owner, const char *arg) {
  fail(SWIFTKV_ESTATE, forked_message(owner, arg));
}

bool destroy_refused_in_fork(const ProcessOwner &owner, const char *function,
                             const char *arg) noexcept {
  if (owned_here(owner)) return false;
  try {
    set_error(function, SWIFTKV_ESTATE, forked_message(owner, arg) + "; nothing was released");
  } catch (...) {
    // No memory for the message: the refusal stands without it.
  }
  return true;
}

}  // namespace swiftkv::capi
