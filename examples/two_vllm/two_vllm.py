"""SwiftCache's setup in the engine people run: two vLLM engines in two processes on one host
(engine.py each; vLLM's CPU build here, a small Llama with random weights). Engine A lends the
idle tail of its KV cache (the connector's lend option block); engine B borrows it (lenders:
[A]) and serves multi-turn conversations, their prefixes kept in A's memory first, then in host
memory and on disk. Then A gets a burst and takes its memory back, and, idle again, lends again.

    python two_vllm.py [--turns N] [--conversations N] [--a-blocks N] [--workdir DIR]

Prints, per phase and turn, B's tokens found cached in each tier before the turn (peer: A's
memory) and A's blocks lent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK, CHUNK = 32, 64
PEER, HOST, DISK = 0, 1, 2


class Engine:
    def __init__(self, name, model_dir, extra, **engine):
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "engine.py"), model_dir, json.dumps(extra),
             json.dumps(engine)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1",
                 "VLLM_CPU_OMP_THREADS_BIND": "nobind"})
        self.ask()  # ready

    def ask(self, **cmd):
        if cmd:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"engine {self.name} ended (exit {self.proc.wait()})")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.ask(op="quit")
            except (BrokenPipeError, RuntimeError):
                pass
            self.proc.wait(timeout=60)


def write_model(d: str, seed: int = 5) -> None:
    """A 4-layer Llama (hidden 256, 2 KV heads of 64, bfloat16) with random weights."""
    import torch
    from safetensors.torch import save_file
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 64, "num_hidden_layers": 4, "vocab_size": 1000,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    g = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (1000, 256), "lm_head.weight": (1000, 256),
              "model.norm.weight": (256,)}
    for i in range(4):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (256, 256),
                       p + "self_attn.k_proj.weight": (128, 256),
                       p + "self_attn.v_proj.weight": (128, 256),
                       p + "self_attn.o_proj.weight": (256, 256),
                       p + "mlp.gate_proj.weight": (512, 256), p + "mlp.up_proj.weight": (512, 256),
                       p + "mlp.down_proj.weight": (256, 512), p + "input_layernorm.weight": (256,),
                       p + "post_attention_layernorm.weight": (256,)})
    save_file({k: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.05)
               .to(torch.bfloat16) for k, s in shapes.items()},
              os.path.join(d, "model.safetensors"))


def prompt(seed, n):
    return [(seed * 131 + 7 * i) % 997 + 1 for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=3, help="B's turns before and after A's burst")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--a-blocks", type=int, default=512, help="A's KV cache, in 32-token blocks")
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="two-vllm-")
    model = os.path.join(work, "model")
    os.makedirs(model, exist_ok=True)
    os.makedirs(os.path.join(work, "disk"), exist_ok=True)
    write_model(model)
    endpoint = f"ipc://{work}/a.sock"
    borrower = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 64, "dtype": "bfloat16",
                "chunk_tokens": CHUNK}
    print(f"engine A (lends): {a.a_blocks} blocks of {BLOCK} tokens, offered on {endpoint}",
          flush=True)
    eng_a = Engine("A", model, {"host_budget_bytes": 8 << 20, "chunk_tokens": CHUNK,
                                "lend": {"endpoint": endpoint, "name": "A",
                                         "borrower": borrower}}, blocks=a.a_blocks)
    eng_b = None
    try:
        small = [prompt(s, 200) for s in range(2)]
        for _ in range(3):  # A serves a little, and lends as it steps
            eng_a.ask(op="gen", prompts=small, max_tokens=24)
        s = eng_a.ask(op="state")
        print(f"A idle: layout {s['layout']}, {s['lent_blocks']} of {a.a_blocks} blocks lent "
              f"({len(s['lent'])} units of {s['unit_blocks']})", flush=True)
        eng_b = Engine("B", model, {"host_budget_bytes": 4 << 20, "chunk_tokens": CHUNK,
                                    "disk_path": os.path.join(work, "disk"),
                                    "disk_budget_bytes": 64 << 20,
                                    "lenders": [{"endpoint": endpoint, "name": "A",
                                                 "units": 48}]}, blocks=1024)
        convs = [prompt(100 + c, 400) for c in range(a.conversations)]
        print(f"{'phase':<12}{'turn':>5}{'tokens':>8}{'cached':>8}{'peer':>6}{'host':>6}"
              f"{'disk':>6}{'B s':>7}{'A lent blocks':>15}", flush=True)

        def turn(phase, t):
            tiers = [eng_b.ask(op="tiers", prompt=c)["tiers"] for c in convs]
            per = [sum(row.count(k) for row in tiers) * CHUNK for k in (PEER, HOST, DISK)]
            out = eng_b.ask(op="gen", prompts=convs, max_tokens=16)
            eng_b.ask(op="forget")  # vLLM's own cache emptied: the next turn loads from ours
            for i, c in enumerate(convs):
                c.extend(out["tokens"][i] + prompt(300 + 10 * t + i, 48))
            lent = eng_a.ask(op="state")["lent_blocks"]
            print(f"{phase:<12}{t:>5}{sum(len(c) for c in convs):>8}{sum(per):>8}{per[0]:>6}"
                  f"{per[1]:>6}{per[2]:>6}{out['seconds']:>7.2f}{lent:>15}", flush=True)

        for t in range(a.turns):
            turn("A idle", t)
        burst = [prompt(50 + s, 1600) for s in range(8)]
        t0 = time.monotonic()
        eng_a.ask(op="gen", prompts=burst, max_tokens=4)
        s = eng_a.ask(op="state")
        st = s["stats"]
        print(f"A's burst: {len(burst)} prompts of 1600 tokens in {time.monotonic() - t0:.1f} s; "
              f"{st['units_reclaimed']} units taken back (longest {st['reclaim_s_max']:.3f} s), "
              f"{st['steps_waited']} steps waited, {s['lent_blocks']} blocks still lent",
              flush=True)
        for t in range(a.turns, 2 * a.turns):
            turn("after burst", t)
        for _ in range(3):
            eng_a.ask(op="gen", prompts=small, max_tokens=24)
        s = eng_a.ask(op="state")
        print(f"A idle again: {s['lent_blocks']} blocks lent ({s['stats']['units_lent']} units "
              "lent in all)", flush=True)
        for _ in range(12):  # B asks again each second for what it lost
            held = eng_b.ask(op="state")["peer_bytes"]
            if held >= 4 << 20:
                break
            time.sleep(0.5)
        print(f"B borrows again: {held >> 10} KiB of A's memory", flush=True)
        for t in range(2 * a.turns, 2 * a.turns + 2):
            turn("A idle again", t)
    finally:
        eng_a.close()
        if eng_b is not None:
            eng_b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
