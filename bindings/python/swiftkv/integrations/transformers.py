"""libswiftkv under Hugging Face transformers: a ``Cache`` that serves conversation prefixes from
the library (lent peer memory, host, disk) and saves what the model computes, layer by layer.

    import swiftkv
    from swiftkv.integrations.transformers import SwiftKVCache, model_desc

    ctx = swiftkv.Context(host_budget_bytes=1 << 30, disk_path="/ssd/kv", disk_budget_bytes=16 << 30)
    kv_model = ctx.register_model(model_desc(hf_model.config, "llama-3-8b", identity="rev-8c22764"))
    cache = SwiftKVCache(kv_model, max_tokens=8192)
    for turn in conversation:                       # ids: the whole conversation so far
        out = cache.prefill(hf_model, ids)          # computes only ids[out.cached_tokens:]
        ...                                         # decode with past_key_values=cache as usual

A turn is one connector request over the whole conversation: ``begin`` finds the cached prefix
and starts loading it into the cache's pages; the model runs on the tokens after it; each
layer's ``update`` waits for that layer's load, writes the layer's new K/V into the pages,
hands the layer to ``save_layer`` (the library copies every new full chunk out) and returns the
layer's whole K/V; ``end`` waits for the saves. Decoding after ``end`` works as with
``DynamicCache`` (the decoded tokens are saved with the next turn's request, which covers them).

One sequence at a time (batch 1). The K/V the library holds are what the model's attention
layers hand to the cache (after rotary embedding), so a prefix is reused only at the positions
it was computed at: the start of a conversation. Models differing in weights must differ in
name or identity (see model_desc): both are part of every chunk key.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from transformers.cache_utils import DynamicCache

from .. import DType, Model, ModelDesc

__all__ = ["SwiftKVCache", "model_desc", "PrefixLoadFailed"]

_DTYPES = {torch.float16: DType.F16, torch.bfloat16: DType.BF16, torch.float32: DType.F32}


def model_desc(config, name: str, *, identity: Optional[str] = None,
               dtype: torch.dtype = torch.float32, chunk_tokens: int = 256,
               block_tokens: int = 16, device: Optional[int] = None) -> ModelDesc:
    """The KV geometry of a transformers decoder config (Llama, Qwen2, Mistral and the like):
    layers, KV heads and head dim read from it. ``name`` and ``identity`` (a weights revision
    such as the checkpoint's commit hash, an adapter, a tenant) go into every chunk key: two
    models whose K/V differ must differ in one of them."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if dtype not in _DTYPES:
        raise ValueError(f"no swiftkv DType for {dtype}")
    kw = {} if device is None else {"device": device}
    return ModelDesc(name, num_layers=config.num_hidden_layers, num_kv_heads=kv_heads,
                     head_dim=head_dim, block_tokens=block_tokens, chunk_tokens=chunk_tokens,
                     dtype=_DTYPES[dtype], identity=identity, **kw)


class PrefixLoadFailed(RuntimeError):
    """A chunk of the cached prefix could not be loaded (lent memory lost, a checksum
    mismatch): the tokens from ``valid_tokens`` on must be computed. ``prefill`` retries."""

    def __init__(self, layer: int, valid_tokens: int, expected: int):
        super().__init__(f"layer {layer}: the cached prefix is intact only up to token "
                         f"{valid_tokens} of {expected}")
        self.layer, self.valid_tokens = layer, valid_tokens


class SwiftKVCache(DynamicCache):
    """A transformers ``Cache`` backed by a libswiftkv borrower model (see the module's text).

    ``kv_model`` is a registered swiftkv.Model whose desc matches the transformers model (see
    ``model_desc``); ``max_tokens`` bounds a conversation (the cache's pages hold that many
    tokens per layer, registered with the library as a vLLM-layout pool of torch tensors)."""

    def __init__(self, kv_model: Model, max_tokens: int, *, device: str = "cpu"):
        super().__init__()
        d = kv_model.desc
        self.kv_model = kv_model
        self.dtype = {v: k for k, v in _DTYPES.items()}[DType(d.dtype)]
        self.block_tokens = d.block_tokens
        self.num_pages = -(-max_tokens // d.block_tokens)
        self.max_tokens = self.num_pages * d.block_tokens
        self.layers = [torch.zeros((2, self.num_pages, d.block_tokens, d.num_kv_heads, d.head_dim),
                                   dtype=self.dtype, device=device)
                       for _ in range(d.num_layers)]
        self.pool = kv_model.pool_from_tensors(self.layers, layout="vllm")
        self._request = None
        self._use = 0       # tokens of the prefix the model does not compute this turn
        self._tokens = 0    # the whole turn's tokens
        self.cached_tokens = 0
        self.saved_tokens = 0

    # --- a turn ---------------------------------------------------------------------------

    def begin(self, input_ids, *, use_cached: bool = True) -> int:
        """Starts a turn over the whole conversation ``input_ids`` ([T] or [1, T]); returns how
        many leading tokens come from the library: run the model on input_ids[..., that:] with
        past_key_values=self, then call end()."""
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError("SwiftKVCache serves one sequence at a time (batch 1)")
            ids = ids[0]
        n = int(ids.shape[0])
        if n == 0 or n > self.max_tokens:
            raise ValueError(f"a turn of {n} tokens; this cache holds 1..{self.max_tokens}")
        self.end()
        self.key_cache, self.value_cache = [], []
        pages = torch.arange(-(-n // self.block_tokens), dtype=torch.int32)
        self._request = self.kv_model.request(self.pool, ids, pages)
        info = self._request.info()
        # The model needs at least one token to compute: a prefix covering the whole turn is
        # used up to its last token, which is computed again (and not saved twice).
        cached = info["load_end_tokens"] if use_cached else 0
        self._use = min(cached, n - 1)
        self._tokens = n
        self.cached_tokens = self._use
        self._seen_tokens = self._use
        self._request.start_load()
        return self._use

    def end(self) -> int:
        """Ends the turn: waits for the saves; returns the tokens saved this turn."""
        if self._request is None:
            return 0
        req, self._request = self._request, None
        try:
            if req.info()["layers_saved"] == len(self.layers):
                self.saved_tokens = req.wait_save()
        finally:
            req.finish()
        return self.saved_tokens

    def abort(self) -> None:
        """Ends the turn without waiting for or publishing its saves."""
        if self._request is not None:
            req, self._request = self._request, None
            req.finish()

    def prefill(self, model, input_ids, **kwargs):
        """One turn: begin, the model on the tokens after the cached prefix, end. Returns the
        model's output (logits for those tokens) with ``.cached_tokens`` set. A prefix that
        fails to load is computed instead (the turn is run again)."""
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 1:
            ids = ids[None]
        use_cached = True
        for _ in range(3):
            start = self.begin(ids, use_cached=use_cached)
            try:
                positions = torch.arange(start, ids.shape[1])
                out = model(input_ids=ids[:, start:], past_key_values=self, use_cache=True,
                            cache_position=positions, position_ids=positions[None], **kwargs)
            except PrefixLoadFailed:
                self.abort()
                continue  # the next request finds fewer chunks (or none) cached
            except BaseException:
                self.abort()
                raise
            self.end()
            out.cached_tokens = start
            return out
        # Loads kept failing: compute everything.
        return self.prefill_without_cache(model, ids, **kwargs)

    def prefill_without_cache(self, model, ids, **kwargs):
        self.begin(ids, use_cached=False)
        try:
            out = model(input_ids=ids, past_key_values=self, use_cache=True, **kwargs)
        except BaseException:
            self.abort()
            raise
        self.end()
        out.cached_tokens = 0
        return out

    # --- transformers' Cache interface -----------------------------------------------------

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        if self._request is not None and len(self.key_cache) <= (layer_idx or 0):
            return self._use
        return super().get_seq_length(layer_idx)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: Optional[Dict[str, Any]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._request is None:  # decoding after a turn: as DynamicCache
            return super().update(key_states, value_states, layer_idx, cache_kwargs)
        if key_states.shape[0] != 1:
            raise ValueError("SwiftKVCache serves one sequence at a time (batch 1)")
        new = key_states.shape[-2]
        if self._use + new != self._tokens:
            raise ValueError(f"layer {layer_idx}: {new} new tokens after a prefix of {self._use}, "
                             f"but the turn has {self._tokens} tokens: run the model on "
                             "input_ids[..., cached_tokens:]")
        valid = self._request.wait_layer_load(layer_idx)
        if valid < self._use:
            raise PrefixLoadFailed(layer_idx, valid, self._use)
        k_all = self.layers[layer_idx][0].view(-1, *self.layers[layer_idx].shape[3:])
        v_all = self.layers[layer_idx][1].view(-1, *self.layers[layer_idx].shape[3:])
        # [1, heads, new, dim] -> the pages' [token, heads, dim]
        k_all[self._use:self._tokens] = key_states[0].transpose(0, 1).to(self.dtype)
        v_all[self._use:self._tokens] = value_states[0].transpose(0, 1).to(self.dtype)
        self._request.save_layer(layer_idx)
        k = k_all[:self._tokens].transpose(0, 1).unsqueeze(0)
        v = v_all[:self._tokens].transpose(0, 1).unsqueeze(0)
        while len(self.key_cache) <= layer_idx:
            self.key_cache.append([])
            self.value_cache.append([])
        # Copies: the pages are reused by the next turn while decoding may still read these.
        self.key_cache[layer_idx] = k.contiguous()
        self.value_cache[layer_idx] = v.contiguous()
        if layer_idx == 0:
            self._seen_tokens = self._tokens
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def close(self) -> None:
        """Ends any turn and the pool (the context also does this when it closes)."""
        self.abort()
        self.pool.close()
