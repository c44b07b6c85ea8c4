"""A worker process of a tensor-parallel engine in the connector's tests, as vLLM's
multiprocess executor makes one: its own process, its rank in the engine's parallel config, its
shard of the KV heads in tensors of its own, the connector's worker side over them. The test
(the engine core: the scheduler) drives it through a pipe, one command at a time."""

from __future__ import annotations

import traceback

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvsim import CHUNK, HEADS, KVTensors, names_of, worker_step


def main(conn, config, kv_config, rank: int, layout: str, num_blocks: int) -> None:
    from swiftkv.integrations import vllm as sv

    world = config.parallel_config.world_size
    h = HEADS // world
    heads = slice(rank * h, (rank + 1) * h)
    try:
        config.parallel_config.rank = rank  # as vLLM's WorkerBase sets it
        w = sv.SwiftKVConnector(config, KVConnectorRole.WORKER, kv_config)
        kv = KVTensors(layout, num_blocks, heads=h)
        w.register_kv_caches(kv.tensors)
        conn.send(("ok", w.connector_worker.store.server.path))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        cmd, arg = conn.recv()
        try:
            if cmd == "step":
                meta, plan, has_sync, runs_layers, finished = arg
                got = worker_step(w, kv, meta, plan, has_sync, runs_layers, finished, heads)
            elif cmd == "prefix":  # the tokens of arg this worker holds, from the start
                got = w.connector_worker.store.model.lookup_named(names_of(arg)).prefix_tokens
            elif cmd == "clear":  # drops the chunks of arg from the one after its first `keep`
                tokens, keep = arg
                key = names_of(tokens)
                kept = keep // CHUNK
                model = w.connector_worker.store.model
                if kept:
                    model.pin_named(key[:kept])
                got = model.clear_named(key)
                if kept:
                    model.unpin_named(key[:kept])
            elif cmd == "stats":
                st = w.connector_worker.store.ctx.stats()
                got = {"requests_open": st["requests_open"],
                       "capacity_bytes": list(st["capacity_bytes"])}
            elif cmd == "stop":
                w.shutdown()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", got))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
