"""Speculative decoding inside a vLLM engine on the CPU with the connector (test_vllm_engine.py
runs this in a process of its own: one process holds one vLLM engine of its kind). The drafter
is vLLM's ngram one (drafts from the context), an EAGLE head or a small draft model, both with
random weights in DRAFT_DIR, or the model's own multi-token-prediction (MTP) layer (MODEL_DIR a
MiMo model) (drafters with attention layers and K/V of their own, which they run once per draft
token: the connector leaves their layers alone). vLLM writes K/V for every draft it schedules
and computes a rejected one's position again. A long decode saves the chunks it completes; a
later turn loads them, and what it loads is compared with the K/V vLLM computes for the same
tokens from scratch once the library holds nothing. Prints "RESULT <json>".
With --async-scheduling the engine schedules asynchronously, as vLLM does by default on a GPU
(cpu_async.py); `none` runs the same turns with no drafter.
    spec_engine.py MODEL_DIR ngram|mtp|none [--async-scheduling]
    spec_engine.py MODEL_DIR eagle|draft_model DRAFT_DIR [--async-scheduling]"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

LAYERS, BLOCK, CHUNK = 4, 32, 64


def main() -> int:
    async_scheduling = "--async-scheduling" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if a != "--async-scheduling"]
    if async_scheduling:
        import cpu_async
        cpu_async.enable()
    import recording  # the connector, recording what it saves and loads
    from swiftkv.integrations import vllm as sv
    from swiftkv.integrations.vllm import worker as svw  # noqa: E402
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    if args[1] == "none":
        speculative = None
    elif args[1] == "ngram":
        speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                       "prompt_lookup_min": 1}
    elif args[1] == "mtp":  # the model's MTP layer, run once per draft token
        speculative = {"method": "mtp", "num_speculative_tokens": 2}
    else:
        speculative = {"method": args[1], "model": args[2], "num_speculative_tokens": 2}
    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 64 << 20, "chunk_tokens": CHUNK})
    llm = LLM(model=args[0], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=2048, enforce_eager=True, block_size=BLOCK, seed=0, max_num_seqs=8,
              kv_transfer_config=config, enable_prefix_caching=True,
              speculative_config=speculative, async_scheduling=async_scheduling)
    (store,) = svw.STORES.values()
    core = llm.llm_engine.engine_core.engine_core  # in this process
    runner = core.model_executor.driver_worker.worker.model_runner
    scheduling = {"scheduler": type(core.scheduler).__name__,
                  "batch_queue": core.batch_queue_size,
                  "runner_async": runner.use_async_scheduling}

    def generate(tokens, n):
        sp = SamplingParams(max_tokens=n, temperature=0, logprobs=1, detokenize=False)
        return llm.generate([TokensPrompt(prompt_token_ids=tokens)], sp,
                            use_tqdm=False)[0].outputs[0]

    def forget():
        generate([7, 8, 9], 1)  # a step that reports the finished request's saves
        return llm.reset_prefix_cache()

    # Turn 1: the prompt's tokens recur in it, so the drafter proposes from the first decode
    # step; the model (random weights) soon settles into a loop the drafter predicts, after
    # rejecting the first drafts, whose positions fall in the second chunk.
    prompt = [(13 * i) % 89 + 1 for i in range(100)]
    recording.SCHEDULED.clear()
    recording.AHEAD.clear()
    a = generate(prompt, 120)
    ahead = len(recording.AHEAD)
    steps = [s for s in recording.SCHEDULED if s[3]]
    drafts = sum(s[3] for s in steps)
    # A step computes its known token and its drafts; the next starts past those it kept.
    rejected = 0
    for (_, start, n, d), (_, nxt, _, _) in zip(recording.SCHEDULED, recording.SCHEDULED[1:]):
        if d:
            rejected += start + n - nxt
    conversation = prompt + list(a.token_ids)[:-1]  # 219 tokens with K/V: 3 chunks
    saved = store.model.lookup_named(
        recording.names_of(conversation, CHUNK, BLOCK)).prefix_tokens
    reset1 = forget()

    # Turn 2 loads the chunks turn 1 saved (two of them completed by decoding).
    turn = conversation + [(5 * i) % 71 + 3 for i in range(20)]
    recording.COMPARED.clear()
    recording.LOADED.clear()
    b = generate(turn, 8)
    offer = list(recording.OFFERS[-1][1:])
    same_bytes = [row[3] for row in recording.COMPARED]
    loaded = {layer: pages for (_, layer), (_, pages) in recording.LOADED.items()}

    # The same turn computed from scratch: the library holds nothing, vLLM's cache is empty.
    store.model.clear()
    reset2 = forget()
    recording.SAVED.clear()
    c = generate(turn, 8)
    fresh = {}
    want = recording.names_of(turn, CHUNK, BLOCK)[:saved // CHUNK].tobytes()
    for (names, layer), pages in recording.SAVED.items():
        if names[:len(want)] == want:
            fresh[layer] = pages[:saved // BLOCK]
    # Per token, the largest difference between what was loaded and what vLLM computes now:
    # bfloat16 rounding where the two runs batch the work differently, against a whole token's
    # K/V apart where a page held another token's.
    worst = []
    for layer in range(LAYERS):
        diff = (loaded[layer].float() - fresh[layer].float()).abs()
        worst.append(diff.flatten(2).amax(2).max().item() if diff.numel() else None)
    scale = max(fresh[layer].float().abs().max().item() for layer in range(LAYERS))
    print("RESULT " + json.dumps({
        **scheduling, "steps_ahead": ahead, "drafts": drafts, "rejected": rejected,
        "saved": saved, "reset": reset1 and reset2,
        "model_layers": len(store.layers), "drafter_calls": len(recording.DRAFTER_CALLS),
        "offer": offer, "same_bytes": same_bytes, "layers_loaded": sorted(loaded),
        "worst_token_diff": worst, "scale": scale,
        "same_tokens": list(b.token_ids) == list(c.token_ids),
        "logprob_diff": max(abs(b.logprobs[i][t].logprob - c.logprobs[i][t].logprob)
                            for i, t in enumerate(b.token_ids))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
