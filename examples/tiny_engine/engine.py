"""A tiny decoder-only transformer in numpy that keeps its KV cache the way a serving engine does:
in paged per-layer tensors registered with libswiftkv, loading cached conversation prefixes layer
by layer through the connector and saving new chunks as it computes.

The model: random weights (seeded), 4 layers, GQA with 8 query heads and 2 KV heads of 64 dims,
RoPE, RMSNorm, a SwiGLU MLP, float32 throughout (so a loaded prefix can be compared with a
recomputed one to float rounding). Attention over the pages uses libswiftkv's multi-token paged
attention (the host path); the from-scratch reference uses plain numpy attention.
"""

from __future__ import annotations

import numpy as np

import swiftkv

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 8, 2, 64
D_MODEL, D_FF, VOCAB = Q_HEADS * HEAD_DIM, 1024, 512
BLOCK, CHUNK = 16, 32


def model_desc() -> swiftkv.ModelDesc:
    return swiftkv.ModelDesc("tiny-gqa", num_layers=LAYERS, num_kv_heads=KV_HEADS,
                             head_dim=HEAD_DIM, block_tokens=BLOCK, chunk_tokens=CHUNK,
                             dtype=swiftkv.DType.F32)


class Weights:
    def __init__(self, seed: int = 1234):
        r = np.random.default_rng(seed)

        def w(*shape):
            return (r.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

        self.embed = (r.standard_normal((VOCAB, D_MODEL)) * 0.5).astype(np.float32)
        self.layers = [dict(norm1=np.ones(D_MODEL, np.float32), wq=w(D_MODEL, D_MODEL),
                            wk=w(D_MODEL, KV_HEADS * HEAD_DIM), wv=w(D_MODEL, KV_HEADS * HEAD_DIM),
                            wo=w(D_MODEL, D_MODEL), norm2=np.ones(D_MODEL, np.float32),
                            w1=w(D_MODEL, D_FF), w3=w(D_MODEL, D_FF), w2=w(D_FF, D_MODEL))
                       for _ in range(LAYERS)]
        self.norm = np.ones(D_MODEL, np.float32)
        self.unembed = w(D_MODEL, VOCAB)


def rms_norm(x, g):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g).astype(np.float32)


def rope(x, positions):
    """x: [tokens, heads, HEAD_DIM], rotated by position (the two halves as pairs)."""
    half = HEAD_DIM // 2
    freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float64) / half))
    ang = np.outer(positions, freq)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(np.float32)


def qkv(lw, x, positions):
    h = rms_norm(x, lw["norm1"])
    q = rope((h @ lw["wq"]).reshape(-1, Q_HEADS, HEAD_DIM), positions)
    k = rope((h @ lw["wk"]).reshape(-1, KV_HEADS, HEAD_DIM), positions)
    v = (h @ lw["wv"]).reshape(-1, KV_HEADS, HEAD_DIM)
    return q, k, v


def finish_layer(lw, x, attn):
    x = x + attn.reshape(-1, D_MODEL) @ lw["wo"]
    h = rms_norm(x, lw["norm2"])
    g = h @ lw["w1"]
    return (x + ((g / (1.0 + np.exp(-g))) * (h @ lw["w3"])) @ lw["w2"]).astype(np.float32)


def reference_logits(w: Weights, tokens: np.ndarray, first: int) -> np.ndarray:
    """From scratch, no cache: logits of positions [first, len(tokens))."""
    n = len(tokens)
    x = w.embed[tokens]
    pos = np.arange(n)
    mask = np.tril(np.ones((n, n), bool))
    for lw in w.layers:
        q, k, v = qkv(lw, x, pos)
        out = np.zeros_like(q)
        for h in range(Q_HEADS):
            kh = h // (Q_HEADS // KV_HEADS)
            s = (q[:, h].astype(np.float64) @ k[:, kh].astype(np.float64).T) / np.sqrt(HEAD_DIM)
            s = np.where(mask, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, h] = ((p / p.sum(axis=1, keepdims=True)) @ v[:, kh]).astype(np.float32)
        x = finish_layer(lw, x, out)
    return rms_norm(x[first:], w.norm) @ w.unembed


class StreamRetry(Exception):
    """A load failed below a layer whose KV already sits in stream pages: restart the step."""


class Engine:
    """One model served from one process: its pages, its pool, and the step loop.

    The pool is library-made: regular pages, plus stream pages whose memory every layer shares
    (the layer stream cache). The oldest blocks of a conversation go to the stream pages, so
    their KV is in the engine's memory one layer at a time: loaded for layer l, read by layer
    l's attention, then replaced by layer l+1's load once save_layer(l) has run."""

    def __init__(self, ctx: swiftkv.Context, weights: Weights, max_tokens: int = 1024,
                 stream_pages: int = 6):
        self.w = weights
        self.model = ctx.register_model(model_desc())
        self.pool = self.model.pool_create(max_tokens // BLOCK, stream_pages)
        self.layout = self.pool.describe()
        d = self.layout
        self.kv = [self.pool.layer(l) for l in range(LAYERS)]  # [pages, 2, B, H, D] views
        stream = list(range(d["stream_first"], d["stream_first"] + d["stream_pages"]))
        regular = [p for p in range(d["num_pages"]) if p not in stream]
        # Block b of a conversation goes to page self.pages[b]: the stream pages first, then
        # regular pages in a shuffled order, as an engine's allocator hands them out.
        shuffled = list(np.random.default_rng(7).permutation(regular))
        self.pages = np.array(stream + shuffled, dtype=np.int32)
        self.att = swiftkv.AttentionDesc(num_qo_heads=Q_HEADS, num_kv_heads=KV_HEADS,
                                         head_dim=HEAD_DIM, page_tokens=BLOCK,
                                         dtype=swiftkv.DType.F32)
        self.workspace = swiftkv.attention_workspace(self.att, 1, max_tokens)

    def _attention(self, q, layer, n):
        """Queries of the last len(q) tokens over the KV of tokens [0, n) in the pages."""
        t = len(q)
        used = (n + BLOCK - 1) // BLOCK
        plan = swiftkv.AttentionPlan(self.att, [0, t], [0, used], [n - (used - 1) * BLOCK],
                                     self.workspace)
        out = np.zeros_like(q)
        d = self.layout
        k_base = d["layer_base"][layer]
        plan.run(q, k_base, k_base + d["kv_stride"] * 4, self.pages[:used], out,
                 page_stride=d["page_stride"], token_stride=d["token_stride"],
                 head_stride=d["head_stride"], num_pages=d["num_pages"])
        return out

    def _write_kv(self, layer, k, v, first):
        for i in range(len(k)):
            p, o = self.pages[(first + i) // BLOCK], (first + i) % BLOCK
            self.kv[layer][p, 0, o] = k[i]
            self.kv[layer][p, 1, o] = v[i]

    def turn(self, tokens: np.ndarray, logits_from: int) -> tuple[np.ndarray, dict]:
        """One engine step over tokens (the whole conversation so far): loads what the cache
        has layer by layer, computes the rest, saves the new chunks; returns the logits of
        positions [logits_from, n) and what happened. A step that loses a chunk below a layer
        already in the stream pages is run again (the lost chunks are recomputed then)."""
        for attempt in range(3):
            try:
                return self._step(tokens, logits_from, attempt)
            except StreamRetry:
                continue
        raise RuntimeError("three attempts lost chunks mid-load")

    def _step(self, tokens, logits_from, attempt):
        n = len(tokens)
        used = (n + BLOCK - 1) // BLOCK
        prefix = self.model.lookup(tokens)["prefix_tokens"]
        # The pages served other requests since: nothing in them may be trusted (NaN shows it).
        for kv in self.kv:
            kv.fill(np.nan)
        streamed = min(used, self.layout["stream_pages"]) * BLOCK
        with self.model.request(self.pool, tokens, self.pages[:used]) as req:
            req.start_load()
            start = None  # tokens [start, n) are computed; [0, start) were loaded
            x = None
            valid_per_layer = []
            for l in range(LAYERS):
                valid = req.wait_layer_load(l)
                valid_per_layer.append(valid)
                if start is None:
                    start = min(valid, logits_from)
                    x = self.w.embed[tokens[start:]]
                elif valid < start:
                    if valid < streamed:
                        raise StreamRetry()  # lower layers' KV there is gone: start over
                    # A load failed mid-way: recompute [valid, n) through the layers below.
                    start = valid
                    x = self.w.embed[tokens[start:]]
                    for j in range(l):
                        x = self._layer(j, x, start, n)
                x = self._layer(l, x, start, n)
                req.save_layer(l)
            saved = req.wait_save()
        logits = rms_norm(x[logits_from - start:], self.w.norm) @ self.w.unembed
        return logits, {"prefix": prefix, "loaded": valid_per_layer[-1], "computed_from": start,
                        "saved": saved, "streamed": streamed, "attempts": attempt + 1,
                        "info": req.final}

    def _layer(self, l, x, start, n):
        lw = self.w.layers[l]
        q, k, v = qkv(lw, x, np.arange(start, n))
        self._write_kv(l, k, v, start)
        return finish_layer(lw, x, self._attention(q, l, n))

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """One decode step: the last token of `tokens` (the rest are the conversation so far).
        It is an engine step like any other: the cached prefix streams in layer by layer and
        the tokens after the last cached chunk are computed; its logits, [1, VOCAB]."""
        logits, _ = self.turn(tokens, len(tokens) - 1)
        return logits
