// The host backend across processes: one process exports a memfd region, a child it spawns maps
// it and writes, and the first reads the bytes back. Also: opening a region twice in one process
// reuses the mapping, decommit returns pages, commit makes and maps every page (no fault on first
// touch), NUMA binding places them, and a region in granules is exported, imported, held, dropped
// and replaced granule by granule as VMM memory is.
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/common/error.hpp"
#include "core/memory/host_region.hpp"
#include "core/memory/numa_nodes.hpp"
#include "core/memory/region_registry.hpp"

extern "C" {
#include <cmocka.h>
}

extern char **environ;

namespace {

const char *g_self = nullptr;
constexpr uint64_t kSize = 3 * 1024 * 1024 + 512;  // not a whole number of pages on purpose

uint8_t pattern(uint64_t i, uint8_t salt) { return static_cast<uint8_t>((i * 131 + salt) % 251); }

// The child: open the region named by an inherited fd, check the parent's bytes, write its own.
int child_main(int fd, uint64_t size) {
  swiftkv::RegionExport e;
  e.kind = swiftkv::MemoryKind::host_memfd;
  e.size = size;
  swiftkv::ExportedPiece p;
  p.size = size;
  p.fd.reset(fd);
  e.pieces.push_back(std::move(p));
  try {
    auto m = swiftkv::open_region(e);
    auto *b = reinterpret_cast<uint8_t *>(m->data());
    for (uint64_t i = 0; i < 4096; ++i) {
      if (b[i] != pattern(i, 1)) return 3;  // the parent's bytes are visible
    }
    for (uint64_t i = 4096; i < size; ++i) b[i] = pattern(i, 2);
  } catch (const swiftkv::Error &err) {
    std::fprintf(stderr, "child: %s\n", err.what());
    return 2;
  }
  return 0;
}

void test_two_processes(void **) {
  swiftkv::HostRegionOptions o;
  o.size = kSize;
  auto region = swiftkv::create_host_region(o);
  assert_true(region->size() >= kSize);
  region->commit(0, region->size());
  auto *b = reinterpret_cast<uint8_t *>(region->data());
  for (uint64_t i = 0; i < 4096; ++i) b[i] = pattern(i, 1);
  swiftkv::RegionExport e = region->export_range(0, region->size());
  assert_int_equal(e.pieces.size(), 1);
  // The exported fd is close-on-exec; the child gets its own copy as fd 3.
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, e.pieces[0].fd.get(), 3);
  const std::string size = std::to_string(region->size());
  char *argv[] = {const_cast<char *>(g_self), const_cast<char *>("--child"),
                  const_cast<char *>("3"), const_cast<char *>(size.c_str()), nullptr};
  pid_t pid = 0;
  assert_int_equal(posix_spawn(&pid, g_self, &fa, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  for (uint64_t i = 4096; i < region->size(); ++i) {
    if (b[i] != pattern(i, 2)) fail_msg("byte %llu differs", static_cast<unsigned long long>(i));
  }
}

void test_open_twice_reuses_mapping(void **) {
  swiftkv::HostRegionOptions o;
  o.size = 1 << 20;
  auto region = swiftkv::create_host_region(o);
  swiftkv::RegionExport e = region->export_range(0, region->size());
  // Opened in its own process: the owner's mapping itself.
  auto again = swiftkv::open_region(e);
  assert_ptr_equal(again.get(), region.get());
  // Opened twice by an importer after the owner's mapping is gone: one mapping.
  swiftkv::RegionExport e2 = region->export_range(0, region->size());
  const std::byte *owner_data = region->data();
  region->data()[5] = std::byte{77};
  again.reset();
  region.reset();  // the fds in e and e2 keep the memfd alive
  auto first = swiftkv::open_region(e);
  auto second = swiftkv::open_region(e2);
  assert_ptr_equal(first.get(), second.get());
  assert_int_equal(static_cast<int>(first->data()[5]), 77);
  (void)owner_data;
}

void test_decommit_returns_pages(void **) {
  swiftkv::HostRegionOptions o;
  o.size = 64 * 4096;
  auto region = swiftkv::create_host_region(o);
  assert_int_equal(region->committed_bytes(), 0);
  region->commit(0, 64 * 4096);
  assert_int_equal(region->committed_bytes(), 64 * 4096);
  std::memset(region->data(), 0xAB, 64 * 4096);
  region->decommit(16 * 4096, 32 * 4096);
  assert_int_equal(region->committed_bytes(), 32 * 4096);
  // Punched pages read back as zeros; the others keep their bytes.
  assert_int_equal(static_cast<int>(region->data()[16 * 4096]), 0);
  assert_int_equal(static_cast<int>(region->data()[48 * 4096 - 1]), 0);
  assert_int_equal(static_cast<int>(region->data()[16 * 4096 - 1]), 0xAB);
  assert_int_equal(static_cast<int>(region->data()[48 * 4096]), 0xAB);
  region->commit(0, 64 * 4096);  // idempotent for the pages already there
  assert_int_equal(region->committed_bytes(), 64 * 4096);
  assert_int_equal(static_cast<int>(region->data()[48 * 4096]), 0xAB);
}

void test_numa_binding(void **) {
  const swiftkv::NumaNodes nodes = swiftkv::numa_nodes();
  if (!nodes.numa_supported) skip();
  swiftkv::HostRegionOptions o;
  o.size = 1 << 20;
  o.numa_node = nodes.max_node;  // the highest node: on a one-node machine, node 0
  auto region = swiftkv::create_host_region(o);
  region->commit(0, region->size());
  region->data()[0] = std::byte{1};
  region->data()[region->size() - 1] = std::byte{1};
  assert_int_equal(swiftkv::numa_node_of(region->data()), nodes.max_node);
  assert_int_equal(swiftkv::numa_node_of(region->data() + region->size() - 1), nodes.max_node);
}

// Minor page faults this thread has taken so far.
long minor_faults() {
  struct rusage u {};
  ::getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Whether the kernel has MADV_POPULATE_WRITE (5.14), without which pages fault in on first touch.
bool kernel_populates() {
  struct utsname u {};
  if (::uname(&u) != 0) return false;
  int major = 0, minor = 0;
  if (std::sscanf(u.release, "%d.%d", &major, &minor) != 2) return false;
  return major > 5 || (major == 5 && minor >= 14);
}

// Writes one byte into each of pages [from, to) at `base`: the minor faults that took. Not
// instrumented, so that a sanitizer's own shadow memory faulting in is not counted.
__attribute__((no_sanitize("address", "thread"))) long touch_pages(std::byte *base, uint64_t page,
                                                                   uint64_t from, uint64_t to,
                                                                   uint8_t salt) {
  const long before = minor_faults();
  for (uint64_t i = from; i < to; ++i) base[i * page] = std::byte{pattern(i, salt)};
  return minor_faults() - before;
}

// Bytes of the memfd behind an export that the kernel has allocated.
uint64_t allocated_bytes(const swiftkv::RegionExport &e) {
  struct stat st {};
  assert_int_equal(::fstat(e.pieces[0].fd.get(), &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Commit allocates every page of the range in the file and maps it here (a 64 MiB range is made
// on several threads where there are cores), so that writing each page takes no fault; decommit
// gives the pages back, and committing again makes and maps them again.
void test_commit_maps_every_page(void **) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  swiftkv::HostRegionOptions o;
  o.size = uint64_t{64} << 20;
  auto region = swiftkv::create_host_region(o);
  const swiftkv::RegionExport e = region->export_range(0, region->size());
  assert_int_equal(allocated_bytes(e), 0);
  region->commit(0, region->size());
  assert_int_equal(region->committed_bytes(), region->size());
  assert_int_equal(allocated_bytes(e), region->size());
  const uint64_t pages = region->size() / page;
  auto touch = [&](uint64_t from, uint64_t to, uint8_t salt) {
    return touch_pages(region->data(), page, from, to, salt);
  };
  const long faults = touch(0, pages, 3);
  if (kernel_populates()) assert_true(faults < 64);  // 16384 without the mapping
  const uint64_t half = pages / 2;
  region->decommit(half * page, (pages - half) * page);
  assert_int_equal(allocated_bytes(e), half * page);
  region->commit(0, region->size());
  assert_int_equal(allocated_bytes(e), region->size());
  const long again = touch(half, pages, 4);
  if (kernel_populates()) assert_true(again < 64);
  for (uint64_t i = 0; i < pages; ++i) {
    const uint8_t want = pattern(i, i < half ? 3 : 4);
    if (region->data()[i * page] != std::byte{want}) {
      fail_msg("page %llu lost its byte", static_cast<unsigned long long>(i));
    }
  }
}

// Whether the page at p is mapped readable here, by /proc/self/maps (a granule's place holds a
// PROT_NONE reservation when nothing is mapped there).
bool readable(const std::byte *p) {
  FILE *f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  char line[512];
  bool ok = false;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && at >= lo && at < hi) {
      ok = perms[0] == 'r';
      break;
    }
  }
  std::fclose(f);
  return ok;
}

// Granules of two pages: commit and decommit go granule by granule; an export carries one fd per
// committed granule asked for, with a generation that changes when the owner makes new memory
// there; an importer (opened under another identity here, as another process would) maps only
// what it is given, shares its bytes with the owner, keeps a granule the owner decommitted until
// its last lease drops it, and takes the new generation in place of the old.
void test_granules_export_and_import(void **) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)), granule = 2 * page;
  swiftkv::HostRegionOptions o;
  o.size = 7 * granule + 1;  // rounded up to 8 granules
  o.granule = granule;
  auto region = swiftkv::create_host_region(o);
  assert_int_equal(static_cast<int>(region->kind()),
                   static_cast<int>(swiftkv::MemoryKind::host_granules));
  assert_int_equal(region->size(), 8 * granule);
  assert_int_equal(region->commit_granule(), granule);
  assert_int_equal(region->committed_bytes(), 0);
  assert_false(readable(region->data()));
  region->commit(granule, 3 * granule);  // granules 1-3
  assert_int_equal(region->committed_bytes(), 3 * granule);
  assert_true(readable(region->data() + granule) && readable(region->data() + 3 * granule));
  std::memset(region->data() + granule, 0x11, 3 * granule);

  swiftkv::RegionExport e = region->export_range(0, 8 * granule);
  assert_int_equal(e.pieces.size(), 3);  // only what holds memory
  assert_int_equal(e.pieces[0].offset, granule);
  assert_int_equal(e.pieces[2].offset, 3 * granule);
  const uint64_t gen1 = e.pieces[0].generation;
  assert_true(gen1 != 0);
  e.identity += ":elsewhere";  // an importer's view, not the owner's mapping
  auto imp = swiftkv::open_region(e);
  assert_true(imp.get() != region.get());
  assert_int_equal(imp->size(), 8 * granule);
  assert_false(readable(imp->data()));  // granule 0 was never passed
  assert_int_equal(static_cast<int>(imp->data()[granule]), 0x11);
  imp->data()[2 * granule] = std::byte{0x22};  // one memory: the owner sees it
  assert_int_equal(static_cast<int>(region->data()[2 * granule]), 0x22);

  // A lease on granules 1-2 holds; one reaching granule 0 was not passed: EPEER.
  imp->hold(granule, 2 * granule);
  try {
    imp->hold(0, 2 * granule);
    fail_msg("a hold over a granule never passed was accepted");
  } catch (const swiftkv::Error &err) {
    assert_int_equal(err.status(), SWIFTKV_EPEER);
  }
  // The owner gives granule 1 back and makes new memory there: the importer's lease still reads
  // the old bytes until it adopts the new generation.
  region->decommit(granule, granule);
  assert_int_equal(region->committed_bytes(), 2 * granule);
  assert_int_equal(static_cast<int>(imp->data()[granule]), 0x11);
  region->commit(granule, granule);
  assert_int_equal(static_cast<int>(region->data()[granule]), 0);  // fresh memory
  swiftkv::RegionExport again = region->export_range(granule, granule);
  assert_int_equal(again.pieces.size(), 1);
  assert_true(again.pieces[0].generation > gen1);
  again.identity = e.identity;
  imp->adopt(again);
  region->data()[granule] = std::byte{0x33};
  assert_int_equal(static_cast<int>(imp->data()[granule]), 0x33);

  // Dropping the lease unmaps the granules it alone held; granule 3 was never held and stays.
  imp->drop(granule, 2 * granule);
  assert_false(readable(imp->data() + granule) || readable(imp->data() + 2 * granule));
  assert_true(readable(imp->data() + 3 * granule));

  // Pieces that do not fit the importer's granules are refused.
  swiftkv::RegionExport bad = region->export_range(granule, granule);
  bad.identity = e.identity;
  bad.pieces[0].size = page;
  try {
    imp->adopt(bad);
    fail_msg("a piece of the wrong size was adopted");
  } catch (const swiftkv::Error &err) {
    assert_int_equal(err.status(), SWIFTKV_EINVAL);
  }
  // A granule that is not whole pages is refused at creation.
  o.granule = page + 1;
  try {
    (void)swiftkv::create_host_region(o);
    fail_msg("a granule of page + 1 bytes was accepted");
  } catch (const swiftkv::Error &err) {
    assert_int_equal(err.status(), SWIFTKV_EINVAL);
  }
}

// Memory that another process maps cannot be cut short or grown by either side: a lender that
// truncated a lent memfd killed its borrower with SIGBUS at the next read, and a borrower that
// truncated the lender's killed the lender. Every memfd a region exports is sealed (shrink, grow,
// and no further seals); an importer refuses one that is not, or is short, as the peer's fault.
void test_lent_memory_is_sealed(void **) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto assert_sealed = [](int fd, const char *what) {
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) !=
                         (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
      fail_msg("%s: seals 0x%x", what, seals);
    }
    if (::ftruncate(fd, 0) == 0 || errno != EPERM) fail_msg("%s: truncated to 0", what);
    struct stat st {};
    assert_int_equal(::fstat(fd, &st), 0);
    if (::ftruncate(fd, st.st_size + static_cast<off_t>(4096)) == 0 || errno != EPERM) {
      fail_msg("%s: grown", what);
    }
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0) fail_msg("%s: sealed further", what);
  };
  swiftkv::HostRegionOptions o;
  o.size = 16 * page;
  auto whole = swiftkv::create_host_region(o);
  whole->commit(0, whole->size());
  swiftkv::RegionExport e = whole->export_range(0, whole->size());
  assert_sealed(e.pieces[0].fd.get(), "a whole region's memfd");
  // Decommit still returns pages (a punched hole keeps the size).
  whole->decommit(0, 4 * page);
  assert_int_equal(whole->committed_bytes(), 12 * page);

  o.granule = 2 * page;
  auto granular = swiftkv::create_host_region(o);
  granular->commit(0, 4 * page);
  swiftkv::RegionExport g = granular->export_range(0, 4 * page);
  assert_int_equal(g.pieces.size(), 2);
  for (const swiftkv::ExportedPiece &p : g.pieces) assert_sealed(p.fd.get(), "a granule's memfd");

  // Importers: a memfd without the seals, with only the shrink seal, or shorter than the
  // export says is refused with EPEER naming it, and nothing is mapped.
  struct Bad {
    unsigned seals;
    uint64_t bytes;
    const char *needle;
  };
  const Bad bads[] = {{0, 16 * page, "is not sealed against shrinking and growing"},
                      {F_SEAL_SHRINK, 16 * page, "is not sealed against shrinking and growing"},
                      {F_SEAL_SHRINK | F_SEAL_GROW, 8 * page, "is not a memfd of at least"}};
  for (const Bad &b : bads) {
    for (const bool granules : {false, true}) {
      swiftkv::UniqueFd fd(::memfd_create("swiftkv-bad", MFD_CLOEXEC | MFD_ALLOW_SEALING));
      assert_true(static_cast<bool>(fd));
      assert_int_equal(::ftruncate(fd.get(), static_cast<off_t>(granules ? b.bytes / 8 : b.bytes)),
                       0);
      if (b.seals != 0) assert_int_equal(::fcntl(fd.get(), F_ADD_SEALS, b.seals), 0);
      swiftkv::RegionExport x;
      x.size = 16 * page;
      swiftkv::ExportedPiece p;
      p.size = granules ? 2 * page : 16 * page;
      p.generation = 1;
      p.fd = std::move(fd);
      x.pieces.push_back(std::move(p));
      x.kind = granules ? swiftkv::MemoryKind::host_granules : swiftkv::MemoryKind::host_memfd;
      x.identity = granules ? "host_granules:test-bad" : "";
      try {
        (void)swiftkv::open_region(x);
        fail_msg("a memfd with seals 0x%x of %llu bytes was mapped (%s)", b.seals,
                 static_cast<unsigned long long>(b.bytes), granules ? "granule" : "whole");
      } catch (const swiftkv::Error &err) {
        assert_int_equal(err.status(), SWIFTKV_EPEER);
        if (std::strstr(err.what(), b.needle) == nullptr) fail_msg("%s", err.what());
      }
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0) {
    return child_main(std::atoi(argv[2]), std::strtoull(argv[3], nullptr, 10));
  }
  g_self = argv[0];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_processes),
      cmocka_unit_test(test_open_twice_reuses_mapping),
      cmocka_unit_test(test_decommit_returns_pages),
      cmocka_unit_test(test_commit_maps_every_page),
      cmocka_unit_test(test_numa_binding),
      cmocka_unit_test(test_granules_export_and_import),
      cmocka_unit_test(test_lent_memory_is_sealed),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
