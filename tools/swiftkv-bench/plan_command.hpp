// `swiftkv-bench plan`: a capacity planner for one multi-GPU server. For each borrower it
// prints the layer-stream / regular split and the longest context against no sharing.
#pragma once

#include <string>
#include <vector>

namespace swiftkv::bench {

// Runs the subcommand on its arguments (after "plan"); returns the process exit code:
// 0 success, 1 a library call failed, 2 bad usage.
int run_plan(const std::vector<std::string> &args);

void print_plan_usage();

}  // namespace swiftkv::bench
