// `swiftkv-bench replay`: runs a multi-turn trace (a file or the built-in generator) under each
// caching policy and reports TTFT percentiles, hit rates per tier, bytes per link, recomputed
// tokens, the longest context and the lenders' interference: a table, a JSON file and SVG plots.
#pragma once

#include <string>
#include <vector>

namespace swiftkv::bench {

// Runs the subcommand on its arguments (after "replay"); returns the exit code: 0 success,
// 1 a library call failed, 2 bad usage or a bad trace file.
int run_replay(const std::vector<std::string> &args);

void print_replay_usage();

}  // namespace swiftkv::bench
