"""SwiftKVCache under transformers: small Llama and Qwen2 models with random weights (configs
built here; nothing downloaded) serve multi-turn conversations through libswiftkv, from host
memory, from disk (also through a new context on the same disk path) and from lent memory.
Every turn computes only the tokens after the cached prefix, and its logits are compared with a
full recompute of the whole conversation.

Tolerance: none against a recompute of the prefix with eager attention on the CPU in float32:
the logits equal (torch.equal) those of the same rows computed by transformers' own
DynamicCache over the prefix recomputed, the cached K/V being the very bytes the model computed.
Against the whole conversation computed at once the difference is torch's, not the cache's: its
kernels reduce a turn's rows over another split than the whole sequence's (1.5e-7 at most here,
with DynamicCache as with this cache), so that comparison allows 1e-5. With SDPA attention the
same holds within 1e-5 relative (test_sdpa_attention).

transformers 5 (the cache-layer interface) on torch 2; tests/transformers/requirements.txt pins
what CI runs."""

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from transformers.cache_utils import DynamicCache

import swiftkv
from swiftkv.integrations.transformers import SwiftKVCache, model_desc

CHUNK = 32
VOCAB = 256


def make_model(family: str, attn: str = "eager"):
    torch.manual_seed({"llama": 1, "qwen2": 2}[family])
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    if family == "llama":
        cfg, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        cfg, cls = Qwen2Config(**common), Qwen2ForCausalLM
    cfg._attn_implementation = attn
    return cls(cfg).eval()


def with_cache(model, cache):
    """The keyword the model's forward takes a cache by (cache, or past_key_values before it)."""
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {key: cache}


def conversation(seed: int, turns: int):
    """Turn k's whole conversation: the previous one plus an answer and a new question."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, 70), generator=g)
    out = [ids]
    for _ in range(turns - 1):
        ids = torch.cat([ids, torch.randint(0, VOCAB, (1, 45), generator=g)], 1)
        out.append(ids)
    return out


def recomputed(model, ids, start):
    """The logits of ids[start:] with the prefix ids[:start] recomputed, through transformers'
    own DynamicCache."""
    if start == 0:
        return model(ids).logits[0]
    dc = DynamicCache()
    model(ids[:, :start], use_cache=True, **with_cache(model, dc))
    pos = torch.arange(start, ids.shape[1])
    return model(ids[:, start:], use_cache=True, position_ids=pos[None],
                 **with_cache(model, dc)).logits[0]


def check_logits(model, ids, out):
    """A turn's logits: bit-identical to the same rows over the prefix recomputed, and within
    float32 rounding of the whole conversation computed at once (torch 2's kernels reduce 45
    rows and 205 over different splits: 1.5e-7 apart with DynamicCache as with this cache)."""
    assert torch.equal(out.logits[0], recomputed(model, ids, out.cached_tokens))
    full = model(ids).logits[0, out.cached_tokens:]
    assert (out.logits[0] - full).abs().max().item() < 1e-5


def serve(cache, model, turns, prev_tokens=0):
    """Runs the turns; checks cached tokens and logits against a recompute."""
    cached = []
    with torch.no_grad():
        for ids in turns:
            out = cache.prefill(model, ids)
            check_logits(model, ids, out)
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
                step = model(input_ids=nxt.view(1, 1), use_cache=True, position_ids=pos,
                             **with_cache(model, cache))
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
            model(input_ids=ids, use_cache=True, **with_cache(model, cache))  # whole turn again
        cache.abort()
        assert ctx.stats()["requests_open"] == 0


def test_save_only_and_load_only_shapes():
    """An engine that runs the model first (its own DynamicCache) stores the result with one
    save-only request; a later turn loads the prefix with one load-only request into the pages,
    builds its DynamicCache from them and computes only the rest: logits equal a recompute."""
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
        engine = DynamicCache()
        with torch.no_grad():
            model(turn1, use_cache=True, **with_cache(model, engine))
        # Save-only: the engine's K/V ([1, H, T, D] per layer) into pages 0.., then one request.
        for l, t in enumerate(layers):
            t[0].view(-1, H, D)[:n1] = engine.layers[l].keys[0].transpose(0, 1)
            t[1].view(-1, H, D)[:n1] = engine.layers[l].values[0].transpose(0, 1)
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
            got = model(input_ids=turn2[:, p:], use_cache=True, position_ids=pos[None],
                        **with_cache(model, dc)).logits[0]
            assert torch.equal(got, recomputed(model, turn2, p))
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


def test_mask_and_length_before_the_first_layer():
    """What transformers reads of the cache before layer 0 runs (the attention mask's size, the
    positions) counts the cached prefix: the bug of the first transformers 5 run, where the mask
    ignored it and the logits were off by up to 0.55."""
    model = make_model("llama")
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model, "llama-mask", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=512)
        first, second = conversation(9, 2)
        serve(cache, model, [first])
        start = cache.begin(second)
        assert start == 64
        n = second.shape[1]
        assert cache.get_seq_length() == 64
        # (Its first argument is the query length, or before 5.2x the query's positions.)
        params = inspect.signature(cache.get_mask_sizes).parameters
        query = torch.arange(64, n) if "cache_position" in params else n - 64
        for layer in range(3):
            assert cache.get_mask_sizes(query, layer) == (n, 0)
        cache.abort()
        assert cache.get_seq_length() == 0  # the aborted turn left nothing behind


def test_sdpa_attention():
    model = make_model("qwen2", attn="sdpa")
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model, "qwen2-sdpa", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=512)
        with torch.no_grad():
            for ids in conversation(10, 3):
                out = cache.prefill(model, ids)
                full = model(ids).logits[0, out.cached_tokens:]
                err = ((out.logits[0] - full).norm() / full.norm()).item()
                assert err < 1e-5, err
        assert out.cached_tokens == 96


def test_generate():
    """generate over a turn: the prefix comes from the library, the rest of the prompt is
    computed and saved, and the greedy tokens are those of generate with a DynamicCache."""
    model = make_model("llama")
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model, "llama-generate", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=512)
        turns = conversation(11, 2)
        serve(cache, model, turns[:1])
        with torch.no_grad():
            got = cache.generate(model, turns[1], max_new_tokens=8, do_sample=False)
            want = model.generate(turns[1], max_new_tokens=8, do_sample=False)
        assert cache.cached_tokens == 64
        assert torch.equal(got, want)
        # Its prompt was saved: the next turn finds all of it but the partial last chunk.
        assert km.lookup(turns[1][0])["prefix_tokens"] == (turns[1].shape[1] // CHUNK) * CHUNK
        assert ctx.stats()["requests_open"] == 0


def test_model_desc_from_the_model():
    model = make_model("qwen2").to(torch.bfloat16)
    d = model_desc(model, "qwen2-desc")
    assert (d.num_layers, d.num_kv_heads, d.head_dim) == (3, 2, 16)
    assert d.dtype == swiftkv.DType.BF16 and d.device == swiftkv.DEVICE_HOST
    assert model_desc(model.config, "qwen2-desc").dtype == swiftkv.DType.F32
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(d)
        with pytest.raises(ValueError, match="desc says device"):
            SwiftKVCache(km, max_tokens=64, device="cuda:0")


def test_the_extra_keeps_what_is_installed():
    """pip install swiftkv[transformers] keeps the torch and transformers installed here (newer
    than any pin would be): the extra names ranges, and these versions are in them."""
    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    reqs = [Requirement(r) for r in extra["transformers"]]
    assert sorted(r.name for r in reqs) == ["torch", "transformers"]
    for r in reqs:
        assert "==" not in str(r.specifier), r
        assert r.specifier.contains(version(r.name).split("+")[0]), (r, version(r.name))


def test_the_docs_example_runs(tmp_path):
    """docs/bindings.md's example as written, with a small model as hf_model, a conversation as
    ids and a temporary directory for its disk path."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "bindings.md").read_text()
    start = text.index("<!-- docs example: transformers")
    code = text[text.index("```python\n", start) + 10:text.index("```\n", text.index("```python\n", start) + 10)]
    assert "/ssd/kv" in code
    (tmp_path / "kv").mkdir()
    code = code.replace("/ssd/kv", str(tmp_path / "kv")).replace("1 << 30", "64 << 20")
    model = make_model("llama")
    ns = {"hf_model": model, "ids": conversation(12, 1)[0]}
    with torch.no_grad():
        exec(compile(code, "docs/bindings.md", "exec"), ns)
    assert ns["out"].cached_tokens == 0
    assert ns["tokens"].shape[1] == ns["ids"].shape[1] + 64
    ns["ctx"].close()


def test_the_default_identity_changes_with_the_weights():
    """model_desc(model, name) names the weights: the same weights give the same identity (a
    later context finds their chunks), other weights under the same name another, and they
    share nothing."""
    a, same, b = make_model("llama"), make_model("llama"), make_model("llama")
    with torch.no_grad():
        b.model.layers[2].mlp.down_proj.weight[3, 5] += 0.25  # one weight of many
    da, db = model_desc(a, "llama", chunk_tokens=CHUNK), model_desc(b, "llama", chunk_tokens=CHUNK)
    assert da.identity == model_desc(same, "llama", chunk_tokens=CHUNK).identity
    assert da.identity.startswith("weights-") and da.identity != db.identity
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        ka, kb = ctx.register_model(da), ctx.register_model(db)
        turns = conversation(8, 2)
        serve(SwiftKVCache(ka, max_tokens=512), a, turns)
        assert serve(SwiftKVCache(kb, max_tokens=512), b, turns) == [0, 64]


def test_peft_adapters_never_share_kv():
    """One cache over a PEFT model with two LoRA adapters (random weights, so each changes the
    answer): a turn with adapter B loads nothing adapter A computed and equals B's own
    recompute; the base model (adapters disabled) neither; each finds its own chunks again;
    an adapter whose weights change is another."""
    from peft import LoraConfig, get_peft_model
    base = make_model("llama")
    torch.manual_seed(11)
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"],
                init_lora_weights=False)
    model = get_peft_model(base, LoraConfig(**lora), adapter_name="a")
    model.add_adapter("b", LoraConfig(**lora))
    model.eval()
    ids = conversation(9, 1)[0]  # 70 tokens: 2 chunks of 32
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model, "llama-peft", chunk_tokens=CHUNK))
        cache = SwiftKVCache(km, max_tokens=512)

        def turn(expect_cached):
            out = cache.prefill(model, ids)
            assert out.cached_tokens == expect_cached
            want = model(ids).logits[0, expect_cached:]
            assert torch.allclose(out.logits[0], want, atol=1e-5, rtol=0)
            return want

        model.set_adapter("a")
        a = turn(0)
        model.set_adapter("b")
        b = turn(0)  # A's chunks are not B's
        assert not torch.allclose(a, b, atol=1e-3)
        with model.disable_adapter():
            turn(0)  # nor the base model's
            turn(64)
        turn(64)  # B finds its own
        model.set_adapter("a")
        turn(64)
        with torch.no_grad():  # new weights for adapter A: another identity of its turns
            model.base_model.model.model.layers[0].self_attn.q_proj.lora_B["a"].weight.add_(0.5)
        turn(0)
        turn(64)


def test_sliding_window_layers_are_served_exactly():
    """A Mistral whose every layer attends to its last 24 tokens, and a Ministral whose layers
    alternate sliding and full attention: the cache hands a sliding layer the whole K/V and the model's
    mask keeps the window, so every turn's logits equal those over the prefix recomputed with
    DynamicCache (which keeps only the window), bit for bit, and the prefix is loaded."""
    from transformers import (MinistralConfig, MinistralForCausalLM, MistralConfig,
                              MistralForCausalLM)
    small = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=1024, sliding_window=24)
    models = [(MistralConfig(**small), MistralForCausalLM),
              (MinistralConfig(**small, layer_types=["sliding_attention", "full_attention",
                                                     "sliding_attention"]),
               MinistralForCausalLM)]
    for cfg, cls in models:
        torch.manual_seed(5)
        cfg._attn_implementation = "eager"
        model = cls(cfg).eval()
        with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
            km = ctx.register_model(model_desc(model, "swa", chunk_tokens=CHUNK))
            cache = SwiftKVCache(km, max_tokens=512)
            assert serve(cache, model, conversation(11, 3)) == [0, 64, 96]


def test_models_with_other_layers_are_refused_by_name():
    """LFM2 (convolution layers), Jamba (Mamba layers) and Qwen3-Next (linear attention) keep
    state that is not K/V per token: model_desc refuses them from their configs, and a turn
    refuses such a model even under a desc made by hand, naming the layer kinds, before the
    model runs (it used to fail inside transformers with an error about the cache's layers)."""
    from transformers import (JambaConfig, Lfm2Config, Lfm2ForCausalLM, Qwen3NextConfig)
    small = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2)
    configs = [(Lfm2Config(**small, full_attn_idxs=[1, 3]), "'conv'"),
               (JambaConfig(**small, attn_layer_period=2, attn_layer_offset=1),
                "'linear_attention'|'mamba'"),
               (Qwen3NextConfig(**small), "'linear_attention'")]
    for cfg, kind in configs:
        with pytest.raises(ValueError, match=f"full or sliding-window attention.*({kind}) layers"):
            model_desc(cfg, "hybrid")
    torch.manual_seed(6)
    cfg = configs[0][0]
    model = Lfm2ForCausalLM(cfg).eval()
    desc = swiftkv.ModelDesc("lfm2-by-hand", num_layers=4, num_kv_heads=2, head_dim=16,
                             block_tokens=16, chunk_tokens=CHUNK, dtype=swiftkv.DType.F32)
    ids = conversation(12, 1)[0]
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        cache = SwiftKVCache(ctx.register_model(desc), max_tokens=512)
        for call in (cache.prefill, cache.generate, cache.prefill_without_cache):
            with pytest.raises(ValueError, match="'conv' layers"):
                call(model, ids)
        assert ctx.stats()["requests_open"] == 0
