"""The lending policy's scheduler half (swiftkv.integrations.vllm.lending.TailLender) against
vLLM's own BlockPool: which tail units are lent and reclaimed at the watermarks, busy tail blocks
taken as vLLM frees them, cached ones out of the prefix cache, the reclaim deadline, and, in a
random run of requests, that no block of a unit out of vLLM's hands is ever in its free queue,
its prefix cache or a request's blocks."""

import random

import pytest
from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

from swiftkv.integrations.vllm.lending import LendOptions, TailLender, Unit

BLOCK = 16
NUM_BLOCKS = 64  # block 0 is vLLM's null block


def pool():
    return BlockPool(num_gpu_blocks=NUM_BLOCKS, enable_caching=True, hash_block_size=BLOCK)


def options(**kw):
    return LendOptions(**{"unit_blocks": 8, "high_free_blocks": 24, "low_free_blocks": 8,
                          "keep_blocks": 8, "reclaim_deadline_s": 2.0, **kw})


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def free_ids(p):
    return {b.block_id for b in p.free_block_queue.get_all_free_blocks()}


def lend_settled(lender):
    """plan() and the workers' acks until nothing moves: the units lent."""
    for _ in range(4 * lender.num_units):
        orders = lender.plan()
        lender.workers_done(orders.release, orders.restore)
        if not orders and lender._moving() is None:
            break
    return [k for k, s in enumerate(lender.state) if s is Unit.LENT]


def test_an_idle_engine_lends_its_tail_down_to_the_high_watermark():
    p = pool()
    lender = TailLender(p, options())
    assert lender.num_units == 7  # (64 - 8 kept) / 8
    orders = lender.plan()
    assert orders.release == [0] and lender.state[0] is Unit.RELEASING
    # Every block of unit 0 (the last 8) is out of vLLM's hands before the workers are told.
    assert list(lender.blocks_of(0)) == list(range(56, 64))
    assert not free_ids(p) & set(range(56, 64))
    assert all(p.blocks[b].ref_cnt == 1 for b in range(56, 64))
    assert p.get_num_free_blocks() == 63 - 8
    # It counts as lent only once every rank says so; nothing else moves meanwhile.
    assert lender.stats.units_lent == 0 and not lender.plan()
    lender.workers_done([0], [])
    assert lender.state[0] is Unit.LENT and lender.stats.units_lent == 1
    # Outermost first, while 24 blocks stay free after the unit: 63 -> 31 free, 4 units.
    assert lend_settled(lender) == [0, 1, 2, 3]
    assert p.get_num_free_blocks() == 31 and lender.lent_blocks() == 32
    assert not free_ids(p) & set(range(32, 64))


def test_busy_tail_blocks_are_taken_as_vllm_frees_them():
    p = pool()
    lender = TailLender(p, options())
    everything = p.get_new_blocks(63)  # blocks 1..63, all in use
    p.free_blocks([b for b in everything if b.block_id < 58])  # 58..63 stay busy
    orders = lender.plan()
    assert not orders and lender.state[0] is Unit.FENCING
    assert all(p.blocks[b].ref_cnt == 1 for b in (56, 57))  # the free two are taken
    assert not free_ids(p) & {56, 57}
    busy = [b for b in everything if b.block_id >= 58]
    p.free_blocks(busy[:3])  # 58, 59, 60 freed by vLLM at the end of a step
    lender.after_frees()  # before the next step schedules: taken
    assert not free_ids(p) & set(range(56, 64))
    # A request scheduled now never gets them.
    got = p.get_new_blocks(p.get_num_free_blocks())
    assert not {b.block_id for b in got} & set(range(56, 64))
    p.free_blocks(got)
    p.free_blocks(busy[3:])
    assert lender.plan().release == [0]
    lender.workers_done([0], [])
    assert lender.state[0] is Unit.LENT


def hashed_request(blocks):
    """A request of `blocks` full blocks whose block hashes vLLM computes, as its own would be."""
    if not hasattr(kv_cache_utils, "NONE_HASH"):
        init_none_hash(sha256)
    return Request(request_id="r", prompt_token_ids=list(range(blocks * BLOCK)),
                   sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                   mm_features=None, block_hasher=get_request_block_hasher(BLOCK, sha256))


def test_a_cached_tail_block_leaves_the_prefix_cache():
    p = pool()
    r = hashed_request(60)
    blocks = p.get_new_blocks(60)  # blocks 1..60: the tail blocks 56..60 hold this prefix
    p.cache_full_blocks(r, blocks, 0, 60, BLOCK, 0)
    p.free_blocks(blocks)
    assert p.blocks[58].block_hash is not None
    lender = TailLender(p, options(high_free_blocks=9))
    assert lender.plan().release == [0]
    for b in range(56, 64):
        assert p.blocks[b].block_hash is None
    # The request's prefix is found up to the first fenced block only.
    hits = 0
    for h in r.block_hashes:
        if p.get_cached_block(h, [0]) is None:
            break
        hits += 1
    assert hits == 55  # blocks 1..55


def test_a_cached_tail_block_in_use_leaves_the_prefix_cache_at_once():
    """A tail block a request holds is taken when vLLM frees it; it leaves the prefix cache at
    once, so that a later request with the same prefix does not share it and keep it in use (an
    engine serving one prompt again and again would never let its unit go)."""
    p = pool()
    r = hashed_request(60)
    blocks = p.get_new_blocks(60)  # blocks 1..60, in use, the tail ones cached
    p.cache_full_blocks(r, blocks, 0, 60, BLOCK, 0)
    p.free_blocks(blocks[:55])
    lender = TailLender(p, options(high_free_blocks=9))
    assert not lender.plan()  # unit 0 (56..63): 56..60 are in use
    assert lender.state[0] is Unit.FENCING
    assert all(p.blocks[b].block_hash is None for b in range(56, 61))
    assert p.get_cached_block(r.block_hashes[56], [0]) is None
    p.free_blocks(blocks[55:])
    lender.after_frees()
    assert lender.plan().release == [0]


def test_a_reclaim_starts_below_the_low_watermark_and_vllm_waits_for_it():
    p = pool()
    clock = Clock()
    lender = TailLender(p, options(), clock=clock)
    assert lend_settled(lender) == [0, 1, 2, 3]
    taken = p.get_new_blocks(p.get_num_free_blocks() - 7)  # 7 free: below 8
    assert not lender.has_pending_block_frees()
    orders = lender.plan()
    # As many units as bring the free blocks back to the high watermark of 24, at once:
    # ceil((24 - 7) / 8) = 3, innermost first, so that the engine's blocks stay one range.
    assert orders.restore == [3, 2, 1]
    assert all(lender.state[k] is Unit.RECLAIMING for k in (1, 2, 3))
    assert lender.has_pending_block_frees() and lender.has_pending_block_frees()
    clock.t += 0.3
    assert not lender.plan()  # nothing else moves meanwhile
    assert lender.has_pending_block_frees()
    assert lender.stats.steps_waited == 2  # a count of steps, not of calls
    lender.workers_done([], [2])  # reported before the unit inside it: it waits for that one
    assert lender.state[2] is Unit.RECLAIMING and lender.stats.units_reclaimed == 0
    lender.workers_done([], [3, 1])  # every rank has their memory mapped again
    assert all(lender.state[k] is Unit.OWNED for k in (1, 2, 3))
    assert p.get_num_free_blocks() == 7 + 24 and lender.lent_blocks() == 8
    assert lender.stats.units_reclaimed == 3 and lender.stats.reclaim_s_max == pytest.approx(0.3)
    assert not lender.has_pending_block_frees()
    # The blocks came back whole and vLLM hands them out.
    got = p.get_new_blocks(31)
    assert set(range(32, 56)) <= {b.block_id for b in got}
    p.free_blocks(got + taken)


def test_past_the_deadline_vllm_preempts_as_without_lending():
    p = pool()
    clock = Clock()
    lender = TailLender(p, options(reclaim_deadline_s=1.0), clock=clock)
    assert lend_settled(lender) == [0, 1, 2, 3]
    p.get_new_blocks(p.get_num_free_blocks() - 2)
    assert lender.plan().restore == [3, 2, 1]
    clock.t += 0.9
    assert lender.has_pending_block_frees()
    clock.t += 0.2
    assert not lender.has_pending_block_frees()
    lender.workers_done([], [3, 2, 1])
    assert lender.stats.reclaims_late == 3 and lender.state[3] is Unit.OWNED


def test_fencing_stops_when_vllm_needs_its_blocks():
    p = pool()
    lender = TailLender(p, options())
    everything = p.get_new_blocks(63)
    p.free_blocks([b for b in everything if b.block_id < 62])  # 62, 63 busy
    assert not lender.plan() and lender.state[0] is Unit.FENCING
    assert p.get_num_free_blocks() == 61 - 6
    p.get_new_blocks(50)  # 5 free: below the low watermark
    assert not lender.plan()
    assert lender.state[0] is Unit.OWNED and lender.stats.fences_cancelled == 1
    assert p.get_num_free_blocks() == 5 + 6  # the six taken are vLLM's again
    assert lender.lent_blocks() == 0


def test_options_are_checked():
    for bad, what in ((dict(unit_blocks=0), "unit_blocks"),
                      (dict(low_free_blocks=24), "below high_free_blocks"),
                      (dict(keep_blocks=0), "null block"),
                      (dict(reclaim_deadline_s=0), "reclaim_deadline_s"),
                      (dict(unit_blocks=60), "no unit")):
        with pytest.raises(ValueError, match=what):
            TailLender(pool(), options(**bad))


def test_a_random_run_never_hands_a_lent_block_to_a_request():
    """Requests come and go (allocations, frees, bursts); the lender plans each step and the
    workers answer a step later. Every step: no block of a unit out of vLLM's hands is free, in
    the prefix cache or held by a request, and the lent units are the outermost ones."""
    rng = random.Random(7)
    p = pool()
    clock = Clock()
    lender = TailLender(p, options(reclaim_deadline_s=0.5), clock=clock)
    held = []  # each request's blocks
    acks = None
    lent_ever = 0
    for step in range(3000):
        clock.t += 0.01
        if acks is not None:
            lender.workers_done(*acks)
        burst = (step // 300) % 2 == 1
        if rng.random() < (0.6 if burst else 0.3):
            n = rng.randint(1, 6 if burst else 3)
            if n <= p.get_num_free_blocks():
                held.append(p.get_new_blocks(n))
        if held and rng.random() < (0.3 if burst else 0.5):
            p.free_blocks(held.pop(rng.randrange(len(held))))
        lender.after_frees()
        orders = lender.plan()
        acks = (orders.release, orders.restore) if orders else None
        out = set()
        for k, s in enumerate(lender.state):
            if s is not Unit.OWNED:
                out |= {b.block_id for b in lender._fenced[k]}
                assert all(b.block_id in lender.blocks_of(k) for b in lender._fenced[k])
            if s in (Unit.RELEASING, Unit.LENT, Unit.RECLAIMING):
                assert len(lender._fenced[k]) == 8  # all of it
        assert not out & free_ids(p)
        assert not out & {b.block_id for r in held for b in r}
        assert all(p.blocks[b].block_hash is None and p.blocks[b].ref_cnt == 1 for b in out)
        m = lender._boundary()
        assert all(s is Unit.OWNED for s in lender.state[m:])
        lent_ever = max(lent_ever, sum(s is Unit.LENT for s in lender.state))
    assert lent_ever >= 3 and lender.stats.units_reclaimed >= 2


def test_a_region_past_vllms_last_block_lends_its_last_unit_short():
    """The lending region is whole units (lend_region.LendGeometry): vLLM's 64 blocks in units of
    12 make a region of 72, whose last unit holds vLLM's blocks 60..63 only. Unit 0 is lent once
    those 4 are out of vLLM's hands, and unit 1 is blocks 48..59."""
    p = pool()
    with pytest.raises(ValueError, match="rounded up to whole units of 12"):
        TailLender(p, options(unit_blocks=12, capacity_blocks=84))
    lender = TailLender(p, options(unit_blocks=12, keep_blocks=1, capacity_blocks=72))
    assert lender.num_units == 5  # (72 - 1) // 12
    assert list(lender.blocks_of(0)) == [60, 61, 62, 63]
    assert list(lender.blocks_of(1)) == list(range(48, 60))
    assert list(lender.blocks_of(4)) == list(range(12, 24))
    orders = lender.plan()
    assert orders.release == [0] and lender.lent_blocks() == 4
    assert not free_ids(p) & {60, 61, 62, 63}
    lender.workers_done([0], [])
    assert lender.state[0] is Unit.LENT
    orders = lender.plan()
    assert orders.release == [1] and lender.lent_blocks() == 16


def test_a_unit_is_done_once_every_rank_reports_it():
    """The scheduler half counts the workers' reports (lend_region.LendReport, which vLLM
    aggregates across the workers of a step): a unit two ranks release in different steps is
    released at the second; a rank's report twice counts once."""
    from types import SimpleNamespace

    from swiftkv.integrations.vllm.lend_region import LendReport
    from swiftkv.integrations.vllm.scheduler import SwiftKVConnectorScheduler

    p = pool()
    s = SwiftKVConnectorScheduler(SimpleNamespace(world=2, lend=None))
    s.lender = TailLender(p, options())
    orders = s.lender.plan()
    assert orders.release == [0]
    s._lend_reports(LendReport(released={0: {1}}))
    s._lend_reports(LendReport(released={0: {1}}))
    assert s.lender.state[0] is Unit.RELEASING
    both = LendReport(released={0: {0}}).aggregate(LendReport())
    s._lend_reports(both)
    assert s.lender.state[0] is Unit.LENT
    merged = LendReport(released={3: {0}}).aggregate(
        LendReport(released={3: {1}}, restored={2: {1}}))
    assert merged == LendReport(released={3: {0, 1}}, restored={2: {1}})


def test_lending_geometry_from_vllms_kv_cache_config():
    """How vLLM's KV cache divides into lending units: a block of all 4 layers of 2 heads of 64
    (bf16, 32 tokens) is 4 * 2 * 32 * 2 * 64 * 2 = 64 KiB; a borrower's chunk of 3 layers, 64
    tokens, 1 head of 128 is 3 * 2 * 64 * 128 * 2 = 96 KiB; their unit is lcm = 192 KiB = 3
    blocks. 100 blocks make a region of 102. Options are checked with the key named."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from swiftkv.integrations.vllm.lend_region import LendGeometry, blocks_of_share, lend_options

    spec = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    config = SimpleNamespace(
        num_blocks=100, kv_cache_tensors=[SimpleNamespace(size=100 * 65536)],
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=["a"])])
    opts = lend_options({"endpoint": "ipc:///tmp/x", "borrower": {
        "num_layers": 3, "num_kv_heads": 1, "head_dim": 128, "dtype": "bfloat16",
        "chunk_tokens": 64}})
    g = LendGeometry.of(config, opts)
    assert (g.block_bytes, g.unit_blocks, g.capacity_blocks, g.units) == (65536, 3, 102, 34)
    assert g.lender.num_layers == 4
    assert blocks_of_share(0.5, 100) == 50 and blocks_of_share(30, 100) == 30
    with pytest.raises(ValueError, match="unknown lend keys"):
        lend_options({"endpoint": "x", "borrower": {}, "high": 1})
    with pytest.raises(ValueError, match="needs an endpoint"):
        lend_options({"borrower": {}})
    with pytest.raises(ValueError, match="borrower's geometry"):
        lend_options({"endpoint": "x", "borrower": {"num_layers": 3}})
    bad = SimpleNamespace(num_blocks=100,
                          kv_cache_tensors=[SimpleNamespace(size=100 * 65536 + 8)],
                          kv_cache_groups=config.kv_cache_groups)
    with pytest.raises(ValueError, match="not 100 blocks of whole layers"):
        LendGeometry.of(bad, opts)


def test_lendings_metrics_reach_prometheus():
    """The scheduler half reports lending's counts since its last report (None when nothing
    changed), vLLM's logger aggregates them, and the Prometheus families count them: 2 units
    lent, both taken back in one reclaim with its seconds, a step waited."""
    import functools
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from swiftkv.integrations.vllm import SwiftKVConnector
    from swiftkv.integrations.vllm.scheduler import SwiftKVConnectorScheduler

    p = pool()
    clock = Clock()
    s = SwiftKVConnectorScheduler(SimpleNamespace(world=1, lend=None))
    s.lender = TailLender(p, options(high_free_blocks=40), clock=clock)
    assert s.kv_connector_stats() is None
    lend_settled(s.lender)  # 63 free: units 0 and 1 while 40 stay free after
    first = s.kv_connector_stats()
    assert first.data["units_lent"] == 2 and first.data["lent_blocks"] == 16
    assert s.kv_connector_stats() is None  # nothing since
    held = p.get_new_blocks(p.get_num_free_blocks() - 7)  # below the low watermark of 8
    orders = s.lender.plan()
    assert orders.restore == [1, 0]  # both: 7 free is far below the high watermark
    assert s.lender.has_pending_block_frees()
    clock.t += 0.25
    s.lender.workers_done([], [1, 0])
    second = s.kv_connector_stats()
    assert second.data["units_reclaimed"] == 2 and second.data["steps_waited"] == 1
    assert second.data["reclaim_s"] == [0.25, 0.25] and second.data["lent_blocks"] == 0
    both = SwiftKVConnector.build_kv_connector_stats(first.data).aggregate(second)
    assert both.reduce() == {"units_lent": 2, "units_reclaimed": 2, "steps_waited": 1,
                             "preemptions": 0, "lent_blocks": 0, "reclaim_s_max": 0.25}
    reg = CollectorRegistry()
    types = {Gauge: functools.partial(Gauge, registry=reg),
             Counter: functools.partial(Counter, registry=reg),
             Histogram: functools.partial(Histogram, registry=reg)}
    config = SimpleNamespace(kv_transfer_config=SimpleNamespace())
    prom = SwiftKVConnector.build_prom_metrics(config, types, ["engine"], {0: ["0"]})
    prom.observe(first.data)
    prom.observe(second.data)
    value = functools.partial(reg.get_sample_value, labels={"engine": "0"})
    assert value("swiftkv_vllm_lent_units_total") == 2
    assert value("swiftkv_vllm_reclaimed_units_total") == 2
    assert value("swiftkv_vllm_reclaim_wait_steps_total") == 1
    assert value("swiftkv_vllm_lent_blocks") == 0
    assert value("swiftkv_vllm_reclaim_seconds_count") == 2
    assert value("swiftkv_vllm_reclaim_seconds_sum") == 0.5
    p.free_blocks(held)
