// libFuzzer target: the replay's trace parser, with a save/load round trip. Whatever a trace
// file holds, load_trace() either throws TraceError (naming the file and line) or gives a
// trace that saves and loads back to the same sessions and turns. Any other exception is a
// crash here, as it is an abort in swiftkv-bench.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "trace.hpp"

using swiftkv::bench::Trace;
using swiftkv::bench::TraceError;

namespace {

std::string temp_path(const char *what) {
  return "/tmp/swiftkv-fuzz-trace-" + std::to_string(::getpid()) + "-" + what + ".jsonl";
}

bool same(const Trace &a, const Trace &b) {
  if (a.sessions.size() != b.sessions.size()) return false;
  for (size_t s = 0; s < a.sessions.size(); ++s) {
    const auto &x = a.sessions[s], &y = b.sessions[s];
    if (x.id != y.id || x.turns.size() != y.turns.size()) return false;
    for (size_t t = 0; t < x.turns.size(); ++t) {
      const auto &p = x.turns[t], &q = y.turns[t];
      if (p.index != q.index || p.arrival_s != q.arrival_s || p.prompt_tokens != q.prompt_tokens ||
          p.output_tokens != q.output_tokens || p.prompt_ids != q.prompt_ids ||
          (t > 0 && p.think_s != q.think_s)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const std::string in = temp_path("in"), out = temp_path("out");
  FILE *f = std::fopen(in.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size != 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  Trace t;
  try {
    t = swiftkv::bench::load_trace(in);
  } catch (const TraceError &e) {
    if (std::string(e.what()).rfind(in, 0) != 0) std::abort();  // the message names the file
    return 0;
  }
  swiftkv::bench::save_trace(t, out);
  const Trace back = swiftkv::bench::load_trace(out);
  if (!same(t, back)) std::abort();
  return 0;
}
