#!/usr/bin/env python3
"""bench_python: the fixed cost of the Python binding's hot calls, per call, against the raw
SWIG call under it measured in the same run (interleaved, same thread): Model.lookup with
tokens as a uint32 numpy array, an int64 numpy array, a torch int64 tensor (when torch is
there) and a list, over a prompt whose chunks are all cached in the host tier; and the
connector's per-layer calls for a batch of 64 open requests over 32 layers. With torch and a
CUDA device: a load of 16 chunks from the host tier into a pool of torch CUDA tensors (16-token
pages, vLLM layout), through swiftkv.Request and through the raw SWIG calls, each beside one
pinned-host-to-device copy of the same bytes, interleaved; GB/s of KV loaded (the C path's own
figure is bench_transfer's).

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


def cuda_loads(reps: int):
    """GB/s of a 16-chunk load from the host tier into a torch CUDA pool through Request, through
    the raw SWIG calls, and of one pinned copy of the same bytes; None without torch and a CUDA
    device. Timed from start_load to the stream's end; the request's begin (host planning) and
    finish are outside the timing, as in bench_transfer."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or swiftkv.device_count() == 0:
        return None
    layers, heads, dim, chunk, page, chunks = 8, 8, 128, 256, 16, 16
    desc = swiftkv.ModelDesc("bench-python-cuda", num_layers=layers, num_kv_heads=heads,
                             head_dim=dim, block_tokens=page, chunk_tokens=chunk, device=0)
    n_pages = chunks * chunk // page
    nbytes = chunks * desc.chunk_bytes
    out = {"Request load": [], "raw SWIG load": [], "pinned copy": []}
    with swiftkv.Context(host_budget_bytes=2 * nbytes + (64 << 20)) as ctx:
        model = ctx.register_model(desc)
        tokens = np.arange(chunks * chunk, dtype=np.uint32)
        model.store(tokens, np.full(nbytes, 0x3C, np.uint8))
        kv = [torch.zeros((2, n_pages, page, heads, dim), dtype=torch.float16, device="cuda")
              for _ in range(layers)]
        pool = model.pool_from_tensors(kv, layout="vllm")
        pages = np.random.default_rng(1).permutation(n_pages).astype(np.int32)
        stream = torch.cuda.Stream()
        src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        h = ctx.handle
        shape = swiftkv.RequestShape.LOAD_ONLY

        def load(raw: bool) -> float:
            r = model.request(pool, tokens, pages, shape=shape)
            stream.synchronize()
            t0 = time.perf_counter_ns()
            if raw:
                sh = swiftkv.stream_handle(stream)
                capi.swiftkv_start_load(h, r.id, sh)
                for layer in range(layers):
                    capi.swiftkv_wait_layer_load(h, r.id, layer, sh)
            else:
                r.start_load(stream)
                for layer in range(layers):
                    r.wait_layer_load(layer, stream)
            stream.synchronize()
            t = (time.perf_counter_ns() - t0) / 1e9
            if r.finish()["valid_end_tokens"] != len(tokens):
                raise SystemExit("bench_python: a CUDA load came back short")
            return nbytes / t / 1e9

        def copy() -> float:
            stream.synchronize()
            t0 = time.perf_counter_ns()
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
            stream.synchronize()
            return nbytes / ((time.perf_counter_ns() - t0) / 1e9) / 1e9

        load(False), load(True), copy()  # warm-up
        for _ in range(reps):
            out["Request load"].append(load(False))
            out["raw SWIG load"].append(load(True))
            out["pinned copy"].append(copy())
        pool.close()
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
    loads = cuda_loads(args.reps)
    if loads is not None:
        print(f"CUDA loads, 16 chunks of 8 layers from the host tier into a torch CUDA pool, "
              f"GB/s median / max of {args.reps}, beside one pinned copy of the same bytes")
        copy_med = statistics.median(loads["pinned copy"])
        for name, xs in loads.items():
            med, hi = statistics.median(xs), max(xs)
            report[name] = {"median_gbs": round(med, 2), "max_gbs": round(hi, 2),
                            "over_pinned_copy": round(med / copy_med, 3)}
            print(f"{name:40} {med:10.1f} {hi:10.1f} {med / copy_med:8.2f}")
    print(json.dumps({"bench": "python", "tokens": args.tokens, "results": report}))


if __name__ == "__main__":
    main()
