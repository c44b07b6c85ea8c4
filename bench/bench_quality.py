"""Quality of compressed chunks on a transformers model: a multi-turn conversation served
through SwiftKVCache from host memory whose chunks are stored under one codec, against a full
recompute of each turn, and against the same turns served from exact chunks (bf16 logits of
a turn that reads a cached prefix are not bit-identical to a full recompute: the matmuls reduce
in another order, so the exact chunks' row is the floor). Per codec: the logits' error (largest absolute difference, and the RMS
difference relative to the RMS of the logits) and top-1 agreement over every token computed by
the turns that found a cached prefix, and the bytes the host tier holds against the bytes the
chunks decode to.

The models are Llama and Qwen2 configs with random weights in bf16 (no weights can be
downloaded here), so the figures are for random weights: a trained model's logits are sharper
and its K/V have outlier channels these lack. Eager attention on the CPU.

Run it with the venv the transformers test makes (tests/transformers/run.sh):
    build/bindings/python/transformers-venv/bin/python bench/bench_quality.py
with PYTHONPATH=build/bindings/python. Prints a markdown table (docs/codecs.md has it)."""

import argparse
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import swiftkv
from swiftkv.integrations.transformers import SwiftKVCache, model_desc

K = swiftkv.CodecKind
CODECS = [
    ("raw", swiftkv.Codec()),
    ("zstd planes", swiftkv.Codec(K.ZSTD, byte_planes=True)),
    ("kivi 8 g32", swiftkv.Codec(K.KIVI, bits=8, group=32)),
    ("fp8 e4m3", swiftkv.Codec(K.FP8)),
    ("kivi 4 g32", swiftkv.Codec(K.KIVI, bits=4, group=32)),
    ("kivi 2 g32", swiftkv.Codec(K.KIVI, bits=2, group=32)),
]


def make_model(family: str, vocab: int):
    torch.manual_seed({"llama": 11, "qwen2": 12}[family])
    common = dict(vocab_size=vocab, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    cfg, cls = ((LlamaConfig(**common), LlamaForCausalLM) if family == "llama"
                else (Qwen2Config(**common), Qwen2ForCausalLM))
    cfg._attn_implementation = "eager"
    return cls(cfg).eval().to(torch.bfloat16)


def conversation(seed: int, turns: int, first: int, step: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, first), generator=g)
    out = [ids]
    for _ in range(turns - 1):
        ids = torch.cat([ids, torch.randint(0, vocab, (1, step), generator=g)], 1)
        out.append(ids)
    return out


class Error:
    """Logit error against a reference, summed over turns."""

    def __init__(self):
        self.max_abs = 0.0
        self.err2 = self.ref2 = 0.0
        self.agree = self.total = 0

    def add(self, got, want):
        d = got - want
        self.max_abs = max(self.max_abs, d.abs().max().item())
        self.err2 += d.pow(2).sum().item()
        self.ref2 += want.pow(2).sum().item()
        self.agree += (got.argmax(-1) == want.argmax(-1)).sum().item()
        self.total += got.shape[0]

    def rel_rms(self):
        return (self.err2 / self.ref2) ** 0.5

    def top1(self):
        return self.agree / self.total


def measure(family: str, codec, args, reference=None):
    """Serves the conversation with host chunks under codec. Returns the error against a full
    recompute, the error against `reference` (the logits of the same turns served exact), the
    logits, the tokens computed and cached, and the stored / decoded ratio."""
    model = make_model(family, args.vocab)
    turns = conversation(21, args.turns, args.first, args.step, args.vocab)
    vs_full, vs_ref, logits = Error(), Error(), []
    total = cached = 0
    with swiftkv.Context(host_budget_bytes=256 << 20) as ctx:
        km = ctx.register_model(model_desc(model.config, f"{family}-quality",
                                           dtype=torch.bfloat16, chunk_tokens=args.chunk))
        if codec.kind != K.RAW:
            km.set_compression(accept_lossy=True, host=codec)
        cache = SwiftKVCache(km, max_tokens=args.first + args.turns * args.step + 64)
        with torch.no_grad():
            for ids in turns:
                out = cache.prefill(model, ids)
                if out.cached_tokens == 0:
                    continue  # nothing served from the cache: nothing to measure
                got = out.logits[0].float()
                vs_full.add(got, model(ids).logits[0, out.cached_tokens:].float())
                if reference is not None:
                    vs_ref.add(got, reference[len(logits)])
                logits.append(got)
                total += got.shape[0]
                cached += out.cached_tokens
        s = ctx.codec_stats()
        c, host = int(codec.kind), int(swiftkv.Tier.HOST)
        ratio = s["stored_bytes"][c][host] / max(1, s["raw_bytes"][c][host])
    return vs_full, vs_ref, logits, total, cached, ratio


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--first", type=int, default=512, help="tokens of the first turn")
    p.add_argument("--step", type=int, default=256, help="tokens each later turn adds")
    p.add_argument("--chunk", type=int, default=64, help="chunk tokens")
    p.add_argument("--vocab", type=int, default=4096)
    args = p.parse_args()
    print("| model | codec | stored / decoded | vs recompute: max abs | rel RMS | top-1 "
          "| vs exact chunks: max abs | rel RMS | top-1 | tokens (cached) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for family in ("llama", "qwen2"):
        reference = None
        for name, codec in CODECS:
            try:
                full, ref, logits, total, cached, ratio = measure(family, codec, args, reference)
            except swiftkv.Error as e:
                if e.status == swiftkv.Status.EUNSUPPORTED:
                    continue  # zstd in a build without it
                raise
            if reference is None:
                reference = logits  # raw: the exact chunks
                ref = None
            cols = ["-", "-", "-"] if ref is None else [
                f"{ref.max_abs:.4g}", f"{ref.rel_rms():.2e}", f"{100 * ref.top1():.2f}%"]
            print(f"| {family} | {name} | {ratio:.3f} | {full.max_abs:.4g} | {full.rel_rms():.2e} "
                  f"| {100 * full.top1():.2f}% | {' | '.join(cols)} | {total} ({cached}) |")
            sys.stdout.flush()

if __name__ == "__main__":
    main()
