"""Version, statuses and errors, dtypes, geometry and planning (exact figures)."""

import numpy as np
import pytest

import swiftkv


def test_version():
    assert swiftkv.version() == 100  # 0.1.0
    assert swiftkv.version_string() == "0.1.0"


def test_status_strings_and_errors():
    assert swiftkv.status_string(swiftkv.Status.EINVAL).startswith("SWIFTKV_EINVAL")
    assert swiftkv.status_string(12345) == "unknown swiftkv_status"
    with pytest.raises(swiftkv.Error) as e:
        swiftkv.bytes_per_token(swiftkv.ModelDesc("x", num_layers=0, num_kv_heads=1, head_dim=1))
    assert e.value.status == swiftkv.Status.EINVAL
    assert "num_layers" in e.value.message
    assert e.value.message == swiftkv.last_error_message()
    assert str(e.value).startswith("EINVAL: ")


def test_dtypes():
    sizes = {swiftkv.DType.F16: 2, swiftkv.DType.BF16: 2, swiftkv.DType.F32: 4,
             swiftkv.DType.FP8_E4M3: 1, swiftkv.DType.FP8_E5M2: 1, swiftkv.DType.I8: 1}
    for d, n in sizes.items():
        assert swiftkv.dtype_size(d) == n
    assert swiftkv.dtype_size(99) == 0


def qwen3(layers):
    return swiftkv.ModelDesc("qwen3", num_layers=layers, num_kv_heads=8, head_dim=128)


def test_geometry_exact():
    # Qwen3-32B: 2 * 64 layers * 8 heads * 128 dims * 2 bytes.
    assert swiftkv.bytes_per_token(qwen3(64)) == 262144
    assert qwen3(64).chunk_bytes == 262144 * 256
    # SwiftCache Eq. 6-9 between Qwen3-14B (40 layers) and Qwen3-8B (36 layers): 9 and 10 blocks.
    assert swiftkv.meu(qwen3(40), qwen3(36)) == (9, 10)
    assert swiftkv.meu(qwen3(36), qwen3(40)) == (10, 9)
    b, l = swiftkv.lend_unit(qwen3(36), qwen3(36))
    assert (b, l) == (1, 16)  # one 256-token chunk is sixteen 16-token blocks


def test_planning():
    flat = swiftkv.ModelDesc("flat", num_layers=32, num_kv_heads=32, head_dim=128,
                             dtype=swiftkv.DType.F16)
    gib = 1 << 30
    plan = swiftkv.plan_borrower(flat, 40 * gib, [20 * gib, 30 * gib])
    assert plan["lender_full_blocks"] == 6400
    assert plan["stream_blocks"] == 6400
    assert plan["regular_blocks"] == 4920
    assert plan["max_context_tokens"] == 181120
    assert plan["baseline_context_tokens"] == 81920
    alone = swiftkv.plan_borrower(flat, 40 * gib)
    assert alone["lender_full_blocks"] == 0
    assert swiftkv.plan_scale_up(10, 16, 4, 3, 100) == (0, 0)
    assert swiftkv.plan_scale_up(10, 16, 4, 3, 200) == (4, 3)
    lender, borrower = swiftkv.plan_scale_down(40, 16, 4, 3, 100)
    assert lender % 4 == 0 and borrower == lender // 4 * 3 and lender > 0
    with pytest.raises(swiftkv.Error) as e:
        swiftkv.plan_scale_up(10, 0, 4, 3, 100)
    assert "block_tokens is 0" in e.value.message


def test_devices():
    assert swiftkv.device_count() >= 0


def test_each_status_raises_its_own_error_class(tmp_path):
    with swiftkv.Context(host_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(swiftkv.ModelDesc("errs", num_layers=1, num_kv_heads=1,
                                                 head_dim=8, chunk_tokens=16))
        with pytest.raises(swiftkv.InvalidArgument) as e:
            m.store(np.arange(17, dtype=np.uint32), np.zeros(64, np.uint8))
        assert isinstance(e.value, ValueError) and e.value.status == swiftkv.Status.EINVAL
        with pytest.raises(swiftkv.NotFound) as e:
            m.unpin(np.arange(16, dtype=np.uint32))
        assert isinstance(e.value, LookupError) and e.value.status == swiftkv.Status.ENOTFOUND
        with pytest.raises(swiftkv.Busy):
            ctx.register_model(m.desc)
        assert swiftkv.Error.of(swiftkv.Status.ETIMEDOUT) is swiftkv.TimedOut
        assert swiftkv.capi.Error is swiftkv.Error
    with pytest.raises(swiftkv.StateError):
        ctx.stats()  # closed


def test_pools_and_regions_close_with_with():
    d = swiftkv.ModelDesc("with", num_layers=3, num_kv_heads=2, head_dim=16, chunk_tokens=32)
    with swiftkv.Context(host_budget_bytes=8 << 20) as ctx:
        m = ctx.register_model(d)
        with m.pool_create(4) as pool:
            pid = pool.id
            assert pool.describe()["num_pages"] >= 4
        with pytest.raises(swiftkv.NotFound):
            m.request(pool, np.arange(32, dtype=np.uint32), [0, 1])  # the pool is gone
        lender = swiftkv.ModelDesc("with-lender", num_layers=3, num_kv_heads=2, head_dim=16)
        with ctx.elastic(lender, d, capacity_blocks=64) as region:
            assert region.stats()["capacity_blocks"] == 64
        with pytest.raises(swiftkv.StateError):
            region.stats()
        assert pid == pool.id


def test_results_are_records():
    """What the library fills comes back as frozen dataclasses; dict-style reads still work."""
    import dataclasses

    ctx = swiftkv.Context(host_budget_bytes=8 << 20)
    m = ctx.register_model(swiftkv.ModelDesc("r", num_layers=2, num_kv_heads=2, head_dim=16))
    tokens = np.arange(512, dtype=np.uint32)
    m.store(tokens, np.zeros(512 * m.desc.bytes_per_token, dtype=np.uint8))
    st = ctx.stats()
    assert isinstance(st, swiftkv.Record) and dataclasses.is_dataclass(st)
    assert st.stores == st["stores"] == dict(st)["stores"] == st.as_dict()["stores"] == 2
    assert "stores" in st and "size" not in st and st.get("nothing", 5) == 5
    with pytest.raises(KeyError):
        st["nothing"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.stores = 0
    assert ctx.stats() == st  # nothing changed in between
    assert ctx.config().host_budget_bytes == 8 << 20
    look = m.lookup(tokens)
    assert isinstance(look, swiftkv.Lookup)
    assert (look.chunks, look.prefix_tokens, look["loadable_tokens"]) == (2, 512, 512)
    assert list(look.residency) == [swiftkv.Tier.HOST] * 2
    ctx.close()
