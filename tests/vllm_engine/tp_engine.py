"""A tensor-parallel vLLM engine on the CPU with the connector (test_vllm_engine.py runs this in
a process of its own, since one process holds one vLLM distributed environment): two workers
in processes of their own under vLLM's multiprocess executor, each with one of the model's two
KV heads. Saves a prompt, empties vLLM's prefix cache, generates it again; prints a line
"RESULT <json>": the scheduler's offers, whether the outputs match. The workers record their byte comparisons in
$SWIFTKV_RECORD_DIR (recording.py).
    tp_engine.py MODEL_DIR"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def main() -> int:
    import recording  # the connector, recording what it saves and loads
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 128 << 20, "chunk_tokens": 64})
    llm = LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=2048, enforce_eager=True, block_size=32, seed=0, max_num_seqs=8,
              kv_transfer_config=config, enable_prefix_caching=True, tensor_parallel_size=2,
              distributed_executor_backend="mp")
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=2, detokenize=False)
    prompt = [(7 * i) % 997 + 1 for i in range(299)]
    a = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0]
    llm.generate([TokensPrompt(prompt_token_ids=[7, 8, 9])], sp, use_tqdm=False)
    reset = llm.reset_prefix_cache()
    b = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0]
    print("RESULT " + json.dumps({"offers": [list(o[1:]) for o in recording.OFFERS], "reset": reset,
                      "same_tokens": list(a.token_ids) == list(b.token_ids)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
