"""The chunk cache: store, lookup, retrieve bit-exact, the controller calls, stats, the event
callback, and the disk tier found again by a later context."""

import os

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


def test_lookup_reports_the_longest_run(ctx, small_model):
    m = ctx.register_model(small_model)
    tokens = tokens_of(3, 4 * 32)
    kv = chunks_of(3, 4, small_model.chunk_bytes)
    assert m.store(tokens, kv) == 128
    assert m.clear(tokens[:64]) == 2
    assert m.store(tokens[:32], kv[:small_model.chunk_bytes]) == 32  # chunk 1 alone is missing
    r = m.lookup(tokens)
    assert (r.prefix_tokens, r.dropped_head_tokens, r.loadable_tokens) == (32, 64, 64)
    assert list(r.residency) == [swiftkv.Tier.HOST, swiftkv.Tier.DROPPED] + [swiftkv.Tier.HOST] * 2
    out = np.zeros(2 * small_model.chunk_bytes, np.uint8)
    assert m.retrieve(tokens, 64, out) == 64
    assert np.array_equal(out, kv[2 * small_model.chunk_bytes:])


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


def test_a_failed_store_says_what_it_kept(tmp_path):
    """A disk that fails mid-store (a file size limit, in a child process): Error(EIO) carries
    the leading tokens cached, and those are there, bit-exact."""
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent(f"""
        import resource, signal
        import numpy as np
        import swiftkv
        from conftest import chunks_of, tokens_of
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        desc = swiftkv.ModelDesc("pytest-model", num_layers=2, num_kv_heads=2, head_dim=16,
                                 block_tokens=16, chunk_tokens=32)
        with swiftkv.Context(disk_path={str(tmp_path)!r}, disk_budget_bytes=1 << 20) as ctx:
            m = ctx.register_model(desc)
            assert m.store(tokens_of(9, 32), chunks_of(9, 1, desc.chunk_bytes)) == 32
            resource.setrlimit(resource.RLIMIT_FSIZE, (32768, 32768))
            tokens, kv = tokens_of(8, 8 * 32), chunks_of(8, 8, desc.chunk_bytes)
            try:
                m.store(tokens, kv)
                raise SystemExit("the store did not fail")
            except swiftkv.Error as e:
                assert e.status == swiftkv.Status.EIO, e
                n = e.cached_tokens
            assert 0 < n < 8 * 32 and n % 32 == 0, n
            assert m.lookup(tokens)["prefix_tokens"] == n
            out = np.zeros_like(kv)
            assert m.retrieve(tokens, 0, out) == n
            assert np.array_equal(out[:n // 32 * desc.chunk_bytes], kv[:n // 32 * desc.chunk_bytes])
        print("child ok", n)
    """)
    env = dict(os.environ, SWIFTKV_LOG="off")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "child ok" in r.stdout


def test_identity_keeps_models_apart(ctx, small_model):
    import dataclasses

    rev1 = ctx.register_model(dataclasses.replace(small_model, identity="weights-rev-1"))
    t = tokens_of(8, 64)
    rev1.store(t, chunks_of(8, 2, small_model.chunk_bytes))
    rev2 = ctx.register_model(dataclasses.replace(small_model, identity="weights-rev-2"))
    none = ctx.register_model(small_model)
    assert [m.lookup(t)["prefix_tokens"] for m in (rev1, rev2, none)] == [64, 0, 0]
    with pytest.raises(swiftkv.Error) as e:
        ctx.register_model(dataclasses.replace(small_model, identity="weights-rev-1"))
    assert e.value.status == swiftkv.Status.EBUSY and "geometry and identity" in e.value.message
    with pytest.raises(swiftkv.Error) as e:
        ctx.register_model(dataclasses.replace(small_model, identity=""))  # "" is none
    assert e.value.status == swiftkv.Status.EBUSY


@pytest.mark.parametrize("write_back", [True, False])
def test_host_chunks_written_back_on_close(small_model, tmp_path, write_back):
    t = tokens_of(11, 96)
    kv = chunks_of(11, 3, small_model.chunk_bytes)
    with swiftkv.Context(host_budget_bytes=1 << 20, disk_path=str(tmp_path),
                         disk_budget_bytes=1 << 20, write_back_on_close=write_back) as ctx:
        m = ctx.register_model(small_model)
        m.store(t, kv)
        assert m.lookup(t)["chunks_per_tier"] == [0, 3, 0]  # in host memory only
    with swiftkv.Context(disk_path=str(tmp_path), disk_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)
        if not write_back:
            assert m.lookup(t)["prefix_tokens"] == 0
            return
        assert m.lookup(t)["chunks_per_tier"] == [0, 0, 3]
        out = np.zeros_like(kv)
        assert m.retrieve(t, 0, out) == 96 and np.array_equal(out, kv)


def test_metrics_text_and_collector(ctx, small_model):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from swiftkv.metrics import Collector

    m = ctx.register_model(small_model)
    t = tokens_of(12, 64)
    m.store(t, chunks_of(12, 2, small_model.chunk_bytes))
    m.lookup(tokens_of(13, 96))  # 3 misses
    m.lookup(t)  # 2 host hits
    text = ctx.metrics_text()
    assert 'swiftkv_chunks{tier="host"} 2\n' in text
    assert "swiftkv_stores_total 2\n" in text and "swiftkv_lookup_misses_total 3\n" in text
    assert 'swiftkv_lookup_hits_total{tier="host"} 2\n' in text
    # Every family parses, with HELP and TYPE, and values agree with stats().
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    s = ctx.stats()
    assert fams["swiftkv_stores"].type == "counter" and fams["swiftkv_chunks"].type == "gauge"
    assert all(f.documentation for f in fams.values())
    assert {x.labels["tier"]: x.value for x in fams["swiftkv_tier_bytes"].samples} == {
        "peer": 0, "host": s["bytes"][1], "disk": 0, "remote": s["remote_bytes"]}
    assert fams["swiftkv_index_bytes"].samples[0].value == s["index_bytes"]
    reg = CollectorRegistry()
    reg.register(Collector(ctx, prefix="engine_a_"))
    out = generate_latest(reg).decode()
    assert 'engine_a_swiftkv_chunks{tier="host"} 2.0' in out
    assert "engine_a_swiftkv_stores_total 2.0" in out


def test_compression_adaptive(ctx, small_model):
    """Adaptive mode: exact while quality is worth the most, compressed by the policy once it is
    worth nothing; bad parameters raise and change nothing; the policy chooses only in adaptive
    mode."""
    m = ctx.register_model(small_model)
    tokens = tokens_of(43, 64)
    rng = np.random.default_rng(43)
    kv = rng.uniform(0.5, 1.0, 2 * small_model.chunk_bytes // 2).astype(np.float16).view(np.uint8)
    with pytest.raises(swiftkv.InvalidArgument):
        m.compress(tokens_of(44, 0))
    kivi4 = swiftkv.Codec(swiftkv.CodecKind.KIVI, bits=4, group=8)
    gpu = swiftkv.Method(kivi4, decode_gbps=1e6)
    with pytest.raises(swiftkv.InvalidArgument):  # lossy, and exact bytes asked
        m.set_compression(adaptive=swiftkv.Adaptive(methods=(gpu,)))
    with pytest.raises(swiftkv.InvalidArgument):
        m.set_compression(accept_lossy=True, host=swiftkv.Codec(swiftkv.CodecKind.FP8),
                          adaptive=swiftkv.Adaptive(methods=(gpu,)))
    with pytest.raises(swiftkv.InvalidArgument):
        m.set_compression(accept_lossy=True, adaptive=swiftkv.Adaptive(
            methods=(swiftkv.Method(swiftkv.Codec(swiftkv.CodecKind.FP8)),) * 9))
    with pytest.raises(swiftkv.InvalidArgument):
        m.set_compression(accept_lossy=True, adaptive=swiftkv.Adaptive(alpha=-1.0))
    m.set_compression(accept_lossy=True, adaptive=swiftkv.Adaptive(alpha=1e6, methods=(gpu,)))
    assert m.store(tokens, kv) == 64
    assert [i.codec.kind for i in m.chunk_info(tokens)] == [swiftkv.CodecKind.RAW] * 2
    m.set_compression(accept_lossy=True, adaptive=swiftkv.Adaptive(alpha=0.0, methods=(gpu,)))
    assert m.compress(tokens) == 2
    for i in m.chunk_info(tokens):
        assert i.codec == kivi4 and i.lossy and i.stored_bytes < small_model.chunk_bytes
    d = swiftkv._c.swiftkv_compression_config_init()
    assert (d.alpha, d.reuse_horizon_s, d.host_gbps, d.disk_gbps) == (1.0, 60.0, 25.0, 3.0)


def test_compression(ctx, small_model):
    """A fixed host codec encodes what is stored; a lossy chunk is refused until the model
    accepts it; compress re-encodes in place; bad parameters raise and change nothing."""
    m = ctx.register_model(small_model)
    tokens = tokens_of(41, 64)
    rng = np.random.default_rng(41)
    kv = rng.uniform(0.5, 1.0, 2 * small_model.chunk_bytes // 2).astype(np.float16).view(np.uint8)
    with pytest.raises(swiftkv.Error):
        m.set_compression(host=swiftkv.Codec(swiftkv.CodecKind.KIVI, bits=3, group=32))
    with pytest.raises(swiftkv.InvalidArgument, match="exact bytes only"):
        m.set_compression(host=swiftkv.Codec(swiftkv.CodecKind.FP8))  # chunks it could not load
    m.set_compression(accept_lossy=True, host=swiftkv.Codec(swiftkv.CodecKind.FP8))
    assert m.store(tokens, kv) == 64
    info = m.chunk_info(tokens)
    assert [i.tier for i in info] == [swiftkv.Tier.HOST] * 2
    assert info[0].codec == swiftkv.Codec(swiftkv.CodecKind.FP8) and info[0].lossy
    assert info[0].stored_bytes < small_model.chunk_bytes
    s = ctx.codec_stats()
    assert s["chunks"][swiftkv.CodecKind.FP8][swiftkv.Tier.HOST] == 2
    assert s["raw_bytes"][swiftkv.CodecKind.FP8][swiftkv.Tier.HOST] == 2 * small_model.chunk_bytes
    out = np.zeros_like(kv)
    m.set_compression()  # exact bytes again: the lossy chunks stay, refused
    assert m.retrieve(tokens, 0, out) == 0
    assert ctx.codec_stats()["lossy_refused"] == 1
    m.set_compression(accept_lossy=True, host=swiftkv.Codec(swiftkv.CodecKind.FP8))
    assert m.retrieve(tokens, 0, out) == 64
    got, want = out.view(np.float16).astype(np.float32), kv.view(np.float16).astype(np.float32)
    assert not np.array_equal(got, want)
    assert np.all(np.abs(got - want) <= want / 16 + 2.0 ** -11)
    with pytest.raises(swiftkv.Error):
        m.compress(tokens, swiftkv.Codec(swiftkv.CodecKind.KIVI, bits=5, group=32))
    with pytest.raises(swiftkv.Error):
        m.compress(tokens_of(42, 32), swiftkv.Codec())
    assert m.chunk_info(tokens)[1].codec.kind == swiftkv.CodecKind.FP8
    kivi4 = swiftkv.Codec(swiftkv.CodecKind.KIVI, bits=4, group=32)
    assert m.compress(tokens, kivi4) == 2
    assert m.chunk_info(tokens)[1] == swiftkv.ChunkInfo(swiftkv.Tier.HOST, kivi4, True,
                                                        m.chunk_info(tokens)[1].stored_bytes)


def test_named_chunks(small_model, tmp_path):
    """Chunks named by the caller (an engine's block keys): stored, found and loaded by name in
    host memory, moved to disk and found by a later context; never through the tokens, another
    identity or another name; bad names raise with nothing stored."""
    names = [bytes([i]) * 32 for i in range(3)]
    kv = chunks_of(11, 3, small_model.chunk_bytes)
    with swiftkv.Context(host_budget_bytes=8 << 20, disk_path=str(tmp_path),
                         disk_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)
        assert m.store_named(names, kv) == 3
        r = m.lookup_named(names)
        assert (r.chunks, r.prefix_tokens) == (3, 96)
        assert list(r.residency) == [swiftkv.Tier.HOST] * 3
        out = np.zeros_like(kv)
        assert m.retrieve_named(names, out) == 3 and np.array_equal(out, kv)
        # A [n, 32] uint8 array names the same chunks; another first name finds only the rest.
        arr = np.frombuffer(b"".join(names), np.uint8).reshape(3, 32)
        assert m.lookup_named(arr).prefix_tokens == 96
        assert m.lookup_named([b"x" * 32] + names[1:]).prefix_tokens == 0
        assert m.lookup(np.frombuffer(b"".join(names), np.uint32)).prefix_tokens == 0
        other = ctx.register_model(swiftkv.ModelDesc(
            "pytest-model", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=16,
            chunk_tokens=32, identity="tenant-b"))
        assert other.lookup_named(names).prefix_tokens == 0
        with pytest.raises(ValueError):
            m.store_named([b"a", b"bb"], kv[:2 * small_model.chunk_bytes])
        with pytest.raises(swiftkv.InvalidArgument):
            m.store_named([b"y" * 65], kv[:small_model.chunk_bytes])
        with pytest.raises(swiftkv.InvalidArgument):
            m.store_named([b"y" * 32], kv)  # three chunks' bytes for one name
        assert ctx.stats()["stores"] == 3
        m.pin_named(names[:1])
        assert m.clear_named(names) == 2
        m.unpin_named(names[:1])
        assert m.move_named(names[:1], swiftkv.Tier.DISK) == 1
        assert m.store_named(names[1:], kv[small_model.chunk_bytes:], first_chunk=1) == 2
    with swiftkv.Context(disk_path=str(tmp_path), disk_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)
        r = m.lookup_named(names)
        assert r.prefix_tokens == 96 and list(r.residency) == [swiftkv.Tier.DISK] * 3
        out = np.zeros_like(kv)
        assert m.retrieve_named(names, out) == 3 and np.array_equal(out, kv)


def test_named_chunk_keys_are_the_events(small_model):
    """The keys of named chunks are those the chunk event callback reports: an evicted named
    chunk is known by its name."""
    names = [bytes([9, i]) * 16 for i in range(5)]
    events = []
    with swiftkv.Context(host_budget_bytes=4 * small_model.chunk_bytes,
                         eviction_policy=swiftkv.EvictionPolicy.LRU) as ctx:
        m = ctx.register_model(small_model)
        keys = m.chunk_keys_named(names)
        assert len(set(keys)) == 5
        assert m.store_named(names[:4], chunks_of(1, 4, small_model.chunk_bytes)) == 4
        ctx.on_chunk_event(events.append)
        assert m.store_named(names[4:], chunks_of(2, 1, small_model.chunk_bytes),
                             first_chunk=4) == 1
        ctx.on_chunk_event(None)
        info = m.chunk_info_named(names)
        assert [i.tier for i in info] == [swiftkv.Tier.DROPPED] + [swiftkv.Tier.HOST] * 4
        assert ctx.stats().misses == 0  # nothing looked up
    assert [e["key"] for e in events] == [keys[0]]
