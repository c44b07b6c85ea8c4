// Multi-turn conversation traces for `swiftkv-bench replay`: the JSONL format (docs/replay.md),
// its reader and writer, and the seeded synthetic generators (ShareGPT-like chat, long-document
// QA) with Poisson session arrivals and exponential user think time.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace swiftkv::bench {

// A trace file that cannot be read: the message names the file and line.
struct TraceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Turn {
  uint32_t index = 0;                // 0, 1, ... within its session
  std::optional<double> arrival_s;   // earliest send time; required for turn 0
  double think_s = 0;                // sent this long after the previous turn's answer ended
  uint64_t prompt_tokens = 0;        // new user tokens of this turn (>= 1)
  uint64_t output_tokens = 0;        // the answer's tokens
  std::vector<uint32_t> prompt_ids;  // the prompt's token ids, or empty: made from the session
};

struct Session {
  std::string id;
  std::vector<Turn> turns;  // in turn order
};

struct Trace {
  std::vector<Session> sessions;  // in order of first appearance
  uint64_t turns() const;
};

// Reads a JSONL trace: one JSON object per line (blank lines are skipped) with "session"
// (string or integer), "turn", "prompt_tokens" and/or "prompt" (token ids), "output_tokens",
// "arrival_s" (turn 0; optional later) and "think_s" (optional). Throws TraceError naming the
// file and line of the first bad line.
Trace load_trace(const std::string &path);

// Writes a trace in the same format (turn 0 with arrival_s, later turns with think_s).
void save_trace(const Trace &trace, const std::string &path);

enum class WorkloadKind { sharegpt, docqa };

struct GeneratorOptions {
  WorkloadKind kind = WorkloadKind::sharegpt;
  uint64_t seed = 1;
  uint32_t sessions = 400;
  double sessions_per_s = 0.1;  // Poisson arrivals of first turns
  double think_mean_s = 60;     // exponential user think time (Pensieve §6.1)
};

// The synthetic workloads. sharegpt (SwiftCache §2.2): session lengths lognormal with 10% over
// 13K tokens and 1% over 56K; 90% of user prompts under 132 tokens. docqa: a long document
// (median 16K tokens) in the first turn, then a few short questions. Same options, same trace.
Trace generate_trace(const GeneratorOptions &o);

// Sessions of the workload chosen for a long-context experiment (SwiftCache §5.1): candidates are
// drawn as generate_trace draws them, each is cut before its first turn whose context plus answer
// would pass max_context (0: no limit), and it is kept only if some turn that is left has a
// context (history plus prompt) of at least min_context. o.sessions sessions are kept; their
// first turns arrive as a Poisson process at o.sessions_per_s. Throws std::runtime_error when
// fewer than one candidate in 10,000 qualifies.
Trace generate_long_trace(const GeneratorOptions &o, uint64_t min_context, uint64_t max_context);

// The statistics the generator is built to meet.
struct TraceSummary {
  uint64_t sessions = 0, turns = 0;
  double prompts_under_132 = 0;  // fraction of turns
  double sessions_over_13k = 0;  // fraction of sessions whose total tokens exceed 13,000
  double sessions_over_56k = 0;  // ... 56,000
  double mean_session_tokens = 0;
  uint64_t max_session_tokens = 0;
};
TraceSummary summarize(const Trace &trace);

std::optional<WorkloadKind> parse_workload(const std::string &name);
const char *workload_name(WorkloadKind k);

}  // namespace swiftkv::bench
