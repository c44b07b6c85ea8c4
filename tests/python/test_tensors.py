"""Tensors in: the array protocols (numpy, torch through DLPack, buffers, a CUDA array interface),
pools built from an engine's tensors in every layout, clear errors on contradictions, tier
masks, tokens of any integer type, and no finished request kept by its context."""

import gc
import weakref

import numpy as np
import pytest

import swiftkv
from conftest import chunks_of, tokens_of

torch = pytest.importorskip("torch")  # Debian's python3-torch; tools/deps.sh installs it

B, H, D = 16, 2, 16  # small_model's block_tokens, num_kv_heads, head_dim


class FakeCudaArray:
    """Claims to be CUDA memory (never touched: the checks refuse it first)."""

    def __init__(self, shape, typestr="<f2", device=0):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (0x7F0000000000, False), "version": 3}
        self.device = device


def test_tensor_info_reads_every_protocol():
    a = np.zeros((3, 4), np.float16)
    t = swiftkv.tensor_info(a)
    assert (t.address, t.shape, t.strides, t.itemsize, t.kind, t.device) == (
        a.ctypes.data, (3, 4), (4, 1), 2, "f", swiftkv.DEVICE_HOST)
    v = swiftkv.tensor_info(a[:, 1:3])  # strided view: element strides kept
    assert v.strides == (4, 1) and v.address == a.ctypes.data + 2 and not v.c_contiguous
    x = torch.zeros((2, 5, 3), dtype=torch.bfloat16)[:, 1:]
    tx = swiftkv.tensor_info(x)
    assert (tx.address, tx.shape, tx.strides, tx.itemsize, tx.kind) == (
        x.data_ptr(), (2, 4, 3), tuple(x.stride()), 2, "bf")
    assert swiftkv.tensor_info(x).span_bytes == ((2 - 1) * 15 + (4 - 1) * 3 + 2 + 1) * 2
    g = torch.zeros((2, 3), requires_grad=True)  # read through a detached view: same memory
    assert swiftkv.tensor_info(g).address == g.data_ptr()
    b = bytearray(10)
    tb = swiftkv.tensor_info(b)
    assert tb.shape == (10,) and tb.itemsize == 1 and not tb.readonly
    assert swiftkv.tensor_info(bytes(4)).readonly
    f = swiftkv.tensor_info(FakeCudaArray((2, 3), device=1))
    assert f.device == 1 and f.strides == (3, 1) and f.address == 0x7F0000000000
    with pytest.raises(TypeError, match="is not an array"):
        swiftkv.tensor_info([1, 2, 3])


def test_store_and_retrieve_take_torch_tensors(ctx, small_model):
    m = ctx.register_model(small_model)
    tokens = torch.arange(64, dtype=torch.int64) + 500  # input_ids are int64 in torch
    kv = torch.from_numpy(chunks_of(5, 2, small_model.chunk_bytes))
    assert m.store(tokens, kv) == 64
    out = torch.zeros_like(kv)
    assert m.retrieve(tokens, 0, out) == 64
    assert torch.equal(out, kv)
    with pytest.raises(TypeError, match="C-contiguous"):
        m.retrieve(tokens, 0, torch.zeros(2 * kv.numel(), dtype=torch.uint8)[::2])
    with pytest.raises(TypeError, match="CUDA memory"):
        m.store(tokens, FakeCudaArray((kv.numel(),), "|u1"))


def test_tokens_of_any_integer_type(ctx, small_model):
    m = ctx.register_model(small_model)
    t = tokens_of(6, 64)
    m.store(t, chunks_of(6, 2, small_model.chunk_bytes))
    for form in (t, list(map(int, t)), t.astype(np.int64), torch.from_numpy(t.astype(np.int64))):
        r = m.lookup(form)
        assert r["prefix_tokens"] == 64 and list(r["residency"]) == [swiftkv.Tier.HOST] * 2
    assert m.lookup(torch.from_numpy(t.astype(np.int64))[None])["prefix_tokens"] == 64  # [1, T]
    with pytest.raises(ValueError, match="one sequence"):
        m.lookup(np.zeros((2, 32), np.uint32))
    with pytest.raises(ValueError, match="2\\*\\*32"):
        m.lookup(np.array([-1] * 32))
    with pytest.raises(TypeError, match="integers"):
        m.lookup(np.zeros(32, np.float32))
    assert ctx.stats()["stores"] == 2


def _engine_tensors(layout, pages, layers=2, dtype=torch.float16):
    shape = {"vllm": (2, pages, B, H, D), "nhd": (pages, 2, B, H, D),
             "hnd": (pages, 2, H, B, D)}
    if layout == "cross_layer":
        return torch.zeros((pages, layers, 2, B, H, D), dtype=dtype)
    return [torch.zeros(shape[layout], dtype=dtype) for _ in range(layers)]


def _token_slot(layout, tensors, layer, page, slot):
    """(K, V) of one token of one layer as [H, D] views, in the engine's own indexing."""
    if layout == "vllm":
        t = tensors[layer]
        return t[0, page, slot], t[1, page, slot]
    if layout == "nhd":
        t = tensors[layer]
        return t[page, 0, slot], t[page, 1, slot]
    if layout == "hnd":
        t = tensors[layer]
        return t[page, 0, :, slot], t[page, 1, :, slot]
    return tensors[page, layer, 0, slot], tensors[page, layer, 1, slot]


@pytest.mark.parametrize("layout", ["vllm", "nhd", "hnd", "cross_layer"])
def test_pool_from_tensors_round_trip(small_model, layout):
    """An engine's torch KV in each layout: computed K/V saved by one request and loaded into
    other pages by the next come back bit-exact, written where the engine reads them."""
    with swiftkv.Context(host_budget_bytes=8 << 20) as ctx:
        m = ctx.register_model(small_model)
        pages_n = 8
        tensors = _engine_tensors(layout, pages_n)
        pool = m.pool_from_tensors(tensors, layout="auto" if layout != "hnd" else "hnd")
        d = pool.describe()
        assert d["num_pages"] == pages_n
        tokens = tokens_of(9, 96)
        gen = torch.Generator().manual_seed(9)
        truth = torch.randn((2, 96, 2, H, D), generator=gen).to(torch.float16)
        pages = torch.tensor([5, 1, 7, 0, 3, 2], dtype=torch.int32)
        with m.request(pool, tokens, pages) as r:
            r.start_load()
            for l in range(2):
                assert r.wait_layer_load(l) == 0
                for tok in range(96):
                    k, v = _token_slot(layout, tensors, l, int(pages[tok // B]), tok % B)
                    k.copy_(truth[l, tok, 0])
                    v.copy_(truth[l, tok, 1])
                r.save_layer(l)
            assert r.wait_save() == 96
        (tensors if layout == "cross_layer" else tensors[0]).zero_()
        if layout != "cross_layer":
            tensors[1].zero_()
        pages2 = [4, 6, 0, 1, 2, 3]
        with m.request(pool, tokens, pages2) as r:
            r.start_load()
            for l in range(2):
                assert r.wait_layer_load(l) == 96
                r.save_layer(l)
            r.wait_save()
        for l in range(2):
            for tok in range(96):
                k, v = _token_slot(layout, tensors, l, pages2[tok // B], tok % B)
                assert torch.equal(k, truth[l, tok, 0]) and torch.equal(v, truth[l, tok, 1])
        pool.close()


def test_a_tensor_changed_under_its_pool_is_refused(ctx, small_model):
    """A registered tensor resized (its memory gone) or pointed at other memory is refused at the
    next request, with nothing begun; dropping the engine's own reference is harmless (the pool
    keeps the tensor alive)."""
    m = ctx.register_model(small_model)
    tensors = _engine_tensors("vllm", 8)
    pool = m.pool_from_tensors(tensors)
    ref = weakref.ref(tensors[1])
    del tensors[1]
    gc.collect()
    assert ref() is not None  # the pool holds it
    tokens = tokens_of(3, 32)
    with m.request(pool, tokens, [0, 1]) as r:
        r.start_load()
    tensors[0].resize_(0)  # its storage is freed
    with pytest.raises(swiftkv.StateError, match="tensor 0 changed since it was registered"):
        m.request(pool, tokens, [0, 1])
    assert ctx.stats()["requests_open"] == 0
    tensors[0].set_(torch.zeros((2, 8, B, H, D), dtype=torch.float16))  # other memory, same shape
    with pytest.raises(swiftkv.StateError, match="register the tensors again"):
        m.request(pool, tokens, [0, 1])
    pool.close()


def test_layers_that_overlap_are_refused(ctx, small_model):
    """Two slices of one tensor that share pages are two layers on the same memory: a load into
    one would overwrite the other. Refused, naming the layers; disjoint slices are fine."""
    m = ctx.register_model(small_model)
    big = torch.zeros((12, 2, B, H, D), dtype=torch.float16)
    with pytest.raises(swiftkv.InvalidArgument, match="layers 0 and 1 share memory"):
        m.pool_from_tensors([big[0:8], big[4:12]])
    m.pool_from_tensors([big[0:6], big[6:12]]).close()


def test_pool_from_tensors_names_what_contradicts_the_model(ctx, small_model):
    m = ctx.register_model(small_model)
    with pytest.raises(ValueError, match=r"dimension 3 \(kv_heads\) is 4 .*num_kv_heads=2"):
        m.pool_from_tensors([torch.zeros((2, 8, B, 4, D), dtype=torch.float16)] * 2)
    with pytest.raises(ValueError, match=r"dimension 4 \(head_dim\) is 8 .*head_dim=16"):
        m.pool_from_tensors([torch.zeros((8, 2, B, H, 8), dtype=torch.float16)] * 2,
                            layout="nhd")
    with pytest.raises(ValueError, match="3 tensors but .*num_layers=2"):
        m.pool_from_tensors([torch.zeros((2, 8, B, H, D), dtype=torch.float16)] * 3)
    with pytest.raises(ValueError, match="4-byte float elements but .* is F16"):
        m.pool_from_tensors([torch.zeros((2, 8, B, H, D), dtype=torch.float32)] * 2)
    with pytest.raises(ValueError, match="CUDA memory .* on the host"):
        m.pool_from_tensors([FakeCudaArray((2, 8, B, H, D))] * 2)
    with pytest.raises(ValueError, match="head_dim must be the innermost"):
        m.pool_from_tensors([torch.zeros((2, 8, B, H, D), dtype=torch.float16)
                             .transpose(3, 4).contiguous().transpose(3, 4)] * 2)
    with pytest.raises(ValueError, match="differs from layer 0"):
        m.pool_from_tensors([torch.zeros((2, 8, B, H, D), dtype=torch.float16),
                             torch.zeros((2, 9, B, H, D), dtype=torch.float16)])
    # B == H == 16 makes NHD and HND indistinguishable by shape: the caller must say.
    sq = swiftkv.ModelDesc("square", num_layers=1, num_kv_heads=16, head_dim=8, block_tokens=16,
                           chunk_tokens=32)
    ms = ctx.register_model(sq)
    with pytest.raises(ValueError, match=r"fits layouts \['nhd', 'hnd'\]"):
        ms.pool_from_tensors([torch.zeros((4, 2, 16, 16, 8), dtype=torch.float16)])
    ms.pool_from_tensors([torch.zeros((4, 2, 16, 16, 8), dtype=torch.float16)],
                         layout="hnd").close()
    assert ctx.stats()["requests_open"] == 0


def test_pool_register_needs_num_pages(ctx, small_model):
    """The hand-described form no longer guesses pages from shape[0] (2 for vLLM's layout)."""
    m = ctx.register_model(small_model)
    layers = [np.zeros((2, 8, B, H, D), np.float16) for _ in range(2)]
    with pytest.raises(TypeError, match="num_pages"):
        m.pool_register(layers, page_stride=B * H * D, kv_stride=8 * B * H * D,
                        token_stride=H * D, head_stride=D)


def test_tier_masks(small_model, tmp_path):
    assert swiftkv.Tier.HOST.bit == 2 and swiftkv.tier_mask(swiftkv.Tier.PEER,
                                                            swiftkv.Tier.DISK) == 5
    with pytest.raises(TypeError, match="ambiguous"):
        swiftkv.tier_mask(1)
    with swiftkv.Context(host_budget_bytes=1 << 20, disk_path=str(tmp_path),
                         disk_budget_bytes=1 << 20) as ctx:
        m = ctx.register_model(small_model)
        a, b = tokens_of(1, 32), tokens_of(2, 32)
        m.store(a, chunks_of(1, 1, small_model.chunk_bytes))
        m.store(b, chunks_of(2, 1, small_model.chunk_bytes))
        assert m.move(b, swiftkv.Tier.DISK) == 1
        # Tier.HOST is tier number 1, which as a raw mask would mean the peer tier: a Tier is
        # taken as its bit.
        assert m.clear(tier_mask=swiftkv.Tier.PEER) == 0
        assert m.clear(tier_mask=swiftkv.Tier.HOST) == 1
        assert m.lookup(a)["prefix_tokens"] == 0 and m.lookup(b)["prefix_tokens"] == 32
        assert ctx.clear([swiftkv.Tier.HOST, swiftkv.Tier.DISK]) == 1


def test_a_call_out_of_order_says_what_is_next(ctx, small_model):
    m = ctx.register_model(small_model)
    pool = m.pool_create(4)
    with m.request(pool, tokens_of(1, 32), [0, 1]) as r:
        r.start_load()
        r.wait_layer_load(0)
        with pytest.raises(swiftkv.Error) as e:
            r.wait_layer_load(1)
        assert e.value.status == swiftkv.Status.ESTATE
        assert "layer by layer" in e.value.message and "next is save_layer(0)" in e.value.message
        r.save_layer(0)
        assert r.info()["layers_saved"] == 1  # the refused call changed nothing


def test_finished_requests_are_not_kept(ctx, small_model):
    m = ctx.register_model(small_model)
    pool = m.pool_create(4)
    refs = []
    for i in range(200):
        with m.request(pool, tokens_of(i, 32), [0, 1]) as r:
            pass
        refs.append(weakref.ref(r))
    open_one = m.request(pool, tokens_of(999, 32), [2, 3])
    del r
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0
    assert ctx.stats()["requests_open"] == 1
    ctx.close()  # ends the open request, then the pool
    assert open_one.final is None or open_one.final["layers_saved"] == 0
