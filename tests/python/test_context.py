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
