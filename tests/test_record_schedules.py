"""Pipeline schedules and the rank layout of `vtrain record` (pure functions, no processes)."""

from __future__ import annotations

import pytest

from vtrain.record.parallel import ACTIVATION, GRADIENT, Layout
from vtrain.record.schedules import BACKWARD, FORWARD, Action, build_schedule, gpipe, interleaved, one_f_one_b


def run_to_completion(name: str, stages: int, chunks: int, micro_batches: int) -> bool:
    """Play every stage's schedule with asynchronous sends and blocking receives, as the executor does;
    True when every stage finishes (no stage waits forever for a message)."""
    schedules = [build_schedule(name, s, stages, chunks, micro_batches) for s in range(stages)]
    position = [0] * stages
    done: set[tuple[str, int, int]] = set()
    last_virtual = stages * chunks - 1
    progress = True
    while progress:
        progress = False
        for stage, schedule in enumerate(schedules):
            while position[stage] < len(schedule):
                action = schedule[position[stage]]
                virtual = action.chunk * stages + stage
                if action.kind == FORWARD:
                    needs = [] if virtual == 0 else [(FORWARD, virtual - 1, action.mb)]
                else:
                    needs = [(FORWARD, virtual, action.mb)]
                    if virtual != last_virtual:
                        needs.append((BACKWARD, virtual + 1, action.mb))
                if not all(need in done for need in needs):
                    break
                done.add((action.kind, virtual, action.mb))
                position[stage] += 1
                progress = True
    return all(position[s] == len(schedules[s]) for s in range(stages))


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    assert gpipe(3) == [Action(FORWARD, 0, 0), Action(FORWARD, 0, 1), Action(FORWARD, 0, 2),
                        Action(BACKWARD, 0, 0), Action(BACKWARD, 0, 1), Action(BACKWARD, 0, 2)]


def test_1f1b_warms_up_with_stages_minus_stage_minus_one_forwards() -> None:
    kinds = ["F" if a.kind == FORWARD else "B" for a in one_f_one_b(stage=0, stages=4, micro_batches=6)]
    assert "".join(kinds) == "FFF" + "FB" * 3 + "BBB"
    last = one_f_one_b(stage=3, stages=4, micro_batches=6)
    assert "".join("F" if a.kind == FORWARD else "B" for a in last) == "FB" * 6
    assert [a.mb for a in last if a.kind == BACKWARD] == list(range(6))


def test_1f1b_with_fewer_micro_batches_than_stages() -> None:
    assert one_f_one_b(stage=0, stages=4, micro_batches=2) == [
        Action(FORWARD, 0, 0), Action(FORWARD, 0, 1), Action(BACKWARD, 0, 0), Action(BACKWARD, 0, 1)]


def test_interleaved_matches_megatron_order() -> None:
    # Megatron-LM, pp=2, 2 chunks, 4 micro-batches, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards.
    schedule = interleaved(stage=0, stages=2, chunks=2, micro_batches=4)
    forwards = [(a.chunk, a.mb) for a in schedule if a.kind == FORWARD]
    backwards = [(a.chunk, a.mb) for a in schedule if a.kind == BACKWARD]
    assert forwards == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert backwards == [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]
    assert [a.kind for a in schedule[:5]] == [FORWARD] * 5 and schedule[5].kind == BACKWARD


CASES = [(name, stages, micro_batches)
         for name in ("gpipe", "1f1b", "interleaved") for stages in (1, 2, 3, 4) for micro_batches in (1, 2, 4, 6, 8)
         if name != "interleaved" or (stages > 1 and micro_batches % stages == 0)]


@pytest.mark.parametrize(("name", "stages", "micro_batches"), CASES)
def test_every_schedule_covers_each_micro_batch_once_and_cannot_deadlock(name: str, stages: int,
                                                                         micro_batches: int) -> None:
    for chunks in ([2, 3] if name == "interleaved" else [1]):
        for stage in range(stages):
            schedule = build_schedule(name, stage, stages, chunks, micro_batches)
            expected = {(c, mb) for c in range(chunks) for mb in range(micro_batches)}
            for kind in (FORWARD, BACKWARD):
                seen = [(a.chunk, a.mb) for a in schedule if a.kind == kind]
                assert sorted(seen) == sorted(expected)
            first_forward = {(a.chunk, a.mb): i for i, a in enumerate(schedule) if a.kind == FORWARD}
            assert all(first_forward[(a.chunk, a.mb)] < i for i, a in enumerate(schedule) if a.kind == BACKWARD)
        assert run_to_completion(name, stages, chunks, micro_batches)


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        build_schedule("zero-bubble", 0, 2, 1, 4)


def test_layout_is_megatron_order_tp_then_dp_then_pp() -> None:
    layout = Layout(tp=2, pp=2, dp=2)
    assert [layout.coords(r) for r in range(8)] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert all(layout.rank(*layout.coords(r)) == r for r in range(layout.world_size))


def test_pipeline_channels_per_direction_and_wrap_around() -> None:
    assert Layout(tp=1, pp=3, dp=1).channels(wrap_around=False) == [
        (0, 1, ACTIVATION), (1, 2, ACTIVATION), (1, 0, GRADIENT), (2, 1, GRADIENT)]
    assert Layout(tp=1, pp=2, dp=1).channels(wrap_around=True) == [
        (0, 1, ACTIVATION), (1, 0, ACTIVATION), (1, 0, GRADIENT), (0, 1, GRADIENT)]
    assert Layout(tp=4, pp=1, dp=2).channels(wrap_around=True) == []
