// Hand-written SVG: enough for two figures, with no plotting library to install.
#include "svg_plot.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

namespace swiftkv::bench {

namespace {

const char *const kColours[] = {"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"};

std::string escape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

constexpr double kW = 720, kH = 420, kLeft = 70, kRight = 170, kTop = 40, kBottom = 50;

// The document's start: size, white background, title.
void open_svg(std::ostringstream &o, double width, const std::string &title) {
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << kH
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
       "fill=\"white\"/>\n";
  o << "<text x=\"" << kLeft << "\" y=\"22\" font-size=\"14\">" << escape(title) << "</text>\n";
}

// Five horizontal grid lines over a plot area of pw x ph, labelled label(0) .. label(4).
void horizontal_grid(std::ostringstream &o, double pw, double ph,
                     const std::function<std::string(int)> &label) {
  for (int k = 0; k <= 4; ++k) {
    const double yy = kTop + ph - ph * k / 4.0;
    o << "<line x1=\"" << kLeft << "\" y1=\"" << yy << "\" x2=\"" << kLeft + pw << "\" y2=\"" << yy
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << kLeft - 8 << "\" y=\"" << yy + 4
      << "\" text-anchor=\"end\">" << label(k) << "</text>\n";
  }
}

}  // namespace

std::string cdf_svg(const std::string &title, const std::vector<CdfSeries> &series) {
  double lo = INFINITY, hi = 0;
  for (const CdfSeries &s : series) {
    for (double v : s.sorted_seconds) {
      if (v > 0) lo = std::min(lo, v * 1e3);
      hi = std::max(hi, v * 1e3);
    }
  }
  if (!(lo < INFINITY) || hi <= 0) {
    lo = 1;
    hi = 10;
  }
  const double d0 = std::floor(std::log10(lo)), d1 = std::max(d0 + 1, std::ceil(std::log10(hi)));
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto x = [&](double ms) { return kLeft + (std::log10(std::max(ms, lo)) - d0) / (d1 - d0) * pw; };
  auto y = [&](double f) { return kTop + (1 - f) * ph; };
  std::ostringstream o;
  open_svg(o, kW, title);
  for (double d = d0; d <= d1; ++d) {
    const double px = x(std::pow(10, d));
    o << "<line x1=\"" << px << "\" y1=\"" << kTop << "\" x2=\"" << px << "\" y2=\"" << kTop + ph
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << px << "\" y=\"" << kTop + ph + 16
      << "\" text-anchor=\"middle\">" << std::pow(10, d) << "</text>\n";
  }
  for (int k = 0; k <= 4; ++k) {
    const double f = k / 4.0;
    o << "<line x1=\"" << kLeft << "\" y1=\"" << y(f) << "\" x2=\"" << kLeft + pw << "\" y2=\""
      << y(f) << "\" stroke=\"#ddd\"/>\n<text x=\"" << kLeft - 8 << "\" y=\"" << y(f) + 4
      << "\" text-anchor=\"end\">" << f << "</text>\n";
  }
  o << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kH - 10
    << "\" text-anchor=\"middle\">TTFT (ms, log scale)</text>\n";
  o << "<text x=\"16\" y=\"" << kTop + ph / 2 << "\" transform=\"rotate(-90 16 " << kTop + ph / 2
    << ")\" text-anchor=\"middle\">fraction of turns</text>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const CdfSeries &s = series[i];
    const char *colour = kColours[i % 6];
    o << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"2\" points=\"";
    const size_t n = s.sorted_seconds.size();
    const size_t step = std::max<size_t>(1, n / 800);  // at most ~800 points a line
    for (size_t k = 0; k < n; k += step) {
      o << x(s.sorted_seconds[k] * 1e3) << ','
        << y(static_cast<double>(k + 1) / static_cast<double>(n)) << ' ';
    }
    if (n > 0) o << x(s.sorted_seconds[n - 1] * 1e3) << ',' << y(1.0);
    o << "\"/>\n";
    const double ly = kTop + 16 + 20.0 * static_cast<double>(i);
    o << "<line x1=\"" << kW - kRight + 15 << "\" y1=\"" << ly << "\" x2=\"" << kW - kRight + 40
      << "\" y2=\"" << ly << "\" stroke=\"" << colour << "\" stroke-width=\"3\"/>\n<text x=\""
      << kW - kRight + 46 << "\" y=\"" << ly + 4 << "\">" << escape(s.name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string bars_svg(const std::string &title, const std::vector<StackedBar> &bars) {
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  std::ostringstream o;
  open_svg(o, kW, title);
  horizontal_grid(o, pw, ph, [](int k) { return std::to_string(25 * k) + "%"; });
  const double slot = bars.empty() ? pw : pw / static_cast<double>(bars.size());
  std::vector<std::string> labels;
  for (size_t i = 0; i < bars.size(); ++i) {
    double acc = 0;
    const double bx = kLeft + slot * static_cast<double>(i) + slot * 0.2;
    for (size_t k = 0; k < bars[i].parts.size(); ++k) {
      const auto &[label, value] = bars[i].parts[k];
      if (std::find(labels.begin(), labels.end(), label) == labels.end()) labels.push_back(label);
      const size_t colour =
          static_cast<size_t>(std::find(labels.begin(), labels.end(), label) - labels.begin());
      const double h = ph * std::clamp(value, 0.0, 100.0) / 100.0;
      o << "<rect x=\"" << bx << "\" y=\"" << kTop + ph - ph * acc / 100.0 - h << "\" width=\""
        << slot * 0.6 << "\" height=\"" << h << "\" fill=\"" << kColours[colour % 6] << "\"/>\n";
      acc += std::clamp(value, 0.0, 100.0);
    }
    o << "<text x=\"" << bx + slot * 0.3 << "\" y=\"" << kTop + ph + 16
      << "\" text-anchor=\"middle\">" << escape(bars[i].name) << "</text>\n";
  }
  for (size_t k = 0; k < labels.size(); ++k) {
    const double ly = kTop + 16 + 20.0 * static_cast<double>(k);
    o << "<rect x=\"" << kW - kRight + 15 << "\" y=\"" << ly - 8
      << "\" width=\"14\" height=\"14\" fill=\"" << kColours[k % 6] << "\"/>\n<text x=\""
      << kW - kRight + 36 << "\" y=\"" << ly + 4 << "\">" << escape(labels[k]) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

std::string grouped_bars_svg(const std::string &title, const std::vector<std::string> &series,
                             const std::vector<BarGroup> &groups) {
  // Wider than the other plots: a group per master and workload, each with a bar per series.
  // The legend's names are long (a policy and the system it models): a wider right margin.
  const double right = 250;
  const double w = std::max(kW, 160.0 * static_cast<double>(groups.size()) + kLeft + right);
  const double pw = w - kLeft - right, ph = kH - kTop - kBottom - 20;
  double hi = 0;
  for (const BarGroup &g : groups) {
    for (double v : g.values) hi = std::max(hi, v);
  }
  // The axis ends at the next 1, 2 or 5 times a power of ten.
  double top = 1;
  if (hi > 0) {
    const double p = std::pow(10, std::floor(std::log10(hi)));
    top = hi <= p ? p : hi <= 2 * p ? 2 * p : hi <= 5 * p ? 5 * p : 10 * p;
  }
  std::ostringstream o;
  open_svg(o, w, title);
  horizontal_grid(o, pw, ph, [&](int k) {
    std::ostringstream v;
    v << top * k / 4.0;
    return v.str();
  });
  const double slot = groups.empty() ? pw : pw / static_cast<double>(groups.size());
  const double bar = slot * 0.8 / static_cast<double>(std::max<size_t>(series.size(), 1));
  for (size_t i = 0; i < groups.size(); ++i) {
    const double gx = kLeft + slot * static_cast<double>(i) + slot * 0.1;
    for (size_t k = 0; k < groups[i].values.size() && k < series.size(); ++k) {
      const double h = ph * std::clamp(groups[i].values[k] / top, 0.0, 1.0);
      o << "<rect x=\"" << gx + bar * static_cast<double>(k) << "\" y=\"" << kTop + ph - h
        << "\" width=\"" << bar * 0.9 << "\" height=\"" << h << "\" fill=\"" << kColours[k % 6]
        << "\"/>\n";
    }
    // The group's name on two lines: the model, then the workload.
    const std::string &name = groups[i].name;
    const size_t cut = name.find(' ');
    o << "<text x=\"" << gx + slot * 0.4 << "\" y=\"" << kTop + ph + 16
      << "\" text-anchor=\"middle\">" << escape(name.substr(0, cut)) << "</text>\n";
    if (cut != std::string::npos) {
      o << "<text x=\"" << gx + slot * 0.4 << "\" y=\"" << kTop + ph + 32
        << "\" text-anchor=\"middle\">" << escape(name.substr(cut + 1)) << "</text>\n";
    }
  }
  for (size_t k = 0; k < series.size(); ++k) {
    const double ly = kTop + 16 + 20.0 * static_cast<double>(k);
    o << "<rect x=\"" << w - right + 15 << "\" y=\"" << ly - 8
      << "\" width=\"14\" height=\"14\" fill=\"" << kColours[k % 6] << "\"/>\n<text x=\""
      << w - right + 36 << "\" y=\"" << ly + 4 << "\">" << escape(series[k]) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

void write_file(const std::string &path, const std::string &text) {
  std::ofstream f(path);
  f << text;
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace swiftkv::bench
