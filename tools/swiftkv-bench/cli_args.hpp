// Command-line helpers shared by the swiftkv-bench subcommands.
#pragma once

#include <stdexcept>
#include <string>

namespace swiftkv::bench {

// Bad usage: the subcommand prints the message and exits with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `text` as a finite number in [lo, hi]; UsageError naming `flag` otherwise.
double parse_number(const std::string &flag, const std::string &text, double lo, double hi);

}  // namespace swiftkv::bench
