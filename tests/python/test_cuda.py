"""CUDA tensors through the Python binding: device pools made from torch CUDA tensors in every
layout, saved and loaded on the caller's stream; SwiftKVCache on a CUDA model against a
recompute; a registered tensor resized is refused. Skipped without a CUDA device (torch without
CUDA, or none the library sees); the GPU validation runs them."""

import inspect

import pytest

import swiftkv
from conftest import tokens_of

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or swiftkv.device_count() == 0:
    pytest.skip("no CUDA device", allow_module_level=True)

from test_tensors import B, D, H, _engine_tensors, _token_slot  # noqa: E402


@pytest.fixture
def cuda_model(small_model):
    small_model.device = 0
    return small_model


@pytest.mark.parametrize("layout", ["vllm", "nhd", "hnd", "cross_layer"])
def test_device_pool_round_trip_on_a_stream(cuda_model, layout):
    """K/V written by the engine on its own stream are saved by one request and loaded into
    other pages by the next, every library call enqueued on that stream (nothing synchronised
    by hand between layers), and come back bit-exact."""
    with swiftkv.Context(host_budget_bytes=8 << 20) as ctx:  # every visible device by default
        m = ctx.register_model(cuda_model)
        cpu = _engine_tensors(layout, 8)
        tensors = cpu.cuda() if layout == "cross_layer" else [t.cuda() for t in cpu]
        pool = m.pool_from_tensors(tensors, layout="auto" if layout != "hnd" else "hnd")
        tokens = tokens_of(9, 96)
        gen = torch.Generator().manual_seed(9)
        truth = torch.randn((2, 96, 2, H, D), generator=gen).to(torch.float16).cuda()
        pages = torch.tensor([5, 1, 7, 0, 3, 2], dtype=torch.int32)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s), m.request(pool, tokens, pages) as r:
            r.start_load(s)
            for l in range(2):
                assert r.wait_layer_load(l, s) == 0
                for tok in range(96):
                    k, v = _token_slot(layout, tensors, l, int(pages[tok // B]), tok % B)
                    k.copy_(truth[l, tok, 0])
                    v.copy_(truth[l, tok, 1])
                r.save_layer(l, s)
            assert r.wait_save(s) == 96
        with torch.cuda.stream(s):
            for t in ([tensors] if layout == "cross_layer" else tensors):
                t.zero_()
        pages2 = [4, 6, 0, 1, 2, 3]
        with torch.cuda.stream(s), m.request(pool, tokens, pages2,
                                             shape=swiftkv.RequestShape.LOAD_ONLY) as r:
            r.start_load(s)
            for l in range(2):
                assert r.wait_layer_load(l, s) == 96
        s.synchronize()
        for l in range(2):
            for tok in range(96):
                k, v = _token_slot(layout, tensors, l, pages2[tok // B], tok % B)
                assert torch.equal(k, truth[l, tok, 0]) and torch.equal(v, truth[l, tok, 1])
        pool.close()


def test_a_resized_cuda_tensor_is_refused(cuda_model):
    with swiftkv.Context(host_budget_bytes=8 << 20) as ctx:
        m = ctx.register_model(cuda_model)
        tensors = [t.cuda() for t in _engine_tensors("vllm", 8)]
        pool = m.pool_from_tensors(tensors)
        tensors[1].resize_(0)
        with pytest.raises(swiftkv.StateError, match="tensor 1 changed"):
            m.request(pool, tokens_of(1, 32), [0, 1])
        pool.close()


def test_a_host_only_context_says_what_to_do(cuda_model):
    """A model on a device registers in a host-only context (its lookups need no device), but
    a pool over CUDA tensors is refused with ENODEV, naming the option to set."""
    with swiftkv.Context(host_budget_bytes=8 << 20, device_mask=0) as ctx:
        assert ctx.device_count() == 0
        m = ctx.register_model(cuda_model)
        tensors = [t.cuda() for t in _engine_tensors("vllm", 8)]
        with pytest.raises(swiftkv.Error, match="device_mask") as e:
            m.pool_from_tensors(tensors)
        assert e.value.status == swiftkv.Status.ENODEV


def test_swiftkv_cache_on_cuda():
    """A model on the GPU: the cache's pages follow it there with no device option, and each
    turn's logits match a recompute."""
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("the integration needs transformers 5")
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache
    from swiftkv.integrations.transformers import SwiftKVCache, model_desc

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval().cuda()
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (1, 70), generator=g)
    turns = [ids]
    for _ in range(2):
        ids = torch.cat([ids, torch.randint(0, 256, (1, 45), generator=g)], 1)
        turns.append(ids)
    with swiftkv.Context(host_budget_bytes=64 << 20) as ctx:
        km = ctx.register_model(model_desc(model, "llama-cuda", chunk_tokens=32))
        assert km.desc.device == torch.cuda.current_device()
        cache = SwiftKVCache(km, max_tokens=512)
        assert cache.pages[0].is_cuda
        with torch.no_grad():
            prev = 0
            for ids in turns:
                ids = ids.cuda()
                out = cache.prefill(model, ids)
                start = out.cached_tokens
                # Each turn finds the whole chunks of the turn before it.
                assert start == prev // 32 * 32
                prev = ids.shape[1]
                dc = DynamicCache()
                if start:
                    model(ids[:, :start], use_cache=True, **{key: dc})
                pos = torch.arange(start, ids.shape[1], device=ids.device)
                want = model(ids[:, start:], use_cache=True, position_ids=pos[None],
                             **{key: dc}).logits[0]
                assert (out.logits[0] - want).abs().max().item() < 1e-4
        assert out.cached_tokens == 96  # the 115 tokens of turn two: three chunks
