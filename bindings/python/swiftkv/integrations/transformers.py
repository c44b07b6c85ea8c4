"""libswiftkv under Hugging Face transformers 5: a ``Cache`` that serves conversation prefixes from
the library (lent peer memory, host, disk) and saves what the model computes, layer by layer.

    import swiftkv
    from swiftkv.integrations.transformers import SwiftKVCache, model_desc

    ctx = swiftkv.Context(host_budget_bytes=1 << 30, disk_path="/ssd/kv", disk_budget_bytes=16 << 30)
    kv_model = ctx.register_model(model_desc(hf_model, "llama-3-8b", identity="rev-8c22764"))
    cache = SwiftKVCache(kv_model, max_tokens=8192)  # pages on the model's device
    for turn in conversation:                       # ids: the whole conversation so far
        out = cache.prefill(hf_model, ids)          # computes only ids[out.cached_tokens:]
        ...                                         # decode with the cache as with DynamicCache

A turn is one connector request over the whole conversation: ``begin`` finds the cached prefix
and starts loading it into the cache's pages; the model runs on the tokens after it; each
layer's ``update`` (a transformers cache layer per model layer) waits for that layer's load,
writes the layer's new K/V into the pages, hands the layer to ``save_layer`` (the library copies
every new full chunk out) and returns the layer's whole K/V; after the last layer the turn ends
(the saves are waited for). Before a layer's update the layer reports the cached prefix as its
length, so the attention mask and positions transformers derive from the cache cover the prefix
from the first layer on. Decoding after the turn works as with ``DynamicCache``, by hand or in
``generate`` (``SwiftKVCache.generate``); the decoded tokens are saved with the next turn's
request, which covers them.

transformers 5.0 and later 5.x releases (the cache-layer interface); transformers 4 is not
supported. One sequence at a time (batch 1), decoders whose every layer is full or sliding-window
attention (Llama, Qwen2, Mistral, Ministral and the like: a sliding-window layer is given the whole
K/V and its mask keeps the window, as with DynamicCache). Models with other layers
(convolution, linear attention or Mamba state: LFM2, Jamba, Qwen3-Next and the like) are refused
by model_desc and by each turn, naming the layer kinds: their state is not K/V per token. The
K/V the library holds are what the model's attention layers hand to the cache (after rotary
embedding), so a prefix is reused only at the positions it was computed at: the start of a
conversation. The cache serves inference:
no gradient flows through the K/V it returns.

Which K/V is which: every chunk key holds the model's name and identity, and model_desc(model,
name) makes the identity a digest of the model's weights (and config), so other weights under
the same name never share K/V. PEFT adapters: prefill and generate read, each turn, which
adapters change what the model computes (active and enabled, or merged, and their weights) and
name the turn's chunks by that too, so a turn with adapter A never loads what adapter B or the
base model computed, and each finds its own. Prompt-learning adapters (prompt or prefix tuning)
are refused: they change the sequence the K/V belong to.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Optional, Tuple

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from .. import DType, Model, ModelDesc
from ._torch import DTYPES as _DTYPES, device_index as _device_index

__all__ = ["SwiftKVCache", "model_desc", "PrefixLoadFailed", "weights_identity", "adapter_state"]


# Elements of a tensor as integers of their own size: every bit of every weight counts.
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _tensor_digest(t: torch.Tensor) -> Tuple[int, int]:
    """Two sums over a tensor's bits, on its device, in slices (no copy of the whole tensor):
    of its elements as integers, and of each times a weight of its position. Not a
    cryptographic hash: it tells weights apart that were trained, loaded or drawn apart."""
    x = t.detach().reshape(-1)
    if x.numel() == 0 or x.element_size() not in _INTS:
        return 0, 0
    x = x.view(_INTS[x.element_size()])
    s1 = s2 = 0
    step = 1 << 24
    for i in range(0, x.numel(), step):
        part = x[i:i + step].to(torch.int64)
        pos = torch.arange(i, i + part.numel(), device=part.device, dtype=torch.int64) % 65521 + 1
        s1 += int(part.sum())
        s2 += int((part * pos).sum())
    return s1, s2


def weights_identity(model: torch.nn.Module) -> str:
    """A digest of what makes a model's K/V besides its geometry: its config (without where it
    was loaded from) and every parameter (name, shape, dtype and bits). model_desc's default
    identity. One pass over the weights, on their device."""
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        d = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
        h.update(json.dumps(d, sort_keys=True, default=str).encode())
    for n, p in model.named_parameters():
        h.update(f"{n}|{tuple(p.shape)}|{p.dtype}|{_tensor_digest(p)}\n".encode())
    return "weights-" + h.hexdigest()[:32]


def adapter_state(model: torch.nn.Module) -> str:
    """What the PEFT adapters of a model change in what it computes now: "" when none does
    (no adapter, or all disabled and none merged); else a digest of each adapted layer's active
    adapters, whether they are disabled, which are merged into its weights, and their weights.
    Raises NotImplementedError for prompt-learning adapters (prompt or prefix tuning), which
    change the sequence the K/V belong to."""
    configs = getattr(model, "peft_config", None)
    if isinstance(configs, dict) and not getattr(model, "_adapters_disabled", False):
        for name, c in configs.items():
            if getattr(c, "is_prompt_learning", False) or getattr(c, "is_adaption_prompt", False):
                raise NotImplementedError(
                    f"SwiftKVCache: adapter {name!r} is a prompt-learning adapter "
                    f"({type(c).__name__}): it changes the sequence the K/V belong to")
    h = hashlib.sha256()
    changes = False
    for module_name, m in model.named_modules():
        layer_names = getattr(type(m), "adapter_layer_names", None)
        if not layer_names or not hasattr(m, "merged_adapters"):
            continue  # not a PEFT tuner layer
        disabled = bool(getattr(m, "disable_adapters", False))
        active = [] if disabled else list(getattr(m, "active_adapters", []))
        merged = list(m.merged_adapters)
        if not active and not merged:
            continue
        changes = True
        h.update(f"{module_name}|{sorted(active)}|{sorted(merged)}".encode())
        for layer_name in layer_names:
            holder = getattr(m, layer_name, None)
            if not isinstance(holder, (torch.nn.ModuleDict, torch.nn.ParameterDict)):
                continue
            for adapter in sorted(set(active) | set(merged)):
                if adapter not in holder:
                    continue
                sub = holder[adapter]
                params = [sub] if isinstance(sub, torch.nn.Parameter) else sub.parameters()
                for p in params:
                    h.update(f"{layer_name}.{adapter}|{tuple(p.shape)}|{_tensor_digest(p)}".encode())
    return ("adapters-" + h.hexdigest()[:32]) if changes else ""


def _chunk_names(ids: torch.Tensor, chunk: int, salt: str) -> np.ndarray:
    """The names of the full chunks of ids under salt (an adapter state): a SHA-256 chained over
    the salt and each chunk's token ids, 32 bytes a chunk."""
    tokens = np.ascontiguousarray(ids.cpu().numpy().astype("<u4"))
    prev = hashlib.sha256(b"swiftkv-transformers-salt|" + salt.encode()).digest()
    out = []
    for i in range(len(tokens) // chunk):
        prev = hashlib.sha256(prev + tokens[i * chunk:(i + 1) * chunk].tobytes()).digest()
        out.append(prev)
    return np.frombuffer(b"".join(out), dtype=np.uint8).reshape(len(out), 32)


# The layer kinds (transformers' config.layer_types) whose state is K/V per token.
_SERVED_LAYERS = ("full_attention", "sliding_attention")


def _check_layers(model_or_config) -> None:
    """Refuses a model with a layer whose state is not K/V per token, naming the kinds."""
    config = getattr(model_or_config, "config", model_or_config)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = getattr(text, "layer_types", None)
    if kinds is None:
        kinds = getattr(text, "layers_block_type", None)  # Jamba-style configs of before
    other = sorted({str(k) for k in kinds or ()} - set(_SERVED_LAYERS))
    if other:
        raise ValueError(
            f"SwiftKVCache serves models whose layers are all full or sliding-window attention; "
            f"this {getattr(text, 'model_type', type(text).__name__)} model also has "
            f"{', '.join(repr(k) for k in other)} layers, whose state is not K/V per token")


def model_desc(model_or_config, name: str, *, identity: Optional[str] = None,
               dtype: Optional[torch.dtype] = None, chunk_tokens: int = 256,
               block_tokens: int = 16, device=None) -> ModelDesc:
    """The KV geometry of a transformers decoder (Llama, Qwen2, Mistral and the like): layers, KV
    heads and head dim read from its config. Given the model itself, its parameters' dtype and
    device are the KV's unless ``dtype`` or ``device`` say otherwise (a config alone: float32 on
    the CPU). ``name`` and ``identity`` go into every chunk key: two models whose K/V differ
    must differ in one of them. Given the model, ``identity`` defaults to weights_identity(model),
    a digest of its weights and config (one pass over the weights); given a config alone, to
    none: then say what tells the weights apart (a checkpoint's commit hash, say)."""
    _check_layers(model_or_config)
    config = getattr(model_or_config, "config", model_or_config)
    param = None
    if isinstance(model_or_config, torch.nn.Module):
        param = next(model_or_config.parameters(), None)
    if identity is None and isinstance(model_or_config, torch.nn.Module):
        identity = weights_identity(model_or_config)
    if dtype is None:
        dtype = param.dtype if param is not None else torch.float32
    if device is None and param is not None:
        device = param.device
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    if dtype not in _DTYPES:
        raise ValueError(f"no swiftkv DType for {dtype}")
    index = None if device is None else _device_index(device)
    kw = {} if index is None else {"device": index}
    return ModelDesc(name, num_layers=text.num_hidden_layers, num_kv_heads=kv_heads,
                     head_dim=head_dim, block_tokens=block_tokens, chunk_tokens=chunk_tokens,
                     dtype=_DTYPES[dtype], identity=identity, **kw)


class PrefixLoadFailed(RuntimeError):
    """A chunk of the cached prefix could not be loaded (lent memory lost, a checksum
    mismatch): the tokens from ``valid_tokens`` on must be computed. ``prefill`` retries."""

    def __init__(self, layer: int, valid_tokens: int, expected: int):
        super().__init__(f"layer {layer}: the cached prefix is intact only up to token "
                         f"{valid_tokens} of {expected}")
        self.layer, self.valid_tokens = layer, valid_tokens


class _SwiftKVLayer(DynamicLayer):
    """One model layer of a SwiftKVCache. In a turn, ``update`` goes through the library (see
    the module's text) and the layer's length is the cached prefix until then; after the turn
    it grows as a DynamicLayer."""

    def __init__(self, cache: "SwiftKVCache", index: int):
        super().__init__()
        self._cache, self._index = cache, index
        self._updated = False  # this turn's update has run

    def begin_turn(self) -> None:
        self.keys = self.values = None
        self.is_initialized = False
        self._updated = False

    def get_seq_length(self) -> int:
        if self._cache._request is not None and not self._updated:
            return self._cache._use
        return super().get_seq_length()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._cache._request is None:  # decoding after a turn: as DynamicLayer
            return super().update(key_states, value_states, *args, **kwargs)
        k, v = self._cache._update_in_turn(self._index, key_states, value_states)
        # Copies: the pages are reused by the next turn while decoding may still read these.
        self.keys, self.values = k.contiguous(), v.contiguous()
        self.device = self.keys.device
        self.is_initialized = True
        self._updated = True
        return self.keys, self.values


class SwiftKVCache(Cache):
    """A transformers ``Cache`` backed by a libswiftkv borrower model (see the module's text).

    ``kv_model`` is a registered swiftkv.Model whose desc matches the transformers model (see
    ``model_desc``); ``max_tokens`` bounds a conversation (the cache's pages hold that many
    tokens per layer, registered with the library as a vLLM-layout pool of torch tensors).
    ``device`` is where the pages live: by default the model's device as its desc says (the
    CPU, or ``cuda:<desc.device>``), which the context must use (swiftkv.Context uses every
    visible device unless told otherwise)."""

    def __init__(self, kv_model: Model, max_tokens: int, *, device=None):
        d = kv_model.desc
        if device is None:
            device = "cpu" if d.device < 0 else f"cuda:{d.device}"
        index = _device_index(device)
        if (index if index is not None else -1) != d.device:
            raise ValueError(f"the pages would live on {device}, but the model's desc says device "
                             f"{d.device} (swiftkv.DEVICE_HOST is the CPU): register the model "
                             "with the device its K/V are on (model_desc(model, ...) reads it)")
        super().__init__(layers=[_SwiftKVLayer(self, i) for i in range(d.num_layers)])
        self.kv_model = kv_model
        self.dtype = {v: k for k, v in _DTYPES.items()}[DType(d.dtype)]
        self.block_tokens = d.block_tokens
        self.num_pages = -(-max_tokens // d.block_tokens)
        self.max_tokens = self.num_pages * d.block_tokens
        self.pages = [torch.zeros((2, self.num_pages, d.block_tokens, d.num_kv_heads, d.head_dim),
                                  dtype=self.dtype, device=device)
                      for _ in range(d.num_layers)]
        self.pool = kv_model.pool_from_tensors(self.pages, layout="vllm")
        self._device = index  # None: the CPU
        self._request = None
        self._use = 0       # tokens of the prefix the model does not compute this turn
        self._tokens = 0    # the whole turn's tokens
        self.cached_tokens = 0
        self.saved_tokens = 0

    @property
    def _stream(self):
        """The stream the model computes on now (None on the CPU): every library call of a turn
        is enqueued there, so nothing waits on the host between layers."""
        return None if self._device is None else torch.cuda.current_stream(self._device)

    # --- a turn ---------------------------------------------------------------------------

    def begin(self, input_ids, *, use_cached: bool = True, salt: str = "") -> int:
        """Starts a turn over the whole conversation ``input_ids`` ([T] or [1, T]); returns how
        many leading tokens come from the library: run the model on input_ids[..., that:] with
        this cache, then call end(). ``salt``: what else the turn's K/V depend on (prefill and
        generate pass adapter_state(model)): chunks are named by it with the tokens, so turns of
        other salts never share them."""
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError("SwiftKVCache serves one sequence at a time (batch 1)")
            ids = ids[0]
        n = int(ids.shape[0])
        if n == 0 or n > self.max_tokens:
            raise ValueError(f"a turn of {n} tokens; this cache holds 1..{self.max_tokens}")
        self.end()
        for layer in self.layers:
            layer.begin_turn()
        pages = torch.arange(-(-n // self.block_tokens), dtype=torch.int32)
        if salt:
            names = _chunk_names(ids, self.kv_model.desc.chunk_tokens, salt)
            self._request = self.kv_model.request(self.pool, n, pages, names=names)
        else:
            self._request = self.kv_model.request(self.pool, ids.cpu(), pages)
        info = self._request.info()
        # The model needs at least one token to compute: a prefix covering the whole turn is
        # used up to its last token, which is computed again (and not saved twice).
        cached = info["load_end_tokens"] if use_cached else 0
        self._use = min(cached, n - 1)
        self._tokens = n
        self.cached_tokens = self._use
        self._request.start_load(self._stream)
        return self._use

    def end(self) -> int:
        """Ends the turn: waits for the saves; returns the tokens saved this turn."""
        if self._request is None:
            return 0
        req, self._request = self._request, None
        try:
            if req.info()["layers_saved"] == len(self.layers):
                self.saved_tokens = req.wait_save(self._stream)
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
        _check_layers(model)
        use_cached = True
        salt = adapter_state(model)
        for _ in range(3):
            start = self.begin(ids, use_cached=use_cached, salt=salt)
            try:
                positions = torch.arange(start, ids.shape[1], device=ids.device)
                out = model(input_ids=ids[:, start:], use_cache=True, position_ids=positions[None],
                            **_cache_kwarg(model, self), **kwargs)
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
        return self.prefill_without_cache(model, ids, salt=salt, **kwargs)

    def generate(self, model, input_ids, **kwargs):
        """One turn through ``model.generate``: the cached prefix is loaded, generate's first
        forward computes the rest of ``input_ids`` (and the library saves it), and its decoding
        steps go on as with DynamicCache. Returns what generate returns; ``cached_tokens`` says
        how much of the prompt came from the library."""
        ids = torch.as_tensor(input_ids)
        if ids.dim() == 1:
            ids = ids[None]
        _check_layers(model)
        self.begin(ids, salt=adapter_state(model))
        try:
            out = model.generate(input_ids=ids, **_cache_kwarg(model, self), **kwargs)
        except BaseException:
            self.abort()
            raise
        self.end()
        return out

    def prefill_without_cache(self, model, ids, *, salt: Optional[str] = None, **kwargs):
        _check_layers(model)
        self.begin(ids, use_cached=False, salt=adapter_state(model) if salt is None else salt)
        try:
            out = model(input_ids=ids, use_cache=True, **_cache_kwarg(model, self), **kwargs)
        except BaseException:
            self.abort()
            raise
        self.end()
        out.cached_tokens = 0
        return out

    # --- what a layer's update does in a turn ---------------------------------------------

    def _update_in_turn(self, layer_idx: int, key_states: torch.Tensor,
                        value_states: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[0] != 1:
            raise ValueError("SwiftKVCache serves one sequence at a time (batch 1)")
        new = key_states.shape[-2]
        if self._use + new != self._tokens:
            raise ValueError(f"layer {layer_idx}: {new} new tokens after a prefix of {self._use}, "
                             f"but the turn has {self._tokens} tokens: run the model on "
                             "input_ids[..., cached_tokens:]")
        # Enqueued on the current stream: the layer's pages are written after its load lands.
        valid = self._request.wait_layer_load(layer_idx, self._stream)
        if valid < self._use:
            raise PrefixLoadFailed(layer_idx, valid, self._use)
        page = self.pages[layer_idx]
        k_all = page[0].view(-1, *page.shape[3:])
        v_all = page[1].view(-1, *page.shape[3:])
        # [1, heads, new, dim] -> the pages' [token, heads, dim]. The pages are the library's
        # memory, outside any autograd graph.
        with torch.no_grad():
            k_all[self._use:self._tokens] = key_states[0].transpose(0, 1).to(self.dtype)
            v_all[self._use:self._tokens] = value_states[0].transpose(0, 1).to(self.dtype)
        self._request.save_layer(layer_idx, self._stream)
        k = k_all[:self._tokens].transpose(0, 1).unsqueeze(0)
        v = v_all[:self._tokens].transpose(0, 1).unsqueeze(0)
        if layer_idx == len(self.layers) - 1:
            # The turn's forward is done with the library: what follows (generate's decoding
            # steps) grows the layers as DynamicCache does.
            k, v = k.contiguous(), v.contiguous()
            self.end()
        return k, v

    def close(self) -> None:
        """Ends any turn and the pool (the context also does this when it closes)."""
        self.abort()
        self.pool.close()


def _cache_kwarg(model, cache) -> dict:
    """The keyword a model's forward takes its cache by: ``cache`` in newer 5.x releases,
    ``past_key_values`` in earlier ones."""
    params = inspect.signature(model.forward).parameters
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}
