"""The pipeline phase model (tracea/targets/nvvm/phase_cycle.py): every schedule it emits passes its
checker, for every depth and trip count, and the checker rejects the classic pipelining bugs."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracea.targets.nvvm.phase_cycle import (AgentPlan, AwaitTurn, Barrier, Commit, Compute, Load, LoopPlan, PassTurn, PhaseError, Release,
                                             WaitEmpty, WaitFull, WaitGroups, WaitMma, check, check_agents, schedule,
                                             specialized_plan, tma_wgmma_plan)


@settings(max_examples=300)
@given(stages=st.integers(1, 8), trips=st.integers(0, 40),
       mechanism=st.sampled_from(["cp.async", "tma", "tma.wgmma"]))
def test_every_emitted_schedule_is_safe(stages, trips, mechanism):
    check(schedule(stages, trips, mechanism), stages, trips, mechanism)


@pytest.mark.parametrize("mechanism", ["cp.async", "tma", "tma.wgmma"])
@pytest.mark.parametrize("trips", [0, 1, 2, 3])
def test_fewer_trips_than_stages(mechanism, trips):
    events = schedule(4, trips, mechanism)
    check(events, 4, trips, mechanism)
    assert [e.tile for e in events if isinstance(e, Compute)] == list(range(trips))


def test_tma_parities_alternate_per_buffer():
    waits = [e for e in schedule(3, 9, "tma") if isinstance(e, WaitFull)]
    assert [(w.buffer, w.parity) for w in waits] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1),
                                                     (0, 0), (1, 0), (2, 0)]


def _replace(events, old, new, nth=0):
    """`events` with the nth event equal to `old` replaced by `new` (None: dropped)."""
    out, seen = [], 0
    for e in events:
        if e == old:
            if seen == nth:
                seen += 1
                if new is not None:
                    out.append(new)
                continue
            seen += 1
        out.append(e)
    return out


def test_cp_async_waiting_for_one_group_too_few_reads_a_tile_in_flight():
    events = [WaitGroups(3) if e == WaitGroups(2) else e for e in schedule(4, 6, "cp.async")]
    with pytest.raises(PhaseError, match="reads tile 0 before its copy is known complete"):
        check(events, 4, 6, "cp.async")


def test_cp_async_without_the_barrier_overwrites_a_tile_being_read():
    events = _replace(schedule(3, 6, "cp.async"), Barrier(), None, nth=1)
    with pytest.raises(PhaseError, match="while some threads may still read tile 0"):
        check(events, 3, 6, "cp.async")


def test_cp_async_skipping_empty_commits_breaks_short_loops():
    """Committing only when a tile was loaded shifts the group count when trips < stages - 1:
    the steady state's wait_group(stages - 2) then lets the last tile be read in flight."""
    stages, trips = 4, 2
    events = [e for e in schedule(stages, trips, "cp.async")]
    prologue_end = events.index(WaitGroups(stages - 2))
    trimmed = [e for e in events[:prologue_end] if not isinstance(e, Commit)]
    trimmed = [x for e in trimmed for x in (e, Commit())]  # one commit per actual load
    with pytest.raises(PhaseError, match="before its copy is known complete"):
        check(trimmed + events[prologue_end:], stages, trips, "cp.async")


def test_tma_wrong_parity_would_return_on_the_previous_phase():
    events = _replace(schedule(2, 5, "tma"), WaitFull(0, 1), WaitFull(0, 0))
    with pytest.raises(PhaseError, match="expects parity 0, but tile 2 completes phase 1"):
        check(events, 2, 5, "tma")


def test_tma_reuse_without_waiting_for_the_release():
    events = _replace(schedule(2, 5, "tma"), WaitEmpty(0, 0), None)
    with pytest.raises(PhaseError, match="reuses buffer 0 without waiting for the release of tile 0"):
        check(events, 2, 5, "tma")


def test_tma_empty_wait_with_the_wrong_parity():
    events = _replace(schedule(2, 7, "tma"), WaitEmpty(0, 1), WaitEmpty(0, 0))
    with pytest.raises(PhaseError, match="expects parity 0, but the release it needs completes phase 1"):
        check(events, 2, 7, "tma")


def test_tma_waiting_before_the_release_deadlocks():
    events = schedule(2, 4, "tma")
    first_release = events.index(Release(0))
    events = events[:first_release] + events[first_release + 1:]
    events.insert(events.index(WaitEmpty(0, 0)) + 1, Release(0))
    with pytest.raises(PhaseError, match="producer would deadlock"):
        check(events, 2, 4, "tma")


def test_loads_past_the_loop_and_copies_left_in_flight_are_reported():
    events = schedule(3, 4, "cp.async") + [Load(4, 1), Commit()]
    with pytest.raises(PhaseError, match="loads must cover tiles 0..3"):
        check(events, 3, 4, "cp.async")
    with pytest.raises(PhaseError, match=r"copies of tiles \[0\] are still in flight"):
        check([Load(0, 0), Commit()], 2, 1, "cp.async")
    with pytest.raises(PhaseError, match="computed 0 of 1 tiles"):
        check([Load(0, 0), Commit(), WaitGroups(0)], 2, 1, "cp.async")


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown copy mechanism 'tmaa'"):
        schedule(2, 2, "tmaa")
    with pytest.raises(ValueError, match="stages >= 1"):
        schedule(0, 2, "tma")


def test_tma_wgmma_plan_waits_with_the_parity_of_each_use():
    plan = tma_wgmma_plan(3)
    waits = [e for e in plan.unroll(7) if isinstance(e, WaitFull)]
    assert [(w.buffer, w.parity) for w in waits] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0)]
    assert plan.unroll(7)[-1] == WaitMma(0)


def _with_body(plan: LoopPlan, body, epilogue=None) -> LoopPlan:
    return LoopPlan(plan.stages, plan.prologue, tuple(body), plan.epilogue if epilogue is None else epilogue,
                    plan.mechanism)


def test_tma_wgmma_reusing_a_buffer_its_mmas_may_still_read():
    plan = tma_wgmma_plan(3)
    # waiting for 2 groups in flight leaves iteration k - 1's MMAs running while its buffer refills
    lax = _with_body(plan, (WaitFull(0, 0), Compute(0, 0), WaitMma(2), Load(2, 2)))
    with pytest.raises(PhaseError, match="while the MMAs of tile 0 may still read it"):
        lax.verify(6)
    # loading before the wait
    early = _with_body(plan, (WaitFull(0, 0), Compute(0, 0), Load(2, 2), WaitMma(1)))
    with pytest.raises(PhaseError, match="while the MMAs of tile 0 may still read it"):
        early.verify(6)


def test_tma_wgmma_refill_waits_for_every_warp_to_retire_the_mmas():
    """A warp's wait_group retires only its own part of the MMAs, and a slower warp may not yet
    have waited on the buffer's full barrier: the copying thread refills after a barrier that
    follows the wait_group."""
    plan = tma_wgmma_plan(3)
    assert plan.body[2:4] == (WaitMma(1), Barrier())
    for body in [(WaitFull(0, 0), Compute(0, 0), WaitMma(1), Load(2, 2)),
                 (WaitFull(0, 0), Compute(0, 0), Barrier(), WaitMma(1), Load(2, 2))]:  # before the retire
        with pytest.raises(PhaseError, match=r"while some threads may still read tile 0 \(no barrier since the "
                                             r"read, retired\)"):
            _with_body(plan, body).verify(6)
    with pytest.raises(PhaseError, match="no barrier since the read, retired"):
        _with_body(tma_wgmma_plan(1), tma_wgmma_plan(1).body[:-1]).verify(3)


def test_tma_wgmma_without_the_final_wait_races_the_epilogue():
    with pytest.raises(PhaseError, match=r"MMAs of tiles \[4\] may still read shared memory at the end"):
        _with_body(tma_wgmma_plan(2), tma_wgmma_plan(2).body, epilogue=()).verify(5)


def test_tma_wgmma_parity_formula_must_match_the_phases():
    events = tma_wgmma_plan(2).unroll(5)
    wrong = [WaitFull(e.buffer, 1 - e.parity) if isinstance(e, WaitFull) and e.buffer == 1 else e for e in events]
    with pytest.raises(PhaseError, match="expects parity 1, but tile 1 completes phase 0"):
        check(wrong, 2, 5, "tma.wgmma")


# -- warp-specialized: a producer and consumers, proved over every interleaving ----------------

@settings(max_examples=200)
@given(stages=st.integers(1, 8), trips=st.integers(0, 40), consumers=st.integers(1, 12))
def test_every_specialized_plan_is_safe(stages, trips, consumers):
    specialized_plan(stages, consumers).verify(trips)


def test_specialized_plan_parities():
    producer, consumer = specialized_plan(3, 2).unroll(8)
    assert [(e.buffer, e.parity) for e in producer if isinstance(e, WaitEmpty)] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]  # before tiles 3..7: the release of tile j - 3
    assert [(e.buffer, e.parity) for e in consumer if isinstance(e, WaitFull)] == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 0), (1, 0)]
    assert [e.buffer for e in consumer if isinstance(e, Release)] == [0, 1, 2, 0, 1, 2, 0]  # tiles 0..6
    assert consumer[-1] == WaitMma(0)


def _agents(plan: AgentPlan, producer=None, consumer=None, epilogue=None) -> AgentPlan:
    return AgentPlan(plan.stages, plan.consumers, plan.producer if producer is None else tuple(producer),
                     plan.consumer if consumer is None else tuple(consumer),
                     plan.consumer_epilogue if epilogue is None else tuple(epilogue))


def test_specialized_release_before_the_mmas_retire():
    plan = specialized_plan(3, 2)
    early = _agents(plan, consumer=(WaitFull(0, 0), Compute(0, 0), WaitMma(1), Release(0)))
    with pytest.raises(PhaseError, match="Load.tile=3, buffer=0. may overwrite buffer 0 while consumer 0's MMAs "
                                         "still read tile 0"):
        early.verify(9)


def test_specialized_producer_that_does_not_wait_for_the_release():
    # its load of tile j + stages may complete the full barrier's next phase before a consumer waited
    # for this one: the consumer would sleep through it
    with pytest.raises(PhaseError, match="which would sleep through phase 0"):
        _agents(specialized_plan(3, 2), producer=(Load(0, 0),)).verify(9)


def test_specialized_wrong_parities():
    plan = specialized_plan(2, 2)
    producer, consumer = plan.unroll(6)
    flipped = [WaitEmpty(e.buffer, 1 - e.parity) if isinstance(e, WaitEmpty) else e for e in producer]
    with pytest.raises(PhaseError, match=r"WaitEmpty\(buffer=0, parity=1\) expects parity 1, but the phase it waits "
                                         r"for is 0"):
        check_agents(flipped, [consumer] * 2, 2, 6)
    flipped = [WaitFull(e.buffer, 1 - e.parity) if isinstance(e, WaitFull) else e for e in consumer]
    with pytest.raises(PhaseError, match="expects parity 1, but the phase it waits for is 0"):
        check_agents(producer, [consumer, flipped], 2, 6)


def test_specialized_missing_releases_and_waits():
    plan = specialized_plan(2, 2)
    producer, consumer = plan.unroll(6)
    silent = [e for e in consumer if not isinstance(e, Release)]
    with pytest.raises(PhaseError, match="empty barrier 0 expects 2 arrivals per phase, but 1 agents arrive"):
        check_agents(producer, [consumer, silent], 2, 6)
    with pytest.raises(PhaseError, match="waits for phase 0 of the empty barrier 0, which never completes"):
        check_agents(producer, [silent, silent], 2, 6)
    with pytest.raises(PhaseError, match=r"MMAs of tiles \[5\] may still read shared memory"):
        check_agents(producer, [consumer[:-1]] * 2, 2, 6)


def test_specialized_deadlock_is_a_cycle():
    # the producer waits for a release that follows a tile it has not loaded yet
    plan = specialized_plan(2, 1)
    producer, consumer = plan.unroll(4)
    assert producer[:3] == [Load(0, 0), Load(1, 1), WaitEmpty(0, 0)]
    late = [producer[0], producer[2], producer[1]] + producer[3:]  # waits for tile 0's release before loading tile 1
    with pytest.raises(PhaseError, match="deadlock: .* wait on each other"):
        check_agents(late, [consumer], 2, 4)


# -- consumer groups taking turns (the attention's ping-pong) ---------------------------------

@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("groups", [2, 3, 4])
def test_consumer_groups_taking_turns_are_proved(stages, groups):
    plan = specialized_plan(stages, 4 * groups, groups)
    for trips in range(8):
        plan.verify(trips, trips)
    first, last = plan.unroll(3, group=0)[1], plan.unroll(3, group=groups - 1)[1]
    assert first[0] == AwaitTurn() and first[-2:] == [PassTurn(), WaitMma(0)]  # closes its last turn
    assert last[:2] == [PassTurn(), AwaitTurn()] and last[-1] == WaitMma(0)  # opens the first round


def test_a_turn_that_waits_before_releasing_the_last_buffer_deadlocks():
    """Group 0's turn waits for tile k + 1, whose load waits for group 1's release of tile k - 1,
    which group 1 makes only in its next turn, after group 0's: a cycle."""
    good = specialized_plan(2, 8, 2)
    late = AgentPlan(2, 8, good.producer, (WaitFull(0, 0), Compute(0, 0), PassTurn(), AwaitTurn(), WaitMma(1),
                                           Release(-1)), good.consumer_epilogue, turns=2)
    late.verify(2, 2)  # two tiles fit the two buffers
    with pytest.raises(PhaseError, match="deadlock"):
        late.verify(3, 3)


def test_unbalanced_turns_are_refused():
    good = specialized_plan(2, 8, 2)
    no_pass = AgentPlan(2, 8, good.producer, (WaitFull(0, 0), Compute(0, 0), WaitMma(1), Release(-1), AwaitTurn()),
                        good.consumer_epilogue, turns=2)
    with pytest.raises(PhaseError, match="turn barrier left unbalanced"):
        no_pass.verify(3, 3)
    with pytest.raises(PhaseError, match="not an event of a specialized pipeline"):
        AgentPlan(2, 8, (PassTurn(),) + good.producer, good.consumer, good.consumer_epilogue, turns=2).verify(3, 3)
