// The memory limit over a process (core/memory/memory_limit.hpp), read from a made-up /proc/self
// and cgroup trees in a temporary directory: cgroup v2 with limits at several levels, v1 with an
// unlimited root, a hierarchy mounted from below its root (as in a container), both kinds at
// once (the tightest wins), and nothing known where the files are missing.
#include <unistd.h>

#include <setjmp.h>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/memory/memory_limit.hpp"

extern "C" {
#include <cmocka.h>
}

namespace {

namespace fs = std::filesystem;

struct Tree {
  fs::path top;
  Tree() {
    char t[] = "/tmp/swiftkv-memlimit-XXXXXX";
    if (::mkdtemp(t) == nullptr) std::abort();
    top = t;
    fs::create_directories(top / "proc");
  }
  ~Tree() { fs::remove_all(top); }
  void write(const fs::path &rel, const std::string &text) const {
    fs::create_directories((top / rel).parent_path());
    std::ofstream(top / rel) << text;
  }
  std::string proc() const { return (top / "proc").string(); }
  std::string at(const std::string &rel) const { return (top / rel).string(); }
  // A mountinfo line for a hierarchy mounted at `point` (under top) from `root`.
  std::string mount(const std::string &root, const std::string &point, const std::string &type,
                    const std::string &options) const {
    return "30 20 0:26 " + root + " " + at(point) + " rw,nosuid - " + type + " cgroup " + options +
           "\n";
  }
};

constexpr uint64_t MiB = uint64_t{1} << 20;

void v2_tightest_level_wins(void **) {
  Tree t;
  t.write("proc/mountinfo", t.mount("/", "cg", "cgroup2", "rw"));
  t.write("proc/cgroup", "0::/pods/a/engine\n");
  t.write("cg/pods/memory.max", std::to_string(1024 * MiB) + "\n");
  t.write("cg/pods/memory.current", std::to_string(900 * MiB) + "\n");
  t.write("cg/pods/a/memory.max", "max\n");
  t.write("cg/pods/a/engine/memory.max", std::to_string(512 * MiB) + "\n");
  t.write("cg/pods/a/engine/memory.current", std::to_string(200 * MiB) + "\n");
  t.write("cg/pods/a/engine/memory.stat",
          "anon 100\ninactive_file " + std::to_string(50 * MiB) + "\nactive_file 3\n");
  const auto l = swiftkv::memory_limit(t.proc());
  assert_true(l.has_value());
  // The parent's 1 GiB with 900 MiB used leaves 124 MiB; the leaf's 512 MiB with 150 MiB of
  // working set leaves 362: the parent limits.
  assert_string_equal(l->cgroup.c_str(), t.at("cg/pods").c_str());
  assert_int_equal(l->limit, 1024 * MiB);
  assert_int_equal(l->left(), 124 * MiB);
  // The parent's limit raised: the leaf's applies, less its inactive file cache.
  t.write("cg/pods/memory.max", "max\n");
  const auto leaf = swiftkv::memory_limit(t.proc());
  assert_true(leaf.has_value());
  assert_string_equal(leaf->cgroup.c_str(), t.at("cg/pods/a/engine").c_str());
  assert_int_equal(leaf->in_use, 150 * MiB);
  assert_int_equal(leaf->left(), 362 * MiB);
}

void v1_unlimited_is_no_limit(void **) {
  Tree t;
  t.write("proc/mountinfo", t.mount("/", "memory", "cgroup", "rw,memory") +
                                t.mount("/", "cpu", "cgroup", "rw,cpu,cpuacct"));
  t.write("proc/cgroup", "5:cpu,cpuacct:/x\n4:memory:/job/7\n0::/\n");
  t.write("memory/memory.limit_in_bytes", "9223372036854771712\n");
  t.write("memory/job/memory.limit_in_bytes", "9223372036854771712\n");
  t.write("memory/job/7/memory.limit_in_bytes", "9223372036854771712\n");
  assert_false(swiftkv::memory_limit(t.proc()).has_value());
  t.write("memory/job/7/memory.limit_in_bytes", std::to_string(256 * MiB) + "\n");
  t.write("memory/job/7/memory.usage_in_bytes", std::to_string(100 * MiB) + "\n");
  t.write("memory/job/7/memory.stat",
          "cache 5\ntotal_inactive_file " + std::to_string(40 * MiB) + "\n");
  const auto l = swiftkv::memory_limit(t.proc());
  assert_true(l.has_value());
  assert_int_equal(l->limit, 256 * MiB);
  assert_int_equal(l->in_use, 60 * MiB);
  assert_int_equal(l->left(), 196 * MiB);
}

// In a container the hierarchy is often mounted from the container's own cgroup: the path in
// /proc/self/cgroup is the whole one, the mount's root its head.
void a_hierarchy_mounted_from_below_its_root(void **) {
  Tree t;
  t.write("proc/mountinfo", t.mount("/kubepods/pod1", "cg", "cgroup2", "rw"));
  t.write("proc/cgroup", "0::/kubepods/pod1/ctr\n");
  t.write("cg/memory.max", std::to_string(2048 * MiB) + "\n");
  t.write("cg/ctr/memory.max", "max\n");
  const auto l = swiftkv::memory_limit(t.proc());
  assert_true(l.has_value());
  assert_string_equal(l->cgroup.c_str(), t.at("cg").c_str());
  assert_int_equal(l->left(), 2048 * MiB);  // no memory.current: nothing counted as used
}

// A machine with both kinds (v1's memory controller and an unified hierarchy beside it): the one
// leaving less wins; the unified hierarchy without memory files adds nothing.
void both_kinds_the_tightest_wins(void **) {
  Tree t;
  t.write("proc/mountinfo",
          t.mount("/", "memory", "cgroup", "rw,memory") + t.mount("/", "unified", "cgroup2", "rw"));
  t.write("proc/cgroup", "4:memory:/a\n0::/b\n");
  t.write("memory/a/memory.limit_in_bytes", std::to_string(300 * MiB) + "\n");
  t.write("unified/b/cgroup.procs", "1\n");
  auto l = swiftkv::memory_limit(t.proc());
  assert_true(l.has_value());
  assert_int_equal(l->limit, 300 * MiB);
  t.write("unified/b/memory.max", std::to_string(200 * MiB) + "\n");
  l = swiftkv::memory_limit(t.proc());
  assert_true(l.has_value());
  assert_int_equal(l->limit, 200 * MiB);
}

void nothing_readable_is_no_limit(void **) {
  Tree t;
  assert_false(swiftkv::memory_limit(t.proc()).has_value());
  t.write("proc/mountinfo", "garbage\n\n30 20 0:26\n");
  t.write("proc/cgroup", "nonsense\n");
  assert_false(swiftkv::memory_limit(t.proc()).has_value());
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(v2_tightest_level_wins),
      cmocka_unit_test(v1_unlimited_is_no_limit),
      cmocka_unit_test(a_hierarchy_mounted_from_below_its_root),
      cmocka_unit_test(both_kinds_the_tightest_wins),
      cmocka_unit_test(nothing_readable_is_no_limit),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
