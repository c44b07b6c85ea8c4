// Small SVG plots for the replay report: a CDF with a logarithmic x axis and stacked bars.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace swiftkv::bench {

struct CdfSeries {
  std::string name;
  std::vector<double> sorted_seconds;  // ascending
};

struct StackedBar {
  std::string name;
  std::vector<std::pair<std::string, double>> parts;  // label, percent
};

std::string cdf_svg(const std::string &title, const std::vector<CdfSeries> &series);
std::string bars_svg(const std::string &title, const std::vector<StackedBar> &bars);

// Writes text to a file; throws std::runtime_error when it cannot.
void write_file(const std::string &path, const std::string &text);

}  // namespace swiftkv::bench
