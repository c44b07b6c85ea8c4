"""The scheduler's half of a lending vLLM engine: which units at the tail of its KV cache are lent
and when they come back, decided against vLLM's own BlockPool (vllm/v1/core/block_pool.py).

The KV cache is block-major: block b of every layer is one range of the backing memory, so the
last blocks are one contiguous tail, SwiftCache's elastic region. A unit is `unit_blocks`
consecutive blocks (a whole number of the region's granules); unit 0 is the outermost, units
are lent outermost first and come back innermost first, so what the engine keeps is always the
blocks before one boundary.

A unit's life: OWNED (vLLM's) -> FENCING (its blocks taken out of vLLM's circulation one by one:
each free one leaves the prefix cache, `evict_blocks`, and the free queue, `touch`, which gives
it a reference no request holds; one in use is taken when vLLM frees it) -> RELEASING (every
block fenced: the workers are told to give the unit's memory to the library, and it counts as
lent only once every tensor-parallel rank says it did) -> LENT -> RECLAIMING (the free blocks fell
below the low watermark: the workers are told to take the memory back, which the library does
by reclaiming it from its borrower) -> OWNED again (every rank has its memory mapped back: the
blocks are handed back with `free_blocks`). A fenced block is never in the free queue, in the
prefix cache or in a block table: vLLM cannot give it to a request.

While a reclaim is in flight and younger than the deadline, `has_pending_block_frees()` is True,
so vLLM's scheduler waits a step instead of preempting a request; past the deadline it is False
and vLLM preempts, as it would without lending. Lending moves one unit at a time; a reclaim
takes back at once as many units as bring the free blocks to the high watermark (a burst waits
for one reclaim, not for one after another), and nothing else moves until it is done. Block 0
(vLLM's null block) and the first `keep_blocks` blocks are never lent.

Not thread-safe: vLLM calls its scheduler-side connector from the scheduler's thread only.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Callable, List, Optional


class Unit(enum.Enum):
    OWNED = "owned"
    FENCING = "fencing"
    RELEASING = "releasing"
    LENT = "lent"
    RECLAIMING = "reclaiming"


@dataclasses.dataclass(frozen=True)
class LendOptions:
    """When an engine lends: in vLLM blocks, and seconds."""

    unit_blocks: int            # blocks a unit: a whole number of the region's granules
    high_free_blocks: int       # a unit is lent only if at least this many stay free after it
    low_free_blocks: int        # below this many free blocks a lent unit is taken back
    keep_blocks: int = 1        # blocks at the head never lent (block 0, vLLM's null block, is)
    reclaim_deadline_s: float = 2.0  # how long vLLM waits for a reclaim before it preempts
    # The lending region's blocks: whole units, counted from its end, which may lie past vLLM's
    # last block (then the last unit holds fewer of vLLM's blocks). None: vLLM's block count.
    capacity_blocks: Optional[int] = None

    def check(self, num_blocks: int) -> None:
        who = "SwiftKVConnector's lend options"
        if self.unit_blocks < 1:
            raise ValueError(f"{who}: unit_blocks must be >= 1, not {self.unit_blocks}")
        if not 0 <= self.low_free_blocks < self.high_free_blocks:
            raise ValueError(f"{who}: low_free_blocks ({self.low_free_blocks}) must be below "
                             f"high_free_blocks ({self.high_free_blocks}) and >= 0: lending "
                             "would start the reclaim it causes")
        if self.keep_blocks < 1:
            raise ValueError(f"{who}: keep_blocks must be >= 1 (block 0 is vLLM's null block), "
                             f"not {self.keep_blocks}")
        if not self.reclaim_deadline_s > 0:
            raise ValueError(f"{who}: reclaim_deadline_s must be > 0, not "
                             f"{self.reclaim_deadline_s}")
        capacity = num_blocks if self.capacity_blocks is None else self.capacity_blocks
        if self.capacity_blocks is not None and (
                capacity < num_blocks or capacity % self.unit_blocks or
                capacity - num_blocks >= self.unit_blocks):
            raise ValueError(f"{who}: capacity_blocks ({capacity}) must be vLLM's {num_blocks} "
                             f"blocks rounded up to whole units of {self.unit_blocks}")
        if self.keep_blocks + self.unit_blocks > capacity:
            raise ValueError(f"{who}: {num_blocks} blocks hold no unit of {self.unit_blocks} "
                             f"beside the {self.keep_blocks} kept")


@dataclasses.dataclass
class LendStats:
    """What the connector's metrics report of lending."""

    units_lent: int = 0          # units that became LENT
    units_reclaimed: int = 0     # units that came back
    reclaim_s_total: float = 0.0  # from the reclaim's start to the blocks' return
    reclaim_s_max: float = 0.0
    steps_waited: int = 0        # steps in which vLLM waited for a reclaim instead of preempting
    reclaims_late: int = 0       # reclaims past the deadline: vLLM may have preempted meanwhile
    fences_cancelled: int = 0    # units whose fencing stopped because free blocks fell
    preemptions: int = 0         # preemptions while lending (counted by the connector)
    # Each reclaim's seconds since the connector last took them (metrics.SwiftKVConnectorStats).
    reclaim_s: List[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Orders:
    """What the workers must do this step: give the units' memory to the library (release) or
    take it back (restore), by unit number."""

    release: List[int] = dataclasses.field(default_factory=list)
    restore: List[int] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.release or self.restore)


class TailLender:
    """The lending state of one engine's block pool (see the module's docstring)."""

    def __init__(self, pool, options: LendOptions, clock: Callable[[], float] = time.monotonic):
        self.pool = pool
        self.opts = options
        self.num_blocks = int(pool.num_gpu_blocks)
        options.check(self.num_blocks)
        self.capacity = self.num_blocks if options.capacity_blocks is None else \
            options.capacity_blocks
        self.num_units = (self.capacity - options.keep_blocks) // options.unit_blocks
        self.state = [Unit.OWNED] * self.num_units
        self._fenced: List[list] = [[] for _ in range(self.num_units)]  # the blocks taken
        self._since: List[float] = [0.0] * self.num_units  # when a reclaim began
        self._clock = clock
        self._waited_this_step = False
        self._restored: set = set()  # restored units waiting for those inside them
        self.stats = LendStats()

    # --- Which blocks ---------------------------------------------------------------------------

    def blocks_of(self, unit: int) -> range:
        """vLLM's block ids in a unit: unit 0 is the region's last unit_blocks blocks (fewer of
        them vLLM's when the region ends past vLLM's last block)."""
        u = self.opts.unit_blocks
        return range(self.capacity - (unit + 1) * u, min(self.capacity - unit * u,
                                                         self.num_blocks))

    def lent_blocks(self) -> int:
        """Blocks out of vLLM's hands: lent, or on their way out or back."""
        return sum(len(self._fenced[k]) for k in range(self.num_units))

    def _moving(self) -> Optional[int]:
        for k, s in enumerate(self.state):
            if s in (Unit.FENCING, Unit.RELEASING, Unit.RECLAIMING):
                return k
        return None

    def _boundary(self) -> int:
        """The number of units from the tail that are not OWNED (they always form a prefix)."""
        n = 0
        while n < self.num_units and self.state[n] is not Unit.OWNED:
            n += 1
        return n

    # --- Fencing ---------------------------------------------------------------------------------

    def _fence_free(self, unit: int) -> bool:
        """Takes the unit's free blocks out of circulation; True when every block is taken."""
        taken = {b.block_id for b in self._fenced[unit]}
        for bid in self.blocks_of(unit):
            if bid in taken:
                continue
            block = self.pool.blocks[bid]
            # Out of the prefix cache: no request can hit it (nor share a block in use and keep
            # it in use).
            self.pool.evict_blocks({bid})
            if block.ref_cnt != 0:
                continue  # in a request's block table: taken when vLLM frees it
            self.pool.touch([block])  # out of the free queue: no request can get it
            self._fenced[unit].append(block)
        return len(self._fenced[unit]) == len(self.blocks_of(unit))

    def _unfence(self, unit: int) -> None:
        """Hands a unit's taken blocks back to vLLM (its memory is mapped)."""
        blocks, self._fenced[unit] = self._fenced[unit], []
        self.pool.free_blocks(blocks)
        self.state[unit] = Unit.OWNED

    # --- The scheduler's calls -------------------------------------------------------------------

    def plan(self) -> Orders:
        """Once a step, as vLLM builds the step's connector metadata: goes on with the unit that
        is moving, or starts lending or reclaiming one; returns what the workers must do."""
        self._waited_this_step = False
        orders = Orders()
        free = self.pool.get_num_free_blocks()
        k = self._moving()
        if k is not None:
            s = self.state[k]
            if s is Unit.FENCING:
                if free < self.opts.low_free_blocks:
                    self._unfence(k)  # vLLM needs them more than a borrower
                    self.stats.fences_cancelled += 1
                elif self._fence_free(k):
                    self.state[k] = Unit.RELEASING
                    orders.release.append(k)
            return orders
        m = self._boundary()
        if free < self.opts.low_free_blocks and m > 0 and self.state[m - 1] is Unit.LENT:
            # As many units at once as bring the free blocks back to the high watermark: a
            # burst that needs many waits for one reclaim, not for one after another.
            need = max(1, -(-(self.opts.high_free_blocks - free) // self.opts.unit_blocks))
            now = self._clock()
            for k in range(m - 1, max(m - 1 - need, -1), -1):
                if self.state[k] is not Unit.LENT:
                    break
                self.state[k] = Unit.RECLAIMING
                self._since[k] = now
                orders.restore.append(k)
        elif m < self.num_units and free - self.opts.unit_blocks >= self.opts.high_free_blocks:
            self.state[m] = Unit.FENCING
            if self._fence_free(m):
                self.state[m] = Unit.RELEASING
                orders.release.append(m)
        return orders

    def after_frees(self) -> None:
        """After vLLM freed the blocks of a step's finished requests and before it schedules the
        next (update_connector_output): the fencing unit's blocks freed meanwhile are taken
        before any request can get them."""
        k = self._moving()
        if k is not None and self.state[k] is Unit.FENCING:
            self._fence_free(k)

    def workers_done(self, released: List[int], restored: List[int]) -> None:
        """Every rank gave these units' memory to the library (released) or has it mapped again
        (restored): the first become LENT, the second go back to vLLM."""
        for k in released:
            if 0 <= k < self.num_units and self.state[k] is Unit.RELEASING:
                self.state[k] = Unit.LENT
                self.stats.units_lent += 1
        # Restored units go back innermost first: the units out of vLLM's hands stay the ones
        # before a boundary (one a worker reports early waits for those inside it).
        self._restored.update(k for k in restored if 0 <= k < self.num_units and
                              self.state[k] is Unit.RECLAIMING)
        while self._restored:
            k = max(self._restored)
            if k + 1 < self.num_units and self.state[k + 1] is Unit.RECLAIMING:
                break
            self._restored.discard(k)
            took = self._clock() - self._since[k]
            self.stats.units_reclaimed += 1
            self.stats.reclaim_s_total += took
            self.stats.reclaim_s_max = max(self.stats.reclaim_s_max, took)
            if len(self.stats.reclaim_s) < 4096:
                self.stats.reclaim_s.append(took)
            if took > self.opts.reclaim_deadline_s:
                self.stats.reclaims_late += 1
            self._unfence(k)

    def has_pending_block_frees(self) -> bool:
        """Whether vLLM should wait for a reclaim rather than preempt: a reclaim is in flight and
        younger than the deadline."""
        k = self._moving()
        if k is None or self.state[k] is not Unit.RECLAIMING:
            return False
        if self._clock() - self._since[k] > self.opts.reclaim_deadline_s:
            return False  # vLLM's own preemption takes over
        if not self._waited_this_step:
            self._waited_this_step = True
            self.stats.steps_waited += 1
        return True
