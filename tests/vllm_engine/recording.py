"""The connector as test_vllm_engine.py runs it inside vLLM: SwiftKVConnector, recording what it
was asked and checking, byte for byte, what it loads into vLLM's KV cache.

When a step saves a request's chunks, each layer's pages of those chunks are copied aside (keyed
by the chunks' names: vLLM's block hashes, which stand for the tokens and everything else the
K/V depends on) right after vLLM's attention layer wrote them; when a later step loads a prefix,
each layer's loaded pages are compared with the copy once wait_for_layer_load returns, before
vLLM's attention reads them. The records live in the process that makes them (the tests
run vLLM's engine core in their own process, VLLM_ENABLE_V1_MULTIPROCESSING=0); a worker in a
process of its own (tensor parallelism) also appends each comparison to
$SWIFTKV_RECORD_DIR/rank<r>.jsonl."""

from __future__ import annotations

import json
import os

import torch

from swiftkv.integrations.vllm import SwiftKVConnector


def write_llama(d, **over) -> str:
    """The tests' small Llama (4 layers, hidden 256, 2 KV heads of 64, bfloat16): its config.json
    in directory d (a pathlib.Path), with `over` replacing fields; d as a string."""
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "num_hidden_layers": 4, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}
    config.update(over)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def write_weights(d, seed: int, hidden: int = 256, layers: int = 4) -> None:
    """Random weights (safetensors) for write_llama's model in d (a pathlib.Path): vLLM's dummy
    weights give every token about the same logit, too small for an adapter, an embedding or a
    wrong page of K/V to change the answer."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (1000, hidden), "lm_head.weight": (1000, hidden),
              "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (256, hidden),
                       p + "self_attn.k_proj.weight": (128, hidden),
                       p + "self_attn.v_proj.weight": (128, hidden),
                       p + "self_attn.o_proj.weight": (hidden, 256),
                       p + "mlp.gate_proj.weight": (512, hidden),
                       p + "mlp.up_proj.weight": (512, hidden),
                       p + "mlp.down_proj.weight": (hidden, 512),
                       p + "input_layernorm.weight": (hidden,),
                       p + "post_attention_layernorm.weight": (hidden,)})
    tensors = {k: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.05)
               .to(torch.bfloat16) for k, s in shapes.items()}
    save_file(tensors, str(d / "model.safetensors"))


def names_of(tokens, chunk: int, block: int, **extras):
    """The connector's names of the full chunks of tokens in an engine of this process (whose
    block hashes vLLM's engine core seeded): vLLM's sha256 block hash of each chunk's last block
    over a request of those tokens and `extras` (lora_request, cache_salt, ...)."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    from swiftkv.integrations import vllm as sv
    from swiftkv.integrations.vllm import common as svc  # noqa: E402
    r = Request(request_id="names", prompt_token_ids=[int(t) for t in tokens],
                sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                block_hasher=get_request_block_hasher(block, sha256), **extras)
    return svc.chunk_names(r.block_hashes, chunk // block, len(tokens) // chunk)


OFFERS: list = []    # (request id, vLLM's own hit, external tokens offered)
SAVED: dict = {}     # (names of whole chunks, layer) -> their pages, as vLLM wrote them
COMPARED: list = []  # (request id, layer, tokens compared, equal)
LOADED: dict = {}    # (request id, layer) -> (tokens, the loaded pages), as vLLM will read them
SCHEDULED: list = []  # (request id, first computed token, tokens scheduled, drafts among them)
DRAFTER_CALLS: list = []  # (hook, layer) of calls for a speculative drafter's layers
# Request ids of steps scheduled before the request's previous step's tokens were back: its
# computed tokens reach past the tokens the scheduler knows (async scheduling only).
AHEAD: list = []


class RecordingConnector(SwiftKVConnector):
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        got = super().get_num_new_matched_tokens(request, num_computed_tokens)
        OFFERS.append((request.request_id, num_computed_tokens, got[0]))
        return got

    def build_connector_meta(self, scheduler_output):
        new = [(r.req_id, r.num_computed_tokens) for r in scheduler_output.scheduled_new_reqs]
        c = scheduler_output.scheduled_cached_reqs
        for rid, start in new + list(zip(c.req_ids, c.num_computed_tokens)):
            SCHEDULED.append((rid, start, scheduler_output.num_scheduled_tokens[rid],
                              len(scheduler_output.scheduled_spec_decode_tokens.get(rid, ()))))
            s = self.connector_scheduler.scheduled.get(rid)
            if s is not None and start >= len(s.request.all_token_ids):
                AHEAD.append(rid)
        return super().build_connector_meta(scheduler_output)

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self._bound = connector_metadata

    def _pages(self, layer: int, block_ids) -> torch.Tensor:
        t = self.connector_worker.store.layers[layer]
        assert t.dim() == 4 and t.shape[0] == self.cfg.geometry.num_blocks, (
            "the check reads one page a block (no kernel-block split)")
        return t[torch.tensor(block_ids, dtype=torch.long)]

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        if layer_name in self.cfg.drafter:
            DRAFTER_CALLS.append(("save", layer_name))
            return
        layer = self.cfg.index[layer_name]
        b = self.cfg.geometry.block_tokens
        for r in self._bound.requests:
            n = r.n_tokens // self.cfg.chunk * self.cfg.chunk
            if r.saves and n:
                SAVED[(r.names[:n // self.cfg.chunk].tobytes(), layer)] = \
                    self._pages(layer, r.block_ids[:n // b]).clone()

    def wait_for_layer_load(self, layer_name: str) -> None:
        super().wait_for_layer_load(layer_name)
        if layer_name in self.cfg.drafter:
            DRAFTER_CALLS.append(("wait", layer_name))
            return
        layer = self.cfg.index[layer_name]
        b = self.cfg.geometry.block_tokens
        for r in self._bound.requests:
            if not r.loads:
                continue
            # The chunks the load reaches into; a saved run holding them holds their pages.
            want = r.names[:-(-r.load_to // self.cfg.chunk)].tobytes()
            for (names, l), pages in SAVED.items():
                if l == layer and names[:len(want)] == want:
                    first, end = r.load_from // b, r.load_to // b
                    got = self._pages(layer, r.block_ids[first:end])
                    LOADED[(r.req_id, layer)] = (want, got.clone())
                    row = (r.req_id, layer, r.load_to - r.load_from,
                           torch.equal(got.view(torch.int16), pages[first:end].view(torch.int16)))
                    COMPARED.append(row)
                    where = os.environ.get("SWIFTKV_RECORD_DIR")
                    if where:
                        with open(os.path.join(where, f"rank{self.cfg.rank}.jsonl"), "a") as f:
                            f.write(json.dumps(row) + "\n")
                    break
