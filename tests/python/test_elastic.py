"""The lender's elastic region, borrowing from it in-process, and the coordinator between two
contexts (the same protocol as between processes)."""

import time

import numpy as np
import pytest

import swiftkv
from conftest import chunks_of, endpoint, tokens_of


def lender_desc():
    # 3 layers, 2 heads, 16 dims, 16-token blocks: with the small model the unit is 4 blocks =
    # 3 chunks.
    return swiftkv.ModelDesc("pytest-lender", num_layers=3, num_kv_heads=2, head_dim=16)


def test_region_calls(ctx, small_model):
    e = ctx.elastic(lender_desc(), small_model, capacity_blocks=64, owned_blocks=8,
                    lease_ms=60000)
    s = e.stats()
    assert (s["capacity_blocks"], s["owned_blocks"], s["free_blocks"]) == (64, 8, 56)
    assert (s["unit_lender_blocks"], s["unit_borrower_chunks"]) == (4, 3)
    v = e.layer_view(2)
    assert v["num_pages"] == 64 and v["page_stride"] == 3 * 2 * 16 * 2 * 16 * 2
    lease = e.lend(2)
    assert lease["blocks"] == 8 and lease["chunks"] == 6 and lease["first_block"] == 56
    assert e.lease(lease["id"])["reclaim_requested"] == 0
    e.renew(lease["id"])
    st, grown, lost = e.scale_for_request(64 * 16)
    assert st == swiftkv.Status.IN_PROGRESS and grown == 56 and lost == 42
    assert e.pending_reclaims() == [lease["id"]]
    e.release(lease["id"])
    assert e.pending_reclaims() == []
    st, shrunk, gained = e.tick(8)
    assert st == swiftkv.Status.OK
    with pytest.raises(swiftkv.Error) as err:
        e.renew(lease["id"])
    assert err.value.status == swiftkv.Status.ENOTFOUND
    # The owned part set by hand: 16 blocks (4 more units), then 8 (the lendable tail grows).
    owned = e.stats()["owned_blocks"]
    assert e.resize(16) == (swiftkv.Status.OK, abs(16 - owned), abs(16 - owned) // 4 * 3)
    assert e.resize(8) == (swiftkv.Status.OK, 8, 6)
    assert e.stats()["owned_blocks"] == 8
    with pytest.raises(swiftkv.Error) as err:
        e.resize(9)  # not whole units
    assert err.value.status == swiftkv.Status.EINVAL and "lending units" in str(err.value)
    assert e.stats()["owned_blocks"] == 8
    with pytest.raises(swiftkv.Error) as err:
        ctx.elastic(lender_desc(), small_model, capacity_blocks=63)  # not whole units
    assert err.value.status == swiftkv.Status.EINVAL
    with pytest.raises(swiftkv.Error) as err:
        ctx.elastic(lender_desc(), small_model, capacity_blocks=64, host_granule_bytes=4097)
    assert err.value.status == swiftkv.Status.EINVAL and "page size" in str(err.value)
    e.close()


def test_borrow_in_process_and_reclaim(ctx, small_model):
    m = ctx.register_model(small_model)
    left_peer = []  # the reason each chunk left the lease: demoted ahead, or revoked
    ctx.on_chunk_event(lambda ev: left_peer.append(ev["reason"])
                       if ev["from_tier"] == swiftkv.Tier.PEER else None)
    e = ctx.elastic(lender_desc(), small_model, capacity_blocks=16, owned_blocks=4)
    lease = m.borrow(e, 10)
    assert lease > 0
    t = tokens_of(5, 9 * 32)
    kv = chunks_of(5, 9, small_model.chunk_bytes)
    m.store(t, kv)
    # All nine went to the lease; the background thread may already have demoted ahead to host
    # memory until a quarter of the lease is free again (demote_free_percent 25: three chunks).
    per_tier = m.lookup(t)["chunks_per_tier"]
    assert per_tier[swiftkv.Tier.PEER] + per_tier[swiftkv.Tier.HOST] == 9
    assert per_tier[swiftkv.Tier.PEER] >= 6
    e.reclaim(swiftkv.LEASE_ALL)
    e.wait_reclaims(5000)  # the borrower's thread answers while this one waits
    assert e.pending_reclaims() == []
    assert m.lookup(t)["chunks_per_tier"][swiftkv.Tier.HOST] == 9
    out = np.zeros_like(kv)
    assert m.retrieve(t, 0, out) == 9 * 32 and np.array_equal(out, kv)
    # Each chunk left the lease once: revoked by the reclaim, or demoted ahead before it (the
    # events come on a thread of the library's: waited for, at most 10 s).
    for _ in range(1000):
        if len(left_peer) >= 9:
            break
        time.sleep(0.01)
    ctx.on_chunk_event(None)
    revoked = left_peer.count(swiftkv.ChunkEventReason.REVOKED)
    assert len(left_peer) == 9 and revoked >= 6
    assert ctx.stats()["revocations"] == revoked


@pytest.mark.parametrize("granule", [0, 16384])
def test_remote_lender(tmp_path, small_model, granule):
    # With host granules the region's memory passes with each grant, as device memory does.
    ep = endpoint(tmp_path, "lender")
    with swiftkv.Context(host_budget_bytes=4 << 20, coord_endpoint=ep,
                         coord_heartbeat_ms=20) as lctx, \
            swiftkv.Context(host_budget_bytes=4 << 20, coord_heartbeat_ms=20,
                            demote_free_percent=0) as bctx:
        e = lctx.elastic(lender_desc(), small_model, capacity_blocks=32, owned_blocks=8,
                         host_granule_bytes=granule)
        kind = swiftkv.MemoryKind.HOST_GRANULES if granule else swiftkv.MemoryKind.HOST_MEMFD
        assert e.stats()["memory_kind"] == kind
        e.offer("pool-a")
        with pytest.raises(swiftkv.Error) as err:
            e.offer("pool-b")
        assert err.value.status == swiftkv.Status.EBUSY
        m = bctx.register_model(small_model)
        lease = m.borrow_remote(ep, "pool-a", 6)
        assert e.lease(lease)["blocks"] == 24
        t = tokens_of(6, 12 * 32)
        kv = chunks_of(6, 12, small_model.chunk_bytes)
        m.store(t, kv)
        # Memory of this host, mapped here, is the peer tier.
        lk = m.lookup(t)
        assert lk["chunks_per_tier"][swiftkv.Tier.PEER] == 12 and lk["remote_chunks"] == 0
        out = np.zeros_like(kv)
        assert m.retrieve(t, 0, out) == 12 * 32 and np.array_equal(out, kv)
        # A heartbeat goes every 20 ms; on a loaded machine its answer may take a while.
        for _ in range(5000):
            if bctx.coord_stats()["heartbeats_answered"] > 0:
                break
            time.sleep(0.001)
        cs = bctx.coord_stats()
        assert cs["lenders_connected"] == 1 and cs["heartbeats_answered"] > 0
        st, _, _ = e.scale_for_request(32 * 16)
        assert st == swiftkv.Status.IN_PROGRESS
        for _ in range(5000):
            if e.stats()["reclaiming_blocks"] == 0:
                break
            time.sleep(0.001)
        assert e.stats()["reclaiming_blocks"] == 0
        ls = lctx.coord_stats()
        assert ls["reclaims_acked"] == 1 and ls["reclaim_ns_max"] > 0
        assert m.retrieve(t, 0, out) == 12 * 32 and np.array_equal(out, kv)
        with pytest.raises(swiftkv.Error) as err:
            m.borrow_remote(ep, "nobody", 1)
        assert err.value.status == swiftkv.Status.ENOTFOUND


def free_tcp_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_lender_over_ucx(small_model):
    # The borrower asks for UCX although the lender is on this host: every byte goes over UCX's
    # tcp transport, none through a mapping.
    ep = f"tcp://127.0.0.1:{free_tcp_port()}"
    with swiftkv.Context(host_budget_bytes=4 << 20, coord_endpoint=ep, coord_heartbeat_ms=20,
                         coord_ucx_transports="tcp") as lctx, \
            swiftkv.Context(host_budget_bytes=4 << 20, coord_heartbeat_ms=20,
                            demote_free_percent=0, coord_ucx_transports="tcp",
                            coord_remote_path=swiftkv.RemotePath.UCX) as bctx:
        e = lctx.elastic(lender_desc(), small_model, capacity_blocks=32, owned_blocks=8)
        e.offer("pool-a")
        m = bctx.register_model(small_model)
        try:
            m.borrow_remote(ep, "pool-a", 6)
        except swiftkv.Unsupported:
            pytest.skip("this libswiftkv has no UCX")
        t = tokens_of(7, 12 * 32)
        kv = chunks_of(7, 12, small_model.chunk_bytes)
        m.store(t, kv)
        # Memory of another host (UCX) is the remote tier, not the peer tier.
        lk = m.lookup(t)
        assert lk["remote_chunks"] == 12 and lk["chunks_per_tier"][swiftkv.Tier.PEER] == 0
        assert (lk["residency"] == swiftkv.Tier.REMOTE).all()
        assert bctx.stats()["remote_chunks"] == 12
        out = np.zeros_like(kv)
        assert m.retrieve(t, 0, out) == 12 * 32 and np.array_equal(out, kv)
        cs = bctx.coord_stats()
        assert cs["remote_lenders"] == 1 and cs["rma_batches_failed"] == 0
        assert cs["rma_bytes_written"] == cs["rma_bytes_read"] == 12 * small_model.chunk_bytes
        assert lctx.coord_stats()["remote_sessions"] == 1
        # The remote tier moves and clears as any tier does: down to host memory and back.
        assert m.move(t, swiftkv.Tier.HOST) == 12 and m.lookup(t)["remote_chunks"] == 0
        assert m.move(t, swiftkv.Tier.REMOTE) == 12 and m.lookup(t)["remote_chunks"] == 12
        assert m.retrieve(t, 0, out) == 12 * 32 and np.array_equal(out, kv)
        assert m.clear(t, swiftkv.Tier.HOST) == 0
        assert m.clear(t, swiftkv.Tier.REMOTE) == 12 and bctx.stats()["remote_chunks"] == 0


def test_reclaim_deadline(ctx, small_model):
    # A borrower that renews a lease asked back and never releases it loses it at the deadline.
    now = [10**9]
    e = ctx.elastic(lender_desc(), small_model, capacity_blocks=64, lease_ms=500,
                    reclaim_deadline_ms=1200, clock=lambda: now[0])
    lease = e.lend(1)
    start = now[0]
    now[0] += 100_000_000
    e.reclaim(lease["id"])
    for _ in range(11):
        now[0] += 100_000_000
        e.renew(lease["id"])
        assert e.lease(lease["id"])["expires_ns"] == min(now[0] + 500_000_000,
                                                         start + 1_300_000_000)
    now[0] = start + 1_300_000_000
    with pytest.raises(swiftkv.Error) as err:
        e.renew(lease["id"])
    assert err.value.status == swiftkv.Status.ETIMEDOUT
    assert e.pending_reclaims() == []
    with pytest.raises(swiftkv.Error) as err:
        ctx.elastic(lender_desc(), small_model, capacity_blocks=64, reclaim_deadline_ms=0)
    assert err.value.status == swiftkv.Status.EINVAL
    e.close()
