// The planner behind `swiftkv-bench plan`. KV memory of a model on its GPU is
// HBM * utilization - weights - activation reserve; the borrower's split comes from
// swiftkv_plan_borrower and the MEU of each pair from swiftkv_geometry_meu.
#include "plan_command.hpp"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <swiftkv/swiftkv.h>

#include "cli_args.hpp"
#include "model_presets.hpp"

namespace swiftkv::bench {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct LibraryError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Placement {
  ModelSpec model;
  std::optional<double> gpu_gib;  // the model's own GPU size, else the scenario's
};

struct Options {
  std::vector<double> gpu_gib;
  std::optional<Placement> borrower;
  std::vector<Placement> lenders;
  std::vector<ModelSpec> custom;
  uint32_t block_tokens = 16;
  double utilization = 0.95;
  double activation_gib = 1.0;
  bool table = true;
  bool json = true;
};

struct Member {
  std::string name;
  double gpu_gib;
  uint64_t kv_bytes;  // 0 when the model does not fit
  bool fits;
  uint64_t meu_borrower = 0, meu_lender = 0;  // lenders only
};

struct Scenario {
  double gpu_gib;
  Member borrower;
  std::vector<Member> lenders;
  swiftkv_capacity_plan plan;
};

ModelSpec lookup(const Options &o, const std::string &name) {
  for (const ModelSpec &m : o.custom) {
    if (m.name == name) return m;
  }
  if (auto p = find_preset(name)) return *p;
  std::string known;
  for (const ModelSpec &m : model_presets()) known += (known.empty() ? "" : ", ") + m.name;
  throw UsageError("unknown model '" + name + "': the presets are " + known +
                   "; or define it with --model");
}

Placement parse_placement(const Options &o, const std::string &flag, const std::string &text) {
  const size_t at = text.find('@');
  Placement p{lookup(o, text.substr(0, at)), std::nullopt};
  if (at != std::string::npos) p.gpu_gib = parse_number(flag, text.substr(at + 1), 1, 1 << 20);
  return p;
}

// NAME:LAYERS:KV_HEADS:HEAD_DIM:WEIGHT_GIB[:DTYPE]
ModelSpec parse_model(const std::string &text) {
  std::vector<std::string> f;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ':');) f.push_back(part);
  if (f.size() != 5 && f.size() != 6) {
    throw UsageError("--model: '" + text +
                     "' is not NAME:LAYERS:KV_HEADS:HEAD_DIM:WEIGHT_GIB[:DTYPE]");
  }
  if (f[0].empty() || f[0].find('@') != std::string::npos) {
    throw UsageError("--model: the name must be non-empty and without '@'");
  }
  ModelSpec m;
  m.name = f[0];
  m.num_layers = static_cast<uint32_t>(parse_number("--model layers", f[1], 1, 1 << 16));
  m.num_kv_heads = static_cast<uint32_t>(parse_number("--model kv_heads", f[2], 1, 1 << 16));
  m.head_dim = static_cast<uint32_t>(parse_number("--model head_dim", f[3], 1, 1 << 16));
  m.weight_bytes =
      static_cast<uint64_t>(parse_number("--model weight_gib", f[4], 0, 1 << 20) * kGiB);
  m.dtype = SWIFTKV_DTYPE_F16;
  if (f.size() == 6) {
    static const std::pair<const char *, swiftkv_dtype> names[] = {
        {"f16", SWIFTKV_DTYPE_F16},           {"bf16", SWIFTKV_DTYPE_BF16},
        {"f32", SWIFTKV_DTYPE_F32},           {"fp8_e4m3", SWIFTKV_DTYPE_FP8_E4M3},
        {"fp8_e5m2", SWIFTKV_DTYPE_FP8_E5M2}, {"i8", SWIFTKV_DTYPE_I8}};
    bool found = false;
    for (const auto &[n, d] : names) {
      if (f[5] == n) {
        m.dtype = d;
        found = true;
      }
    }
    if (!found) throw UsageError("--model: unknown dtype '" + f[5] + "'");
  }
  return m;
}

Options parse(const std::vector<std::string> &args) {
  Options o;
  std::vector<std::pair<std::string, std::string>> placements;  // resolved after --model
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string &a = args[i];
    auto value = [&]() -> const std::string & {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    if (a == "--gpu-gib") {
      o.gpu_gib.push_back(parse_number(a, value(), 1, 1 << 20));
    } else if (a == "--borrower" || a == "--lender") {
      placements.emplace_back(a, value());
    } else if (a == "--model") {
      o.custom.push_back(parse_model(value()));
    } else if (a == "--block-tokens") {
      o.block_tokens = static_cast<uint32_t>(parse_number(a, value(), 1, 1 << 20));
    } else if (a == "--utilization") {
      o.utilization = parse_number(a, value(), 0.01, 1.0);
    } else if (a == "--activation-gib") {
      o.activation_gib = parse_number(a, value(), 0, 1 << 20);
    } else if (a == "--format") {
      const std::string &f = value();
      if (f != "table" && f != "json" && f != "both")
        throw UsageError("--format: table, json or both");
      o.table = f != "json";
      o.json = f != "table";
    } else {
      throw UsageError("unknown argument '" + a + "'");
    }
  }
  for (const auto &[flag, text] : placements) {
    Placement p = parse_placement(o, flag, text);
    if (flag == "--borrower") {
      if (o.borrower) throw UsageError("--borrower given twice; a plan has one borrower");
      o.borrower = p;
    } else {
      o.lenders.push_back(p);
    }
  }
  if (!o.borrower && !o.lenders.empty()) throw UsageError("--lender needs a --borrower");
  return o;
}

void check(swiftkv_status st, const char *what) {
  if (st != SWIFTKV_OK) {
    throw LibraryError(std::string(what) + ": " + swiftkv_status_string(st) + ": " +
                       swiftkv_last_error_message());
  }
}

Member place(const Options &o, const Placement &p, double scenario_gib) {
  Member m;
  m.name = p.model.name;
  m.gpu_gib = p.gpu_gib.value_or(scenario_gib);
  m.kv_bytes = kv_bytes_on_gpu(p.model, m.gpu_gib, o.utilization, o.activation_gib);
  m.fits = m.kv_bytes > 0;
  return m;
}

Scenario plan_one(const Options &o, double gpu_gib, const Placement &borrower,
                  const std::vector<Placement> &lenders) {
  Scenario s{gpu_gib, place(o, borrower, gpu_gib), {}, SWIFTKV_CAPACITY_PLAN_INIT};
  const swiftkv_model_desc bdesc = to_desc(borrower.model, o.block_tokens);
  std::vector<uint64_t> lender_bytes;
  for (const Placement &l : lenders) {
    Member m = place(o, l, gpu_gib);
    const swiftkv_model_desc ldesc = to_desc(l.model, o.block_tokens);
    check(swiftkv_geometry_meu(&bdesc, &ldesc, &m.meu_borrower, &m.meu_lender),
          "swiftkv_geometry_meu");
    lender_bytes.push_back(m.kv_bytes);
    s.lenders.push_back(m);
  }
  check(swiftkv_plan_borrower(&bdesc, s.borrower.kv_bytes, lender_bytes.data(), lender_bytes.size(),
                              &s.plan),
        "swiftkv_plan_borrower");
  return s;
}

// SwiftCache §5.3: LWM-1M-Text borrows from Qwen3-14B and Qwen3-8B on 96, 80 and 32 GB GPUs, and
// from two Qwen3-8B on 24 GB, where Qwen3-14B does not fit.
std::vector<Scenario> default_scenarios(const Options &o) {
  const std::vector<double> sizes =
      o.gpu_gib.empty() ? std::vector<double>{96, 80, 32, 24} : o.gpu_gib;
  std::vector<Scenario> out;
  for (double gib : sizes) {
    const Placement borrower{*find_preset("lwm-1m-text"), std::nullopt};
    const char *first = gib >= 32 ? "qwen3-14b" : "qwen3-8b";
    const std::vector<Placement> lenders = {{*find_preset(first), std::nullopt},
                                            {*find_preset("qwen3-8b"), std::nullopt}};
    out.push_back(plan_one(o, gib, borrower, lenders));
  }
  return out;
}

double gain(const Scenario &s) {
  return s.plan.baseline_context_tokens == 0
             ? 0.0
             : static_cast<double>(s.plan.max_context_tokens) /
                   static_cast<double>(s.plan.baseline_context_tokens);
}

std::string gib_text(uint64_t bytes, bool fits) {
  if (!fits) return "no fit";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", static_cast<double>(bytes) / kGiB);
  return b;
}

void print_table(const Options &o, const std::vector<Scenario> &all) {
  std::printf("KV capacity plan (block %u tokens, utilization %.2f, activation reserve %.2f GiB)\n",
              o.block_tokens, o.utilization, o.activation_gib);
  std::printf("%-7s %-12s %-8s %-40s %8s %8s %8s %10s %10s %6s\n", "gpu_GiB", "borrower", "kv_GiB",
              "lenders (kv_GiB, MEU b:l)", "lent_blk", "stream", "regular", "max_ctx", "baseline",
              "gain");
  for (const Scenario &s : all) {
    std::string lenders;
    for (const Member &l : s.lenders) {
      if (!lenders.empty()) lenders += ", ";
      lenders += l.name + " " + gib_text(l.kv_bytes, l.fits) + " " +
                 std::to_string(l.meu_borrower) + ":" + std::to_string(l.meu_lender);
    }
    if (lenders.empty()) lenders = "-";
    const double g = gain(s);
    char gain_text[16] = "-";
    if (g > 0) std::snprintf(gain_text, sizeof gain_text, "%.2fx", g);
    std::printf("%-7g %-12s %-8s %-40s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64
                " %10" PRIu64 " %6s\n",
                s.gpu_gib, s.borrower.name.c_str(),
                gib_text(s.borrower.kv_bytes, s.borrower.fits).c_str(), lenders.c_str(),
                s.plan.lender_full_blocks, s.plan.stream_blocks, s.plan.regular_blocks,
                s.plan.max_context_tokens, s.plan.baseline_context_tokens, gain_text);
  }
}

void print_member(const Member &m, bool lender) {
  std::printf("{\"model\":\"%s\",\"gpu_gib\":%g,\"kv_bytes\":%" PRIu64 ",\"fits\":%s",
              m.name.c_str(), m.gpu_gib, m.kv_bytes, m.fits ? "true" : "false");
  if (lender) {
    std::printf(",\"meu_borrower_blocks\":%" PRIu64 ",\"meu_lender_blocks\":%" PRIu64,
                m.meu_borrower, m.meu_lender);
  }
  std::printf("}");
}

void print_json(const Options &o, const std::vector<Scenario> &all) {
  std::printf(
      "{\"tool\":\"swiftkv-bench\",\"command\":\"plan\",\"version\":\"%s\",\"block_tokens\":%u,"
      "\"utilization\":%g,\"activation_gib\":%g,\"scenarios\":[",
      swiftkv_version_string(), o.block_tokens, o.utilization, o.activation_gib);
  for (size_t i = 0; i < all.size(); ++i) {
    const Scenario &s = all[i];
    std::printf("%s{\"gpu_gib\":%g,\"borrower\":", i ? "," : "", s.gpu_gib);
    print_member(s.borrower, false);
    std::printf(",\"lenders\":[");
    for (size_t j = 0; j < s.lenders.size(); ++j) {
      if (j) std::printf(",");
      print_member(s.lenders[j], true);
    }
    std::printf("],\"lender_full_blocks\":%" PRIu64 ",\"stream_blocks\":%" PRIu64
                ",\"regular_blocks\":%" PRIu64 ",\"max_context_tokens\":%" PRIu64
                ",\"baseline_context_tokens\":%" PRIu64 ",\"gain\":%.4f}",
                s.plan.lender_full_blocks, s.plan.stream_blocks, s.plan.regular_blocks,
                s.plan.max_context_tokens, s.plan.baseline_context_tokens, gain(s));
  }
  std::printf("]}\n");
}

}  // namespace

void print_plan_usage() {
  std::printf(
      "usage: swiftkv-bench plan [options]\n"
      "  Plans each borrower's layer stream cache and regular cache (SwiftCache Eq. 1-5) and\n"
      "  compares its longest context with the same GPU without sharing. Without --borrower it\n"
      "  plans the paper's §5.3 servers: LWM-1M-Text borrowing from Qwen3-14B + Qwen3-8B\n"
      "  (96, 80, 32 GiB GPUs) or from two Qwen3-8B (24 GiB).\n"
      "options:\n"
      "  --gpu-gib N              HBM of each GPU in GiB; repeat for one plan per size\n"
      "  --borrower MODEL[@GIB]   the borrowing model (optionally on a GPU of its own size)\n"
      "  --lender MODEL[@GIB]     a lending model; repeat for several\n"
      "  --model NAME:LAYERS:KV_HEADS:HEAD_DIM:WEIGHT_GIB[:DTYPE]\n"
      "                           define a model (dtype f16 bf16 f32 fp8_e4m3 fp8_e5m2 i8)\n"
      "  --block-tokens N         tokens per block (16)\n"
      "  --utilization F          fraction of HBM the engine may use (0.95)\n"
      "  --activation-gib F       activation reserve per GPU in GiB (1)\n"
      "  --format table|json|both output (both: a table, then one JSON line)\n"
      "models:");
  for (const ModelSpec &m : model_presets()) {
    std::printf(" %s", m.name.c_str());
  }
  std::printf("\n");
}

int run_plan(const std::vector<std::string> &args) {
  try {
    for (const std::string &a : args) {
      if (a == "-h" || a == "--help") {
        print_plan_usage();
        return 0;
      }
    }
    const Options o = parse(args);
    std::vector<Scenario> all;
    if (!o.borrower) {
      all = default_scenarios(o);
    } else {
      if (o.gpu_gib.empty() && !o.borrower->gpu_gib) {
        throw UsageError("give --gpu-gib or MODEL@GIB for the borrower");
      }
      const std::vector<double> sizes =
          o.gpu_gib.empty() ? std::vector<double>{*o.borrower->gpu_gib} : o.gpu_gib;
      for (double gib : sizes) all.push_back(plan_one(o, gib, *o.borrower, o.lenders));
    }
    if (o.table) print_table(o, all);
    if (o.json) print_json(o, all);
    return 0;
  } catch (const UsageError &e) {
    std::fprintf(stderr, "swiftkv-bench plan: %s\n", e.what());
    return 2;
  } catch (const LibraryError &e) {
    std::fprintf(stderr, "swiftkv-bench plan: %s\n", e.what());
    return 1;
  }
}

}  // namespace swiftkv::bench
