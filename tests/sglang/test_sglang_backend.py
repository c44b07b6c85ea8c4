"""The HiCache storage backend (swiftkv.integrations.sglang) driven through SGLang 0.5.23's own
classes on the CPU: its backend factory makes the backend from the extra config, its host pools
(MHATokenToKVPoolHost, MLATokenToKVPoolHost over CPU device pools) hold the pages, its page hash
names them, and its cache controller's backup and prefetch code (HiCacheController's methods,
run over a stand-in for the controller's state: the controller itself needs torch.distributed
groups and a device stream) makes the calls. Pages are compared as raw bits: random bf16 bits
hold NaNs."""

import functools
import glob
import os
import queue
import struct
import time
import types

import numpy as np
import pytest
import torch

from sglang.srt.managers.cache_controller import (
    HiCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str

import swiftkv
from swiftkv.integrations import sglang as skv

PAGE, LAYERS, HEADS, DIM = 16, 4, 2, 64
DEVICE_TOKENS = 1024
LAYOUTS = ["layer_first", "page_first", "page_first_direct"]
BACKEND = {"backend_name": "swiftkv", "module_path": "swiftkv.integrations.sglang",
           "class_name": "SwiftKVStorage", "interface_v1": 1}


def mha_host(layout, dtype=torch.bfloat16, ratio=2.0):
    dev = MHATokenToKVPool(size=DEVICE_TOKENS, page_size=PAGE, dtype=dtype, head_num=HEADS,
                           head_dim=DIM, layer_num=LAYERS, device="cpu",
                           enable_memory_saver=False, enable_alt_stream=False)
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), host_to_device_ratio=ratio, host_size=0,
                                page_size=PAGE, layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=LAYERS)


def mla_host(layout):
    dev = MLATokenToKVPool(size=DEVICE_TOKENS, page_size=PAGE, dtype=torch.bfloat16,
                           kv_lora_rank=128, qk_rope_head_dim=32, layer_num=LAYERS, device="cpu",
                           enable_memory_saver=False)
    return MLATokenToKVPoolHost(dev._mla_buffer_info(), host_to_device_ratio=2.0, host_size=0,
                                page_size=PAGE, layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0,
                                end_layer=LAYERS, target_layer_num=LAYERS)


def config(extra=None, *, tp=(0, 1), mla=False, dp_rank=0, model="pytest-model",
           layout="layer_first"):
    return HiCacheStorageConfig(
        tp_rank=tp[0], tp_size=tp[1], pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first", model_name=model, dp_rank=dp_rank,
        extra_config={**BACKEND, "host_budget_bytes": 64 << 20, "model_identity": "pytest",
                      **(extra or {})})


def backend(host, extra=None, **kw):
    """The backend as SGLang's cache controller makes it: the factory, then the host pool."""
    b = StorageBackendFactory.create_backend("dynamic", config(extra, layout=host.layout, **kw),
                                             host)
    b.register_mem_pool_host(host)
    return b


_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def fill(host, seed):
    g = torch.Generator().manual_seed(seed)
    bits = host.kv_buffer.view(_BITS[host.kv_buffer.element_size()])
    bits.copy_(torch.randint(-128, 127, bits.shape, dtype=bits.dtype, generator=g))


def slots(pages):
    """The host slots of whole pages, as SGLang hands them."""
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def page_bits(host, page):
    """Every element of one page of the pool, layer by layer, as int16 bits."""
    t = slots([page])
    out = []
    for layer in range(LAYERS):
        if isinstance(host, MLATokenToKVPoolHost):
            out.append(host.kv_buffer[layer][t] if host.layout == "layer_first" else
                       host.kv_buffer[t, layer] if host.layout == "page_first" else
                       host.kv_buffer[page, layer])
        elif host.layout == "layer_first":
            out.append(host.kv_buffer[:, layer, t])
        elif host.layout == "page_first":
            out.append(host.kv_buffer[:, t, layer])
        else:
            out.append(host.kv_buffer[:, page, layer])
    t = torch.stack(out).contiguous()
    return t.view(_BITS[t.element_size()])


def keys_of(n, seed=0):
    """SGLang's own page keys for a sequence of n pages."""
    return get_storage_hash_str([seed * 100_003 + i for i in range(n * PAGE)], None,
                                page_size=PAGE)


def round_trip(b, host, keys, src, dst):
    """Pages src stored under keys, the pool's bits elsewhere scrambled, loaded into dst: the
    loads' results and whether each loaded page equals its source bit for bit."""
    want = [page_bits(host, p).clone() for p in src]
    assert b.batch_set_v1(keys, slots(src)) == [True] * len(keys)
    fill(host, 999)
    got = b.batch_get_v1(keys, slots(dst))
    same = [torch.equal(page_bits(host, d), w) for d, w in zip(dst, want)]
    return got, same


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pages_round_trip_through_the_host_tier(layout):
    host = mha_host(layout)
    fill(host, 1)
    b = backend(host)
    keys = keys_of(8)
    got, same = round_trip(b, host, keys, list(range(8, 16)), list(range(40, 48)))
    assert got == [True] * 8 and same == [True] * 8
    assert b.batch_exists(keys) == 8
    # Each page is one chunk of the host tier, of the pool's page bytes.
    info = b.model.chunk_info_named(skv.page_names(keys))
    assert all(i.tier == swiftkv.Tier.HOST for i in info)
    assert b.model.desc.chunk_bytes == 2 * LAYERS * PAGE * HEADS * DIM * 2
    # page_first: a page's K and V are each one run of the pool's bytes, copied as such.
    assert b.model.desc.num_layers == (1 if layout == "page_first" else LAYERS)
    b.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float8_e4m3fn])
def test_other_dtypes_round_trip(dtype):
    # SGLang keeps an fp8 KV cache as uint8 in its pools: 1-byte elements the library keeps as
    # they are.
    host = mha_host("page_first", dtype=dtype)
    fill(host, 17)
    b = backend(host)
    keys = keys_of(5, seed=17)
    got, same = round_trip(b, host, keys, [1, 2, 3, 4, 5], [70, 71, 72, 73, 74])
    assert got == [True] * 5 and same == [True] * 5
    item = host.kv_buffer.element_size()
    assert b.model.desc.chunk_bytes == 2 * LAYERS * PAGE * HEADS * DIM * item
    b.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mla_pages_round_trip(layout):
    host = mla_host(layout)
    fill(host, 2)
    b = backend(host, mla=True)
    keys = keys_of(4, seed=7)
    got, same = round_trip(b, host, keys, [3, 4, 5, 6], [20, 9, 31, 2])
    assert got == [True] * 4 and same == [True] * 4
    # The latent row (128 + 32 elements) is kept as one head of two halves (page_first: one
    # layer whose heads are every layer's, a page's rows being side by side there).
    d = b.model.desc
    assert (d.num_layers, d.num_kv_heads, d.head_dim) == \
        ((1, LAYERS, 80) if layout == "page_first" else (LAYERS, 1, 80))
    b.close()


def test_batch_exists_counts_the_leading_held_pages():
    host = mha_host("layer_first")
    fill(host, 3)
    b = backend(host)
    keys = keys_of(12, seed=3)
    assert b.batch_exists(keys) == 0
    held = keys[:4] + keys[5:8]  # page 4 never stored
    assert b.batch_set_v1(keys[:4], slots(range(4))) == [True] * 4
    assert b.batch_set_v1(keys[5:8], slots(range(5, 8))) == [True] * 3
    assert b.batch_exists(keys) == 4
    assert b.batch_exists(keys[5:8]) == 3
    assert b.batch_exists(keys[4:]) == 0
    assert b.batch_exists(held) == 7
    assert [b.exists(k) for k in keys[3:6]] == [True, False, True]
    # A load stops at the first page not held, and writes nothing past it.
    before = page_bits(host, 60).clone()
    assert b.batch_get_v1(keys[2:7], slots([50, 51, 60, 61, 62])) == [True, True, False,
                                                                        False, False]
    assert torch.equal(page_bits(host, 60), before)
    b.close()


def test_a_restart_on_the_same_disk_path_finds_the_pages(tmp_path):
    extra = {"disk_path": str(tmp_path / "l3"), "disk_budget_bytes": 64 << 20}
    host = mha_host("page_first")
    fill(host, 4)
    keys = keys_of(6, seed=4)
    want = [page_bits(host, p).clone() for p in range(6)]
    b = backend(host, extra)
    assert b.batch_set_v1(keys, slots(range(6))) == [True] * 6
    b.close()  # host pages written to disk
    fill(host, 5)
    again = backend(host, extra)
    assert again.batch_exists(keys) == 6
    assert again.batch_get_v1(keys, slots(range(20, 26))) == [True] * 6
    assert all(torch.equal(page_bits(host, 20 + i), w) for i, w in enumerate(want))
    info = again.model.chunk_info_named(skv.page_names(keys))
    assert {i.tier for i in info} <= {swiftkv.Tier.DISK, swiftkv.Tier.HOST}
    again.close()


def test_pages_past_the_host_budget_come_back_from_disk(tmp_path):
    # A host tier of 4 pages' bytes (a slab of whole pages) and a disk tier behind it: the rest
    # are demoted to disk, and every page loads exact.
    chunk = 2 * LAYERS * PAGE * HEADS * DIM * 2
    extra = {"host_budget_bytes": 4 * chunk, "disk_path": str(tmp_path / "l3"),
             "disk_budget_bytes": 64 << 20}
    host = mha_host("layer_first")
    fill(host, 6)
    b = backend(host, extra)
    keys = keys_of(24, seed=6)
    want = [page_bits(host, p).clone() for p in range(24)]
    for i in range(0, 24, 4):
        assert b.batch_set_v1(keys[i:i + 4], slots(range(i, i + 4))) == [True] * 4
    tiers = [i.tier for i in b.model.chunk_info_named(skv.page_names(keys))]
    assert tiers.count(swiftkv.Tier.DISK) >= 20
    fill(host, 7)
    assert b.batch_get_v1(keys, slots(range(30, 54))) == [True] * 24
    assert all(torch.equal(page_bits(host, 30 + i), w) for i, w in enumerate(want))
    b.close()


def _records(directory):
    """(path, offset, key_lo, key_hi) of every chunk record in a disk directory's segments."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "seg-*.kvlog"))):
        data = open(path, "rb").read()
        for off in range(128, len(data) - 128, 64):
            if data[off:off + 8] == b"SWKVREC\0" and struct.unpack_from("<I", data, off + 16)[0] == 1:
                lo, hi = struct.unpack_from("<QQ", data, off + 32)
                found.append((path, off, lo, hi))
    return found


def test_a_corrupt_disk_record_ends_the_run_there(tmp_path):
    d = tmp_path / "l3"
    extra = {"disk_path": str(d), "disk_budget_bytes": 64 << 20}
    host = mha_host("layer_first")
    fill(host, 8)
    keys = keys_of(6, seed=8)
    want = [page_bits(host, p).clone() for p in range(6)]
    b = backend(host, extra)
    assert b.batch_set_v1(keys, slots(range(6))) == [True] * 6
    ck = b.model.chunk_keys_named(skv.page_names(keys))
    b.close()
    lo, hi = ck[3] & ((1 << 64) - 1), ck[3] >> 64
    (path, off, _, _), = [r for r in _records(str(d)) if (r[2], r[3]) == (lo, hi)]
    with open(path, "r+b") as f:  # one payload byte of page 3
        f.seek(off + 128 + 100)
        byte = f.read(1)
        f.seek(off + 128 + 100)
        f.write(bytes([byte[0] ^ 0x40]))
    fill(host, 9)
    again = backend(host, extra)
    got = again.batch_get_v1(keys, slots(range(40, 46)))
    # Pages 0-2 loaded; page 3 fails its checksum and is not handed to SGLang as good data,
    # nor is anything after it (SGLang recomputes them).
    assert got == [True, True, True, False, False, False]
    assert all(torch.equal(page_bits(host, 40 + i), w) for i, w in enumerate(want[:3]))
    assert again.batch_exists(keys) == 3  # the bad record is gone from the index
    again.close()


def test_pages_in_a_lenders_memory_and_a_lost_lease(tmp_path):
    ep = f"ipc://{tmp_path}/lender"
    lender = swiftkv.Context(host_budget_bytes=16 << 20, coord_endpoint=ep, coord_heartbeat_ms=20)
    host = mha_host("layer_first")
    fill(host, 10)
    b = backend(host, {"host_budget_bytes": 16 << 20})
    keys = keys_of(8, seed=10)
    want = [page_bits(host, p).clone() for p in range(8)]
    # Pages 0-3 in host memory, before anything is borrowed.
    assert b.batch_set_v1(keys[:4], slots(range(4))) == [True] * 4
    region = lender.elastic(swiftkv.ModelDesc("pytest-lender", num_layers=2, num_kv_heads=2,
                                              head_dim=64, block_tokens=16),
                            b.model.desc, capacity_blocks=64, owned_blocks=8)
    region.offer("pytest-pool")
    b.borrower.leases.append(b.model.borrow_remote(ep, "pytest-pool", 16))  # 16 pages of room
    # Pages 4-7 into the lent memory, which is the first tier with room.
    assert b.batch_set_v1(keys[4:], slots(range(4, 8))) == [True] * 4
    tiers = [i.tier for i in b.model.chunk_info_named(skv.page_names(keys))]
    assert tiers[:4] == [swiftkv.Tier.HOST] * 4 and tiers[4:] == [swiftkv.Tier.PEER] * 4
    fill(host, 11)
    assert b.batch_get_v1(keys, slots(range(20, 28))) == [True] * 8
    assert all(torch.equal(page_bits(host, 20 + i), w) for i, w in enumerate(want))
    # The lender goes away: its pages are lost, and a load ends where they begin.
    region.close()
    lender.close()
    deadline = time.monotonic() + 30  # the borrower sees the lease end at its next beat
    while b.batch_exists(keys) > 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    fill(host, 12)
    assert b.batch_get_v1(keys, slots(range(20, 28))) == [True] * 4 + [False] * 4
    assert all(torch.equal(page_bits(host, 20 + i), w) for i, w in enumerate(want[:4]))
    b.close()


def test_two_tp_ranks_keep_their_shards_apart(tmp_path):
    extra = {"disk_path": str(tmp_path / "l3"), "disk_budget_bytes": 64 << 20}
    keys = keys_of(4, seed=12)
    hosts, ranks, want = [], [], []
    for rank in (0, 1):
        host = mha_host("layer_first")
        fill(host, 20 + rank)  # each rank its own heads: other bytes under the same keys
        b = backend(host, extra, tp=(rank, 2))
        assert b.batch_set_v1(keys, slots(range(4))) == [True] * 4
        hosts.append(host)
        ranks.append(b)
        want.append([page_bits(host, p).clone() for p in range(4)])
    names = skv.page_names(keys)
    k0, k1 = (r.model.chunk_keys_named(names) for r in ranks)
    assert not set(k0) & set(k1)
    # Each rank has a disk directory and half the budgets of its own.
    assert sorted(os.listdir(tmp_path / "l3")) == ["tp0of2", "tp1of2"]
    assert ranks[0].ctx.config()["host_budget_bytes"] == 32 << 20
    for b in ranks:
        b.close()
    for rank in (0, 1):
        fill(hosts[rank], 30)
        b = backend(hosts[rank], extra, tp=(rank, 2))
        assert b.batch_get_v1(keys, slots(range(10, 14))) == [True] * 4
        assert all(torch.equal(page_bits(hosts[rank], 10 + i), w)
                   for i, w in enumerate(want[rank]))
        b.close()


def test_mla_keys_are_shared_across_ranks():
    # Every rank holds an MLA page whole, so its key carries no rank; MHA shards' keys do.
    keys = skv.page_names(keys_of(3, seed=13))
    mla = [backend(mla_host("page_first"), mla=True, dp_rank=r) for r in (0, 1)]
    assert mla[0].model.chunk_keys_named(keys) == mla[1].model.chunk_keys_named(keys)
    mha = [backend(mha_host("page_first"), tp=(r, 2)) for r in (0, 1)]
    k0, k1 = (b.model.chunk_keys_named(keys) for b in mha)
    assert not set(k0) & set(k1)
    for b in mla + mha:
        b.close()
    # MLA over several TP ranks is refused: SGLang writes its pages from one rank only.
    with pytest.raises(ValueError, match="MLA model with tensor parallel size 2"):
        StorageBackendFactory.create_backend("dynamic", config(tp=(0, 2), mla=True), None)


def test_sglangs_backup_and_prefetch_code_drive_the_backend():
    """HiCacheController's own _page_backup, _storage_hit_query and _page_transfer (batches of
    STORAGE_BATCH_SIZE pages, its zero-copy page functions) over 300 pages."""
    host = mha_host("layer_first", ratio=12.0)  # 768 pages
    fill(host, 14)
    b = backend(host)
    ctl = types.SimpleNamespace(storage_backend=b, page_size=PAGE,
                                prefetch_sync_queue=queue.Queue())
    ctl.page_set_func = functools.partial(HiCacheController._page_set_zero_copy, ctl)
    ctl.page_get_func = functools.partial(HiCacheController._page_get_zero_copy, ctl)
    ctl._page_transfer_kv_batch = functools.partial(HiCacheController._page_transfer_kv_batch,
                                                    ctl)
    n = 300
    tokens = list(range(5_000, 5_000 + n * PAGE))
    keys = get_storage_hash_str(tokens, None, page_size=PAGE)
    want = [page_bits(host, p).clone() for p in range(n)]
    op = StorageOperation(slots(range(n)), tokens, hash_value=keys)
    HiCacheController._page_backup(ctl, op)
    assert op.completed_tokens == n * PAGE
    # The prefetch: the hit query over SGLang's hashes of the tokens, then the transfer.
    pf = PrefetchOperation("req-1", tokens)
    hashes, hit_tokens = HiCacheController._storage_hit_query(ctl, pf)
    assert hashes == keys and hit_tokens == n * PAGE
    fill(host, 15)
    pf.hash_value = hashes
    pf.host_indices = slots(range(n, 2 * n))
    assert HiCacheController._page_transfer(ctl, pf) == n
    assert all(torch.equal(page_bits(host, n + i), w) for i, w in enumerate(want))
    # A prompt that diverges after 130 pages hits 130 of them.
    other = tokens[:130 * PAGE] + [1] * (20 * PAGE)
    _, hit = HiCacheController._storage_hit_query(ctl, PrefetchOperation("req-2", other))
    assert hit == 130 * PAGE
    b.close()


def test_v2_calls_serve_the_kv_pool_and_refuse_others():
    host = mha_host("layer_first")
    fill(host, 16)
    b = backend(host)
    keys = keys_of(3, seed=16)
    kv = PoolTransfer(name=PoolName.KV, host_indices=slots(range(3)), keys=keys)
    assert b.batch_set_v2([kv]) == {PoolName.KV: [True] * 3}
    r = b.batch_exists_v2(keys)
    assert r.kv_hit_pages == 3 and r.extra_pool_hit_pages == {PoolName.KV: 3}
    back = PoolTransfer(name=PoolName.KV, host_indices=slots(range(5, 8)), keys=keys)
    assert b.batch_get_v2([back]) == {PoolName.KV: [True] * 3}
    mamba = PoolTransfer(name=PoolName.MAMBA, host_indices=slots(range(3)), keys=keys)
    for call in (lambda: b.batch_get_v2([mamba]), lambda: b.batch_set_v2([kv, mamba]),
                 lambda: b.batch_exists_v2(keys, [mamba]),
                 lambda: b.register_mem_host_pool_v2(host, PoolName.MAMBA)):
        with pytest.raises(ValueError, match="'mamba'"):
            call()
    b.register_mem_host_pool_v2(host, PoolName.KV)  # the anchor pool again: accepted
    b.close()


def test_bad_configurations_are_refused_by_name():
    def make(extra):
        StorageBackendFactory.create_backend("dynamic", config(extra), None)

    with pytest.raises(ValueError, match='"interface_v1": 1'):
        make({"interface_v1": 0})
    with pytest.raises(ValueError, match="unknown .* keys \\['host_budget'\\]"):
        make({"host_budget": 1})
    with pytest.raises(ValueError, match="disk_path needs disk_budget_bytes"):
        make({"disk_path": "/tmp/x"})
    with pytest.raises(ValueError, match="unknown codec 'lz4'"):
        make({"host_codec": "lz4"})
    with pytest.raises(ValueError, match="lenders\\[0\\]"):
        make({"lenders": [{"endpoint": "ipc://x"}]})
    b = StorageBackendFactory.create_backend("dynamic", config(), None)
    with pytest.raises(ValueError, match="layout 'page_head' is not supported"):
        b.register_mem_pool_host(types.SimpleNamespace(layout="page_head"))
    with pytest.raises(NotImplementedError, match="interface_v1"):
        b.batch_get(["a"], [None])
    b.close()
    host = mha_host("layer_first")
    b = backend(host)
    with pytest.raises(ValueError, match="3 keys take 48 host slots"):
        b.batch_set_v1(keys_of(3), torch.arange(32))
    with pytest.raises(ValueError, match="whole pages"):
        b.batch_set_v1(keys_of(1), torch.arange(3, 3 + PAGE))
    assert b.batch_exists(keys_of(3)) == 0  # nothing was stored by the refused calls
    b.close()


def test_keys_that_are_not_sglangs_digests_are_named_consistently():
    a = skv.page_names(["k1", "f" * 64, "key-two"])
    b = skv.page_names(["f" * 64])
    assert a.shape == (3, 32) and np.array_equal(a[1], b[0])
    assert bytes(b[0]) == b"\xff" * 32
    assert np.array_equal(skv.page_names(["k1"])[0], a[0])
    assert not np.array_equal(a[0], a[2])


def test_the_benchmark_runs():
    """bench/bench_sglang_backend.py, small: it runs and its JSON line is whole."""
    import json
    import subprocess
    import sys
    bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                         "bench_sglang_backend.py")
    out = subprocess.run([sys.executable, bench, "--reps", "1", "--pages", "16",
                          "--layouts", "page_first", "--resident", "4096",
                          "--exists-calls", "5"], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    line = json.loads(out.strip().splitlines()[-1])
    assert line["bench"] == "sglang_backend" and len(line["pages"]) == 1
    row = line["pages"][0]
    assert row["call_bytes"] == 128 * 2 * 32 * 16 * 2 * 128 * 2
    assert row["set_gbs"]["median"] > 0 and row["get_disk_gbs"]["median"] > 0
    assert line["exists"]["resident"] == 4096
    # Each row is read against the design's bar (0.8x the memcpy, sets and host gets), in its
    # JSON and at the end of its table line.
    cp = row["memcpy_gbs"]["median"]
    assert row["meets_bar"] == (row["set_gbs"]["median"] >= 0.8 * cp and
                                row["get_host_gbs"]["median"] >= 0.8 * cp)
    table_row = [ln for ln in out.splitlines() if ln.split()[:2] == ["page_first", "16"]]
    assert len(table_row) == 1
    assert table_row[0].split()[-1] == ("met" if row["meets_bar"] else "MISSED")
