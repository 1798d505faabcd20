"""The phase cycle of a multi-stage asynchronous copy pipeline (the seeds' "Z/NZ cyclicity"),
modelled explicitly, and a checker that proves a schedule safe before a pass emits it.

A K loop of `trips` iterations computes on tile k while later tiles stream into shared memory.
`stages` buffers are used in turn: tile j lands in buffer j % stages, for the (j // stages)-th
time. The two NVIDIA mechanisms track completion differently:
- cp.async (sm_80): copies are committed in groups; `cp.async.wait_group n` returns once at most
  the n most recent groups are in flight, and a barrier then makes every thread's copies
  visible (and guarantees every thread finished reading the previous tile).
- TMA (sm_90a): each buffer has a "full" mbarrier, completed once per tile that lands in it, and
  an "empty" one, completed once per release by the consumers. Waits name the phase by parity:
  the wait for the u-th use of a buffer expects parity u % 2; the producer reusing a buffer for
  its u-th use waits for the empty barrier's phase u - 1, parity (u - 1) % 2. A wrong parity
  does not fail loudly: it returns at once on the previous phase, and the kernel reads stale data.
- TMA + wgmma in one warpgroup ("tma.wgmma", sm_90a): a thread of the warpgroup issues the TMA
  copies (full barriers as above) and the warpgroup's wgmma reads the tiles *asynchronously*:
  a buffer is free again only once `wgmma.wait_group n` has retired the MMAs that read it (all
  but the n most recent groups), not when they were issued, and only once every warp did so:
  each warp's wait retires its own part of the MMAs (its 16 rows, on its SM sub-partition's
  Tensor Core), and a warp may still be about to wait on the buffer's full barrier. So a
  barrier after the wait_group precedes the refill.

- warp-specialized TMA + wgmma ("tma.wgmma.specialized"): a producer thread and the MMA warps
  run concurrently, meeting only at full and empty mbarriers. There is no single event order to
  replay: `check_agents` proves the plan over every interleaving (AgentPlan, specialized_plan).

`schedule(stages, trips, mechanism)` is the event sequence a kernel performs (prologue, steady
state, epilogue), in program order. `check(events, stages, trips, mechanism)` replays events
against the model and raises PhaseError at the first one that could read a tile before it
landed, overwrite a buffer some thread may still read, wait on the wrong phase, deadlock, or
leave a copy in flight at exit.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import TraceaError

MECHANISMS = ("cp.async", "tma", "tma.wgmma")


class PhaseError(TraceaError):
    """A pipeline schedule that is not safe; the message names the event and the hazard."""


@dataclass(frozen=True)
class Load:
    """Issue the asynchronous copy of tile `tile` into `buffer`."""
    tile: int
    buffer: int


@dataclass(frozen=True)
class Commit:
    """cp.async.commit_group: the copies issued since the last commit form a group."""


@dataclass(frozen=True)
class WaitGroups:
    """cp.async.wait_group: wait until at most `pending` committed groups are in flight."""
    pending: int


@dataclass(frozen=True)
class Barrier:
    """bar.sync across the thread block."""


@dataclass(frozen=True)
class WaitFull:
    """mbarrier try_wait.parity on the buffer's full barrier."""
    buffer: int
    parity: int


@dataclass(frozen=True)
class Release:
    """The consumers arrive on the buffer's empty barrier: done reading it."""
    buffer: int


@dataclass(frozen=True)
class WaitEmpty:
    """The producer's try_wait.parity on the buffer's empty barrier before reusing it."""
    buffer: int
    parity: int


@dataclass(frozen=True)
class Compute:
    """The MMA work of iteration `tile`, reading the tile from `buffer` (tma.wgmma: issued as one
    asynchronous wgmma group, reading until retired by WaitMma)."""
    tile: int
    buffer: int


@dataclass(frozen=True)
class WaitMma:
    """wgmma.wait_group: wait until at most `pending` wgmma groups are in flight."""
    pending: int


@dataclass(frozen=True)
class AwaitTurn:
    """Warp-specialized consumers taking turns (a named barrier per consumer group, bar.sync):
    wait until the previous group passed the turn on."""


@dataclass(frozen=True)
class PassTurn:
    """bar.arrive on the next consumer group's turn barrier: its turn may start."""


Event = (Load | Commit | WaitGroups | Barrier | WaitFull | Release | WaitEmpty | Compute | WaitMma | AwaitTurn
         | PassTurn)


def schedule(stages: int, trips: int, mechanism: str) -> list[Event]:
    """The events of a `stages`-deep pipeline over `trips` K iterations, in program order."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown copy mechanism '{mechanism}'; available: {', '.join(MECHANISMS)}")
    if stages < 1 or trips < 0:
        raise ValueError(f"a pipeline needs stages >= 1 and trips >= 0, got stages={stages}, trips={trips}")
    if mechanism == "tma":
        return _tma(stages, trips)
    return (cp_async_plan if mechanism == "cp.async" else tma_wgmma_plan)(stages).unroll(trips)


@dataclass(frozen=True)
class LoopPlan:
    """A pipeline in the form a kernel emits it: `prologue` once, `body` in a loop over
    k < trips, then `epilogue`. Prologue tiles are absolute; in the body a Load(d) is tile k + d
    (into buffer (k + d) % stages), Compute(d) reads tile k + d, and WaitFull(d) waits for tile
    k + d with the parity the kernel computes, ((k + d) // stages) % 2. Events of a tile past the
    last are not issued; a Commit still is (an empty group), so wait counts are the same in every
    trip."""
    stages: int
    prologue: tuple[Event, ...]
    body: tuple[Event, ...]
    epilogue: tuple[Event, ...] = ()
    mechanism: str = "cp.async"

    def unroll(self, trips: int) -> list[Event]:
        events = [e for e in self.prologue if not (isinstance(e, Load) and e.tile >= trips)]
        for k in range(trips):
            for e in self.body:
                if isinstance(e, (Load, Compute, WaitFull)):
                    tile = k + (e.buffer if isinstance(e, WaitFull) else e.tile)
                    if tile >= trips:
                        continue
                    e = (WaitFull(tile % self.stages, (tile // self.stages) % 2) if isinstance(e, WaitFull)
                         else type(e)(tile, tile % self.stages))
                events.append(e)
        return events + list(self.epilogue)

    def verify(self, trips: int) -> None:
        """Prove the plan safe for `trips` iterations (raises PhaseError): what a pass calls
        before emitting it."""
        check(self.unroll(trips), self.stages, trips, self.mechanism)


def cp_async_plan(stages: int) -> LoopPlan:
    if stages < 1:
        raise ValueError(f"a pipeline needs stages >= 1, got {stages}")
    if stages == 1:  # nothing to overlap: load, wait, compute, and let every thread finish reading
        return LoopPlan(1, (), (Load(0, 0), Commit(), WaitGroups(0), Barrier(), Compute(0, 0), Barrier()))
    # Prologue: tiles 0 .. stages-2, one group each. In iteration k, k + stages - 1 groups are
    # committed; at most stages - 2 in flight means groups 0..k (tile k) are done. The barrier
    # makes them visible and guarantees every thread left tile k - 1, whose buffer the load of
    # tile k + stages - 1 reuses.
    prologue = tuple(e for j in range(stages - 1) for e in (Load(j, j), Commit()))
    ahead = stages - 1
    return LoopPlan(stages, prologue, (WaitGroups(stages - 2), Barrier(), Load(ahead, ahead % stages), Commit(),
                                       Compute(0, 0)))


def tma_wgmma_plan(stages: int) -> LoopPlan:
    """One warpgroup: a thread issues the TMA copies of tile k + stages - 1 into the buffer tile
    k - 1 used, once every warp's wgmma.wait_group 1 has retired the MMAs of iteration k - 1
    (those of iteration k may still run) and a barrier told it so; every MMA is retired before
    the epilogue reuses the buffers."""
    if stages < 1:
        raise ValueError(f"a pipeline needs stages >= 1, got {stages}")
    if stages == 1:
        return LoopPlan(1, (), (Load(0, 0), WaitFull(0, 0), Compute(0, 0), WaitMma(0), Barrier()), (), "tma.wgmma")
    ahead = stages - 1
    return LoopPlan(stages, tuple(Load(j, j) for j in range(ahead)),
                    (WaitFull(0, 0), Compute(0, 0), WaitMma(1), Barrier(), Load(ahead, ahead % stages)),
                    (WaitMma(0),), "tma.wgmma")


def _tma(stages: int, trips: int) -> list[Event]:
    events: list[Event] = [Load(j, j % stages) for j in range(min(stages, trips))]
    for k in range(trips):
        b, use = k % stages, k // stages
        events += [WaitFull(b, use % 2), Compute(k, b), Release(b)]
        j = k + stages
        if j < trips:  # tile j is the buffer's next use: wait for the release just made
            events += [WaitEmpty(b, use % 2), Load(j, b)]
    return events


@dataclass
class _Buffer:
    tile: int | None = None  # the last tile loaded here
    landed: bool = False  # that tile's copy is known complete (waited for)
    visible: bool = False  # ... and visible to every thread (cp.async: a barrier after the wait)
    read: bool = False  # the tile has been computed on
    read_barrier: bool = True  # every thread finished reading it (cp.async: a barrier after the read)
    uses: int = 0  # tiles loaded here so far
    full_waited: int = -1  # TMA: the use whose full phase was waited for
    releases: int = 0  # TMA: completed empty phases
    empty_waited: int = 0  # TMA: empty phases the producer waited for


def check(events: list[Event], stages: int, trips: int, mechanism: str) -> None:
    """Replay `events`; raise PhaseError at the first unsafe one."""
    buffers = [_Buffer() for _ in range(stages)]
    reading: list[int] = []  # tma.wgmma: tiles whose MMAs were issued and not yet retired, oldest first
    groups: list[list[int]] = []  # committed groups of tiles, oldest first (cp.async)
    open_group: list[int] = []
    in_flight: set[int] = set()
    next_load = next_compute = 0

    def fail(i: int, event: Event, why: str) -> None:
        raise PhaseError(f"{mechanism} pipeline, {stages} stages, {trips} trips: event #{i} {event}: {why}")

    for i, e in enumerate(events):
        if isinstance(e, Load):
            if e.tile != next_load or e.tile >= trips:
                fail(i, e, f"loads must cover tiles 0..{trips - 1} in order; expected tile {next_load}")
            if not 0 <= e.buffer < stages or e.buffer != e.tile % stages:
                fail(i, e, f"tile {e.tile} belongs in buffer {e.tile % stages}")
            buf = buffers[e.buffer]
            if buf.tile is not None and not buf.read:
                fail(i, e, f"overwrites tile {buf.tile} before it is read")
            if mechanism == "tma.wgmma" and buf.tile in reading:
                fail(i, e, f"overwrites buffer {e.buffer} while the MMAs of tile {buf.tile} may still read it "
                           "(no wgmma.wait_group retired them)")
            if mechanism in ("cp.async", "tma.wgmma") and not buf.read_barrier:
                fail(i, e, f"overwrites buffer {e.buffer} while some threads may still read tile {buf.tile} "
                           "(no barrier since the read" + (", retired" if mechanism == "tma.wgmma" else "") + ")")
            if mechanism == "tma" and buf.uses and buf.empty_waited < buf.uses:
                fail(i, e, f"reuses buffer {e.buffer} without waiting for the release of tile {buf.tile}")
            buffers[e.buffer] = _Buffer(tile=e.tile, uses=buf.uses + 1, releases=buf.releases,
                                        empty_waited=buf.empty_waited)
            in_flight.add(e.tile)
            open_group.append(e.tile)
            next_load += 1
        elif isinstance(e, Commit):
            groups.append(open_group)
            open_group = []
        elif isinstance(e, WaitGroups):
            done = groups[:max(0, len(groups) - e.pending)]
            for group in done:
                for tile in group:
                    if tile in in_flight:
                        in_flight.discard(tile)
                        buffers[tile % stages].landed = True
        elif isinstance(e, Barrier):
            for buf in buffers:  # tma.wgmma: a thread's read ends when its wait_group retired the MMAs
                buf.visible = buf.visible or buf.landed
                buf.read_barrier = buf.read_barrier or buf.read and buf.tile not in reading
        elif isinstance(e, WaitFull):
            buf = buffers[e.buffer]
            if buf.tile is None:
                fail(i, e, "waits on a buffer no copy was issued to: it would never complete (deadlock)")
            use = buf.uses - 1
            if e.parity != use % 2:
                fail(i, e, f"expects parity {e.parity}, but tile {buf.tile} completes phase {use} "
                           f"(parity {use % 2}): the wait would return on the previous phase")
            buf.full_waited = use
            buf.landed = buf.visible = True
            in_flight.discard(buf.tile)
        elif isinstance(e, Compute):
            buf = buffers[e.buffer] if 0 <= e.buffer < stages else None
            if e.tile != next_compute or buf is None or buf.tile != e.tile:
                fail(i, e, f"iteration {next_compute} must read its own tile from buffer {next_compute % stages}")
            if not buf.visible:
                fail(i, e, f"reads tile {e.tile} before its copy is known complete and visible")
            buf.read, buf.read_barrier = True, False
            if mechanism == "tma.wgmma":
                reading.append(e.tile)
            next_compute += 1
        elif isinstance(e, WaitMma):
            del reading[:max(0, len(reading) - e.pending)]
        elif isinstance(e, Release):
            buf = buffers[e.buffer]
            if not buf.read or buf.releases >= buf.uses:
                fail(i, e, "releases a buffer whose tile was not read (or releases it twice)")
            buf.releases += 1
        elif isinstance(e, WaitEmpty):
            buf = buffers[e.buffer]
            if buf.releases <= buf.empty_waited:
                fail(i, e, "waits for a release that has not happened: the producer would deadlock")
            phase = buf.empty_waited
            if e.parity != phase % 2:
                fail(i, e, f"expects parity {e.parity}, but the release it needs completes phase {phase} "
                           f"(parity {phase % 2})")
            buf.empty_waited += 1
    if in_flight:
        raise PhaseError(f"{mechanism} pipeline, {stages} stages, {trips} trips: copies of tiles "
                         f"{sorted(in_flight)} are still in flight at the end")
    if reading:
        raise PhaseError(f"{mechanism} pipeline, {stages} stages, {trips} trips: the MMAs of tiles {reading} "
                         "may still read shared memory at the end (wgmma.wait_group 0 missing)")
    if next_compute != trips:
        raise PhaseError(f"{mechanism} pipeline, {stages} stages, {trips} trips: computed {next_compute} "
                         f"of {trips} tiles")


# -- warp-specialized pipelines: a producer and consumers running concurrently ---------------

@dataclass(frozen=True)
class AgentPlan:
    """A warp-specialized pipeline ("tma.wgmma.specialized", sm_90a): a producer thread loops
    over the K tiles issuing their TMA copies, each consumer (a warp of the MMA warpgroups)
    loops over them computing; they meet only at mbarriers. Each buffer has a "full" barrier
    (1 arrival: the producer's arrive.expect_tx, plus the copies' bytes) and an "empty" one
    (`consumers` arrivals per phase: every consumer releases the buffer once its MMAs on it are
    retired). Bodies run for k < trips with tiles relative to k: Load(d) / WaitFull(d) are tile
    k + d; WaitEmpty(d) waits before the (k + d)-th tile's load for the release of the tile
    `stages` earlier (skipped while k + d < stages); Release(d) releases the buffer of tile
    k + d (skipped while k + d < 0)."""
    stages: int
    consumers: int
    producer: tuple[Event, ...]
    consumer: tuple[Event, ...]
    consumer_epilogue: tuple[Event, ...] = ()
    turns: int = 0  # consumer groups taking turns in the body's AwaitTurn .. PassTurn (0: none)

    def unroll(self, trips: int, tile_trips: int | None = None,
               group: int = 0) -> tuple[list[Event], list[Event]]:
        """The producer's and one consumer's events, in program order, with absolute tiles.
        `tile_trips`: a persistent block's K loop length; its consumers run the epilogue after
        each output tile's last K tile, while the count (buffers, phases) runs on. With turns,
        the consumer is of group `group`: it waits for its first turn before the loop, the last
        group first passing the turn to group 0, and every other group passes its last turn on
        after the loop (so every turn barrier gets as many arrivals as waits)."""
        S = self.stages
        tile_trips = tile_trips or trips

        def events(body, k):
            for e in body:
                if isinstance(e, Load):
                    yield Load(k + e.tile, (k + e.tile) % S)
                elif isinstance(e, WaitFull):
                    yield WaitFull((k + e.buffer) % S, (k + e.buffer) // S % 2)
                elif isinstance(e, Compute):
                    yield Compute(k + e.tile, (k + e.tile) % S)
                elif isinstance(e, WaitEmpty):
                    if k + e.buffer >= S:
                        yield WaitEmpty((k + e.buffer) % S, ((k + e.buffer) // S - 1) % 2)
                elif isinstance(e, Release):
                    if k + e.buffer >= 0:
                        yield Release((k + e.buffer) % S)
                else:
                    yield e
        producer = [e for k in range(trips) for e in events(self.producer, k)]
        last = group == self.turns - 1
        consumer = [PassTurn()] * last + [AwaitTurn()] if self.turns else []
        for k in range(trips):
            consumer += events(self.consumer, k)
            if (k + 1) % tile_trips == 0 and k + 1 < trips:
                consumer += self.consumer_epilogue
        closing = [PassTurn()] if self.turns and not last else []
        return producer, consumer + closing + list(self.consumer_epilogue)

    def verify(self, trips: int, tile_trips: int | None = None, agents: int | None = None) -> None:
        """`agents`: consumers to model, default all. The consumers run one program and meet the
        producer only at barriers that join all their arrivals, so every happens-before path
        between the producer and a consumer exists for each of them alike: one stands for all,
        which keeps the proof of a long persistent loop small."""
        producer, consumer = self.unroll(trips, tile_trips)
        if self.turns:  # the groups differ (first and last turns): one consumer stands for each group
            consumers = [consumer] + [self.unroll(trips, tile_trips, g)[1] for g in range(1, self.turns)]
        else:
            consumers = [consumer] * (agents or self.consumers)
        check_agents(producer, consumers, self.stages, trips)


def specialized_plan(stages: int, consumers: int, turns: int = 0) -> AgentPlan:
    """The producer waits for a buffer's release before refilling it; a consumer releases the
    buffer of tile k - 1 once wgmma.wait_group 1 has retired that tile's MMAs (tile k's may run
    on), and retires every MMA before the epilogue. `turns` groups of consumers (the attention's
    MMA warpgroups) take turns: each passes the turn on once it issued tile k's first MMAs,
    releases tile k - 1, and waits for its next turn before issuing the rest (FlashAttention-3's
    ping-pong)."""
    if stages < 1 or consumers < 1:
        raise ValueError(f"a pipeline needs stages >= 1 and consumers >= 1, got {stages} and {consumers}")
    if turns and stages < 2:
        raise ValueError("consumers taking turns need stages >= 2: with one buffer a group releases it only "
                         "after the MMAs of its next turn, which waits for the others' turns")
    pending = 1 if stages > 1 else 0  # one buffer: its MMAs must retire before the next load
    pass_turn, await_turn = ((PassTurn(),), (AwaitTurn(),)) if turns else ((), ())
    return AgentPlan(stages, consumers, (WaitEmpty(0, 0), Load(0, 0)),
                     (WaitFull(0, 0), Compute(0, 0), *pass_turn, WaitMma(pending), Release(-pending), *await_turn),
                     (WaitMma(0),), turns)


def check_agents(producer: list[Event], consumers: list[list[Event]], stages: int, trips: int) -> None:
    """Prove a producer / consumers pipeline safe under every interleaving (raises PhaseError).

    The proof is over happens-before: program order in each agent, plus "phase u of barrier X
    completes after its arrivals" and "a wait that observes phase u runs after it completes".
    A wait on parity p observes phase u (the n-th wait of an agent on X intends its n-th phase)
    only if p == u % 2, phase u - 1 has completed before it (else it returns at once on the
    stale phase) and phase u + 1 cannot complete before it (else it would sleep through u).
    Then: arrivals for phase u come after phase u - 1 completed, every Compute runs after its
    tile landed, every Load into a buffer runs after each consumer retired the MMAs on the
    buffer's previous tile, every MMA is retired before its agent ends, and the graph has no
    cycle (a cycle is a deadlock)."""
    where = f"tma.wgmma.specialized pipeline, {stages} stages, {trips} trips"
    nodes: list[str] = []
    preds: list[list[int]] = []

    def node(name: str, *after: int) -> int:
        nodes.append(name)
        preds.append([a for a in after if a is not None])
        return len(nodes) - 1

    arrivals: dict[tuple[str, int], dict[int, list[int]]] = {}  # barrier -> agent -> its arrivals, in order
    waits: list[tuple[int, tuple[str, int], int, int]] = []  # node, barrier, phase, parity
    loads: dict[int, tuple[int, int]] = {}  # tile -> (load node, landed node)
    computes: list[tuple[dict[int, int], dict[int, int]]] = []  # per consumer: tile -> Compute, retiring WaitMma
    turn_waits: dict[int, list[tuple[int, int]]] = {}  # consumer -> its AwaitTurns (arrival, resumption)
    turn_passes: dict[int, list[int]] = {}  # consumer -> its PassTurns
    agents = [("producer", producer)] + [(f"consumer {c}", events) for c, events in enumerate(consumers)]
    for a, (agent, events) in enumerate(agents):
        previous, reading, computed, retired, seen = None, [], {}, {}, {}
        next_compute = 0
        for i, e in enumerate(events):
            me = node(f"{agent} event #{i} {e}", previous)
            previous = me
            if isinstance(e, AwaitTurn) and a:  # bar.sync: arrives, then resumes once the barrier completes
                previous = node(f"{agent} resumes after event #{i} {e}", me)
                turn_waits.setdefault(a - 1, []).append((me, previous))
            elif isinstance(e, PassTurn) and a:
                turn_passes.setdefault(a - 1, []).append(me)
            elif isinstance(e, Load):
                if a or e.tile != len(loads) or e.tile >= trips or e.buffer != e.tile % stages:
                    raise PhaseError(f"{where}: {nodes[me]}: the producer loads tiles 0..{trips - 1} in order, "
                                     "tile j into buffer j % stages")
                loads[e.tile] = (me, node(f"the copy of tile {e.tile} landed", me))
                arrivals.setdefault(("full", e.buffer), {}).setdefault(a, []).append(loads[e.tile][1])
            elif isinstance(e, Release):
                arrivals.setdefault(("empty", e.buffer), {}).setdefault(a, []).append(me)
            elif isinstance(e, (WaitFull, WaitEmpty)):
                barrier = ("full" if isinstance(e, WaitFull) else "empty", e.buffer)
                seen[barrier] = seen.get(barrier, -1) + 1
                waits.append((me, barrier, seen[barrier], e.parity))
            elif isinstance(e, Compute):
                if not a or e.tile != next_compute or e.buffer != e.tile % stages:
                    raise PhaseError(f"{where}: {nodes[me]}: consumers compute tiles 0..{trips - 1} in order, "
                                     "tile j from buffer j % stages")
                reading.append(e.tile)
                computed[e.tile] = me
                next_compute += 1
            elif isinstance(e, WaitMma):
                while len(reading) > e.pending:
                    retired[reading.pop(0)] = me
            else:
                raise PhaseError(f"{where}: {nodes[me]}: not an event of a specialized pipeline")
        if reading:
            raise PhaseError(f"{where}: {agent} ends while the MMAs of tiles {reading} may still read shared memory "
                             "(wgmma.wait_group 0 missing)")
        if a:
            if next_compute != trips:
                raise PhaseError(f"{where}: {agent} computed {next_compute} of {trips} tiles")
            computes.append((computed, retired))
    if len(loads) != trips:
        raise PhaseError(f"{where}: the producer loaded {len(loads)} of {trips} tiles")

    # Phase u of a barrier completes once each arriving agent made its u-th arrival.
    counts = {"full": 1, "empty": len(consumers)}
    complete: dict[tuple[str, int], list[int]] = {}
    for barrier, by_agent in arrivals.items():
        if len(by_agent) != counts[barrier[0]]:
            raise PhaseError(f"{where}: {barrier[0]} barrier {barrier[1]} expects {counts[barrier[0]]} arrivals per "
                             f"phase, but {len(by_agent)} agents arrive on it")
        phases = min(len(x) for x in by_agent.values())
        complete[barrier] = [node(f"{barrier[0]} barrier {barrier[1]} completes phase {u}",
                                  *(x[u] for x in by_agent.values())) for u in range(phases)]
    for w, barrier, u, _ in waits:
        if u < len(complete.get(barrier, [])):
            preds[w].append(complete[barrier][u])
    # Consumer c's turn barrier: its u-th completion joins c's u-th AwaitTurn and the u-th
    # PassTurn of the consumer before it (a named barrier counts threads: waits and arrivals
    # must pair up, and no arrival may run ahead into an earlier phase)
    turn_complete: dict[int, list[int]] = {}
    if turn_waits or turn_passes:
        n = len(consumers)
        for c in range(n):
            mine, passes = turn_waits.get(c, []), turn_passes.get((c - 1) % n, [])
            if len(mine) != len(passes):
                raise PhaseError(f"{where}: consumer {c} waits for {len(mine)} turns but consumer {(c - 1) % n} "
                                 f"passes it {len(passes)}: a turn barrier left unbalanced")
            turn_complete[c] = [node(f"consumer {c}'s turn {u} opens", arrival, passing)
                                for u, ((arrival, _), passing) in enumerate(zip(mine, passes))]
            for (_, resumption), opened in zip(mine, turn_complete[c]):
                preds[resumption].append(opened)

    ancestors = _ancestors(nodes, preds, where)

    def before(x: int, y: int) -> bool:
        return bool(ancestors[y] >> x & 1)

    for w, barrier, u, parity in waits:
        phases = complete.get(barrier, [])
        if u >= len(phases):
            raise PhaseError(f"{where}: {nodes[w]} waits for phase {u} of the {barrier[0]} barrier {barrier[1]}, "
                             "which never completes (deadlock)")
        if parity != u % 2:
            raise PhaseError(f"{where}: {nodes[w]} expects parity {parity}, but the phase it waits for is {u} "
                             f"(parity {u % 2})")
        if u and not before(phases[u - 1], w):
            raise PhaseError(f"{where}: {nodes[w]} may run before phase {u - 1} completes and return at once on it")
        if u + 1 < len(phases) and not before(w, phases[u + 1]):
            raise PhaseError(f"{where}: phase {u + 1} may complete before {nodes[w]}, which would sleep through "
                             f"phase {u}")
    for barrier, by_agent in arrivals.items():
        for x in by_agent.values():
            for u in range(1, len(x)):
                if not before(complete[barrier][u - 1], x[u]):
                    raise PhaseError(f"{where}: {nodes[x[u]]} may arrive on the {barrier[0]} barrier {barrier[1]} "
                                     f"before its phase {u - 1} completes, and count towards it")
    for c, opened in turn_complete.items():
        passes = turn_passes[(c - 1) % len(consumers)]
        for u in range(1, len(passes)):
            if not before(opened[u - 1], passes[u]):
                raise PhaseError(f"{where}: {nodes[passes[u]]} may arrive before consumer {c}'s turn {u - 1} opened, "
                                 "and count towards it")
    for c, (computed, retired) in enumerate(computes):
        for tile, (load, landed) in loads.items():
            use = computed[tile]
            if not before(landed, use):
                raise PhaseError(f"{where}: {nodes[use]} may read tile {tile} before its copy landed")
            if tile >= stages and not before(retired[tile - stages], load):
                raise PhaseError(f"{where}: {nodes[load]} may overwrite buffer {tile % stages} while consumer {c}'s "
                                 f"MMAs still read tile {tile - stages}")


def _ancestors(nodes: list[str], preds: list[list[int]], where: str) -> list[int]:
    """For each node, the bit set of the nodes that happen before it; a cycle is a deadlock."""
    succs: list[list[int]] = [[] for _ in nodes]
    missing = [len(p) for p in preds]
    for n, p in enumerate(preds):
        for q in p:
            succs[q].append(n)
    ready = [n for n, m in enumerate(missing) if not m]
    ancestors = [0] * len(nodes)
    done = 0
    while ready:
        n = ready.pop()
        done += 1
        for s in succs[n]:
            ancestors[s] |= ancestors[n] | 1 << n
            missing[s] -= 1
            if not missing[s]:
                ready.append(s)
    if done != len(nodes):
        stuck = [nodes[n] for n, m in enumerate(missing) if m][:3]
        raise PhaseError(f"{where}: deadlock: {'; '.join(stuck)} wait on each other")
    return ancestors
