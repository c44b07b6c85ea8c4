"""bench_vllm_lending: what lending costs the lender and gives the borrower, in two real vLLM
engines (examples/two_vllm/engine.py, vLLM's CPU build, a small Llama with random weights).

Engine A serves short requests turn by turn and, half way through, a burst of long ones; engine
B serves multi-turn conversations. With lending on, A lends the idle tail of its KV cache and B
borrows it; with lending off, the same two engines with the same host budget, nothing lent. The
two modes alternate repetition by repetition (their order swapped each time); each repetition
starts both engines afresh. Reported, median and min over repetitions:

- A's time to first token, P50 and P99, over all its requests (the burst's included): the
  lender's cost. The design's bar: A's P99 with lending within 1.05x of without.
- B's prompt tokens found cached (hit rate) and recomputed, and its time to first token P50 and
  P99 over its turns after the first. The goal: fewer recomputed tokens with lending than
  without, at the same host budget.
- With lending: units lent and taken back, and each reclaim's time from its start (A's free
  blocks fell below the low watermark) to its blocks' return to A.

    python bench/bench_vllm_lending.py [--reps N] [--turns N] [--conversations N] [--workdir D]

Run it in the venv of vLLM's CPU build with the build's package on the path, as
examples/two_vllm/run.sh does (docs/building.md#benchmarks). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "two_vllm"))

import two_vllm  # noqa: E402  (the example's engine driver and model)

CHUNK = 64
A_BLOCKS = 512
BORROWER = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 64, "dtype": "bfloat16",
            "chunk_tokens": CHUNK}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(mode: str, work: str, model: str, turns: int, conversations: int, rep: int) -> dict:
    lend = mode == "lend"
    endpoint = f"ipc://{work}/a-{rep}.sock"
    a_extra = {"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK}
    if lend:
        a_extra["lend"] = {"endpoint": endpoint, "name": "A", "borrower": BORROWER}
    # B's own host memory holds 16 of its chunks (2 MiB) and it has no disk: its conversations
    # (about 55 chunks at the end) do not fit, unless it borrows.
    b_extra = {"host_budget_bytes": 2 << 20, "chunk_tokens": CHUNK}
    if lend:
        b_extra["lenders"] = [{"endpoint": endpoint, "name": "A", "units": 64}]
    a = two_vllm.Engine("A", model, a_extra, blocks=A_BLOCKS, log_stats=True)
    b = None
    try:
        small = [two_vllm.prompt(s, 200) for s in range(2)]
        a_ttft = []
        for _ in range(3):  # A serves a little first (with lending on, it lends as it steps)
            a_ttft += a.ask(op="gen", prompts=small, max_tokens=24)["ttft"]
        b = two_vllm.Engine("B", model, b_extra, blocks=1024, log_stats=True)
        convs = [two_vllm.prompt(100 + c, 400) for c in range(conversations)]
        b_ttft, prompt_tokens, cached = [], 0, 0
        for t in range(turns):
            out = b.ask(op="gen", prompts=convs, max_tokens=16)
            b.ask(op="forget")  # vLLM's own cache emptied: B's next turn finds the library's
            if t > 0:  # the first turn has nothing cached in either mode
                b_ttft += out["ttft"]
                prompt_tokens += sum(len(c) for c in convs)
                cached += sum(out["cached"])
            for i, c in enumerate(convs):
                c.extend(out["tokens"][i] + two_vllm.prompt(300 + 10 * t + i, 48))
            burst = t == turns // 2
            prompts = [two_vllm.prompt(50 + s, 1600) for s in range(8)] if burst else small
            a_ttft += a.ask(op="gen", prompts=prompts, max_tokens=4 if burst else 24)["ttft"]
        s = a.ask(op="state")
        stats = s.get("stats", {})
        return {"a_ttft_p50": pct(a_ttft, 0.5), "a_ttft_p99": pct(a_ttft, 0.99),
                "b_ttft_p50": pct(b_ttft, 0.5), "b_ttft_p99": pct(b_ttft, 0.99),
                "b_hit_rate": cached / prompt_tokens,
                "b_recomputed_tokens": prompt_tokens - cached,
                "units_lent": stats.get("units_lent", 0),
                "units_reclaimed": stats.get("units_reclaimed", 0),
                "reclaim_s_mean": (stats["reclaim_s_total"] / stats["units_reclaimed"]
                                   if stats.get("units_reclaimed") else 0.0),
                "reclaim_s_max": stats.get("reclaim_s_max", 0.0)}
    finally:
        a.close()
        if b is not None:
            b.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="bench-vllm-lending-")
    model = os.path.join(work, "model")
    os.makedirs(model, exist_ok=True)
    two_vllm.write_model(model)
    rows = {"lend": [], "plain": []}
    for rep in range(a.reps):
        for mode in (("lend", "plain") if rep % 2 == 0 else ("plain", "lend")):
            r = run(mode, work, model, a.turns, a.conversations, rep)
            rows[mode].append(r)
            print(f"rep {rep} {mode}: " + ", ".join(f"{k}={v:.4g}" for k, v in r.items()),
                  file=sys.stderr, flush=True)
    keys = list(rows["lend"][0])
    summary = {m: {k: {"median": statistics.median(r[k] for r in rows[m]),
                       "min": min(r[k] for r in rows[m])} for k in keys} for m in rows}
    print(f"two vLLM CPU engines, {a.reps} repetitions; median / min")
    print(f"{'':24}{'lending':>20}{'no lending':>20}")
    for k in keys:
        lo, pl = summary["lend"][k], summary["plain"][k]
        print(f"{k:24}{lo['median']:>11.4g} /{lo['min']:>7.4g}"
              f"{pl['median']:>11.4g} /{pl['min']:>7.4g}")
    ratio = summary["lend"]["a_ttft_p99"]["median"] / summary["plain"]["a_ttft_p99"]["median"]
    fewer = (summary["lend"]["b_recomputed_tokens"]["median"] <
             summary["plain"]["b_recomputed_tokens"]["median"])
    print(f"A's P99 TTFT, lending over not: {ratio:.3f} (the bar: <= 1.05): "
          f"{'met' if ratio <= 1.05 else 'MISSED'}")
    print(f"B's recomputed tokens fewer with lending: {'met' if fewer else 'MISSED'}")
    print(json.dumps({"bench": "vllm_lending", "reps": a.reps, "turns": a.turns,
                      "conversations": a.conversations, "summary": summary,
                      "a_p99_ratio": ratio, "meets_bar": ratio <= 1.05,
                      "fewer_recomputed": fewer}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
