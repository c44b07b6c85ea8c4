#!/usr/bin/env python3
"""bench_attention_sdpa: the paged attention kernels beside PyTorch's
scaled_dot_product_attention over the same KV made contiguous, with GQA in SDPA's kernel
(enable_gqa: no expanded copy of K and V), measured in the same run on a GPU machine. Prefill is
compared as time against SDPA's (the bar: at most 1.1x); decode as KV bytes read per second
against the bytes read plus written per second of a large device-to-device copy timed in the
same repetitions (the bar: at least 0.8). Every kernel's output is checked against SDPA's before
it is timed, and a wrong one is reported and not timed. Median and best of --reps repetitions,
each timing SDPA, the kernels and the copy in turn. Prints a table and one JSON line. Both
attention kernels (FlashInfer's batch prefill and the library's FlashAttention-2 style one,
SWIFTKV_ATTENTION_KERNEL) are measured.

It reaches the library through ctypes over the C header's structs (the Python bindings are not
part of this release yet). `--check-abi` only checks those struct layouts and plans a tiny batch
on the host, which needs no PyTorch and no GPU (the test suite runs it).
"""
import argparse
import ctypes as C
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# The library's attention kernels (SWIFTKV_ATTENTION_KERNEL): both are measured.
KERNELS = ("flashinfer", "fa2")


class Desc(C.Structure):
    _fields_ = [("size", C.c_uint32), ("version", C.c_uint32), ("device", C.c_int32),
                ("dtype", C.c_int32), ("num_qo_heads", C.c_uint32), ("num_kv_heads", C.c_uint32),
                ("head_dim", C.c_uint32), ("page_tokens", C.c_uint32), ("causal", C.c_uint32),
                ("kv_chunk_tokens", C.c_uint32), ("sm_scale", C.c_float),
                ("logits_soft_cap", C.c_float)]


class Plan(C.Structure):
    _fields_ = [("size", C.c_uint32), ("version", C.c_uint32), ("n_requests", C.c_uint32),
                ("work_items", C.c_uint32), ("q_tokens", C.c_uint64), ("kv_tokens", C.c_uint64),
                ("split_requests", C.c_uint32), ("max_kv_pieces", C.c_uint32),
                ("workspace_bytes", C.c_uint64), ("internal", C.c_uint64 * 12)]


class Args(C.Structure):
    _fields_ = [("size", C.c_uint32), ("version", C.c_uint32), ("q", C.c_void_p),
                ("q_token_stride", C.c_int64), ("q_head_stride", C.c_int64),
                ("k_base", C.c_void_p), ("v_base", C.c_void_p), ("page_stride", C.c_int64),
                ("token_stride", C.c_int64), ("head_stride", C.c_int64),
                ("num_pages", C.c_uint32), ("reserved0", C.c_uint32), ("kv_indices", C.c_void_p),
                ("out", C.c_void_p), ("out_token_stride", C.c_int64),
                ("out_head_stride", C.c_int64), ("lse", C.c_void_p)]


DTYPE_F16, DTYPE_BF16 = 0, 1
HQ, HKV, DIM = 32, 8, 128
# bf16 outputs of N(0, 1) inputs: a correct kernel is within a few bf16 steps of SDPA's.
TOLERANCE = 0.05
# The device-to-device copy decode is measured against: large enough to run at full rate.
COPY_BYTES = 1 << 30


def load(path):
    lib = C.CDLL(path)
    lib.swiftkv_attention_workspace_size.argtypes = [C.POINTER(C.c_uint64), C.POINTER(Desc),
                                                     C.c_uint32, C.c_uint64]
    lib.swiftkv_attention_plan_make.argtypes = [
        C.POINTER(Plan), C.POINTER(Desc), C.POINTER(C.c_int32), C.POINTER(C.c_int32),
        C.POINTER(C.c_int32), C.c_uint32, C.c_void_p, C.c_uint64, C.c_void_p]
    lib.swiftkv_attention_run.argtypes = [C.POINTER(Plan), C.POINTER(Args), C.c_void_p,
                                          C.c_void_p]
    lib.swiftkv_last_error_message.restype = C.c_char_p
    return lib


def new(cls, version=1):
    s = cls()
    s.size, s.version = C.sizeof(cls), version
    return s


def ok(lib, status, what):
    if status != 0:
        raise RuntimeError("%s: status %d: %s" % (what, status,
                                                  lib.swiftkv_last_error_message().decode()))


def ints(values):
    return (C.c_int32 * max(1, len(values)))(*values)


def check_abi(lib):
    assert (C.sizeof(Desc), C.sizeof(Plan), C.sizeof(Args)) == (48, 144, 120), "struct layout"
    desc = new(Desc)
    desc.device, desc.dtype, desc.num_qo_heads, desc.num_kv_heads = -1, DTYPE_F16, 8, 2
    desc.head_dim, desc.page_tokens, desc.causal = 64, 16, 1
    size = C.c_uint64()
    ok(lib, lib.swiftkv_attention_workspace_size(C.byref(size), C.byref(desc), 2, 6), "size")
    raw = C.create_string_buffer(size.value + 256)
    ws = (C.addressof(raw) + 255) // 256 * 256
    plan = new(Plan)
    ok(lib, lib.swiftkv_attention_plan_make(C.byref(plan), C.byref(desc), ints([0, 5, 6]),
                                            ints([0, 2, 3]), ints([7, 16]), 2, ws, size.value,
                                            None), "plan")
    assert (plan.n_requests, plan.q_tokens, plan.kv_tokens, plan.work_items) == (2, 6, 39, 4)
    print("ABI of the attention structs checked; a host plan has %d work items" % plan.work_items)


def run_gpu(lib, torch, shapes, iters, reps):
    """Every kernel's output is checked against SDPA's first; only a correct one is timed. Then
    `reps` repetitions, each timing SDPA, every kernel and (for decode) a device copy in turn,
    so that all of them see the same clocks; median and best of each."""
    import torch.nn.functional as F
    dev = torch.device("cuda", 0)
    copy_src = torch.empty(COPY_BYTES, device=dev, dtype=torch.uint8)
    copy_dst = torch.empty_like(copy_src)

    def copy():
        copy_dst.copy_(copy_src)

    results = []
    for name, n_req, q_len, cached in shapes:
        kv_len = cached + q_len
        q = torch.randn(n_req * q_len, HQ, DIM, device=dev, dtype=torch.bfloat16)
        k_c = torch.randn(n_req, HKV, kv_len, DIM, device=dev, dtype=torch.bfloat16)
        v_c = torch.randn_like(k_c)
        q_c = q.view(n_req, q_len, HQ, DIM).transpose(1, 2)
        mask = None
        if q_len > 1:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(q_len, kv_len)

        def sdpa():
            # GQA in the kernel (torch 2.5 and later): no expanded copy of K and V.
            return F.scaled_dot_product_attention(q_c, k_c, v_c, attn_mask=mask, enable_gqa=True)

        flops = 4.0 * n_req * (q_len * cached + q_len * (q_len + 1) / 2) * HQ * DIM
        kv_bytes = 2.0 * n_req * kv_len * HKV * DIM * 2  # K and V read once, bf16
        decode = q_len == 1
        ref = sdpa().transpose(1, 2).reshape(n_req * q_len, HQ, DIM)
        for page in (16, 64):
            pages = (kv_len + page - 1) // page
            total = pages * n_req
            perm = torch.randperm(total, device=dev).to(torch.int32)
            cache = torch.zeros(total, 2, page, HKV, DIM, device=dev, dtype=torch.bfloat16)
            for r in range(n_req):
                for c, src in ((0, k_c), (1, v_c)):
                    flat = torch.zeros(pages * page, HKV, DIM, device=dev, dtype=torch.bfloat16)
                    flat[:kv_len] = src[r].transpose(0, 1)
                    cache[perm[r * pages:(r + 1) * pages].long(), c] = flat.view(pages, page, HKV, DIM)
            out = torch.empty_like(q)
            desc = new(Desc)
            desc.device, desc.dtype, desc.num_qo_heads, desc.num_kv_heads = 0, DTYPE_BF16, HQ, HKV
            desc.head_dim, desc.page_tokens, desc.causal = DIM, page, 1
            size = C.c_uint64()
            ok(lib, lib.swiftkv_attention_workspace_size(C.byref(size), C.byref(desc), n_req,
                                                         n_req * q_len), "size")
            ws = torch.empty(size.value, device=dev, dtype=torch.uint8)
            plan = new(Plan)
            stream = torch.cuda.current_stream().cuda_stream
            ok(lib, lib.swiftkv_attention_plan_make(
                C.byref(plan), C.byref(desc), ints([q_len * r for r in range(n_req + 1)]),
                ints([pages * r for r in range(n_req + 1)]),
                ints([kv_len - (pages - 1) * page] * n_req), n_req, ws.data_ptr(), size.value,
                stream), "plan")
            args = new(Args)
            args.q, args.q_token_stride, args.q_head_stride = q.data_ptr(), HQ * DIM, DIM
            args.k_base = cache.data_ptr()
            args.v_base = cache.data_ptr() + page * HKV * DIM * 2
            args.page_stride, args.token_stride, args.head_stride = 2 * page * HKV * DIM, HKV * DIM, DIM
            args.num_pages, args.kv_indices = total, perm.data_ptr()
            args.out, args.out_token_stride, args.out_head_stride = out.data_ptr(), HQ * DIM, DIM

            def paged():
                ok(lib, lib.swiftkv_attention_run(C.byref(plan), C.byref(args), ws.data_ptr(),
                                                  torch.cuda.current_stream().cuda_stream), "run")

            # Each kernel (chosen by the variable the library reads at each run) is checked
            # against SDPA before it is timed; a wrong one is reported and not timed.
            checked, errors = [], {}
            for kernel in KERNELS:
                os.environ["SWIFTKV_ATTENTION_KERNEL"] = kernel
                out.fill_(float("nan"))
                paged()
                torch.cuda.synchronize()
                errors[kernel] = (out.float() - ref.float()).abs().max().item()
                if errors[kernel] <= TOLERANCE:  # NaN (an element never written) fails too
                    checked.append(kernel)
            times = {k: [] for k in ["sdpa", "copy"] + checked}
            for _ in range(reps):
                times["sdpa"].append(time_it(torch, sdpa, iters))
                for kernel in checked:
                    os.environ["SWIFTKV_ATTENTION_KERNEL"] = kernel
                    times[kernel].append(time_it(torch, paged, iters))
                if decode:
                    times["copy"].append(time_it(torch, copy, iters))
            os.environ.pop("SWIFTKV_ATTENTION_KERNEL", None)
            sdpa_ms = median(times["sdpa"])
            for kernel in KERNELS:
                r = {"shape": name, "page": page, "kernel": kernel, "reps": reps,
                     "max_abs_diff": errors[kernel], "correct": kernel in checked,
                     "split_requests": plan.split_requests, "sdpa_ms": sdpa_ms,
                     "sdpa_tflops": flops / sdpa_ms / 1e9}
                if kernel in checked:
                    ms, best = median(times[kernel]), min(times[kernel])
                    r.update(paged_ms=ms, paged_ms_min=best, paged_tflops=flops / ms / 1e9,
                             paged_over_sdpa_time=ms / sdpa_ms,
                             paged_over_sdpa_time_best=best / min(times["sdpa"]))
                    if decode:
                        # A read-only stream against a copy's reads plus writes: the bar's
                        # terms (a kernel that only reads can beat the copy).
                        copy_ms = median(times["copy"])
                        r.update(kv_read_gbps=kv_bytes / ms / 1e6,
                                 copy_gbps=2.0 * COPY_BYTES / copy_ms / 1e6)
                        r["kv_over_copy"] = r["kv_read_gbps"] / r["copy_gbps"]
                results.append(r)
    return results


def median(values):
    v = sorted(values)
    return v[len(v) // 2]


def time_it(torch, fn, iters):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(HERE, "..", "build", "capi", "libswiftkv.so"))
    ap.add_argument("--check-abi", action="store_true")
    ap.add_argument("--iters", type=int, default=20, help="runs timed together")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median and best)")
    a = ap.parse_args()
    lib = load(a.lib)
    if a.check_abi:
        check_abi(lib)
        return 0
    try:
        import torch
    except ImportError:
        print("bench_attention_sdpa: PyTorch is not installed here: skipped")
        return 0
    if not torch.cuda.is_available():
        print("bench_attention_sdpa: no CUDA device: skipped")
        return 0
    shapes = [("prefill 8x512 over 8K", 8, 512, 8192), ("prefill 8x512 over 32K", 8, 512, 32768),
              ("decode 64x1 over 8K", 64, 1, 8192), ("decode 64x1 over 32K", 64, 1, 32768)]
    results = run_gpu(lib, torch, shapes, a.iters, a.reps)
    print("paged attention vs PyTorch SDPA (enable_gqa, contiguous KV), bf16, %d/%d heads, dim "
          "%d, causal; median of %d (best); decode: KV read against a %d MiB device copy's "
          "read + write rate" % (HQ, HKV, DIM, a.reps, COPY_BYTES >> 20))
    print("%-24s %5s %6s %10s %10s %16s %14s %10s" % (
        "shape", "page", "kernel", "paged ms", "SDPA ms", "paged/SDPA time", "KV/copy rate",
        "max |diff|"))
    for r in results:
        if not r["correct"]:
            print("%-24s %5d %6s %10s %10.3f %16s %14s %10.2e  WRONG: not timed" % (
                r["shape"], r["page"], r["kernel"], "-", r["sdpa_ms"], "-", "-",
                r["max_abs_diff"]))
            continue
        rate = "%.2f" % r["kv_over_copy"] if "kv_over_copy" in r else "-"
        print("%-24s %5d %6s %10.3f %10.3f %8.3f (%.3f) %14s %10.2e" % (
            r["shape"], r["page"], r["kernel"], r["paged_ms"], r["sdpa_ms"],
            r["paged_over_sdpa_time"], r["paged_over_sdpa_time_best"], rate, r["max_abs_diff"]))
    print(json.dumps({"bench": "attention_sdpa", "device": torch.cuda.get_device_name(0),
                      "torch": torch.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
