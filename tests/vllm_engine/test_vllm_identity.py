"""The connector never hands one identity's K/V to another, inside a real vLLM engine on the CPU
(vLLM's CPU build, a 4-layer Llama with random weights): requests that differ only in their LoRA
adapter, their cache salt or their prompt embeddings (whose token ids vLLM makes all 0) share
the tokens the library used to key chunks by, and each must compute its own K/V. For each, the
second identity is offered nothing the first saved, and its tokens and log-probabilities equal
its own run on an empty cache; the same identity still finds what it saved.

vLLM's own prefix cache is emptied before every request that checks an offer, so everything
offered comes from the connector. Adapters are made here with random weights.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache

import pytest  # noqa: E402
import torch  # noqa: E402

import recording  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.inputs import EmbedsPrompt, TokensPrompt  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402

LAYERS, BLOCK, CHUNK, HIDDEN = 4, 32, 64, 256
PROMPT = [(11 * i) % 997 + 1 for i in range(299)]  # 4 whole chunks and a bit


def write_model(d, seed=None):
    """A 4-layer Llama's config in d, and with a seed, random weights in safetensors too (vLLM's
    dummy weights are too small for an adapter or an embedding to change the answer)."""
    recording.write_llama(d)
    if seed is not None:
        recording.write_weights(d, seed, HIDDEN, LAYERS)


def write_adapter(d, seed):
    """A rank-8 LoRA adapter of q_proj and v_proj with random weights, as PEFT saves one."""
    from safetensors.torch import save_file
    d.mkdir()
    (d / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8, "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
        "lora_dropout": 0.0, "base_model_name_or_path": "random-llama"}))
    g = torch.Generator().manual_seed(seed)
    w = {}
    for i in range(LAYERS):
        for proj, out in (("q_proj", 256), ("v_proj", 128)):
            p = f"base_model.model.model.layers.{i}.self_attn.{proj}."
            w[p + "lora_A.weight"] = torch.randn(8, HIDDEN, generator=g) * 0.5
            w[p + "lora_B.weight"] = torch.randn(out, 8, generator=g) * 0.5
    save_file(w, str(d / "adapter_model.safetensors"))
    return str(d)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    write_model(d, seed=7)  # random weights large enough for adapters and embeddings to matter
    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 64 << 20, "chunk_tokens": CHUNK})
    engine = LLM(model=str(d), skip_tokenizer_init=True, dtype="bfloat16",
                 max_model_len=2048, enforce_eager=True, block_size=BLOCK, seed=0,
                 max_num_seqs=8, kv_transfer_config=config, enable_prefix_caching=True,
                 enable_lora=True, max_lora_rank=8, max_loras=2, enable_prompt_embeds=True)
    yield engine
    del engine


def run(llm, prompt, lora=None):
    """One request's greedy tokens and their log-probabilities, and the connector's offer to it
    (vLLM's own hit, tokens offered)."""
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=1, detokenize=False)
    out = llm.generate([prompt], sp, use_tqdm=False, lora_request=lora)[0].outputs[0]
    offer = recording.OFFERS[-1][1:]
    logprobs = [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]
    return list(out.token_ids), logprobs, offer


def forget(llm, connector_too=False):
    """Empties vLLM's prefix cache (and the library's), after a step that reports the saves of
    finished requests."""
    llm.generate([TokensPrompt(prompt_token_ids=[7, 8, 9])],
                 SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    assert llm.reset_prefix_cache(reset_connector=connector_too)


def check_apart(llm, first, second, compute_differently=True):
    """first and second (each (prompt, lora)) are identities that must not share: second is
    offered nothing first saved and answers as on an empty cache; each finds its own.
    compute_differently: the two answer differently (not so for tenants: a salt changes who may
    share, not what is computed)."""
    forget(llm, connector_too=True)
    a, a_lp, _ = run(llm, *first)
    forget(llm)
    b, b_lp, offer = run(llm, *second)
    assert offer == (0, 0), "the second identity was offered the first's chunks"
    forget(llm, connector_too=True)
    b_alone, b_alone_lp, offer = run(llm, *second)
    assert offer == (0, 0)
    assert b == b_alone
    assert b_lp == pytest.approx(b_alone_lp, abs=1e-3)
    if compute_differently:
        assert b != a  # the identities do compute differently: the check above can fail
    # Each identity still finds its own chunks.
    forget(llm)
    again, again_lp, offer = run(llm, *second)
    assert offer == (0, 256) and again == b_alone
    assert again_lp == pytest.approx(b_alone_lp, abs=1e-3)
    forget(llm, connector_too=True)
    run(llm, *first)
    forget(llm)
    a_again, _, offer = run(llm, *first)
    assert offer == (0, 256) and a_again == a


def test_lora_adapters_never_share_kv(llm, tmp_path):
    a = LoRARequest("adapter-a", 1, write_adapter(tmp_path / "a", 1))
    b = LoRARequest("adapter-b", 2, write_adapter(tmp_path / "b", 2))
    check_apart(llm, (TokensPrompt(prompt_token_ids=PROMPT), a),
                (TokensPrompt(prompt_token_ids=PROMPT), b))
    # The base model (no adapter) neither.
    check_apart(llm, (TokensPrompt(prompt_token_ids=PROMPT), a),
                (TokensPrompt(prompt_token_ids=PROMPT), None))


def test_cache_salt_keeps_tenants_apart(llm):
    """cache_salt exists so that a tenant cannot learn from cached-token counts or timing what
    another sent: tenant b is offered (and reported cached) nothing of tenant a's."""
    check_apart(llm, (TokensPrompt(prompt_token_ids=PROMPT, cache_salt="tenant-a"), None),
                (TokensPrompt(prompt_token_ids=PROMPT, cache_salt="tenant-b"), None),
                compute_differently=False)
    # Nor is a request without a salt offered a salted tenant's chunks.
    check_apart(llm, (TokensPrompt(prompt_token_ids=PROMPT, cache_salt="tenant-a"), None),
                (TokensPrompt(prompt_token_ids=PROMPT), None), compute_differently=False)


def test_prompt_embeddings_never_collide(llm):
    """vLLM gives an embeddings prompt token ids that are all 0: two such prompts of the same
    length looked alike to a cache keyed by tokens."""
    g = torch.Generator().manual_seed(3)
    one = torch.randn(len(PROMPT), HIDDEN, generator=g).to(torch.bfloat16)
    two = torch.randn(len(PROMPT), HIDDEN, generator=g).to(torch.bfloat16)
    check_apart(llm, (EmbedsPrompt(prompt_embeds=one), None),
                (EmbedsPrompt(prompt_embeds=two), None))


def test_changed_weights_are_not_served_old_kv(tmp_path):
    """New weights at the same model path with the same disk tier (identity_engine.py, an engine
    process per run): the default identity changes with the weight files, so the new weights
    are offered nothing the old ones saved, and answer as on an empty disk; the old weights,
    put back, still find theirs."""
    import shutil
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    model, disk = tmp_path / "model", tmp_path / "disk"
    model.mkdir()
    disk.mkdir()

    def serve(seed, disk_dir):
        if seed is not None:
            write_model(model, seed)
        out = subprocess.run([sys.executable, os.path.join(here, "identity_engine.py"),
                              str(model), str(disk_dir), json.dumps(PROMPT)],
                             capture_output=True, text=True, timeout=900, env=env)
        assert out.returncode == 0, out.stderr[-4000:]
        (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        return json.loads(line[len("RESULT "):])

    old = serve(1, disk)
    assert old["offer"] == [0, 0] and old["saved"] == 256
    kept = shutil.copy2(model / "model.safetensors", tmp_path / "old.safetensors")
    new = serve(2, disk)
    assert new["identity"] != old["identity"]
    assert new["offer"] == [0, 0], "the new weights were offered the old weights' chunks"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    alone = serve(2, fresh)
    assert new["tokens"] == alone["tokens"] != old["tokens"]
    assert new["logprobs"] == pytest.approx(alone["logprobs"], abs=1e-3)
    # The old files put back as they were (copy2 keeps their modification time): the same
    # identity, which finds its chunks on the disk.
    shutil.copy2(kept, model / "model.safetensors")
    back = serve(None, disk)
    assert back["identity"] == old["identity"]
    assert back["offer"] == [0, 256] and back["tokens"] == old["tokens"]
    shutil.rmtree(fresh)
