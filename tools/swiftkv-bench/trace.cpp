// Trace I/O with nlohmann::json, and the generators (random numbers from sim_random.hpp, so that a
// seed gives the same trace everywhere).
#include "trace.hpp"

#include "sim_random.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace swiftkv::bench {

namespace {

using nlohmann::json;

[[noreturn]] void bad_line(const std::string &path, uint64_t line, const std::string &what) {
  throw TraceError(path + ":" + std::to_string(line) + ": " + what);
}

uint64_t count_field(const json &j, const char *name, const std::string &path, uint64_t line,
                     uint64_t lo) {
  const json &v = j.at(name);
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    bad_line(path, line, std::string("\"") + name + "\" must be a non-negative integer");
  }
  const uint64_t n = v.get<uint64_t>();
  if (n < lo)
    bad_line(path, line, std::string("\"") + name + "\" must be at least " + std::to_string(lo));
  if (n > (uint64_t{1} << 32)) bad_line(path, line, std::string("\"") + name + "\" is too large");
  return n;
}

double seconds_field(const json &j, const char *name, const std::string &path, uint64_t line) {
  const json &v = j.at(name);
  if (!v.is_number()) bad_line(path, line, std::string("\"") + name + "\" must be a number");
  const double s = v.get<double>();
  if (!std::isfinite(s) || s < 0) {
    bad_line(path, line, std::string("\"") + name + "\" must be finite and >= 0");
  }
  return s;
}

uint64_t clamp_tokens(double v, uint64_t lo, uint64_t hi) {
  if (!(v >= static_cast<double>(lo))) return lo;
  if (v >= static_cast<double>(hi)) return hi;
  return static_cast<uint64_t>(std::llround(v));
}

// Standard normal quantiles of 0.90 and 0.99.
constexpr double kZ90 = 1.2815515655446004;
constexpr double kZ99 = 2.3263478740408408;

// ShareGPT (SwiftCache §2.2): the session's total length T is lognormal through
// P(T > 13K) = 10% and P(T > 56K) = 1%; prompts are lognormal with P(p < 132) = 90% around a
// median of 40; a session of T tokens has about sqrt(T / 40) turns (longer sessions have longer
// turns), and its answers share what the prompts leave of T.
Session sharegpt_session(Rng &r, std::string id) {
  static const double sigma_t = (std::log(56000.0) - std::log(13000.0)) / (kZ99 - kZ90);
  static const double median_t = 13000.0 / std::exp(kZ90 * sigma_t);
  static const double sigma_p = std::log(132.0 / 40.0) / kZ90;
  const uint64_t total = clamp_tokens(r.lognormal(median_t, sigma_t), 16, 602000);
  uint64_t turns =
      std::max<uint64_t>(1, clamp_tokens(std::sqrt(static_cast<double>(total) / 40.0), 1, 256));
  std::vector<uint64_t> prompts;
  std::vector<double> answer_weights;
  uint64_t prompt_sum = 0;
  for (uint64_t i = 0; i < turns; ++i) {
    const uint64_t p = clamp_tokens(r.lognormal(40.0, sigma_p), 1, 16384);
    const double w = r.lognormal(1.0, 0.6);
    if (prompt_sum + p + prompts.size() + 1 > total) break;  // leave each answer one token
    prompts.push_back(p);
    answer_weights.push_back(w);
    prompt_sum += p;
  }
  if (prompts.empty()) {
    prompts.push_back(std::max<uint64_t>(1, total / 2));
    answer_weights.push_back(1.0);
    prompt_sum = prompts[0];
  }
  // Answers: total - prompt_sum tokens split by the weights, each >= 1, summing exactly.
  const uint64_t answers = total > prompt_sum ? total - prompt_sum : prompts.size();
  const double wsum = std::accumulate(answer_weights.begin(), answer_weights.end(), 0.0);
  Session s{std::move(id), {}};
  uint64_t given = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Turn t;
    t.index = static_cast<uint32_t>(i);
    t.prompt_tokens = prompts[i];
    uint64_t o = std::max<uint64_t>(
        1, static_cast<uint64_t>(static_cast<double>(answers) * answer_weights[i] / wsum));
    if (i + 1 == prompts.size()) o = answers > given ? std::max<uint64_t>(1, answers - given) : 1;
    t.output_tokens = o;
    given += o;
    s.turns.push_back(t);
  }
  return s;
}

// Long-document QA (L-Eval-like): a document of median 16K tokens with the first question, then
// 2-9 more short questions with short answers.
Session docqa_session(Rng &r, std::string id) {
  Session s{std::move(id), {}};
  const uint64_t doc = clamp_tokens(r.lognormal(16000.0, 0.5), 2048, 200000);
  const uint64_t turns = r.between(3, 10);
  for (uint64_t i = 0; i < turns; ++i) {
    Turn t;
    t.index = static_cast<uint32_t>(i);
    t.prompt_tokens = clamp_tokens(r.lognormal(30.0, 0.5), 4, 512) + (i == 0 ? doc : 0);
    t.output_tokens = clamp_tokens(r.lognormal(120.0, 0.6), 1, 2048);
    s.turns.push_back(t);
  }
  return s;
}

}  // namespace

uint64_t Trace::turns() const {
  uint64_t n = 0;
  for (const Session &s : sessions) n += s.turns.size();
  return n;
}

Trace load_trace(const std::string &path) {
  std::ifstream in(path);
  if (!in) throw TraceError(path + ": cannot open the trace file");
  Trace t;
  std::unordered_map<std::string, size_t> index;
  std::vector<bool> numeric_id;  // per session: its id was a JSON number
  std::string text;
  uint64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception &e) {
      // Syntax errors, and numbers beyond the range of a double (1e400), which the parser
      // reports as out of range rather than as a parse error.
      bad_line(path, line, std::string("not JSON: ") + e.what());
    }
    if (!j.is_object()) bad_line(path, line, "a line must be a JSON object");
    for (const char *need : {"session", "turn", "output_tokens"}) {
      if (!j.contains(need)) bad_line(path, line, std::string("missing \"") + need + "\"");
    }
    std::string sid;
    const json &sj = j.at("session");
    if (sj.is_string())
      sid = sj.get<std::string>();
    else if (sj.is_number_integer())
      sid = sj.dump();
    else
      bad_line(path, line, "\"session\" must be a string or an integer");
    Turn turn;
    turn.index = static_cast<uint32_t>(count_field(j, "turn", path, line, 0));
    turn.output_tokens = count_field(j, "output_tokens", path, line, 0);
    if (j.contains("prompt")) {
      const json &p = j.at("prompt");
      if (!p.is_array() || p.empty())
        bad_line(path, line, "\"prompt\" must be a non-empty array of token ids");
      for (const json &id : p) {
        if (!id.is_number_unsigned() || id.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
          bad_line(path, line, "\"prompt\" token ids must be integers in [0, 2^32)");
        }
        turn.prompt_ids.push_back(id.get<uint32_t>());
      }
      turn.prompt_tokens = turn.prompt_ids.size();
      if (j.contains("prompt_tokens") &&
          count_field(j, "prompt_tokens", path, line, 1) != turn.prompt_tokens) {
        bad_line(path, line, "\"prompt_tokens\" differs from the length of \"prompt\"");
      }
    } else if (j.contains("prompt_tokens")) {
      turn.prompt_tokens = count_field(j, "prompt_tokens", path, line, 1);
    } else {
      bad_line(path, line, "missing \"prompt_tokens\" (or \"prompt\")");
    }
    if (j.contains("arrival_s")) turn.arrival_s = seconds_field(j, "arrival_s", path, line);
    if (j.contains("think_s")) turn.think_s = seconds_field(j, "think_s", path, line);
    auto [it, added] = index.emplace(sid, t.sessions.size());
    if (added) {
      t.sessions.push_back(Session{sid, {}});
      numeric_id.push_back(sj.is_number_integer());
    } else if (numeric_id[it->second] != sj.is_number_integer()) {
      // 1 and "1" would otherwise be one session without a word.
      bad_line(path, line,
               "session " + sid + " is written as " +
                   (sj.is_number_integer() ? "a number" : "a string") + " here and as " +
                   (sj.is_number_integer() ? "a string" : "a number") +
                   " on an earlier line; write it one way");
    }
    Session &s = t.sessions[it->second];
    if (turn.index != s.turns.size()) {
      bad_line(path, line,
               "session \"" + sid + "\": turn " + std::to_string(turn.index) + " where turn " +
                   std::to_string(s.turns.size()) + " was expected");
    }
    if (turn.index == 0 && !turn.arrival_s) bad_line(path, line, "turn 0 needs \"arrival_s\"");
    s.turns.push_back(std::move(turn));
  }
  if (in.bad()) throw TraceError(path + ": read error");
  if (t.sessions.empty()) throw TraceError(path + ": the trace has no turns");
  return t;
}

void save_trace(const Trace &trace, const std::string &path) {
  std::ofstream out(path);
  if (!out) throw TraceError(path + ": cannot write the trace file");
  for (const Session &s : trace.sessions) {
    for (const Turn &t : s.turns) {
      json j;
      j["session"] = s.id;
      j["turn"] = t.index;
      if (t.arrival_s) j["arrival_s"] = *t.arrival_s;
      if (t.index > 0) j["think_s"] = t.think_s;
      if (t.prompt_ids.empty())
        j["prompt_tokens"] = t.prompt_tokens;
      else
        j["prompt"] = t.prompt_ids;
      j["output_tokens"] = t.output_tokens;
      out << j.dump() << '\n';
    }
  }
  if (!out) throw TraceError(path + ": write error");
}

Trace generate_trace(const GeneratorOptions &o) {
  Rng r(o.seed);
  Trace t;
  double clock = 0;
  for (uint32_t i = 0; i < o.sessions; ++i) {
    clock += r.exponential(1.0 / o.sessions_per_s);
    std::string id = "s" + std::to_string(i);
    Session s = o.kind == WorkloadKind::sharegpt ? sharegpt_session(r, std::move(id))
                                                 : docqa_session(r, std::move(id));
    s.turns[0].arrival_s = std::round(clock * 1e3) / 1e3;
    for (size_t k = 1; k < s.turns.size(); ++k) {
      s.turns[k].think_s = std::round(r.exponential(o.think_mean_s) * 1e3) / 1e3;
    }
    t.sessions.push_back(std::move(s));
  }
  return t;
}

Trace generate_long_trace(const GeneratorOptions &o, uint64_t min_context, uint64_t max_context) {
  Rng r(o.seed);
  Trace t;
  double clock = 0;
  const uint64_t max_tries = 10000ull * std::max<uint32_t>(o.sessions, 1);
  for (uint64_t tries = 0; t.sessions.size() < o.sessions; ++tries) {
    if (tries == max_tries) {
      throw std::runtime_error("fewer than one " + std::string(workload_name(o.kind)) +
                               " session in 10,000 reaches " + std::to_string(min_context) +
                               " tokens within " + std::to_string(max_context));
    }
    std::string id = "s" + std::to_string(t.sessions.size());
    Session s = o.kind == WorkloadKind::sharegpt ? sharegpt_session(r, std::move(id))
                                                 : docqa_session(r, std::move(id));
    uint64_t history = 0;
    size_t keep = 0;
    bool reaches = false;
    for (; keep < s.turns.size(); ++keep) {
      const Turn &turn = s.turns[keep];
      const uint64_t context = history + turn.prompt_tokens;
      if (max_context != 0 && context + turn.output_tokens > max_context) break;
      reaches = reaches || context >= min_context;
      history = context + turn.output_tokens;
    }
    if (!reaches) continue;
    s.turns.resize(keep);
    clock += r.exponential(1.0 / o.sessions_per_s);
    s.turns[0].arrival_s = std::round(clock * 1e3) / 1e3;
    for (size_t k = 1; k < s.turns.size(); ++k) {
      s.turns[k].think_s = std::round(r.exponential(o.think_mean_s) * 1e3) / 1e3;
    }
    t.sessions.push_back(std::move(s));
  }
  return t;
}

TraceSummary summarize(const Trace &trace) {
  TraceSummary s;
  uint64_t under = 0, over13 = 0, over56 = 0;
  double total = 0;
  for (const Session &ses : trace.sessions) {
    uint64_t tokens = 0;
    for (const Turn &t : ses.turns) {
      tokens += t.prompt_tokens + t.output_tokens;
      under += t.prompt_tokens < 132;
      ++s.turns;
    }
    over13 += tokens > 13000;
    over56 += tokens > 56000;
    total += static_cast<double>(tokens);
    s.max_session_tokens = std::max(s.max_session_tokens, tokens);
  }
  s.sessions = trace.sessions.size();
  if (s.turns > 0) s.prompts_under_132 = static_cast<double>(under) / static_cast<double>(s.turns);
  if (s.sessions > 0) {
    const auto n = static_cast<double>(s.sessions);
    s.sessions_over_13k = static_cast<double>(over13) / n;
    s.sessions_over_56k = static_cast<double>(over56) / n;
    s.mean_session_tokens = total / n;
  }
  return s;
}

std::optional<WorkloadKind> parse_workload(const std::string &name) {
  if (name == "sharegpt") return WorkloadKind::sharegpt;
  if (name == "docqa") return WorkloadKind::docqa;
  return std::nullopt;
}

const char *workload_name(WorkloadKind k) {
  return k == WorkloadKind::sharegpt ? "sharegpt" : "docqa";
}

}  // namespace swiftkv::bench
