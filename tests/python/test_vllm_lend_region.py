"""A lending vLLM worker's KV cache in the library's elastic region (swiftkv.integrations.vllm.
lend_region.RegionLender), without vLLM: its one backing allocation served from the region, its
views checked block-outermost, a tail unit given to the library, lent, written by a borrower and
taken back, the lender's own blocks untouched throughout. On the host (memfd granules) and, where
a GPU is, on the device (VMM memory, vLLM's tensor a view of it through
__cuda_array_interface__): the path a lending engine takes on a GPU, which the engine tests on
the CPU cannot reach."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import swiftkv  # noqa: E402
from test_vllm_worker import devices, sv  # noqa: E402,F401  (sv: the vLLM fixture)

BLOCKS, BLOCK, LAYERS, HEADS, DIM = 24, 16, 3, 2, 64
BLOCK_BYTES = LAYERS * 2 * BLOCK * HEADS * DIM * 2  # every layer's K and V of a block: 24 KiB


def kv_cache_config():
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=DIM,
                             dtype=torch.float16)
    return SimpleNamespace(
        num_blocks=BLOCKS, kv_cache_tensors=[SimpleNamespace(size=BLOCKS * BLOCK_BYTES)],
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=["a", "b", "c"])])


@pytest.mark.parametrize("device", devices())
def test_a_lending_workers_kv_cache_is_the_region_and_its_tail_goes_and_comes_back(
        sv, device, tmp_path):  # noqa: F811
    from swiftkv.integrations.vllm.lend_region import RegionLender, _CudaBytes, lend_options

    # The borrower's chunk: 3 layers, 32 tokens, 2 heads of 64 (f16) = 48 KiB = 2 blocks: a
    # unit is 2 blocks and the region 12 units.
    opts = lend_options({"endpoint": f"ipc://{tmp_path}/lend.sock", "borrower": {
        "num_layers": 3, "num_kv_heads": 2, "head_dim": 64, "dtype": "float16",
        "chunk_tokens": 32}})
    lender = RegionLender(SimpleNamespace(world=1, rank=0), kv_cache_config(), opts)
    assert (lender.geo.unit_blocks, lender.geo.capacity_blocks) == (2, 24)
    try:
        with lender.allocation():
            buf = torch.zeros(BLOCKS * BLOCK_BYTES, dtype=torch.int8, device=device)
            other = torch.zeros(100, dtype=torch.int8, device=device)  # not the KV cache
        assert buf.data_ptr() == lender.tensor.data_ptr()
        assert buf.device.type == device and other.data_ptr() != buf.data_ptr()
        assert int(buf.abs().sum()) == 0  # zeros, as torch.zeros promised
        # vLLM's BLHNC views: [blocks, H, N, K+V] per layer, a block of all layers together.
        blhnc = buf.view(torch.float16).view(BLOCKS, LAYERS, HEADS, BLOCK, 2 * DIM)
        lender.check_views([blhnc[:, i] for i in range(LAYERS)])
        lbhnc = buf.view(torch.float16).view(LAYERS, BLOCKS, HEADS, BLOCK, 2 * DIM)
        with pytest.raises(RuntimeError, match="block-outermost"):
            lender.check_views([lbhnc[i] for i in range(LAYERS)])

        pattern = (torch.arange(buf.numel(), device=device) % 251).to(torch.int8)
        buf.copy_(pattern)
        mine = BLOCKS * BLOCK_BYTES - 2 * BLOCK_BYTES  # what stays the engine's: blocks 0..21
        lender.apply([0], [])  # unit 0: blocks 22 and 23, fenced by the scheduler before
        report = lender.take_report()
        assert report.released == {0: {0}} and not report.restored
        s = lender.region.stats()
        assert (s["owned_blocks"], s["free_blocks"]) == (22, 2)
        # A borrower in this process takes the unit and writes it all.
        lease = lender.region.lend(1)
        assert (lease["first_block"], lease["blocks"], lease["bytes"]) == (22, 2, 2 * BLOCK_BYTES)
        if device == "cuda":
            torch.as_tensor(_CudaBytes(lease["data"], lease["bytes"]), device=device).fill_(-18)
        else:
            import ctypes
            ctypes.memset(lease["data"], 0xEE, lease["bytes"])
        assert torch.equal(buf[:mine], pattern[:mine])
        # Taken back: done once the borrower released its lease.
        lender.apply([], [0])
        assert lender.take_report() is None
        assert lender.region.stats()["reclaiming_blocks"] == 2
        lender.region.release(lease["id"])
        assert lender.take_report().restored == {0: {0}}
        s = lender.region.stats()
        assert (s["owned_blocks"], s["ready_blocks"], s["lent_blocks"]) == (24, 24, 0)
        buf[mine:].fill_(5)  # the engine's again
        assert int((buf[mine:] == 5).sum()) == 2 * BLOCK_BYTES
        assert torch.equal(buf[:mine], pattern[:mine])
        with pytest.raises(RuntimeError, match="owns 12 of 12 units"):
            lender.apply([], [0])
        assert lender.stats == {"units_released": 1, "units_restored": 1}
    finally:
        lender.close()


def test_lend_options_and_geometry_are_checked(sv, tmp_path):  # noqa: F811
    from swiftkv.integrations.vllm.lend_region import RegionLender, lend_options

    borrower = {"num_layers": 3, "num_kv_heads": 2, "head_dim": 64, "dtype": "float16",
                "chunk_tokens": 32}
    with pytest.raises(ValueError, match="lend.borrower.dtype"):
        lend_options({"endpoint": "ipc:///x", "borrower": {**borrower, "dtype": "int8"}})
    with pytest.raises(ValueError, match="must be > 0"):
        lend_options({"endpoint": "ipc:///x", "borrower": borrower, "lease_ms": 0})
    opts = lend_options({"endpoint": f"ipc://{tmp_path}/x.sock", "borrower": borrower})
    with pytest.raises(ValueError, match="must hold {rank}"):
        RegionLender(SimpleNamespace(world=2, rank=1), kv_cache_config(), opts)
    two = lend_options({"endpoint": f"ipc://{tmp_path}/x.{{rank}}.sock", "name": "A",
                        "borrower": borrower})
    r = RegionLender(SimpleNamespace(world=2, rank=1), kv_cache_config(), two)
    assert (r.endpoint, r.name) == (f"ipc://{tmp_path}/x.1.sock", "A.tp1")
    assert r.geo.borrower.dtype == swiftkv.DType.F16
