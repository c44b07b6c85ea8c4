"""The context: its configuration both ways, bad configurations, the clock, closing."""

import threading
import time

import pytest

import swiftkv


def test_config_round_trip(tmp_path):
    with swiftkv.Context(host_budget_bytes=1 << 20, disk_path=str(tmp_path),
                         disk_budget_bytes=1 << 20, eviction_policy=swiftkv.EvictionPolicy.LRU,
                         demote_free_percent=10, recompute_token_cost=2.0,
                         attention_cost_table=[1.0, 2.0, 4.0], maintenance_interval_ms=5,
                         coord_heartbeat_ms=50, coord_timeout_ms=700,
                         disk_segment_bytes=1 << 18, disk_sync_ms=250,
                         transfer_threads=3, max_open_requests=7,
                         write_back_on_close=False, coord_ucx_transports="tcp",
                         coord_remote_path=swiftkv.RemotePath.UCX,
                         coord_rma_timeout_ms=900,
                         tier_order=swiftkv.TierOrder.HOST_FIRST) as ctx:
        c = ctx.config()
        assert c["host_budget_bytes"] == 1 << 20
        assert c["disk_path"] == str(tmp_path)
        assert c["eviction_policy"] == swiftkv.EvictionPolicy.LRU
        assert c["demote_free_percent"] == 10
        assert c["recompute_token_cost"] == 2.0
        assert c["attention_cost_entries"] == 3
        assert c["maintenance_interval_ms"] == 5
        assert c["coord_endpoint"] is None
        assert (c["coord_heartbeat_ms"], c["coord_timeout_ms"]) == (50, 700)
        assert (c["disk_segment_bytes"], c["disk_sync_ms"]) == (1 << 18, 250)
        assert c["transfer_threads"] == 3 and c["max_open_requests"] == 7
        assert c["write_back_on_close"] == 0
        assert c["coord_ucx_transports"] == "tcp"
        assert c["coord_remote_path"] == swiftkv.RemotePath.UCX
        assert c["coord_rma_timeout_ms"] == 900
        assert c["tier_order"] == swiftkv.TierOrder.HOST_FIRST
        s = ctx.stats()
        assert s["disk_files_skipped"] == 0 and s["disk_bytes_allocated"] == 0
        assert s["disk_full_refusals"] == 0
        assert s["requests_open"] == 0 and 0 < s["index_capacity_chunks"] <= 4096  # no model
        assert 0 < s["index_bytes"] < 1 << 20  # the empty index
        # device_mask left out: every CUDA device this process sees (none on a CPU machine).
        assert ctx.device_count() == swiftkv.device_count()


@pytest.mark.parametrize("kw,needle,status", [
    ({"maintenance_interval_ms": 0}, "maintenance_interval_ms", swiftkv.Status.EINVAL),
    ({"demote_free_percent": 101}, "demote_free_percent", swiftkv.Status.EINVAL),
    ({"disk_path": "/nonexistent/dir", "disk_budget_bytes": 1}, "disk_path",
     swiftkv.Status.EINVAL),
    ({"coord_endpoint": "udp://x"}, "neither ipc:// nor tcp://", swiftkv.Status.EINVAL),
    ({"coord_timeout_ms": 0}, "coord_timeout_ms", swiftkv.Status.EINVAL),
    ({"coord_rma_timeout_ms": 0}, "coord_rma_timeout_ms", swiftkv.Status.EINVAL),
    ({"coord_remote_path": 7}, "not a swiftkv_remote_path", swiftkv.Status.EINVAL),
    ({"tier_order": 2}, "not a swiftkv_tier_order", swiftkv.Status.EINVAL),
])
def test_bad_config(kw, needle, status):
    with pytest.raises(swiftkv.Error) as e:
        swiftkv.Context(**kw)
    assert e.value.status == status
    assert needle in e.value.message


def test_unknown_option():
    with pytest.raises(TypeError):
        swiftkv.Context(host_budget=1)


def test_clock_is_called(small_model):
    calls = []
    now = [10**12]

    def clock():
        calls.append(threading.get_ident())
        return now[0]

    with swiftkv.Context(host_budget_bytes=1 << 20, clock=clock) as ctx:
        m = ctx.register_model(small_model)
        import numpy as np
        m.store(np.arange(32, dtype=np.uint32), np.zeros(small_model.chunk_bytes, np.uint8))
    assert calls, "the library reads the cache's time from the Python clock"


def test_close_is_idempotent_and_final(small_model):
    ctx = swiftkv.Context(host_budget_bytes=1 << 20)
    model = ctx.register_model(small_model)
    ctx.close()
    ctx.close()
    with pytest.raises(swiftkv.Error) as e:
        model.lookup([1, 2, 3])
    assert e.value.status == swiftkv.Status.ESTATE


def test_gil_released_while_waiting(small_model, tmp_path):
    # A borrow from an endpoint that accepts but never answers (a bare listening socket) waits
    # coord_timeout_ms; other Python threads run.
    import socket

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(f"{tmp_path}/silent")
    silent.listen(4)
    with silent, swiftkv.Context(host_budget_bytes=1 << 20, coord_timeout_ms=300) as ctx:
        m = ctx.register_model(small_model)
        ticks = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.001)

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.02)
        before = ticks[0]
        with pytest.raises(swiftkv.Error) as e:
            m.borrow_remote(f"ipc://{tmp_path}/silent", "x", 1)
        during = ticks[0] - before
        stop.set()
        t.join()
        assert e.value.status == swiftkv.Status.ETIMEDOUT
        assert during > 10


def test_close_waits_for_calls_in_flight(small_model):
    """Context.close while another thread is inside a call (here held inside the library by a
    clock that waits): close returns only after that call did, the call completes with its
    result, and every call after raises StateError. It crashed the process before (the binding
    released the GIL around the call and close destroyed the context under it)."""
    import numpy as np
    hold, inside = threading.Event(), threading.Event()
    armed = [False]

    def clock():
        if armed[0] and threading.current_thread().name == "storer":
            inside.set()
            hold.wait(30)
        return time.monotonic_ns()

    ctx = swiftkv.Context(host_budget_bytes=1 << 20, clock=clock)
    m = ctx.register_model(small_model)
    kv = np.zeros(small_model.chunk_bytes, np.uint8)
    got, closed = [], threading.Event()

    def store():
        got.append(m.store(np.arange(32, dtype=np.uint32), kv))

    def close():
        ctx.close()
        closed.set()

    armed[0] = True
    storer = threading.Thread(target=store, name="storer")
    storer.start()
    assert inside.wait(30)  # the store is inside the library
    armed[0] = False
    closer = threading.Thread(target=close)
    closer.start()
    assert not closed.wait(0.3)  # close waits while the store is in flight
    with pytest.raises(swiftkv.StateError):  # and no new call starts
        m.lookup(np.arange(32, dtype=np.uint32))
    hold.set()
    storer.join(30)
    closer.join(30)
    assert closed.is_set() and got == [32]
    with pytest.raises(swiftkv.StateError):
        m.store(np.arange(32, dtype=np.uint32), kv)


def test_close_under_load_from_many_threads(small_model):
    """Eight threads store, look up and retrieve through one context while the main thread
    closes it: no crash, every call either completes with right bytes or raises StateError,
    and each thread sees StateError from the close on."""
    import numpy as np
    for _ in range(5):
        ctx = swiftkv.Context(host_budget_bytes=4 << 20)
        m = ctx.register_model(small_model)
        errors, started = [], threading.Barrier(9)

        def work(seed):
            tokens = np.arange(seed * 1000, seed * 1000 + 64, dtype=np.uint32)
            kv = np.random.default_rng(seed).integers(0, 255, 2 * small_model.chunk_bytes,
                                                      dtype=np.uint8)
            out = np.empty_like(kv)
            started.wait()
            closed_seen = False
            for _ in range(100000):
                try:
                    m.store(tokens, kv)
                    m.lookup(tokens)
                    n = m.retrieve(tokens, 0, out)
                    if closed_seen:
                        errors.append("a call succeeded after one raised StateError")
                    if n == 64 and not np.array_equal(out, kv):
                        errors.append("wrong bytes")
                except swiftkv.StateError:
                    closed_seen = True
                    break
            if not closed_seen:
                errors.append("never saw the close")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.05)
        ctx.close()
        for t in threads:
            t.join(60)
        assert errors == []


def test_close_from_a_callback_is_refused(small_model):
    """A chunk event callback that closes its context would wait for itself: StateError."""
    import numpy as np
    seen = []
    with swiftkv.Context(host_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)

        def on_event(ev):
            try:
                ctx.close()
            except swiftkv.StateError as e:
                seen.append(str(e))

        ctx.on_chunk_event(on_event)
        n = 2 * (1 << 20) // small_model.chunk_bytes  # twice the budget: chunks are dropped
        for i in range(0, n, 16):
            m.store(np.arange(i * 32, (i + 16) * 32, dtype=np.uint32),
                    np.zeros(16 * small_model.chunk_bytes, np.uint8))
        for _ in range(1000):
            if seen:
                break
            time.sleep(0.01)
        ctx.on_chunk_event(None)
    assert seen and "would wait for itself" in seen[0]
