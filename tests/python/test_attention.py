"""Multi-token paged attention on the host through the binding, against numpy."""

import numpy as np
import pytest

import swiftkv


def reference(q, k_pages, v_pages, pages, kv_len, scale):
    k = np.concatenate([k_pages[p] for p in pages])[:kv_len].astype(np.float64)
    v = np.concatenate([v_pages[p] for p in pages])[:kv_len].astype(np.float64)
    t, hq, d = q.shape
    hk = k.shape[1]
    out = np.zeros((t, hq, d))
    for i in range(t):
        limit = kv_len - t + i + 1  # causal, aligned to the end of the KV
        for h in range(hq):
            s = (k[:limit, h // (hq // hk)] @ q[i, h].astype(np.float64)) * scale
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ v[:limit, h // (hq // hk)]
    return out


def test_paged_attention_matches_numpy():
    rng = np.random.default_rng(0)
    desc = swiftkv.AttentionDesc(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_tokens=16,
                                 dtype=swiftkv.DType.F32)
    n_pages = 8
    k_pages = rng.standard_normal((n_pages, 16, 2, 64)).astype(np.float32)
    v_pages = rng.standard_normal((n_pages, 16, 2, 64)).astype(np.float32)
    pages = [6, 2, 5]
    kv_len = 2 * 16 + 7
    q = rng.standard_normal((5, 4, 64)).astype(np.float32)
    ws = swiftkv.attention_workspace(desc, 1, 5)
    assert ws.nbytes == swiftkv.attention_workspace_size(desc, 1, 5)
    with pytest.raises(swiftkv.Error) as e:
        swiftkv.AttentionPlan(desc, [0, 5], [0, 3], [7], np.zeros(ws.nbytes + 256, np.uint8)[1:])
    assert "256-byte aligned" in e.value.message
    plan = swiftkv.AttentionPlan(desc, [0, 5], [0, 3], [7], ws)
    assert plan.counts()["q_tokens"] == 5 and plan.counts()["kv_tokens"] == kv_len
    out = np.zeros_like(q)
    lse = np.zeros((5, 4), np.float32)
    plan.run(q, k_pages, v_pages, pages, out, page_stride=16 * 2 * 64, token_stride=2 * 64,
             head_stride=64, num_pages=n_pages, lse=lse)
    want = reference(q, k_pages, v_pages, pages, kv_len, 1 / 8)
    assert np.abs(out - want).max() < 1e-5
    assert np.isfinite(lse).all()
    with pytest.raises(swiftkv.Error) as e:
        plan.run(q, k_pages, v_pages, [6, 2, 99], out, page_stride=16 * 2 * 64,
                 token_stride=2 * 64, head_stride=64, num_pages=n_pages)
    assert e.value.status == swiftkv.Status.EINVAL
