#!/usr/bin/env python3
"""bench_vllm_connector: what the vLLM connector adds to vLLM's per-layer calls, on the host.

vLLM calls wait_for_layer_load and save_kv_layer once per attention layer per step. For a step of
64 requests that each save a chunk (32 layers, 16-token chunks, a host pool), the connector's
pair of calls per layer is timed against the library's batch calls (swiftkv.wait_layer_load_batch
and save_layer_batch) on an identical step, the two alternated step by step after a warm-up;
also the pair with nothing to do (a decode step between chunk boundaries: the hooks' fixed
cost). Microseconds per layer (both calls, the whole batch), median and min over --reps steps.

Also the scheduler's lookup of a 32k-token prompt whose first half is cached (256-token chunks),
its chunks named from vLLM's block hashes as the connector names them:
in its own process (vLLM's single-process executor) against the workers' lookup sockets of one
and of two worker processes (the multiprocess executor), alternated rep by rep after a warm-up;
microseconds per lookup, median and min over --reps reps of 50 lookups.
Prints a table and one JSON line.

    PYTHONPATH=build/bindings/python <vllm venv>/bin/python bench/bench_vllm_connector.py

Runs with vLLM installed (tests/vllm/run.sh's venv) or, without it, with the stand-in of
tests/python/test_vllm_worker.py.
"""
import argparse
import hashlib
import importlib
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch

import swiftkv

BATCH, LAYERS, HEADS, DIM, BLOCK, CHUNK = 64, 32, 2, 16, 16, 16
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def load_connector():
    try:
        importlib.import_module("vllm")
        where = "vLLM " + sys.modules["vllm"].__version__
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "tests", "python"))
        importlib.import_module("test_vllm_worker")._stand_in_vllm()
        where = "a stand-in of vLLM"
    return importlib.import_module("swiftkv.integrations.vllm"), where


LOOKUP_TOKENS, LOOKUP_CHUNK = 32768, 256


def lookup_model():
    """A context and model holding the first half of the lookup prompt's chunks."""
    ctx = swiftkv.Context(host_budget_bytes=96 << 20)
    model = ctx.register_model(swiftkv.ModelDesc(
        name="bench-lookup", num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
        block_tokens=BLOCK, chunk_tokens=LOOKUP_CHUNK, dtype=swiftkv.DType.F16))
    # The prompt's block hashes as vLLM makes them (32-byte sha256 digests), and its chunks named
    # as the connector names them: by the hash of each chunk's last block.
    hashes = [hashlib.sha256(i.to_bytes(8, "little")).digest()
              for i in range(LOOKUP_TOKENS // BLOCK)]
    names = np.frombuffer(b"".join(hashes[LOOKUP_CHUNK // BLOCK - 1::LOOKUP_CHUNK // BLOCK]),
                          np.uint8).reshape(-1, 32)
    half = len(names) // 2
    model.store_named(names[:half], np.zeros(half * model.desc.chunk_bytes, np.uint8))
    return ctx, model, hashes


def lookup_server(path: str) -> int:
    """--lookup-server PATH: a worker's lookup socket over lookup_model(), until stdin closes."""
    sv, _ = load_connector()
    ctx, model, _ = lookup_model()
    server = sv.lookup.LookupServer(model, path)
    print("ready", flush=True)
    sys.stdin.read()
    server.close()
    ctx.close()
    return 0


def lookup_rows(sv, reps: int) -> dict:
    import subprocess
    import tempfile
    d = tempfile.mkdtemp(prefix="swiftkv-bench-")
    paths = [os.path.join(d, f"{r}.sock") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--lookup-server", p],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for p in paths]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        ctx, model, hashes = lookup_model()
        one, two = sv.lookup.LookupClient(paths[:1], 30.0), sv.lookup.LookupClient(paths, 30.0)
        per, chunks = LOOKUP_CHUNK // BLOCK, LOOKUP_TOKENS // LOOKUP_CHUNK

        def names():  # the connector's names of the prompt's chunks, from vLLM's hashes
            return sv.common.chunk_names(hashes, per, chunks)

        want = model.lookup_named(names()).residency
        assert (want[:chunks // 2] == int(swiftkv.Tier.HOST)).all()
        assert (one.lookup(names()) == want).all() and (two.lookup(names()) == want).all()
        cases = {"lookup, in process": lambda: model.lookup_named(names()),
                 "lookup, 1 worker process": lambda: one.lookup(names()),
                 "lookup, 2 worker processes": lambda: two.lookup(names())}
        rows = {name: [] for name in cases}
        for i in range(reps + 2):  # two warm-up reps
            for name, f in cases.items():
                t0 = time.perf_counter_ns()
                for _ in range(50):
                    f()
                if i >= 2:
                    rows[name].append((time.perf_counter_ns() - t0) / 50 / 1000.0)
        one.close()
        two.close()
        ctx.close()
        return rows
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--lookup-server", metavar="PATH", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.lookup_server:
        return lookup_server(a.lookup_server)
    sv, where = load_connector()
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    blocks = BATCH * 4
    config = SimpleNamespace(
        parallel_config=SimpleNamespace(world_size=1, rank=0, distributed_executor_backend="uni"),
        kv_transfer_config=SimpleNamespace(
            engine_id="bench", kv_connector_extra_config={"host_budget_bytes": 512 << 20,
                                                          "chunk_tokens": CHUNK}),
        model_config=SimpleNamespace(model="bench-vllm-connector", revision=None),
        load_config=SimpleNamespace(load_format="dummy"))
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM,
                             dtype=torch.float16)
    kv_config = SimpleNamespace(num_blocks=blocks, kv_cache_groups=[
        SimpleNamespace(kv_cache_spec=spec, layer_names=list(NAMES))])
    w = sv.SwiftKVConnector(config, KVConnectorRole.WORKER, kv_config)
    tensors = {n: torch.zeros(2, blocks, BLOCK, HEADS, DIM, dtype=torch.float16) for n in NAMES}
    w.register_kv_caches(tensors)
    store = w.connector_worker.store
    seq = [0]

    def step_requests():
        """BATCH requests of one new 16-token chunk each (never cached before)."""
        out = []
        for i in range(BATCH):
            seq[0] += 1
            name = np.frombuffer(hashlib.sha256(seq[0].to_bytes(8, "little")).digest(),
                                 np.uint8).reshape(1, 32)
            out.append(sv.common.RequestMeta(f"r{seq[0]}", CHUNK, name, [i]))
        return out

    def connector_step(reqs) -> float:
        meta = sv.SwiftKVConnectorMetadata(requests=reqs)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        t0 = time.perf_counter_ns()
        for name in NAMES:
            w.wait_for_layer_load(name)
            w.save_kv_layer(name, tensors[name], None)
        t1 = time.perf_counter_ns()
        w.wait_for_save()
        w.clear_connector_metadata()
        for r in reqs:
            w.connector_worker.drain(r.req_id)
        w.get_finished({r.req_id for r in reqs})
        return (t1 - t0) / LAYERS / 1000.0

    def library_step(reqs) -> float:
        opened = [store.model.request(store.pool, r.n_tokens, r.block_ids,
                                      shape=swiftkv.RequestShape.SAVE_ONLY, names=r.names)
                  for r in reqs]
        t0 = time.perf_counter_ns()
        for layer in range(LAYERS):
            swiftkv.wait_layer_load_batch([], layer)
            swiftkv.save_layer_batch(opened, layer)
        t1 = time.perf_counter_ns()
        for r in opened:
            r.wait_save()
            r.finish()
        return (t1 - t0) / LAYERS / 1000.0

    rows = {"connector, 64 saving": [], "library batch calls, 64 saving": [],
            "connector, nothing to do": []}
    for i in range(a.reps + 2):  # two warm-up steps
        c = connector_step(step_requests())
        lib = library_step(step_requests())
        idle = connector_step([])
        if i >= 2:
            rows["connector, 64 saving"].append(c)
            rows["library batch calls, 64 saving"].append(lib)
            rows["connector, nothing to do"].append(idle)
        store.ctx.clear()
    w.shutdown()
    lookups = lookup_rows(sv, a.reps)
    print(f"vLLM connector hooks on the host ({where}): µs per layer (wait_for_layer_load + "
          f"save_kv_layer for the whole batch), {LAYERS} layers, median / min of {a.reps} steps")
    print(f"{'case':36} {'median':>8} {'min':>8}")
    result = {}
    for name, v in rows.items():
        med, low = statistics.median(v), min(v)
        result[name] = {"median_us": med, "min_us": low}
        print(f"{name:36} {med:8.1f} {low:8.1f}")
    print(f"the scheduler's lookup of a {LOOKUP_TOKENS}-token prompt, half cached "
          f"({LOOKUP_CHUNK}-token chunks): µs per lookup, median / min of {a.reps} reps")
    for name, v in lookups.items():
        med, low = statistics.median(v), min(v)
        result[name] = {"median_us": med, "min_us": low}
        print(f"{name:36} {med:8.1f} {low:8.1f}")
    over = (result["connector, 64 saving"]["median_us"] -
            result["library batch calls, 64 saving"]["median_us"])
    print(f"connector over the library's batch calls: {over:.1f} µs per layer, "
          f"{over / BATCH:.2f} µs per request and layer")
    # The design's bar: a connector step with nothing to load or save costs <= 5 µs per layer.
    idle = result["connector, nothing to do"]["median_us"]
    meets = idle <= 5.0
    print(f"the design's bar: a step with nothing to do at <= 5 µs per layer: {idle:.1f} µs, "
          f"{'met' if meets else 'MISSED'}")
    print(json.dumps({"bench": "vllm_connector", "vllm": where, "batch": BATCH, "layers": LAYERS,
                      "results": result, "over_library_us_per_layer": over,
                      "meets_bar": meets}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
