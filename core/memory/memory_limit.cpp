#include "core/memory/memory_limit.hpp"

#include <fstream>
#include <sstream>
#include <vector>

namespace swiftkv {

namespace {

// A v1 cgroup without a limit reports about 2^63 (rounded to pages): no limit.
constexpr uint64_t kNoLimit = uint64_t{1} << 62;

std::optional<uint64_t> read_number(const std::string &path) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;  // missing, "max", or not a number
  }
  try {
    return std::stoull(word);
  } catch (...) {
    return std::nullopt;
  }
}

// A field of a memory.stat file, or 0.
uint64_t stat_field(const std::string &path, const std::string &name) {
  std::ifstream f(path);
  std::string key;
  uint64_t value = 0;
  while (f >> key >> value) {
    if (key == name) return value;
  }
  return 0;
}

struct Hierarchy {
  bool v2 = false;
  std::string mount_point, mount_root;
};

// The memory hierarchies mounted here: cgroup2, and cgroup v1 with the memory controller.
std::vector<Hierarchy> memory_hierarchies(const std::string &mountinfo) {
  std::vector<Hierarchy> out;
  std::ifstream f(mountinfo);
  for (std::string line; std::getline(f, line);) {
    std::istringstream in(line);
    std::string id, parent, dev, root, point;
    in >> id >> parent >> dev >> root >> point;
    std::string word;
    while (in >> word && word != "-") {
    }
    std::string type, source, options;
    in >> type >> source >> options;
    if (type == "cgroup2") {
      out.push_back({true, point, root});
    } else if (type == "cgroup" && ("," + options + ",").find(",memory,") != std::string::npos) {
      out.push_back({false, point, root});
    }
  }
  return out;
}

// The process's cgroup path in a hierarchy (v2's "0::" line, or v1's line naming memory).
std::optional<std::string> cgroup_path(const std::string &cgroup_file, bool v2) {
  std::ifstream f(cgroup_file);
  for (std::string line; std::getline(f, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    if (v2 ? id == "0" && controllers.empty()
           : ("," + controllers + ",").find(",memory,") != std::string::npos) {
      return line.substr(b + 1);
    }
  }
  return std::nullopt;
}

// The tightest limit (the one leaving the least) from the process's cgroup up to the
// hierarchy's mount point.
std::optional<MemoryLimit> limit_in(const Hierarchy &h, const std::string &path) {
  std::string rel = path;
  if (h.mount_root != "/" && rel.compare(0, h.mount_root.size(), h.mount_root) == 0) {
    rel = rel.substr(h.mount_root.size());
  }
  std::string dir = h.mount_point + (rel == "/" ? "" : rel);
  std::optional<MemoryLimit> best;
  for (;;) {
    const std::optional<uint64_t> limit =
        read_number(dir + (h.v2 ? "/memory.max" : "/memory.limit_in_bytes"));
    if (limit && *limit < kNoLimit) {
      const uint64_t usage =
          read_number(dir + (h.v2 ? "/memory.current" : "/memory.usage_in_bytes")).value_or(0);
      const uint64_t inactive =
          stat_field(dir + "/memory.stat", h.v2 ? "inactive_file" : "total_inactive_file");
      const MemoryLimit here{dir, *limit, usage > inactive ? usage - inactive : 0};
      if (!best || here.left() < best->left()) best = here;  // the level leaving the least
    }
    if (dir.size() <= h.mount_point.size()) break;
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash < h.mount_point.size()) break;
    dir.resize(slash);
  }
  return best;
}

}  // namespace

std::optional<MemoryLimit> memory_limit(const std::string &proc_self) {
  std::optional<MemoryLimit> best;
  for (const Hierarchy &h : memory_hierarchies(proc_self + "/mountinfo")) {
    const std::optional<std::string> path = cgroup_path(proc_self + "/cgroup", h.v2);
    if (!path) continue;
    const std::optional<MemoryLimit> l = limit_in(h, *path);
    if (l && (!best || l->left() < best->left())) best = l;
  }
  return best;
}

}  // namespace swiftkv
