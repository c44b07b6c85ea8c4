"""The chunk cache: store, lookup, retrieve bit-exact, the controller calls, stats, the event
callback, and the disk tier found again by a later context."""

import numpy as np
import pytest

import swiftkv
from conftest import chunks_of, tokens_of


def test_store_lookup_retrieve(ctx, small_model):
    m = ctx.register_model(small_model)
    tokens = tokens_of(1, 4 * 32 + 5)  # a partial last chunk is ignored
    kv = chunks_of(1, 4, small_model.chunk_bytes)
    assert m.store(tokens[:128], kv) == 128
    r = m.lookup(tokens)
    assert r["chunks"] == 4 and r["prefix_tokens"] == 128
    assert list(r["residency"]) == [swiftkv.Tier.HOST] * 4
    assert r["chunks_per_tier"] == [0, 4, 0]
    out = np.zeros_like(kv)
    assert m.retrieve(tokens[:128], 0, out) == 128
    assert np.array_equal(out, kv)
    half = np.zeros(2 * small_model.chunk_bytes, np.uint8)
    assert m.retrieve(tokens[:128], 64, half) == 64
    assert np.array_equal(half, kv[2 * small_model.chunk_bytes:])
    s = ctx.stats()
    assert s["chunks"][swiftkv.Tier.HOST] == 4 and s["stores"] == 4


def test_bad_arguments_change_nothing(ctx, small_model):
    m = ctx.register_model(small_model)
    with pytest.raises(swiftkv.Error) as e:
        m.store(tokens_of(2, 33), np.zeros(small_model.chunk_bytes, np.uint8))
    assert e.value.status == swiftkv.Status.EINVAL
    with pytest.raises(TypeError):
        m.store(tokens_of(2, 32), [1, 2, 3])  # not a buffer
    with pytest.raises(swiftkv.Error) as e:
        ctx.register_model(small_model)  # the same model twice
    assert e.value.status == swiftkv.Status.EBUSY
    assert ctx.stats()["stores"] == 0


def test_pin_unpin_move_clear(ctx, small_model, tmp_path):
    m = ctx.register_model(small_model)
    t = tokens_of(3, 64)
    m.store(t, chunks_of(3, 2, small_model.chunk_bytes))
    m.pin(t)
    assert m.clear(t) == 0  # pinned chunks stay
    m.unpin(t)
    with pytest.raises(swiftkv.Error) as e:
        m.unpin(t)
    assert e.value.status == swiftkv.Status.ENOTFOUND
    with pytest.raises(swiftkv.Error) as e:
        m.move(t, swiftkv.Tier.DISK)  # no disk tier configured
    assert e.value.status == swiftkv.Status.EINVAL
    assert m.move(t, swiftkv.Tier.HOST) == 2
    assert m.clear(t) == 2
    assert m.lookup(t)["prefix_tokens"] == 0


def test_events_on_eviction(small_model):
    events = []
    with swiftkv.Context(host_budget_bytes=4 * small_model.chunk_bytes,
                         eviction_policy=swiftkv.EvictionPolicy.LRU) as ctx:
        ctx.on_chunk_event(events.append)
        m = ctx.register_model(small_model)
        for conv in range(8):
            m.store(tokens_of(10 + conv, 32), chunks_of(conv, 1, small_model.chunk_bytes))
        ctx.on_chunk_event(None)
        assert ctx.stats()["evictions"] == len(events) > 0
    assert all(e["reason"] == swiftkv.ChunkEventReason.EVICTED for e in events)
    assert all(e["to_tier"] == swiftkv.Tier.DROPPED for e in events)


def test_disk_tier_survives_the_context(small_model, tmp_path):
    t = tokens_of(4, 96)
    kv = chunks_of(4, 3, small_model.chunk_bytes)
    with swiftkv.Context(disk_path=str(tmp_path), disk_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)
        assert m.store(t, kv) == 96
        assert list(m.lookup(t)["residency"]) == [swiftkv.Tier.DISK] * 3
    with swiftkv.Context(disk_path=str(tmp_path), disk_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)
        out = np.zeros_like(kv)
        assert m.retrieve(t, 0, out) == 96
        assert np.array_equal(out, kv)
        ctx.clear()
        assert m.lookup(t)["prefix_tokens"] == 0


def test_unregister(ctx, small_model):
    m = ctx.register_model(small_model)
    m.unregister()
    with pytest.raises(swiftkv.Error) as e:
        m.lookup(tokens_of(1, 32))
    assert e.value.status == swiftkv.Status.ENOTFOUND
