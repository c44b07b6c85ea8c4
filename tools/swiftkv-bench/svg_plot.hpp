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

// A group of side-by-side bars, one value per series.
struct BarGroup {
  std::string name;
  std::vector<double> values;
};

std::string cdf_svg(const std::string &title, const std::vector<CdfSeries> &series);
std::string bars_svg(const std::string &title, const std::vector<StackedBar> &bars);
// Groups of bars on a linear axis from 0, a colour per series (Fig. 7's shape).
std::string grouped_bars_svg(const std::string &title, const std::vector<std::string> &series,
                             const std::vector<BarGroup> &groups);

// Writes text to a file; throws std::runtime_error when it cannot.
void write_file(const std::string &path, const std::string &text);

}  // namespace swiftkv::bench
