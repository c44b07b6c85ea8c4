// Seeded random numbers for the replay's generators and lenders: std::mt19937_64 turned into
// uniforms, normals (Box-Muller) and exponentials here rather than through the standard
// distributions, whose output differs between standard libraries, so that a seed gives the same
// trace and the same lender load everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

namespace swiftkv::bench {

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() {  // in (0, 1)
    return (static_cast<double>(g_() >> 11) + 0.5) * 0x1.0p-53;
  }
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  double exponential(double mean) { return -std::log(uniform()) * mean; }
  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }
  uint64_t between(uint64_t lo, uint64_t hi) {  // inclusive
    return lo + static_cast<uint64_t>(uniform() * static_cast<double>(hi - lo + 1));
  }

 private:
  std::mt19937_64 g_;
};

}  // namespace swiftkv::bench
