"""Pools (library-made and engine-owned numpy tensors) and the connector's per-layer calls."""

import numpy as np
import pytest

import swiftkv
from conftest import chunks_of, tokens_of


def test_pool_create_and_views(ctx, small_model):
    m = ctx.register_model(small_model)
    pool = m.pool_create(8, 2)
    d = pool.describe()
    assert d["num_pages"] >= 10 and d["stream_pages"] == 2 and d["model"] == m.id
    layer0, layer1 = pool.layer(0), pool.layer(1)
    assert layer0.shape == (d["num_pages"], 2, 16, 2, 16)
    # Stream pages share their memory across layers; regular pages do not.
    s = d["stream_first"]
    layer0[s, 0, 0, 0, 0] = 3.0
    assert layer1[s, 0, 0, 0, 0] == 3.0
    layer0[0, 0, 0, 0, 0] = 5.0
    assert layer1[0, 0, 0, 0, 0] != 5.0
    pool.close()


def run_request(m, pool, layers, tokens, pages, write):
    """One engine step: load, check, compute (write) the rest, save."""
    with m.request(pool, tokens, pages) as r:
        r.start_load()
        info = r.info()
        valid = []
        for l in range(m.desc.num_layers):
            valid.append(r.wait_layer_load(l))
            write(l, valid[-1])
            r.save_layer(l)
        saved = r.wait_save()
    return info, valid, saved, r.final


def test_engine_tensors_round_trip(ctx, small_model):
    m = ctx.register_model(small_model)
    pages_n = 8
    # The engine's own tensors, vLLM-like per layer: [2, pages, B, H, D].
    layers = [np.zeros((2, pages_n, 16, 2, 16), np.float16) for _ in range(2)]
    page_elems = 16 * 2 * 16
    pool = m.pool_register([l for l in layers], page_stride=page_elems,
                           kv_stride=pages_n * page_elems, token_stride=32, head_stride=16,
                           num_pages=pages_n, layer_span_bytes=layers[0].nbytes)
    tokens = tokens_of(7, 96)
    pages = [5, 1, 7, 0, 3, 2]
    rng = np.random.default_rng(7)
    truth = [rng.standard_normal((2, 96, 2, 16)).astype(np.float16) for _ in range(2)]

    def write(l, from_token):
        for tok in range(from_token, 96):
            layers[l][:, pages[tok // 16], tok % 16] = truth[l][:, tok]

    info, valid, saved, final = run_request(m, pool, layers, tokens, pages, write)
    assert valid == [0, 0] and saved == 96 and final["saved_tokens"] == 96
    for l in layers:
        l[:] = 0
    pages2 = [4, 6, 0, 1, 2, 3]
    info, valid, saved, _ = run_request(m, pool, layers, tokens, pages2, lambda l, v: None)
    assert valid == [96, 96] and info["load_end_tokens"] == 96
    for l in range(2):
        for tok in range(96):
            assert np.array_equal(layers[l][:, pages2[tok // 16], tok % 16], truth[l][:, tok])


def test_named_requests(ctx, small_model):
    """A request whose chunks are named by the engine: no tokens, saved under the names, loaded
    back by a request with the same names into other pages; other names load nothing."""
    m = ctx.register_model(small_model)
    pages_n = 8
    layers = [np.zeros((2, pages_n, 16, 2, 16), np.float16) for _ in range(2)]
    page_elems = 16 * 2 * 16
    pool = m.pool_register([l for l in layers], page_stride=page_elems,
                           kv_stride=pages_n * page_elems, token_stride=32, head_stride=16,
                           num_pages=pages_n, layer_span_bytes=layers[0].nbytes)
    names = [bytes([7, i]) * 8 for i in range(3)]
    rng = np.random.default_rng(8)
    truth = [rng.standard_normal((2, 96, 2, 16)).astype(np.float16) for _ in range(2)]
    pages = [5, 1, 7, 0, 3, 2]
    with m.request(pool, 96, pages, names=names) as r:
        r.start_load()
        for l in range(2):
            assert r.wait_layer_load(l) == 0
            for tok in range(96):
                layers[l][:, pages[tok // 16], tok % 16] = truth[l][:, tok]
            r.save_layer(l)
        assert r.wait_save() == 96
    assert m.lookup_named(names).prefix_tokens == 96
    for l in layers:
        l[:] = 0
    pages2 = [4, 6, 0, 1, 2, 3]
    with m.request(pool, 96, pages2, names=names,
                   shape=swiftkv.RequestShape.LOAD_ONLY) as r:
        r.start_load()
        assert [r.wait_layer_load(l) for l in range(2)] == [96, 96]
    for l in range(2):
        for tok in range(96):
            assert np.array_equal(layers[l][:, pages2[tok // 16], tok % 16], truth[l][:, tok])
    with m.request(pool, 96, pages2, names=[b"z" * 16] * 3) as r:
        assert r.info()["load_end_tokens"] == 0
    with pytest.raises(swiftkv.InvalidArgument):
        m.request(pool, 96, pages2, names=names[:2])  # 2 names for 3 full chunks


def test_open_requests_are_bounded(small_model):
    with swiftkv.Context(host_budget_bytes=8 << 20, max_open_requests=1) as ctx:
        m = ctx.register_model(small_model)
        assert ctx.stats()["index_capacity_chunks"] >= (8 << 20) // (8 << 10)
        pool = m.pool_create(4)
        with m.request(pool, tokens_of(1, 32), [0, 1]):
            assert ctx.stats()["requests_open"] == 1
            with pytest.raises(swiftkv.Error) as e:
                m.request(pool, tokens_of(2, 32), [2, 3])
            assert e.value.status == swiftkv.Status.EBUSY and "max_open_requests" in str(e.value)
        with m.request(pool, tokens_of(2, 32), [2, 3]):
            assert ctx.stats()["requests_open"] == 1
        assert ctx.stats()["requests_open"] == 0
        pool.close()


def test_request_errors(ctx, small_model):
    m = ctx.register_model(small_model)
    pool = m.pool_create(4)
    with pytest.raises(swiftkv.Error) as e:
        m.request(pool, tokens_of(1, 64), [0, 0, 1, 2])  # a page twice
    assert e.value.status == swiftkv.Status.EINVAL
    with m.request(pool, tokens_of(1, 32), [0, 1]) as r:
        with pytest.raises(swiftkv.Error) as e:
            r.wait_layer_load(0)  # before start_load
        assert e.value.status == swiftkv.Status.ESTATE
    with m.request(pool, tokens_of(1, 32), [0, 1]):
        with pytest.raises(swiftkv.Error) as e:
            pool.close()  # a request uses it
        assert e.value.status == swiftkv.Status.EBUSY
    pool.close()
    with pytest.raises(swiftkv.Error) as e:
        m.request(pool, tokens_of(1, 32), [0, 1])
    assert e.value.status == swiftkv.Status.ENOTFOUND


def test_load_only_and_save_only(ctx, small_model):
    """An engine that ran the model first stores its pages (save-only); one that loads first
    and computes after loads them (load-only): each a single request, nothing loaded twice."""
    m = ctx.register_model(small_model)
    layers = [np.zeros((2, 8, 16, 2, 16), np.float16) for _ in range(2)]
    pool = m.pool_from_tensors(layers)
    rng = np.random.default_rng(3)
    for l in layers:
        l[:] = rng.standard_normal(l.shape)
    want = [l.copy() for l in layers]
    tokens, pages = tokens_of(3, 96), [5, 1, 7, 0, 3, 2]
    with m.request(pool, tokens, pages, shape=swiftkv.RequestShape.SAVE_ONLY) as r:
        with pytest.raises(swiftkv.Error) as e:
            r.start_load()
        assert e.value.status == swiftkv.Status.ESTATE and "save-only" in e.value.message
        for l in range(2):
            r.save_layer(l)
        assert r.wait_save() == 96
    for l in layers:
        l[:] = 0
    with m.request(pool, tokens, pages, shape=swiftkv.RequestShape.LOAD_ONLY) as r:
        r.start_load()
        assert [r.wait_layer_load(l) for l in range(2)] == [96, 96]
        with pytest.raises(swiftkv.Error) as e:
            r.wait_save()
        assert "next is request_finish" in e.value.message
    for l in range(2):
        for p in pages:
            assert np.array_equal(layers[l][:, p], want[l][:, p])
    assert ctx.stats()["stores"] == 3
    # An engine with the first block in its own prefix cache loads from token 16, inside the
    # first chunk: its page is left alone, the others arrive.
    for l in layers:
        l[:] = 0
    with m.request(pool, tokens, pages, load_from_tokens=16,
                   shape=swiftkv.RequestShape.LOAD_ONLY) as r:
        r.start_load()
        assert [r.wait_layer_load(l) for l in range(2)] == [96, 96]
        assert r.info()["load_begin_tokens"] == 16
    for l in range(2):
        assert not layers[l][:, pages[0]].any()
        for p in pages[1:]:
            assert np.array_equal(layers[l][:, p], want[l][:, p])
    with pytest.raises(swiftkv.InvalidArgument, match="not a block boundary"):
        m.request(pool, tokens, pages, load_from_tokens=8)


def test_batch_hooks(ctx, small_model):
    """Three requests of one step through the batch hooks: the first step saves them, the
    second loads them into other pages, every element checked; a bad batch changes nothing."""
    m = ctx.register_model(small_model)
    layers = [np.zeros((12, 2, 16, 2, 16), np.float16) for _ in range(2)]  # NHD
    pool = m.pool_from_tensors(layers)
    rng = np.random.default_rng(11)
    truth = [[rng.standard_normal((2, 64, 2, 16)).astype(np.float16) for _ in range(2)]
             for _ in range(3)]
    toks = [tokens_of(20 + i, 64) for i in range(3)]

    def step(pages):
        reqs = [m.request(pool, toks[i], pages[i]) for i in range(3)]
        for r in reqs:
            r.start_load()
        valid = []
        for l in range(2):
            valid.append(swiftkv.wait_layer_load_batch(reqs, l))
            for i in range(3):
                for tok in range(valid[-1][i], 64):
                    layers[l][pages[i][tok // 16], :, tok % 16] = truth[i][l][:, tok]
            swiftkv.save_layer_batch(reqs, l)
        saved = [r.wait_save() for r in reqs]
        for r in reqs:
            r.finish()
        return valid, saved

    valid, saved = step([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    assert valid == [[0, 0, 0]] * 2 and saved == [64, 64, 64]
    for l in layers:
        l[:] = 0
    pages = [[11, 2, 7, 4], [0, 9, 3, 6], [5, 10, 1, 8]]
    valid, saved = step(pages)
    assert valid == [[64, 64, 64]] * 2 and saved == [0, 0, 0]
    for i in range(3):
        for l in range(2):
            for tok in range(64):
                assert np.array_equal(layers[l][pages[i][tok // 16], :, tok % 16],
                                      truth[i][l][:, tok])

    a = m.request(pool, toks[0], [0, 1, 2, 3])
    b = m.request(pool, toks[1], [4, 5, 6, 7])
    a.start_load()
    with pytest.raises(swiftkv.StateError) as e:  # b has not started
        swiftkv.wait_layer_load_batch([a, b], 0)
    assert "before start_load" in e.value.message
    assert a.info()["layers_loaded"] == 0
    with pytest.raises(swiftkv.InvalidArgument) as e:
        swiftkv.wait_layer_load_batch([a, a], 0)
    assert "named twice" in e.value.message
    b.start_load()
    assert swiftkv.wait_layer_load_batch([a, b], 0) == [64, 64]
    assert swiftkv.wait_layer_load_batch([], 0) == []
    with swiftkv.Context(host_budget_bytes=1 << 20) as other:
        om = other.register_model(small_model)
        opool = om.pool_create(4)
        with om.request(opool, toks[2], [0, 1, 2, 3]) as c:
            with pytest.raises(ValueError):
                swiftkv.save_layer_batch([a, c], 0)
        opool.close()
    swiftkv.save_layer_batch([a, b], 0)
    assert a.info()["layers_saved"] == 1 and b.info()["layers_saved"] == 1
    a.finish()
    b.finish()
    pool.close()
