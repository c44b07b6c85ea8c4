// The replay tool's simulator and traces: the generator meets its target statistics and is
// reproducible, trace files round-trip and bad ones are refused with their line, and on a tiny
// hand-made trace every policy's hits, recomputation, bytes and first TTFTs are the exact
// expected numbers.
#include <unistd.h>

#include <cmath>
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "figure_models.hpp"
#include "model_presets.hpp"
#include "paper_models.h"
#include "replay.hpp"
#include "trace.hpp"

extern "C" {
#include <cmocka.h>
}

using namespace swiftkv::bench;

namespace {

std::string temp_path(const char *name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("swiftkv-test-replay-") + std::to_string(getpid()) + "-" + name))
      .string();
}

void write(const std::string &path, const std::string &text) {
  std::ofstream f(path);
  f << text;
}

std::string slurp(const std::string &path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void generator_meets_sharegpt_statistics(void **) {
  GeneratorOptions o;
  o.sessions = 20000;
  o.seed = 7;
  const TraceSummary s = summarize(generate_trace(o));
  assert_int_equal(s.sessions, 20000);
  // SwiftCache §2.2: 90% of prompts under 132 tokens; 10% of sessions over 13K, 1% over 56K.
  assert_true(s.prompts_under_132 > 0.88 && s.prompts_under_132 < 0.92);
  assert_true(s.sessions_over_13k > 0.09 && s.sessions_over_13k < 0.11);
  assert_true(s.sessions_over_56k > 0.007 && s.sessions_over_56k < 0.013);
  assert_true(s.max_session_tokens <= 602000);
}

void generator_is_reproducible(void **) {
  GeneratorOptions o;
  o.sessions = 300;
  o.seed = 11;
  o.sessions_per_s = 0.25;
  const std::string a = temp_path("a.jsonl"), b = temp_path("b.jsonl"), c = temp_path("c.jsonl");
  save_trace(generate_trace(o), a);
  save_trace(generate_trace(o), b);
  o.seed = 12;
  save_trace(generate_trace(o), c);
  assert_true(slurp(a) == slurp(b));
  assert_false(slurp(a) == slurp(c));
  // Arrivals are Poisson at the given rate: 300 sessions at 0.25/s take about 1200 s.
  const Trace t = load_trace(a);
  const double last = *t.sessions.back().turns[0].arrival_s;
  assert_true(last > 1000 && last < 1400);
  for (const char *p : {a.c_str(), b.c_str(), c.c_str()}) std::remove(p);

  o.kind = WorkloadKind::docqa;
  o.sessions = 200;
  const Trace d = generate_trace(o);
  for (const Session &s : d.sessions) {
    assert_true(s.turns.size() >= 3 && s.turns.size() <= 10);
    assert_true(s.turns[0].prompt_tokens >= 2048 + 4);
    for (size_t k = 1; k < s.turns.size(); ++k) assert_true(s.turns[k].prompt_tokens <= 512);
  }
}

// The sessions of --preset swiftcache-fig7: every kept session reaches the long context and none
// passes the model's limit; the figures of seed 1 are pinned (a change of the generator or of
// the selection shows here first).
void long_trace_meets_its_bounds(void **) {
  for (const WorkloadKind kind : {WorkloadKind::sharegpt, WorkloadKind::docqa}) {
    for (const uint64_t max_context : {uint64_t{0}, uint64_t{40960}}) {
      GeneratorOptions o;
      o.kind = kind;
      o.sessions = 60;
      o.sessions_per_s = 0.02;
      const Trace t = generate_long_trace(o, 20000, max_context);
      assert_int_equal(t.sessions.size(), 60);
      uint64_t long_turns = 0;
      for (const Session &s : t.sessions) {
        uint64_t history = 0;
        bool reaches = false;
        assert_true(s.turns[0].arrival_s.has_value());
        for (const Turn &turn : s.turns) {
          const uint64_t context = history + turn.prompt_tokens;
          if (max_context != 0) assert_true(context + turn.output_tokens <= max_context);
          reaches = reaches || context >= 20000;
          long_turns += context >= 20000;
          history = context + turn.output_tokens;
        }
        assert_true(reaches);
      }
      // Turns, turns with a long context, the longest session, the last arrival (s).
      const TraceSummary s = summarize(t);
      const uint64_t got[] = {
          s.turns, long_turns, s.max_session_tokens,
          static_cast<uint64_t>(std::llround(*t.sessions.back().turns[0].arrival_s))};
      const bool share = kind == WorkloadKind::sharegpt;
      const uint64_t want[2][4] = {{share ? 1887u : 403u, share ? 838u : 394u,
                                    share ? 220151u : 59060u, share ? 2888u : 3007u},
                                   {share ? 1570u : 401u, share ? 489u : 393u,
                                    share ? 40742u : 40844u, share ? 3349u : 3144u}};
      for (size_t k = 0; k < 4; ++k) assert_int_equal(got[k], want[max_context != 0][k]);
    }
  }
  // Nothing qualifies: refused rather than a search without end.
  GeneratorOptions o;
  o.sessions = 2;
  bool threw = false;
  try {
    generate_long_trace(o, 50000, 40000);
  } catch (const std::runtime_error &) {
    threw = true;
  }
  assert_true(threw);
}

void trace_round_trips(void **) {
  const std::string p = temp_path("rt.jsonl");
  write(
      p,
      "{\"session\":\"x\",\"turn\":0,\"arrival_s\":1.5,\"prompt\":[5,6,7],\"output_tokens\":4}\n"
      "\n"
      "{\"session\":9,\"turn\":0,\"arrival_s\":2,\"prompt_tokens\":100,\"output_tokens\":0}\n"
      "{\"session\":\"x\",\"turn\":1,\"think_s\":3.25,\"prompt_tokens\":7,\"output_tokens\":1}\n");
  const Trace t = load_trace(p);
  assert_int_equal(t.sessions.size(), 2);
  assert_int_equal(t.turns(), 3);
  assert_true(t.sessions[0].id == "x" && t.sessions[1].id == "9");
  assert_int_equal(t.sessions[0].turns[0].prompt_tokens, 3);
  assert_int_equal(t.sessions[0].turns[0].prompt_ids[2], 7);
  assert_true(t.sessions[0].turns[1].think_s == 3.25);
  const std::string q = temp_path("rt2.jsonl");
  save_trace(t, q);
  const Trace u = load_trace(q);
  save_trace(u, p);
  assert_true(slurp(p) == slurp(q));
  std::remove(p.c_str());
  std::remove(q.c_str());
}

void a_session_id_is_a_number_or_a_string_not_both(void **) {
  const std::string p = temp_path("mixed.jsonl");
  write(p,
        "{\"session\":\"1\",\"turn\":0,\"arrival_s\":0,\"prompt_tokens\":4,\"output_tokens\":1}\n"
        "{\"session\":1,\"turn\":1,\"prompt_tokens\":4,\"output_tokens\":1}\n");
  try {
    (void)load_trace(p);
    fail_msg("1 and \"1\" were taken as one session");
  } catch (const TraceError &e) {
    assert_non_null(
        std::strstr(e.what(), ":2: session 1 is written as a number here and as a string"));
  }
  std::remove(p.c_str());
}

void bad_traces_name_their_line(void **) {
  const std::string good =
      "{\"session\":\"a\",\"turn\":0,\"arrival_s\":0,\"prompt_tokens\":4,\"output_tokens\":1}\n";
  const struct {
    const char *line2;
    const char *needle;
  } cases[] = {
      {"{not json", ":2: not JSON"},
      {"{\"session\":\"a\",\"turn\":1,\"arrival_s\":1e400,\"prompt_tokens\":4,\"output_tokens\":1}",
       ":2: not JSON"},
      {"{\"session\":\"a\",\"turn\":1,\"prompt_tokens\":4,\"output_tokens\":-1e999}",
       ":2: not JSON"},
      {"[1,2]", ":2: a line must be a JSON object"},
      {"{\"session\":\"a\",\"turn\":1,\"prompt_tokens\":4}", ":2: missing \"output_tokens\""},
      {"{\"session\":\"a\",\"turn\":2,\"prompt_tokens\":4,\"output_tokens\":1}",
       ":2: session \"a\": turn 2 where turn 1"},
      {"{\"session\":\"b\",\"turn\":0,\"prompt_tokens\":4,\"output_tokens\":1}",
       ":2: turn 0 needs \"arrival_s\""},
      {"{\"session\":\"a\",\"turn\":1,\"prompt_tokens\":-4,\"output_tokens\":1}",
       ":2: \"prompt_tokens\" must be a non-negative integer"},
      {"{\"session\":\"a\",\"turn\":1,\"prompt_tokens\":0,\"output_tokens\":1}",
       ":2: \"prompt_tokens\" must be at least 1"},
      {"{\"session\":\"a\",\"turn\":1,\"output_tokens\":1}", ":2: missing \"prompt_tokens\""},
      {"{\"session\":\"a\",\"turn\":1,\"prompt\":[1,2],\"prompt_tokens\":3,\"output_tokens\":1}",
       ":2: \"prompt_tokens\" differs"},
      {"{\"session\":\"a\",\"turn\":1,\"think_s\":-1,\"prompt_tokens\":3,\"output_tokens\":1}",
       ":2: \"think_s\" must be finite and >= 0"},
      {"{\"session\":[1],\"turn\":1,\"prompt_tokens\":3,\"output_tokens\":1}",
       ":2: \"session\" must be"},
  };
  const std::string p = temp_path("bad.jsonl");
  for (const auto &c : cases) {
    write(p, good + c.line2 + "\n");
    try {
      (void)load_trace(p);
      fail_msg("accepted: %s", c.line2);
    } catch (const TraceError &e) {
      if (std::strstr(e.what(), c.needle) == nullptr)
        fail_msg("'%s' lacks '%s'", e.what(), c.needle);
      assert_true(std::strstr(e.what(), p.c_str()) != nullptr);
    }
  }
  write(p, "");
  try {
    (void)load_trace(p);
    fail_msg("an empty trace was accepted");
  } catch (const TraceError &e) {
    assert_non_null(std::strstr(e.what(), "no turns"));
  }
  std::remove(p.c_str());
  try {
    (void)load_trace(p);
    fail_msg("a missing file was accepted");
  } catch (const TraceError &e) {
    assert_non_null(std::strstr(e.what(), "cannot open"));
  }
}

// A tiny server: a 2-layer model of 512 bytes per token, so a 256-token chunk is 128 KiB; its
// GPU holds exactly 5 chunks of KV and the host 8. A lender of the same geometry offers 8
// chunks at the start.
constexpr uint64_t kChunk = 256 * 512;

ServerConfig tiny_server() {
  ServerConfig c;
  c.borrower = ModelSpec{"tiny", 2, 1, 64, SWIFTKV_DTYPE_F16, 0, 1, 1e6};
  c.borrower.weight_bytes = (uint64_t{1} << 30) - 5 * kChunk;
  c.gpu_gib = 1;
  c.utilization = 1;
  c.activation_gib = 0;
  c.host_gib = 8.0 * kChunk / (1024.0 * 1024 * 1024);
  c.disk_gib = 64.0 * kChunk / (1024.0 * 1024 * 1024);
  ModelSpec lender = c.borrower;
  lender.name = "tiny-lender";
  lender.weight_bytes = (uint64_t{1} << 30) - 10 * kChunk;
  c.lenders = {lender};
  c.lender_initial_tokens = 512;  // owns 2 chunks' worth, lends 8
  c.lender_rate = 1e-9;           // no lender requests in the replay
  c.tpot_ms = 10;
  c.gpu_tflops = 1;
  return c;
}

// Session a: 512 + 256 answer tokens, then (at t = 200 s) 256 + 256 more; session b at t =
// 100 s: 1280 tokens. b's store pushes all of a out of the 5-chunk GPU cache (LRU), so a's
// second turn finds its 3 history chunks only where the policy kept them. The host (8 chunks)
// is then full, and a's two new chunks each push one of b's (the least recent) down.
Trace tiny_trace() {
  const std::string p = temp_path("tiny.jsonl");
  write(
      p,
      "{\"session\":\"a\",\"turn\":0,\"arrival_s\":0,\"prompt_tokens\":512,\"output_tokens\":256}\n"
      "{\"session\":\"b\",\"turn\":0,\"arrival_s\":100,\"prompt_tokens\":1280,\"output_tokens\":0}"
      "\n"
      "{\"session\":\"a\",\"turn\":1,\"arrival_s\":200,\"prompt_tokens\":256,\"output_tokens\":256}"
      "\n");
  Trace t = load_trace(p);
  std::remove(p.c_str());
  return t;
}

bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b)); }

void tiny_capacities(void **) {
  const ServerConfig c = tiny_server();
  const Capacity g = policy_capacity(c, Policy::gpu_only);
  assert_int_equal(g.gpu_tokens, 1280);
  assert_int_equal(g.host_tokens, 0);
  assert_int_equal(g.max_context, 1280);
  const Capacity h = policy_capacity(c, Policy::hierarchical);
  assert_int_equal(h.host_tokens, 2048);
  assert_int_equal(h.disk_tokens, 64 * 256);
  const Capacity s = policy_capacity(c, Policy::swiftkv);
  assert_int_equal(s.peer_tokens, 8 * 256);
  assert_true(s.max_context > g.max_context);  // layer streaming over lent memory
  assert_true(s.gpu_tokens <= g.gpu_tokens);
}

void tiny_trace_exact_numbers(void **) {
  const ServerConfig c = tiny_server();
  const Trace t = tiny_trace();
  const double pcie = c.pcie_gbps * 1e9;

  const PolicyResult g = run_policy(c, t, Policy::gpu_only);
  assert_int_equal(g.served, 3);
  assert_int_equal(g.history_chunks, 3);  // a's second turn: 768 tokens of history
  assert_int_equal(g.hit_chunks[kGpu], 0);
  assert_int_equal(g.recomputed_tokens, 768);
  assert_int_equal(g.computed_tokens, 512 + 1280 + 1024);
  assert_int_equal(g.pcie_bytes + g.nvlink_bytes + g.disk_bytes, 0);
  assert_true(near(g.requests[0].ttft_s, prefill_seconds(c, 0, 512)));
  assert_true(near(g.requests[1].ttft_s, prefill_seconds(c, 0, 1024)));  // records: a0, a1, b0
  assert_int_equal(g.max_context, 1280);

  const PolicyResult h = run_policy(c, t, Policy::host_offload);
  assert_int_equal(h.hit_chunks[kGpu], 0);
  assert_int_equal(h.hit_chunks[kHost], 3);
  assert_int_equal(h.recomputed_tokens, 0);
  assert_int_equal(h.computed_tokens, 512 + 1280 + 256);
  // Stores: a's 3 chunks, b's 5, a's 2 more; loads: 3 chunks. a's last two found the host
  // full and each evicted one chunk (LRU, no disk).
  assert_int_equal(h.pcie_bytes, 13 * kChunk);
  assert_int_equal(h.evicted_chunks, 2);
  // host-offload loads before it computes, and runs LMCache's in-process overhead slower.
  const double o = 1 + c.lmcache_overhead;
  assert_true(near(h.requests[1].ttft_s, (3.0 * kChunk / pcie + prefill_seconds(c, 768, 256)) * o));
  ServerConfig layerwise = c;
  layerwise.lmcache_layerwise = true;
  const PolicyResult hl = run_policy(layerwise, t, Policy::host_offload);
  const double ll = 3.0 * kChunk / pcie / 2, lc = prefill_seconds(c, 768, 256) / 2;
  assert_true(near(hl.requests[1].ttft_s, std::max(ll + 2 * lc, 2 * ll + lc) * o));

  const PolicyResult r = run_policy(c, t, Policy::hierarchical);
  assert_int_equal(r.hit_chunks[kGpu], 0);
  assert_int_equal(r.hit_chunks[kHost], 3);
  assert_int_equal(r.pcie_bytes, 13 * kChunk);
  assert_int_equal(r.disk_bytes, 2 * kChunk);  // the host's victims went down to disk
  assert_int_equal(r.evicted_chunks, 0);
  // Layer-wise overlap over 2 layers: max(l + 2c, 2l + c) with l, c per layer.
  const double l = 3.0 * kChunk / pcie / 2, cc = prefill_seconds(c, 768, 256) / 2;
  assert_true(near(r.requests[1].ttft_s, std::max(l + 2 * cc, 2 * l + cc)));
  // HiCache's selective write-through backs a chunk up only when a later turn uses it from the
  // GPU: a's chunks left the GPU (b filled it) unused, so nothing reached host memory and a's
  // second turn recomputes its history.
  ServerConfig selective = c;
  selective.hicache_selective = true;
  const PolicyResult rs = run_policy(selective, t, Policy::hierarchical);
  assert_int_equal(rs.hit_chunks[kHost] + rs.hit_chunks[kDisk] + rs.hit_chunks[kGpu], 0);
  assert_int_equal(rs.recomputed_tokens, 768);
  assert_int_equal(rs.pcie_bytes + rs.disk_bytes, 0);

  const PolicyResult s = run_policy(c, t, Policy::swiftkv);
  assert_int_equal(s.hit_chunks[kGpu] + s.hit_chunks[kPeer], 3);  // lent memory holds it all
  assert_int_equal(s.hit_chunks[kHost] + s.hit_chunks[kDisk], 0);
  assert_int_equal(s.recomputed_tokens, 0);
  // Every new chunk went to lent memory (10 stores: the idle lender's ScaleDown lent its last
  // 2 chunks before a came back), and what the GPU lacked came back from it.
  assert_int_equal(s.nvlink_bytes, (10 + s.hit_chunks[kPeer]) * kChunk);
  assert_int_equal(s.pcie_bytes + s.disk_bytes, 0);
  assert_int_equal(s.reclaims, 0);
  for (const PolicyResult *p : {&g, &h, &r, &s}) {
    assert_int_equal(p->rejected, 0);
    assert_true(p->requests[2].ttft_s > 0 && near(p->requests[2].ready_s, 100));
    assert_true(near(p->requests[1].ready_s, 200));
  }
}

// The tiny trace with KIVI 4-bit chunks in host memory and on disk: the host (8 raw chunks)
// holds all 10 encoded, so nothing goes down to disk; what crosses PCIe is the encoded bytes;
// a's second turn is served its 3 history chunks from host memory, lossy.
// HiCache's selective write-through, with a chunk used again: a's first two chunks are used
// from the GPU by its second turn and backed up then; the chunk that turn adds is never used
// from the GPU before b pushes a out, so a's third turn finds two chunks in host memory and
// recomputes the third. Plain write-through has all three.
void selective_write_through_backs_up_at_the_second_use(void **) {
  const ServerConfig c = tiny_server();
  const std::string p = temp_path("selective.jsonl");
  write(
      p,
      "{\"session\":\"a\",\"turn\":0,\"arrival_s\":0,\"prompt_tokens\":512,\"output_tokens\":0}\n"
      "{\"session\":\"a\",\"turn\":1,\"arrival_s\":50,\"prompt_tokens\":256,\"output_tokens\":0}\n"
      "{\"session\":\"b\",\"turn\":0,\"arrival_s\":100,\"prompt_tokens\":1280,\"output_tokens\":0}"
      "\n"
      "{\"session\":\"a\",\"turn\":2,\"arrival_s\":200,\"prompt_tokens\":256,\"output_tokens\":0}"
      "\n");
  const Trace t = load_trace(p);
  std::remove(p.c_str());
  ServerConfig selective = c;
  selective.hicache_selective = true;
  const PolicyResult r = run_policy(selective, t, Policy::hierarchical);
  assert_int_equal(r.served, 4);
  assert_int_equal(r.hit_chunks[kGpu], 2);   // a's second turn
  assert_int_equal(r.hit_chunks[kHost], 2);  // a's third turn
  assert_int_equal(r.recomputed_tokens, 256);
  assert_int_equal(r.pcie_bytes, 4 * kChunk);  // two backed up, two loaded
  const PolicyResult w = run_policy(c, t, Policy::hierarchical);
  assert_int_equal(w.hit_chunks[kHost], 3);
  assert_int_equal(w.recomputed_tokens, 0);
}

// A miss in the middle of a history: prefix caching computes from it on; swiftkv loads the
// longest cached run and recomputes the tokens before it, as swiftkv_lookup reports it.
void a_miss_mid_history_loads_the_longest_run(void **) {
  const ServerConfig c = tiny_server();
  const uint64_t C = c.chunk_tokens;  // 256
  const std::vector<uint8_t> resident{1, 0, 0, 1, 1, 1, 0, 1};
  const uint64_t ctx = 8 * C + 10;
  const PrefillPlan prefix = plan_prefill(c, false, resident, ctx, 2 * C);
  assert_true(prefix.load == (std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0, 0}));
  assert_int_equal(prefix.computed_tokens, 7 * C + 10);
  assert_true(near(prefix.compute_seconds, prefill_seconds(c, C, 7 * C + 10)));
  assert_int_equal(prefix.streamed_tokens, 6 * C + 10);  // from 2C on

  const PrefillPlan run = plan_prefill(c, true, resident, ctx, 2 * C);
  assert_true(run.load == (std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 0, 0}));
  assert_int_equal(run.computed_tokens, 3 * C + 2 * C + 10);
  assert_true(near(run.compute_seconds,
                   prefill_seconds(c, 0, 3 * C) + prefill_seconds(c, 6 * C, 2 * C + 10)));
  assert_int_equal(run.streamed_tokens, C + 2 * C + 10);  // [2C, 3C) and [6C, ctx)

  // Runs of equal length: the earliest, here the prefix; nothing cached: one range.
  const PrefillPlan tie = plan_prefill(c, true, {1, 0, 1}, 3 * C, 0);
  assert_true(tie.load == (std::vector<uint8_t>{1, 0, 0}));
  assert_true(near(tie.compute_seconds, prefill_seconds(c, C, 2 * C)));
  const PrefillPlan head = plan_prefill(c, true, {0, 1, 1}, 3 * C, 0);
  assert_true(head.load == (std::vector<uint8_t>{0, 1, 1}));
  assert_int_equal(head.computed_tokens, C);
  const PrefillPlan none = plan_prefill(c, true, {0, 0}, 2 * C + 1, 0);
  assert_int_equal(none.computed_tokens, 2 * C + 1);
  assert_true(near(none.compute_seconds, prefill_seconds(c, 0, 2 * C + 1)));
  bool threw = false;
  try {
    plan_prefill(c, true, {1, 1}, 2 * C - 1, 0);
  } catch (const std::invalid_argument &) {
    threw = true;
  }
  assert_true(threw);
}

void tiny_trace_compressed(void **) {
  ServerConfig c = tiny_server();
  c.compression = *parse_compression("fixed:kivi4");
  const Trace t = tiny_trace();
  const PolicyResult r = run_policy(c, t, Policy::hierarchical);
  assert_int_equal(r.hit_chunks[kHost], 3);
  assert_int_equal(r.disk_bytes, 0);
  assert_int_equal(r.evicted_chunks, 0);
  // 13 chunks crossed (10 stores, 3 loads), each at KIVI 4-bit's size: about a third.
  assert_true(r.pcie_bytes > 13 * kChunk / 4 && r.pcie_bytes < 13 * kChunk / 2);
  assert_int_equal(r.quality_chunks, 3);
  const double q = r.quality_sum / 3;
  assert_true(q > 0.9 && q < 1.0);
  assert_true(r.decode_seconds > 0);
  // Raw, the same trace sends two of b's chunks to disk and serves exact chunks.
  ServerConfig raw = tiny_server();
  const PolicyResult e = run_policy(raw, t, Policy::hierarchical);
  assert_int_equal(e.disk_bytes, 2 * kChunk);
  assert_true(e.quality_sum == 3.0 && e.decode_seconds == 0);
}

void compression_names_parse(void **) {
  assert_true(parse_compression("none")->mode == CompressionSpec::Mode::none);
  assert_true(parse_compression("adaptive")->mode == CompressionSpec::Mode::adaptive);
  const std::optional<CompressionSpec> f = parse_compression("fixed:zstd-planes");
  assert_true(f && f->mode == CompressionSpec::Mode::fixed && f->codec == "zstd-planes");
  assert_true(compression_name(*f) == "fixed:zstd-planes");
  for (const char *bad : {"", "fixed", "fixed:", "fixed:kivi3", "adaptive:fp8", "zstd"}) {
    assert_false(parse_compression(bad).has_value());
  }
}

// A turn longer than the GPU can hold is rejected by the baselines (with the rest of its
// session) and served by swiftkv, whose layer stream cache runs it over lent memory.
void long_turns_need_streaming(void **) {
  const ServerConfig c = tiny_server();
  const std::string p = temp_path("long.jsonl");
  write(
      p,
      "{\"session\":\"a\",\"turn\":0,\"arrival_s\":0,\"prompt_tokens\":1500,\"output_tokens\":10}\n"
      "{\"session\":\"a\",\"turn\":1,\"think_s\":1,\"prompt_tokens\":10,\"output_tokens\":10}\n");
  const Trace t = load_trace(p);
  std::remove(p.c_str());
  const PolicyResult g = run_policy(c, t, Policy::gpu_only);
  assert_int_equal(g.rejected, 2);
  assert_true(g.requests[0].rejected && g.requests[1].rejected);
  const PolicyResult s = run_policy(c, t, Policy::swiftkv);
  assert_int_equal(s.served, 2);
  assert_int_equal(s.max_context, 1530);
}

}  // namespace

// The planner's presets and the tests' list of SwiftCache Table 2 are the same four geometries.
void presets_are_the_paper_models(void **) {
  for (int i = 0; i < SWIFTKV_PAPER_MODEL_COUNT; ++i) {
    const swiftkv_paper_model &m = swiftkv_paper_models[i];
    const auto p = swiftkv::bench::find_preset(m.name);
    if (!p) fail_msg("no preset named %s", m.name);
    assert_int_equal(p->num_layers, m.num_layers);
    assert_int_equal(p->num_kv_heads, m.num_kv_heads);
    assert_int_equal(p->head_dim, m.head_dim);
    assert_int_equal(p->dtype, SWIFTKV_DTYPE_F16);
  }
  assert_int_equal(swiftkv::bench::model_presets().size(), SWIFTKV_PAPER_MODEL_COUNT);
}

// Fig. 9's activation model and vLLM's longest context, from the formulas in figure_models.hpp.
void max_context_model(void **) {
  const ModelSpec lwm = *find_preset("lwm-1m-text");
  assert_int_equal(activation_bytes(lwm, 1), (2 * 4096 + 3 * 11008) * 2);
  assert_int_equal(activation_bytes(lwm, 8192), 8192 * activation_bytes(lwm, 1));
  const uint64_t bpt = bytes_per_token(lwm), a = activation_bytes(lwm, 1);  // 512 KiB, 82432
  // Room for 100K tokens' KV beside an 8K chunk's activations; unchunked, each token pays both.
  const uint64_t avail = 100000 * bpt + activation_bytes(lwm, 8192);
  assert_int_equal(vllm_max_context(lwm, avail, 8192, 16), 100000 / 16 * 16);
  assert_int_equal(vllm_max_context(lwm, avail, 0, 16), avail / (bpt + a) / 16 * 16);
  // A context shorter than the chunk holds its own activations only.
  assert_int_equal(vllm_max_context(lwm, 1000 * (bpt + a), 8192, 1), 1000);
  ModelSpec unknown = lwm;
  unknown.hidden = 0;
  assert_int_equal(activation_bytes(unknown, 10), 0);
  bool threw = false;
  try {
    max_contexts(96, unknown, {}, 0.95, 16);
  } catch (const std::invalid_argument &) {
    threw = true;
  }
  assert_true(threw);
  const ContextLimits c =
      max_contexts(96, lwm, {*find_preset("qwen3-14b"), *find_preset("qwen3-8b")}, 0.95, 16);
  const double usable = 96.0 * 1024 * 1024 * 1024 * 0.95 - static_cast<double>(lwm.weight_bytes);
  assert_int_equal(c.vllm_8k, vllm_max_context(lwm, static_cast<uint64_t>(usable), 8192, 16));
  assert_true(c.vllm_whole < c.vllm_32k && c.vllm_32k < c.vllm_8k && c.vllm_8k < c.swiftkv);
}

// Fig. 8's interference model: a link-bound master turn uses the worker's HBM at nearly the
// NVLink rate, a decode stretches by 1 / (1 - u), a compute-bound prefill not at all and a
// memory-bound one by the same factor.
void interference_model(void **) {
  ServerConfig s = tiny_server();
  s.nvlink_gbps = 400;
  s.gpu_tflops = 120;
  const ModelSpec lwm = *find_preset("lwm-1m-text"), q14 = *find_preset("qwen3-14b");
  const Interference i = estimate_interference(s, lwm, q14, 65536, 128, 2000, 4000);
  ServerConfig m = s;
  m.borrower = lwm;
  const double bytes = (65536.0 + 128) * static_cast<double>(bytes_per_token(lwm));
  const double lt = bytes / 400e9 / 32, ct = prefill_seconds(m, 65536, 128) / 32;
  assert_true(near(i.master_seconds, std::max(lt + 32 * ct, 32 * lt + ct)));
  assert_true(near(i.rate_gbps, bytes / i.master_seconds / 1e9));
  assert_true(i.rate_gbps <= 400);
  assert_true(near(i.hbm_share, i.rate_gbps / 4000));
  assert_true(near(i.tpot_increase, i.hbm_share / (1 - i.hbm_share)));
  assert_true(near(i.ttft_increase, 0));  // 2000 tokens on Qwen3-14B: compute-bound
  // A worker whose prefill is all weights and no flops is memory-bound: it stretches too.
  ModelSpec heavy = q14;
  heavy.params = 1;
  heavy.num_layers = 1;
  const Interference h = estimate_interference(s, lwm, heavy, 65536, 128, 1, 4000);
  assert_true(near(h.ttft_increase, h.tpot_increase));
  bool threw = false;
  try {
    estimate_interference(s, lwm, q14, 1024, 1, 1, 0);
  } catch (const std::invalid_argument &) {
    threw = true;
  }
  assert_true(threw);
}

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(generator_meets_sharegpt_statistics),
      cmocka_unit_test(generator_is_reproducible),
      cmocka_unit_test(long_trace_meets_its_bounds),
      cmocka_unit_test(trace_round_trips),
      cmocka_unit_test(bad_traces_name_their_line),
      cmocka_unit_test(a_session_id_is_a_number_or_a_string_not_both),
      cmocka_unit_test(tiny_capacities),
      cmocka_unit_test(tiny_trace_exact_numbers),
      cmocka_unit_test(long_turns_need_streaming),
      cmocka_unit_test(a_miss_mid_history_loads_the_longest_run),
      cmocka_unit_test(selective_write_through_backs_up_at_the_second_use),
      cmocka_unit_test(tiny_trace_compressed),
      cmocka_unit_test(compression_names_parse),
      cmocka_unit_test(presets_are_the_paper_models),
      cmocka_unit_test(max_context_model),
      cmocka_unit_test(interference_model),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
