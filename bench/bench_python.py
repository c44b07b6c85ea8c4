#!/usr/bin/env python3
"""bench_python: the fixed cost of the Python binding's hot calls, per call, against the raw
SWIG call under it measured in the same run (interleaved, same thread): Model.lookup with
tokens as a uint32 numpy array, an int64 numpy array, a torch int64 tensor (when torch is
there) and a list, over a prompt whose chunks are all cached in the host tier; and the
connector's per-layer calls for a batch of 64 open requests over 32 layers.

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


BATCH, LAYERS = 64, 32


def connector_calls(reps: int) -> dict:
    """Microseconds per connector call for a batch of BATCH requests (one 16-token chunk saved
    each, nothing loaded) over LAYERS layers: through swiftkv.Request, and through the raw SWIG
    calls (the baseline), batch after batch, interleaved."""
    desc = swiftkv.ModelDesc("bench-connector", num_layers=LAYERS, num_kv_heads=2, head_dim=16,
                             block_tokens=16, chunk_tokens=16)
    out = {"Request.wait_layer_load/save_layer": [], "raw SWIG wait_layer_load/save_layer": []}
    with swiftkv.Context(host_budget_bytes=256 << 20) as ctx:
        model = ctx.register_model(desc)
        pool = model.pool_create(BATCH)
        seq = 0

        def batch(raw: bool) -> float:
            nonlocal seq
            reqs = []
            for i in range(BATCH):
                seq += 1
                reqs.append(model.request(pool, np.arange(16, dtype=np.uint32) + seq * 16, [i]))
            for r in reqs:
                r.start_load()
            h = ctx.handle
            t0 = time.perf_counter_ns()
            for layer in range(LAYERS):
                if raw:
                    for r in reqs:
                        capi.swiftkv_wait_layer_load(h, r.id, layer, None)
                    for r in reqs:
                        capi.swiftkv_save_layer(h, r.id, layer, None)
                else:
                    for r in reqs:
                        r.wait_layer_load(layer)
                    for r in reqs:
                        r.save_layer(layer)
            t1 = time.perf_counter_ns()
            for r in reqs:
                r.wait_save()
                r.finish()
            ctx.clear()
            return (t1 - t0) / (BATCH * LAYERS * 2) / 1000.0

        batch(False)  # warm-up
        batch(True)
        for _ in range(reps):
            out["Request.wait_layer_load/save_layer"].append(batch(False))
            out["raw SWIG wait_layer_load/save_layer"].append(batch(True))
    return out


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

    connector = connector_calls(args.reps)

    print(f"per-call cost, {args.tokens} tokens ({chunks} cached chunks), "
          f"median / min of {args.reps} x {args.calls} calls")
    print(f"{'call':40} {'median us':>10} {'min us':>10}")
    report = {}
    for name, xs in samples.items():
        med, lo = statistics.median(xs), min(xs)
        report[name] = {"median_us": round(med, 3), "min_us": round(lo, 3)}
        print(f"{name:40} {med:10.2f} {lo:10.2f}")
    print(f"connector, {BATCH} open requests x {LAYERS} layers, wait_layer_load + save_layer "
          f"per request and layer, median / min of {args.reps} batches")
    for name, xs in connector.items():
        med, lo = statistics.median(xs), min(xs)
        report[name] = {"median_us": round(med, 3), "min_us": round(lo, 3)}
        print(f"{name:40} {med:10.2f} {lo:10.2f}")
    print(json.dumps({"bench": "python", "tokens": args.tokens, "results": report}))


if __name__ == "__main__":
    main()
