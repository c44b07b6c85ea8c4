"""Models with sliding-window attention layers inside a real vLLM engine on the CPU: vLLM turns
its hybrid allocator off for a connector without it, keeps every token's K/V in every layer,
and the connector caches them as it does a full-attention model's. A prefix saved is loaded
byte for byte as saved, and the answer equals the answer computed from nothing (a window
applied to loaded K/V as to computed K/V). Refusals of models the connector cannot serve (a
Mamba group, or the hybrid allocator's separate groups) are in tests/vllm."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache

import pytest  # noqa: E402

import recording  # noqa: E402
from swiftkv.integrations import vllm as sv  # noqa: E402
from swiftkv.integrations.vllm import worker as svw  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

LAYERS, BLOCK, CHUNK = 4, 32, 64


def _engine(model):
    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 64 << 20, "chunk_tokens": CHUNK})
    return LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
               max_model_len=2048, enforce_eager=True, block_size=BLOCK, seed=0,
               max_num_seqs=8, kv_transfer_config=config, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def sliding(tmp_path_factory):
    """A Gemma 2: sliding-window (96 tokens) and full-attention layers alternating. vLLM lays a
    connector without its hybrid allocator every layer out as full attention."""
    llm = _engine(recording.write_llama(
        tmp_path_factory.mktemp("gemma2"), architectures=["Gemma2ForCausalLM"],
        model_type="gemma2", sliding_window=96, query_pre_attn_scalar=64,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh"))
    yield llm
    del llm


def test_a_model_whose_layers_all_slide_is_refused_naming_them(tmp_path):
    """A Mistral whose every layer attends to its last 96 tokens only: vLLM frees the blocks
    that fall out of the window, so a chunk's pages are not all there to save or load. The
    engine does not start, and says why (the layer kinds the connector found)."""
    model = recording.write_llama(tmp_path, architectures=["MistralForCausalLM"],
                                  model_type="mistral", sliding_window=96)
    with pytest.raises(ValueError, match=r"all full attention .*not groups \['SlidingWindowSpec'\]"):
        _engine(model)


def run(llm, prompt):
    sp = SamplingParams(max_tokens=8, temperature=0, logprobs=1, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0].outputs[0]
    return list(out.token_ids), [lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)]


def forget(llm, connector_too=False):
    llm.generate([TokensPrompt(prompt_token_ids=[7, 8, 9])],
                 SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    assert llm.reset_prefix_cache(reset_connector=connector_too)


def test_sliding_window_layers_are_cached_and_loaded_exactly(sliding):
    (store,) = svw.STORES.values()
    assert len(store.layers) == LAYERS  # every layer: one full-attention group to the connector
    prompt = [(19 * i) % 997 + 1 for i in range(299)]  # 4 whole chunks, past the window
    tokens, logprobs = run(sliding, prompt)
    forget(sliding)
    recording.COMPARED.clear()
    again, again_lp = run(sliding, prompt)
    assert recording.OFFERS[-1][1:] == (0, 256)
    assert len(recording.COMPARED) == LAYERS and all(eq for *_, eq in recording.COMPARED)
    assert again == tokens
    assert again_lp == pytest.approx(logprobs, abs=1e-3)
