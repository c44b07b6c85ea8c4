// swiftkv-bench: libswiftkv's command-line tool. Subcommands: replay (multi-turn traces through
// the library under each caching policy; the default job) and plan (capacity planning for a
// server).
#include <cstdio>
#include <string>
#include <vector>

#include <swiftkv/swiftkv.h>

#include "plan_command.hpp"
#include "replay_command.hpp"

namespace {

void usage() {
  std::printf(
      "usage: swiftkv-bench [replay|plan] [options]   (default: replay)\n"
      "       swiftkv-bench --version\n\n");
  swiftkv::bench::print_replay_usage();
  std::printf("\n");
  swiftkv::bench::print_plan_usage();
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    usage();
    return 0;
  }
  if (!args.empty() && args[0] == "--version") {
    std::printf("swiftkv-bench (libswiftkv %s)\n", swiftkv_version_string());
    return 0;
  }
  if (!args.empty() && args[0] == "plan") {
    args.erase(args.begin());
    return swiftkv::bench::run_plan(args);
  }
  if (!args.empty() && args[0] == "replay")
    args.erase(args.begin());
  else if (!args.empty() && args[0].rfind("--", 0) != 0) {
    std::fprintf(stderr, "swiftkv-bench: unknown subcommand '%s'\n", args[0].c_str());
    usage();
    return 2;
  }
  return swiftkv::bench::run_replay(args);
}
