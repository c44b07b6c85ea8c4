"""SwiftKVCache under transformers: small Llama and Qwen2 models with random weights (configs
built here; nothing downloaded) serve multi-turn conversations through libswiftkv, from host
memory, from disk (also through a new context on the same disk path) and from lent memory.
Every turn computes only the tokens after the cached prefix, and its logits are compared with a
full recompute of the whole conversation.

Tolerance: none. With eager attention on the CPU in float32 the logits are bit-identical
(torch.equal): the cached K/V are the very bytes the model computed, and each row computed is
the same row with the same reductions. (Fused SDPA attention needs torch >= 2.1.1 in this
transformers, newer than Debian's 1.13.)"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import swiftkv
from swiftkv.integrations.transformers import SwiftKVCache, model_desc

CHUNK = 32
VOCAB = 256


def make_model(family: str):
    torch.manual_seed({"llama": 1, "qwen2": 2}[family])
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if family == "llama":
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    cfg._attn_implementation = "eager"
    return cls(cfg).eval()


def conversation(seed: int, turns: int):
    """Turn k's whole conversation: the previous one plus an answer and a new question."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, 70), generator=g)
    out = [ids]
    for _ in range(turns - 1):
        ids = torch.cat([ids, torch.randint(0, VOCAB, (1, 45), generator=g)], 1)
        out.append(ids)
    return out


def serve(cache, model, turns, prev_tokens=0):
    """Runs the turns; checks cached tokens and logits against a full recompute."""
    cached = []
    with torch.no_grad():
        for ids in turns:
            out = cache.prefill(model, ids)
            full = model(ids).logits[0, out.cached_tokens:]
            assert torch.equal(out.logits[0], full)
            # Everything the last turn saw is cached, in whole chunks.
            assert out.cached_tokens == (prev_tokens // CHUNK) * CHUNK
            cached.append(out.cached_tokens)
            prev_tokens = ids.shape[1]
    return cached


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_host_tier_multi_turn(family):
    model = make_model(family)
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model.config, f"{family}-random-1", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=512)
        cached = serve(cache, model, conversation(3, 4))
        assert cached == [0, 64, 96, 160]
        assert ctx.stats()["chunks"][swiftkv.Tier.HOST] == 205 // CHUNK


def test_disk_tier_and_a_new_context(tmp_path):
    (tmp_path / "direct").mkdir()
    model = make_model("llama")
    desc = model_desc(model.config, "llama-random-1", chunk_tokens=CHUNK)
    turns = conversation(4, 4)
    # No host memory: every chunk saved goes to disk.
    with swiftkv.Context(disk_path=str(tmp_path / "direct"), disk_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(desc)
        serve(SwiftKVCache(km, max_tokens=512), model, turns[:3])
        assert km.lookup(turns[2][0])["chunks_per_tier"] == [0, 0, 160 // CHUNK]
    # Host memory and disk: the chunks stay in host memory while the context lives and are
    # written to disk when it closes (write_back_on_close, on by default).
    with swiftkv.Context(host_budget_bytes=64 << 20, disk_path=str(tmp_path),
                         disk_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(desc)
        serve(SwiftKVCache(km, max_tokens=512), model, turns[:3])
        assert km.lookup(turns[2][0])["chunks_per_tier"] == [0, 160 // CHUNK, 0]
    # A later process: the same disk path serves the conversation's next turn.
    with swiftkv.Context(disk_path=str(tmp_path), disk_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(desc)
        assert km.lookup(turns[3][0])["prefix_tokens"] == 160
        serve(SwiftKVCache(km, max_tokens=512), model, turns[3:], prev_tokens=turns[2].shape[1])


def test_lent_memory():
    model = make_model("qwen2")
    desc = model_desc(model.config, "qwen2-random-1", chunk_tokens=CHUNK)
    lender = swiftkv.ModelDesc("lender", num_layers=4, num_kv_heads=2, head_dim=16,
                               dtype=swiftkv.DType.F32)
    _, unit_blocks = swiftkv.lend_unit(desc, lender)
    region_bytes = unit_blocks * 8 * lender.block_tokens * lender.bytes_per_token
    # The host budget holds the region (host memory here, as a lender's GPU memory on a GPU
    # machine) and nothing more: no host tier, no disk tier, only the borrowed memory.
    with swiftkv.Context(host_budget_bytes=region_bytes) as ctx:
        km = ctx.register_model(desc)
        region = ctx.elastic(lender, desc, capacity_blocks=unit_blocks * 8)
        km.borrow(region, 8)
        turns = conversation(5, 3)
        serve(SwiftKVCache(km, max_tokens=512), model, turns)
        assert km.lookup(turns[-1][0])["chunks_per_tier"][swiftkv.Tier.PEER] == 160 // CHUNK


def test_a_changed_identity_never_hits():
    """New weights under the same name: with their revision as the identity, nothing of the old
    weights' KV is served (it would be wrong, silently), and each revision keeps its own."""
    a, b = make_model("llama"), make_model("llama")
    with torch.no_grad():
        b.model.layers[0].self_attn.k_proj.weight.mul_(1.5)
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        ka = ctx.register_model(model_desc(a.config, "llama", identity="rev-a", chunk_tokens=CHUNK))
        kb = ctx.register_model(model_desc(b.config, "llama", identity="rev-b", chunk_tokens=CHUNK))
        turns = conversation(6, 2)
        serve(SwiftKVCache(ka, max_tokens=512), a, turns)
        assert serve(SwiftKVCache(kb, max_tokens=512), b, turns) == [0, 64]
        # Served the old revision's KV, the new weights' logits would be wrong: the test above
        # would catch it (logits are compared with b's own recompute).
        cache = SwiftKVCache(ka, max_tokens=512)
        stale = cache.prefill(b, turns[1])
        assert stale.cached_tokens == 96
        assert not torch.equal(stale.logits[0], b(turns[1]).logits[0, 96:])


def test_decoding_after_a_turn():
    model = make_model("llama")
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model.config, "llama-decode", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=512)
        turns = conversation(7, 3)
        serve(cache, model, turns)
        # Greedy decoding after the last turn's prefill, as with DynamicCache.
        ids = turns[-1]
        with torch.no_grad():
            out = cache.prefill(model, ids)
            got = []
            nxt = out.logits[0, -1].argmax()
            for i in range(6):
                got.append(int(nxt))
                pos = torch.tensor([[ids.shape[1] + i]])
                step = model(input_ids=nxt.view(1, 1), past_key_values=cache, use_cache=True,
                             position_ids=pos, cache_position=pos[0])
                nxt = step.logits[0, -1].argmax()
            want, seq = [], ids
            for _ in range(6):
                t = model(seq).logits[0, -1].argmax()
                want.append(int(t))
                seq = torch.cat([seq, t.view(1, 1)], 1)
        assert got == want


def test_wrong_use_is_refused():
    model = make_model("llama")
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model.config, "llama-misuse", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=128)
        with pytest.raises(ValueError, match="1..128"):
            cache.begin(torch.zeros((1, 200), dtype=torch.long))
        with pytest.raises(ValueError, match="batch 1"):
            cache.begin(torch.zeros((2, 10), dtype=torch.long))
        ids = torch.randint(0, VOCAB, (1, 64))
        cache.prefill(model, ids)
        start = cache.begin(ids)
        assert start == 63  # all cached: the last token is computed again
        with torch.no_grad(), pytest.raises(ValueError, match="input_ids\\[..., cached_tokens:\\]"):
            model(input_ids=ids, past_key_values=cache, use_cache=True)  # whole turn again
        cache.abort()
        assert ctx.stats()["requests_open"] == 0


def test_save_only_and_load_only_shapes():
    """An engine that runs the model first (its own DynamicCache) stores the result with one
    save-only request; a later turn loads the prefix with one load-only request into the pages,
    builds its DynamicCache from them and computes only the rest: logits equal a recompute."""
    from transformers.cache_utils import DynamicCache

    model = make_model("llama")
    cfg = model.config
    desc = model_desc(cfg, "llama-shapes", chunk_tokens=CHUNK)
    B, H, D = desc.block_tokens, desc.num_kv_heads, desc.head_dim
    pages_n = 512 // B
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(desc)
        layers = [torch.zeros((2, pages_n, B, H, D)) for _ in range(desc.num_layers)]
        pool = km.pool_from_tensors(layers, layout="vllm")
        turn1, turn2 = conversation(8, 2)
        n1 = turn1.shape[1]
        with torch.no_grad():
            out = model(turn1, use_cache=True, past_key_values=DynamicCache())
        # Save-only: the engine's K/V ([1, H, T, D] per layer) into pages 0.., then one request.
        for l, t in enumerate(layers):
            t[0].view(-1, H, D)[:n1] = out.past_key_values.key_cache[l][0].transpose(0, 1)
            t[1].view(-1, H, D)[:n1] = out.past_key_values.value_cache[l][0].transpose(0, 1)
        pages = torch.arange(-(-n1 // B), dtype=torch.int32)
        with km.request(pool, turn1, pages, shape=swiftkv.RequestShape.SAVE_ONLY) as r:
            for l in range(desc.num_layers):
                r.save_layer(l)
            assert r.wait_save() == (n1 // CHUNK) * CHUNK
        for t in layers:
            t.zero_()
        # Load-only: the cached prefix of the next turn into the pages, nothing saved.
        n2 = turn2.shape[1]
        pages = torch.arange(-(-n2 // B), dtype=torch.int32)
        with km.request(pool, turn2, pages, shape=swiftkv.RequestShape.LOAD_ONLY) as r:
            r.start_load()
            cached = [r.wait_layer_load(l) for l in range(desc.num_layers)]
            assert r.info()["save_tokens"] == 0
        p = cached[0]
        assert cached == [(n1 // CHUNK) * CHUNK] * desc.num_layers
        dc = DynamicCache()
        for l, t in enumerate(layers):
            dc.update(t[0].view(-1, H, D)[:p].transpose(0, 1)[None].contiguous(),
                      t[1].view(-1, H, D)[:p].transpose(0, 1)[None].contiguous(), l)
        with torch.no_grad():
            pos = torch.arange(p, n2)
            got = model(input_ids=turn2[:, p:], past_key_values=dc, use_cache=True,
                        position_ids=pos[None], cache_position=pos).logits[0]
            assert torch.equal(got, model(turn2).logits[0, p:])
        assert ctx.stats()["stores"] == n1 // CHUNK


def test_compressed_chunks():
    """Chunks stored under a codec in host memory (bf16 K/V): lossless zstd serves logits
    identical to exact chunks; lossy codecs serve logits that differ, by more as the bits fall,
    and within a bound for 8 bits (bench/bench_quality.py measures the same at a larger size;
    docs/codecs.md has its table)."""
    model = make_model("llama").to(torch.bfloat16)
    turns = conversation(8, 3)
    K = swiftkv.CodecKind

    def served(codec):
        with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
            km = ctx.register_model(model_desc(model.config, "llama-bf16", dtype=torch.bfloat16,
                                               chunk_tokens=CHUNK))
            if codec is not None:
                km.set_compression(accept_lossy=True, host=codec)
            cache = SwiftKVCache(km, max_tokens=512)
            with torch.no_grad():
                outs = [cache.prefill(model, ids) for ids in turns]
            assert [o.cached_tokens for o in outs] == [0, 64, 96]
            if codec is not None:
                kind = int(codec.kind)
                assert ctx.codec_stats()["chunks"][kind][swiftkv.Tier.HOST] == 160 // CHUNK
            return torch.cat([o.logits[0].float() for o in outs[1:]])

    exact = served(None)

    def rel_err(codec):
        d = served(codec) - exact
        return (d.pow(2).sum() / exact.pow(2).sum()).sqrt().item()

    try:
        assert torch.equal(served(swiftkv.Codec(K.ZSTD, byte_planes=True)), exact)
    except swiftkv.Error as e:
        assert e.status == swiftkv.Status.EUNSUPPORTED  # a build without libzstd
    e8, e4, e2 = (rel_err(swiftkv.Codec(K.KIVI, bits=b, group=32)) for b in (8, 4, 2))
    assert 0 < e8 < e4 < e2
    assert e8 < 2e-2
    assert 0 < rel_err(swiftkv.Codec(K.FP8)) < 5e-2
