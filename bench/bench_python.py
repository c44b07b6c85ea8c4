#!/usr/bin/env python3
"""bench_python: the fixed cost of the Python binding's hot calls, per call, against the raw
SWIG call under it measured in the same run (interleaved, same thread): Model.lookup with
tokens as a uint32 numpy array, an int64 numpy array, a torch int64 tensor (when torch is
there) and a list, over a prompt whose chunks are all cached in the host tier.

    PYTHONPATH=build/bindings/python python3 bench/bench_python.py [--tokens 256] [--reps 9]

Prints a table of median / min microseconds per call over --reps repetitions of --calls calls
each (after a warm-up), and one JSON line.
"""
import argparse
import json
import statistics
import time

import numpy as np

import swiftkv
from swiftkv import capi


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()

    desc = swiftkv.ModelDesc("bench-python", num_layers=2, num_kv_heads=2, head_dim=16,
                             block_tokens=16, chunk_tokens=16)
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        model = ctx.register_model(desc)
        tokens = np.arange(args.tokens, dtype=np.uint32)
        chunks = args.tokens // desc.chunk_tokens
        model.store(tokens, np.zeros(chunks * desc.chunk_bytes, np.uint8))
        res = np.zeros(chunks, np.uint8)
        out = capi.swiftkv_lookup_result_init()
        handle = ctx.handle
        cases = {
            "raw SWIG swiftkv_lookup (baseline)":
                lambda: capi.swiftkv_lookup(out, res, handle, model.id, tokens),
            "Model.lookup, uint32 numpy": lambda: model.lookup(tokens),
            "Model.lookup, int64 numpy": (lambda t=tokens.astype(np.int64): model.lookup(t)),
            "Model.lookup, list": (lambda t=[int(x) for x in tokens]: model.lookup(t)),
        }
        try:
            import torch

            cases["Model.lookup, torch int64"] = (
                lambda t=torch.from_numpy(tokens.astype(np.int64)): model.lookup(t))
        except ImportError:
            pass
        for fn in cases.values():  # warm-up
            per_call_us(fn, args.calls // 5)
        samples = {name: [] for name in cases}
        for _ in range(args.reps):
            for name, fn in cases.items():  # interleaved: every case in every repetition
                samples[name].append(per_call_us(fn, args.calls))
        assert model.lookup(tokens)["prefix_tokens"] == args.tokens

    print(f"per-call cost, {args.tokens} tokens ({chunks} cached chunks), "
          f"median / min of {args.reps} x {args.calls} calls")
    print(f"{'call':40} {'median us':>10} {'min us':>10}")
    report = {}
    for name, xs in samples.items():
        med, lo = statistics.median(xs), min(xs)
        report[name] = {"median_us": round(med, 3), "min_us": round(lo, 3)}
        print(f"{name:40} {med:10.2f} {lo:10.2f}")
    print(json.dumps({"bench": "python", "tokens": args.tokens, "results": report}))


if __name__ == "__main__":
    main()
