#include "cli_args.hpp"

#include <cmath>
#include <sstream>

namespace swiftkv::bench {

double parse_number(const std::string &flag, const std::string &text, double lo, double hi) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception &) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(v) || v < lo || v > hi) {
    std::ostringstream m;
    m << flag << ": '" << text << "' is not a number in [" << lo << ", " << hi << "]";
    throw UsageError(m.str());
  }
  return v;
}

}  // namespace swiftkv::bench
