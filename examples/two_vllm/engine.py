"""One vLLM engine in a process of its own with the SwiftKVConnector, driven by one JSON command
a line on stdin and answering one JSON line on stdout (two_vllm.py starts two of these).

    python engine.py MODEL_DIR CONNECTOR_EXTRA_JSON [ENGINE_JSON]

ENGINE_JSON: {"blocks": vLLM's KV blocks, "tp": tensor parallel workers (vLLM's multiprocess
executor), "connector": "module:Class" (a SwiftKVConnector subclass; module on sys.path),
"log_stats": vLLM's request metrics (each request's time to first token), "max_model_len",
"max_num_seqs"}. Commands:

    {"op": "gen", "prompts": [[token, ...], ...], "max_tokens": N}
        -> {"tokens": [[...], ...], "logprobs": [[...], ...], "seconds": S, "ttft": [...],
            "cached": [...]}
    {"op": "forget"} -> vLLM's own prefix cache emptied, once the saves are reported: what comes
        next is loaded from the library
    {"op": "tiers", "prompt": [...]} -> {"tiers": [...]}: where each of its whole chunks is
        (swiftkv.Tier: 0 peer, 1 host, 2 disk, 3 not cached)
    {"op": "state"} -> the KV cache layout, vLLM's free blocks, for a lender its units lent and
        its lending counts, for a borrower the lent memory it holds (and what the connector's
        module adds: its extra_state())
    {"op": "quit"}
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process


def main(argv) -> int:
    model_dir, extra = argv[1], json.loads(argv[2])
    engine = json.loads(argv[3]) if len(argv) > 3 else {}
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    module, cls = engine.get("connector",
                             "swiftkv.integrations.vllm:SwiftKVConnector").split(":")
    config = KVTransferConfig(kv_connector=cls, kv_connector_module_path=module,
                              kv_role="kv_both", kv_load_failure_policy="recompute",
                              kv_connector_extra_config=extra)
    tp = engine.get("tp", 1)
    more = {"tensor_parallel_size": tp, "distributed_executor_backend": "mp"} if tp > 1 else {}
    llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=engine.get("max_model_len", 2048), enforce_eager=True,
              block_size=32, seed=0, max_num_seqs=engine.get("max_num_seqs", 8),
              num_gpu_blocks_override=engine.get("blocks"), kv_transfer_config=config,
              enable_prefix_caching=True, disable_log_stats=not engine.get("log_stats"), **more)
    core = llm.llm_engine.engine_core.engine_core
    conn = core.scheduler.connector
    mod = importlib.import_module(module)
    if hasattr(mod, "attach"):
        mod.attach(core)  # a checking connector's look at vLLM's scheduler
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "gen":
            sp = SamplingParams(max_tokens=cmd["max_tokens"], temperature=0, logprobs=1,
                                detokenize=False)
            t0 = time.monotonic()
            out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]], sp,
                               use_tqdm=False)
            answer = {"tokens": [list(o.outputs[0].token_ids) for o in out],
                      "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                                   o.outputs[0].logprobs)]
                                   for o in out],
                      "seconds": time.monotonic() - t0,
                      # With "log_stats": each request's time to its first token, and the tokens
                      # of its prompt it did not compute (vLLM's prefix cache and the library's).
                      "ttft": [o.metrics.first_token_latency if o.metrics else None
                               for o in out],
                      "cached": [o.num_cached_tokens or 0 for o in out]}
        elif cmd["op"] == "forget":
            llm.generate([TokensPrompt(prompt_token_ids=[7, 8, 9])],
                         SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
            answer = {"reset": bool(llm.reset_prefix_cache())}
        elif cmd["op"] == "tiers":
            from swiftkv.integrations.vllm import common, worker
            (store,) = worker.STORES.values()
            answer = {"tiers": [int(t) for t in store.model.lookup_named(
                names_of(cmd["prompt"], int(extra["chunk_tokens"]), common)).residency]}
        elif cmd["op"] == "state":
            answer = {"layout": core.vllm_config.cache_config.kv_cache_layout,
                      "free_blocks": core.scheduler.kv_cache_manager.block_pool
                      .get_num_free_blocks()}
            lender = conn.connector_scheduler.lender
            if lender is not None:
                answer.update(units=lender.num_units, unit_blocks=lender.opts.unit_blocks,
                              lent=[k for k, s in enumerate(lender.state)
                                    if s.value == "lent"],
                              lent_blocks=lender.lent_blocks(),
                              stats={k: v for k, v in vars(lender.stats).items()
                                     if k != "reclaim_s"},
                              moving=[(k, lender.state[k].value, len(lender._fenced[k]))
                                      for k in [lender._moving()] if k is not None])
            from swiftkv.integrations.vllm import worker
            stores = list(worker.STORES.values())
            if len(stores) == 1 and stores[0].borrower is not None:
                b = stores[0].borrower
                answer.update(peer_bytes=b.held(), borrowed_again=b.borrowed_again)
            if hasattr(mod, "extra_state"):
                answer.update(mod.extra_state())
        else:
            break
        print(json.dumps(answer), flush=True)
    del llm
    return 0


def names_of(tokens, chunk: int, common):
    """The connector's names of the whole chunks of tokens: vLLM's block hash of each chunk's
    last block (vLLM's sha256 block hashes, as this engine makes them)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request
    r = Request(request_id="names", prompt_token_ids=[int(t) for t in tokens],
                sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                block_hasher=get_request_block_hasher(32, sha256))
    return common.chunk_names(r.block_hashes, chunk // 32, len(tokens) // chunk)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
