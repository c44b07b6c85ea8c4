"""Two models in two processes sharing KV memory, as SwiftCache sets them up.

The worker (lender.py, started here as a child process) is lightly loaded: it keeps its KV cache
in an elastic region and offers the idle tail on a coordinator endpoint. This process is the busy
model: a transformers Llama with random weights (its config is built here; nothing is
downloaded) serving one multi-turn conversation through SwiftKVCache. Its conversation prefixes
go to the worker's lent memory first, then to host memory, then to disk, and each turn loads the
cached prefix layer by layer while the model computes the rest.

Per turn it prints the tokens found cached, where they came from (peer: the worker's memory,
host, disk), the time to first token against the same turn computed from scratch, and the
largest difference of its logits from that recompute. In the middle of the conversation the
worker gets a long request of its own: it asks its memory back, and the borrower moves its
chunks down to host and disk (or drops them) before it gives it back; later the worker is idle
again and lends once more. With --kill-lender-at the worker is killed during a turn: the chunks
in its memory are lost, and the borrower computes them again and carries on.

    python two_models.py [--turns N] [--reclaim-at K] [--kill-lender-at K] [--device cpu|cuda]

Logits are compared with a full recompute of the whole conversation in float32 with eager
attention: they agree within 1e-5 on the CPU (the prefix's K/V are the very bytes the model
computed; what differs is only how torch splits a turn's reductions), and within 2e-3 on a
GPU (its kernels' own reduction order, TF32 off).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import swiftkv
from swiftkv.integrations.transformers import SwiftKVCache, model_desc

HERE = Path(__file__).resolve().parent
CHUNK = 32
VOCAB = 512


def make_model(device: str):
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).eval().to(device)


def conversation(turns: int, device: str):
    """The whole conversation at each turn: a system prompt, then a question and an answer a
    turn (random tokens: the weights are random too)."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, VOCAB, (1, 96), generator=g)
    out = [ids]
    for _ in range(turns - 1):
        ids = torch.cat([ids, torch.randint(0, VOCAB, (1, 70), generator=g)], 1)
        out.append(ids)
    return [t.to(device) for t in out]


def device_mask(device: str) -> int:
    d = torch.device(device)
    return 0 if d.type == "cpu" else 1 << (d.index or 0)


def device_index(device: str) -> int:
    d = torch.device(device)
    return swiftkv.DEVICE_HOST if d.type == "cpu" else (d.index or 0)


class Lender:
    """The worker process: lender.py, one JSON line per command."""

    def __init__(self, endpoint: str, borrower: swiftkv.ModelDesc, device: str, env):
        fields = dict(name=borrower.name, num_layers=borrower.num_layers,
                      num_kv_heads=borrower.num_kv_heads, head_dim=borrower.head_dim,
                      block_tokens=borrower.block_tokens, chunk_tokens=borrower.chunk_tokens,
                      dtype=int(borrower.dtype))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "lender.py"), endpoint,
                                      json.dumps(fields), str(device_index(device))],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self._answer()

    def _answer(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the lender process ended")
        return json.loads(line)

    def ask(self, cmd: str):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def tiers_of(lookup, chunks: int) -> dict:
    """Where the first `chunks` chunks are: counts by tier name."""
    out = {"peer": 0, "host": 0, "disk": 0}
    names = {swiftkv.Tier.PEER: "peer", swiftkv.Tier.HOST: "host", swiftkv.Tier.DISK: "disk"}
    for t in lookup.residency[:chunks]:
        if int(t) in names:
            out[names[int(t)]] += 1
    return out


def timed(fn, device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def run(turns: int = 8, reclaim_at: int = 4, idle_at: int = 6, kill_lender_at: int = -1,
        device: str = "cpu", lend_units: int = 6, quiet: bool = False) -> list:
    """Serves the conversation; returns one dict per turn (what the table prints)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = make_model(device)
    desc = model_desc(model, "two-models-llama", chunk_tokens=CHUNK)
    work = tempfile.mkdtemp(prefix="swiftkv-two-models-")
    os.mkdir(work + "/disk")
    endpoint = f"ipc://{work}/worker-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ)
    env.setdefault("SWIFTKV_LOG", "off")
    lender = Lender(endpoint, desc, device, env)
    rows = []
    chunk_bytes = CHUNK * desc.bytes_per_token
    try:
        # Host memory for 4 chunks, the disk for the rest: a chunk the worker asks back goes down.
        with swiftkv.Context(host_budget_bytes=4 * chunk_bytes, disk_path=work + "/disk",
                             disk_budget_bytes=64 << 20, coord_heartbeat_ms=20,
                             coord_timeout_ms=2000, device_mask=device_mask(device)) as ctx:
            km = ctx.register_model(desc)
            lease = km.borrow_remote(endpoint, "worker", lend_units)
            cache = SwiftKVCache(km, max_tokens=4096)
            turns_ids = conversation(turns, device)
            with torch.no_grad():
                model(input_ids=turns_ids[0], use_cache=False)  # warm-up: not timed
            try:
                for k, ids in enumerate(turns_ids):
                    event = ""
                    if k == reclaim_at:
                        # A request of 640 tokens: 40 of the worker's 48 blocks, 4 of the 6 units
                        # it lent.
                        a = lender.ask("load 640")
                        lender.ask("settle")
                        event = f"worker busy: -{a['borrower_chunks']} chunks"
                    if k == idle_at:
                        a = lender.ask("idle")
                        try:
                            km.borrow_remote(endpoint, "worker", lend_units)
                            event = f"worker idle: lends again (+{a['borrower_chunks']} chunks)"
                        except swiftkv.Error as e:
                            event = f"worker idle, no lease: {e}"
                    found = km.lookup(ids[0].cpu())
                    usable = min(found.prefix_tokens, ids.shape[1] - 1) // CHUNK
                    where = tiers_of(found, usable)
                    kill_hook = None
                    if k == kill_lender_at:
                        # Killed while this turn runs: after its first layer, before the rest load.
                        layers = model.model.layers

                        def kill_now(*_):
                            lender.kill()
                            kill_hook.remove()

                        kill_hook = layers[1].register_forward_pre_hook(kill_now)
                        event = "worker killed during the turn"
                    with torch.no_grad():
                        out, ttft = timed(lambda: cache.prefill(model, ids), device)
                        ref, ttft_ref = timed(lambda: model(input_ids=ids, use_cache=False), device)
                    start = out.cached_tokens
                    diff = (out.logits[0, -1] - ref.logits[0, -1]).abs().max().item()
                    diff_all = (out.logits[0] - ref.logits[0, start:]).abs().max().item()
                    rows.append(dict(turn=k, tokens=ids.shape[1], cached=start, **where,
                                     ttft_ms=ttft * 1e3, recompute_ms=ttft_ref * 1e3,
                                     max_diff=max(diff, diff_all), event=event))
            finally:
                cache.close()
                stats = ctx.stats()
                coord = ctx.coord_stats()
    finally:
        lender.close()  # after the borrower let go of its leases (or failed)
        shutil.rmtree(work, ignore_errors=True)  # the endpoint's socket, the disk tier's segments
    if not quiet:
        print(f"{'turn':>4} {'tokens':>6} {'cached':>6} {'peer':>4} {'host':>4} {'disk':>4} "
              f"{'TTFT ms':>8} {'recompute ms':>12} {'max |dlogit|':>12}  event")
        for r in rows:
            print(f"{r['turn']:>4} {r['tokens']:>6} {r['cached']:>6} {r['peer']:>4} {r['host']:>4} "
                  f"{r['disk']:>4} {r['ttft_ms']:>8.2f} {r['recompute_ms']:>12.2f} "
                  f"{r['max_diff']:>12.2e}  {r['event']}")
        print(f"borrower: {coord['leases_lost']} leases lost, {stats['demotions']} chunks moved "
              f"down, {stats['evictions']} dropped, {stats['load_failures']} failed loads")
    run.stats, run.coord = stats, coord
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--reclaim-at", type=int, default=4)
    p.add_argument("--idle-at", type=int, default=6)
    p.add_argument("--kill-lender-at", type=int, default=-1)
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    rows = run(a.turns, a.reclaim_at, a.idle_at, a.kill_lender_at, a.device)
    tolerance = 1e-5 if a.device == "cpu" else 2e-3
    bad = [r["turn"] for r in rows if r["max_diff"] > tolerance]
    if bad:
        print(f"turns {bad}: logits differ from the recompute by more than {tolerance}")
        return 1
    print(f"every turn's logits agree with a full recompute within {tolerance}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
