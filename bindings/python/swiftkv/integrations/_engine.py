"""What the engine integrations (vLLM's connector, SGLang's storage backend) share and which needs
no engine: codec names, lenders as options give them, and the default model identity."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Optional

import swiftkv

# Files whose bytes make a model's K/V: its weights and its config (architecture, RoPE, norms).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz", ".msgpack", ".h5")
CONFIG_NAMES = ("config.json", "params.json")


def codec(name: str, who: str) -> swiftkv.Codec:
    """The codec an option names: raw, zstd, fp8, kivi-8, kivi-4 or kivi-2."""
    if name == "raw":
        return swiftkv.Codec()
    if name == "zstd":
        return swiftkv.Codec(swiftkv.CodecKind.ZSTD, zstd_level=3)
    if name == "fp8":
        return swiftkv.Codec(swiftkv.CodecKind.FP8)
    m = re.fullmatch(r"kivi-([248])", str(name))
    if m:
        return swiftkv.Codec(swiftkv.CodecKind.KIVI, bits=int(m.group(1)), group=32)
    raise ValueError(f"{who}: unknown codec {name!r} (raw, zstd, fp8, kivi-8, kivi-4, kivi-2)")


def options(extra: dict, defaults: dict, who: str, where: str) -> dict:
    """An integration's options: `extra` (what the engine's config passed in `where`) over
    `defaults`, refused with a message naming the key where one is unknown, a disk path has no
    budget or a lender is malformed."""
    unknown = sorted(set(extra) - set(defaults))
    if unknown:
        raise ValueError(f"{who}: unknown {where} keys {unknown}; known: {sorted(defaults)}")
    opts = {**defaults, **extra}
    if opts["disk_path"] is not None and int(opts["disk_budget_bytes"]) <= 0:
        raise ValueError(f"{who}: disk_path needs disk_budget_bytes > 0")
    check_lenders(opts["lenders"], who)
    return opts


def check_lenders(lenders, who: str) -> None:
    """Lenders as the options list them: [{"endpoint", "name", "units"}]."""
    if not isinstance(lenders, (list, tuple)):
        raise ValueError(f"{who}: lenders is {lenders!r}; a list of "
                         '{"endpoint": ..., "name": ..., "units": ...}')
    for i, lender in enumerate(lenders):
        if not isinstance(lender, dict) or set(lender) != {"endpoint", "name", "units"}:
            raise ValueError(f"{who}: lenders[{i}] is {lender!r}; each lender is "
                             '{"endpoint": ..., "name": ..., "units": ...}')


def borrow(model, lenders, log: logging.Logger, who: str) -> list:
    """Leases of lent memory from each lender, as the model's peer tier. A lender that cannot be
    reached now leaves the tier smaller (logged): the engine serves on from host memory and
    disk."""
    leases = []
    for lender in lenders:
        try:
            leases.append(model.borrow_remote(str(lender["endpoint"]), str(lender["name"]),
                                              int(lender["units"])))
        except swiftkv.Error as e:
            log.warning("%s: no memory borrowed from %s at %s: %s", who, lender["name"],
                        lender["endpoint"], e)
    return leases


class Borrower:
    """A model's leases of lent memory, kept up. At the start each lender is asked for its
    units (borrow). A lender that takes memory back (a reclaim) and lends again later is asked
    again: every `period_s`, while the lent memory held is below the most held so far, each
    lender in turn is asked for what is missing (one unit the first time, which tells the
    bytes of its unit; then as many as make up the difference), on a thread of its own (a
    lease's grant is a round trip to the lender; the engine's steps do not wait for it). A
    lender that refuses (nothing free) or cannot be reached is asked again after twice as long,
    up to a minute."""

    def __init__(self, ctx, model, lenders, log: logging.Logger, who: str,
                 period_s: float = 1.0):
        import threading
        self._ctx, self._model, self._lenders = ctx, model, list(lenders)
        self._log, self._who, self._period = log, who, period_s
        self.leases = borrow(model, self._lenders, log, who)
        self.peak = self.held()
        self.borrowed_again = 0  # leases granted after the start
        self._stop = threading.Event()
        self._thread = None
        if self._lenders:
            self._thread = threading.Thread(target=self._run, name="swiftkv-borrow",
                                            daemon=True)
            self._thread.start()

    def held(self) -> int:
        """Bytes of lent memory the model's context holds now."""
        return int(self._ctx.stats()["capacity_bytes"][0])

    def _run(self) -> None:
        import time
        wait = {i: 0.0 for i in range(len(self._lenders))}   # seconds between asks
        next_ask = {i: 0.0 for i in range(len(self._lenders))}
        unit_bytes = {}  # a lender's unit, learned from a grant of one
        while not self._stop.wait(self._period):
            try:
                held = self.held()
                self.peak = max(self.peak, held)
                for i, lender in enumerate(self._lenders):
                    if held >= self.peak or self._stop.is_set():
                        break
                    now = time.monotonic()
                    if now < next_ask[i]:
                        continue
                    units = 1 if i not in unit_bytes else \
                        max(1, -(-(self.peak - held) // unit_bytes[i]))
                    try:
                        self.leases.append(self._model.borrow_remote(
                            str(lender["endpoint"]), str(lender["name"]), units))
                        self.borrowed_again += 1
                        wait[i] = 0.0
                    except swiftkv.Error:
                        wait[i] = min(60.0, max(self._period, 2 * wait[i]))
                        next_ask[i] = now + wait[i]
                    after = self.held()
                    if units == 1 and after > held:
                        unit_bytes[i] = after - held
                    held = after
            except swiftkv.Error:
                return  # the context is closing

    def close(self) -> None:
        """Stops asking; returns once the thread makes no call into the context."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def set_codecs(model, host: str, disk: str, accept_lossy: bool, who: str) -> None:
    """The model's codecs in host memory and on disk, as the options name them."""
    h, d = codec(host, who), codec(disk, who)
    if h != swiftkv.Codec() or d != swiftkv.Codec() or accept_lossy:
        model.set_compression(accept_lossy=bool(accept_lossy), host=h, disk=d)


def model_dir(model: str, revision: Optional[str] = None,
              download_dir: Optional[str] = None) -> Optional[str]:
    """Where a model's weights are on this machine: its path, or its Hugging Face snapshot in
    the local cache (an engine downloads it before it makes its KV cache); None when neither is
    found."""
    if os.path.exists(str(model)):
        return str(model)
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(repo_id=str(model), revision=revision, cache_dir=download_dir,
                                 local_files_only=True)
    except Exception:  # not a hub id, or not in the cache, or no huggingface_hub
        return None


def weights_identity(model: str, root: Optional[str], parts: list, log: logging.Logger,
                     who: str, *, dummy: bool = False) -> str:
    """The default model identity: a digest of what makes an engine's K/V besides its geometry
    (which the library keys itself): the weight and config files under `root` (their names,
    sizes and modification times; configs hashed whole) and `parts`, what else the engine says
    changes them (revision, load format, quantization, overrides). New weights at the same path
    change it, so chunks of the old weights are never served. With `dummy` weights (made from
    the config alone) only the config is hashed. A model whose files are not found here
    (root None) is named by `parts` alone, and that is logged: new weights under its name would
    not be seen."""
    parts = list(parts)
    if root is None:
        log.warning("%s: the files of %s are not found on this machine: chunks are keyed by its "
                    "name, and new weights under it would not be told apart; set "
                    "model_identity", who, model)
    else:
        if os.path.isfile(root):
            found = [(os.path.basename(root), root)]
        else:
            found = []
            for d, _, names in os.walk(root):
                for n in names:
                    if n in CONFIG_NAMES or (not dummy and n.endswith(WEIGHT_SUFFIXES)):
                        found.append((os.path.relpath(os.path.join(d, n), root),
                                      os.path.join(d, n)))
        for rel, path in sorted(found):
            st = os.stat(path)
            if rel in CONFIG_NAMES or dummy:
                with open(path, "rb") as f:  # small: hashed whole
                    parts.append(f"{rel}:{hashlib.sha256(f.read()).hexdigest()}")
            else:
                parts.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
    return "weights-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
