"""One engine run of test_vllm_identity.py's changed-weights test, in a process of its own: vLLM's
CPU engine over the model directory's weights (safetensors) with the connector on a disk tier,
one prompt answered. Prints RESULT {offer, tokens, logprobs, saved} and leaves what it saved on
disk (its context closed, so a later run finds it).
    identity_engine.py MODEL_DIR DISK_DIR PROMPT_JSON"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def main() -> int:
    import recording
    import swiftkv
    from swiftkv.integrations import vllm as sv
    from swiftkv.integrations.vllm import worker as svw  # noqa: E402
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    model, disk, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    chunk, block = 64, 32
    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 64 << 20, "chunk_tokens": chunk,
                                   "disk_path": disk, "disk_budget_bytes": 64 << 20})
    llm = LLM(model=model, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048,
              enforce_eager=True, block_size=block, seed=0, max_num_seqs=4,
              kv_transfer_config=config, enable_prefix_caching=True)
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=1, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0]
    offer = list(recording.OFFERS[-1][1:])
    llm.generate([TokensPrompt(prompt_token_ids=[7, 8, 9])], SamplingParams(max_tokens=1),
                 use_tqdm=False)  # reports the first request's saves
    (store,) = svw.STORES.values()
    names = recording.names_of(prompt, chunk, block)
    saved = store.model.lookup_named(names).prefix_tokens
    print("RESULT " + json.dumps({
        "offer": offer, "tokens": list(out.token_ids), "saved": saved,
        "logprobs": [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)],
        "identity": store.desc.identity}), flush=True)
    store.model.move_named(names[:saved // chunk], swiftkv.Tier.DISK)
    store.close()  # the disk tier synced: the next run finds the chunks
    return 0


if __name__ == "__main__":
    sys.exit(main())
