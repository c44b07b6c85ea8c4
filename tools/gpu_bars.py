#!/usr/bin/env python3
"""Issue 46's table from one run's benchmark JSON lines: each GPU figure over its baseline, beside
its bar, as a Markdown table to paste into bench/results/ and the note.

    gpu_bars.py BENCH.jsonl [BENCH.jsonl ...]

Reads what device-validate.sh gathers in $OUT/bench.jsonl (bench_transfer, bench_coord,
bench_attention_sdpa.py for the attention bars of DESIGN.md, ...);
a later line of the same benchmark and backend replaces an earlier one. Rows a run did not
measure (older commits had no `ahead` launch, no gaps, no peer pipeline) are left out. Each ratio
is a median over a median, as the benchmarks print them; `meets` compares it with the bar.
"""
import json
import sys


def load(paths):
    found = {}
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not JSON ({e})")
                found[(d.get("bench"), d.get("backend"))] = d
    return found


class Table:
    def __init__(self):
        self.rows = []

    def add(self, measure, value, bar, higher_is_better=True, fmt="{:.2f}", note=""):
        if value is None:
            return
        if bar is None:
            verdict = ""
        elif higher_is_better:
            verdict = "meets" if value >= bar else "short"
        else:
            verdict = "meets" if value <= bar else "short"
        shown_bar = "" if bar is None else ("≥ " if higher_is_better else "≤ ") + fmt.format(bar)
        self.rows.append((measure, fmt.format(value), shown_bar, verdict, note))

    def print(self):
        print("| measure | value | bar | | |")
        print("| --- | --- | --- | --- | --- |")
        for r in self.rows:
            print("| " + " | ".join(r) + " |")


def ratio(a, b):
    return a / b if a is not None and b else None


def transfer_rows(t, d):
    for r in d.get("rows", []):
        p = r["page"]
        t.add(f"load, {p}-token pages / one large pinned copy", ratio(r["load_gbs"], r["large_gbs"]),
              0.90)
        t.add(f"save, {p}-token pages / one large pinned copy", ratio(r["save_gbs"], r["large_gbs"]),
              0.90)
    pair = [r["hook_pair_us"] for r in d.get("rows", []) if "hook_pair_us" in r]
    batch = [r["hook_batch_us"] for r in d.get("rows", []) if "hook_batch_us" in r]
    if pair:
        t.add("hooks, one request's pair, µs (worst page size)", max(pair), 2.0, False)
    if batch:
        t.add("hooks, 64 requests batched, µs a request-layer (worst)", max(batch), 1.0, False)


def overlap_rows(t, d, what):
    for o in d.get("overlap", []):
        note = ""
        if "gap_us" in o:
            note = f"gap µs: pipeline {o['gap_us']:.1f}, alone {o['gap_alone_us']:.1f}"
            if "gap_wait_us" in o:
                note += f", alone behind a wait {o['gap_wait_us']:.1f}"
        t.add(f"{what}, {o['layers']} layers, c = {o['compute_over_transfer']:.1f} t: hidden",
              o["hidden_fraction"], 0.95, note=note)


def kernel_rows(t, d):
    ahead_wins = total = 0
    for r in d.get("rows", []):
        where = r.get("chunks_in", "malloc")
        name = f"{r['layout']} {r['page']}" + ("" if where == "malloc" else f", chunks in {where}")
        if r.get("head_dim", 128) != 128:
            name += f", head dim {r['head_dim']}"
        bar = 0.85 if where == "malloc" else None
        spread = min(r["scatter_gbs"], r["gather_gbs"])
        note = ""
        if "scatter_ahead_gbs" in r:
            ahead = min(r["scatter_ahead_gbs"], r["gather_ahead_gbs"])
            note = f"ahead {ahead / r['copy_gbs']:.2f}"
            total += 1
            ahead_wins += ahead > spread
        t.add(f"gather/scatter kernel, {name} / device copy (slower way)",
              ratio(spread, r["copy_gbs"]), bar, note=note)
    return ahead_wins, total


def decode_rows(t, d):
    ahead_wins = total = 0
    for r in d.get("rows", []):
        note = "bit-exact" if r.get("exact") else "DIFFERS from the CPU twin"
        if "decode_ahead_gbs" in r:
            note = f"ahead {r['decode_ahead_gbs'] / r['copy_gbs']:.2f}; " + note
            total += 1
            ahead_wins += r["decode_ahead_gbs"] > r["decode_gbs"]
        layout = "HND " if r.get("layout") == "hnd" else ""
        dim = f", head dim {r['head_dim']}" if r.get("head_dim", 128) != 128 else ""
        t.add(f"decode kernel, {r['codec']}, {layout}{r['page']}-token pages{dim} / device copy",
              ratio(r["decode_gbs"], r["copy_gbs"]), 0.80, note=note)
    return ahead_wins, total


def peer_rows(t, d):
    for r in d.get("rows", []):
        note = ""
        if "load_ahead_gbs" in r:
            note = f"ahead {r['load_ahead_gbs'] / r['copy_gbs']:.2f}"
        t.add(f"peer load (VMM), {r['page']}-token pages / device copy",
              ratio(r["load_gbs"], r["copy_gbs"]), 0.90, note=note)


def copy_path_rows(t, d):
    large = {r["dir"]: r["gbs"] for r in d.get("rows", []) if r["path"] == "large" and r["ok"]}
    for r in d.get("rows", []):
        if r["path"] == "large":
            continue
        if not r["ok"]:
            t.rows.append((f"copy path {r['dir']} {r['path']}", "failed", "", "", ""))
            continue
        t.add(f"copy path {r['dir']} {r['path']} / large", ratio(r["gbs"], large.get(r["dir"])),
              None)


def attention_rows(t, d):
    """bench_attention_sdpa.py's results: prefill's time over SDPA's (bar ≤ 1.1) and decode's KV
    read rate over a device copy's read + write rate (bar ≥ 0.8), for each kernel it ran."""
    for r in d.get("results", []):
        name = f"attention {r['kernel']}, {r['shape']}, {r['page']}-token pages"
        if not r.get("correct", "paged_over_sdpa_time" in r):
            t.rows.append((name, f"WRONG (max diff {r['max_abs_diff']:.2e})", "", "", ""))
            continue
        note = f"{r['paged_tflops']:.1f} TF/s, SDPA {r['sdpa_tflops']:.1f}"
        if r["shape"].startswith("decode"):
            if "kv_over_copy" in r:
                t.add(f"{name}: KV read / device copy rate", r["kv_over_copy"], 0.80,
                      note=note + f"; time / SDPA's {r['paged_over_sdpa_time']:.2f}")
            else:  # older lines: no copy beside them
                t.add(f"{name}: time / SDPA's", r["paged_over_sdpa_time"], None, note=note)
        else:
            t.add(f"{name}: time / SDPA's", r["paged_over_sdpa_time"], 1.10, False, note=note)


def growth_rows(t, d):
    t.add(f"host tier growing to {d['total_mib']} MiB (pinned slabs): saves / the same once made",
          d.get("grow_over_refill"), None, note=f"grow {d['grow_gbs']:.1f} GB/s, refill "
          f"{d['refill_gbs']:.1f}")


def coord_rows(t, d):
    for r in d.get("reclaim", []):
        if r["chunks"] == 0:
            continue
        t.add(f"reclaim, {r['chunks']} chunks: memcpy / ack", ratio(r["memcpy_ms"], r["ack_ms"]),
              0.5)
    beats = [r["us_per_beat"] for r in d.get("heartbeat", []) if "us_per_beat" in r]
    if beats:
        t.add("heartbeat CPU, µs a beat (worst row)", max(beats), 50.0, False, "{:.1f}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    found = load(sys.argv[1:])
    t = Table()
    if ("transfer", "cuda") in found:
        transfer_rows(t, found[("transfer", "cuda")])
        overlap_rows(t, found[("transfer", "cuda")], "pipeline, host chunks")
    if ("peer_overlap", "cuda") in found:
        overlap_rows(t, found[("peer_overlap", "cuda")], "pipeline, lent VMM memory")
    ahead = {}
    if ("copy_kernel", None) in found:
        ahead["gather/scatter"] = kernel_rows(t, found[("copy_kernel", None)])
    if ("decode_kernel", None) in found:
        ahead["decode"] = decode_rows(t, found[("decode_kernel", None)])
    if ("peer_load", "cuda") in found:
        peer_rows(t, found[("peer_load", "cuda")])
    if ("growth", "cuda") in found:
        growth_rows(t, found[("growth", "cuda")])
    if ("copy_paths", None) in found:
        copy_path_rows(t, found[("copy_paths", None)])
    if ("coord", None) in found:
        coord_rows(t, found[("coord", None)])
    if ("attention_sdpa", None) in found:
        attention_rows(t, found[("attention_sdpa", None)])
    if not t.rows:
        sys.exit("gpu_bars.py: no GPU benchmark lines in " + " ".join(sys.argv[1:]))
    t.print()
    for kernel, (wins, total) in ahead.items():
        if total:
            print(f"\nthe {kernel} kernel's ahead launch is the faster in {wins} of {total} rows "
                  "(SWIFTKV_COPY_KERNEL's default is spread)")


if __name__ == "__main__":
    main()
