"""The one home of the rank layout and the pipeline schedules (vtrain/parallel.py): orders, deadlock freedom,
the layout, and the memory model's micro-batches in flight read off the order."""

from __future__ import annotations

import pytest

from vtrain.parallel import (
    ACTIVATION,
    BACKWARD,
    FORWARD,
    GRADIENT,
    Layout,
    Pass,
    gpipe,
    interleaved,
    one_f_one_b,
    peak_in_flight,
    stage_order,
)


def run_to_completion(name: str, stages: int, chunks: int, micro_batches: int) -> bool:
    """Play every stage's schedule with asynchronous sends and blocking receives, as the executor does;
    True when every stage finishes (no stage waits forever for a message)."""
    schedules = [stage_order(name, stages, micro_batches, s, chunks) for s in range(stages)]
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
                if action.phase == FORWARD:
                    needs = [] if virtual == 0 else [(FORWARD, virtual - 1, action.micro_batch)]
                else:
                    needs = [(FORWARD, virtual, action.micro_batch)]
                    if virtual != last_virtual:
                        needs.append((BACKWARD, virtual + 1, action.micro_batch))
                if not all(need in done for need in needs):
                    break
                done.add((action.phase, virtual, action.micro_batch))
                position[stage] += 1
                progress = True
    return all(position[s] == len(schedules[s]) for s in range(stages))


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    assert gpipe(1, 3, 0) == [Pass(FORWARD, 0, 0), Pass(FORWARD, 0, 1), Pass(FORWARD, 0, 2),
                        Pass(BACKWARD, 0, 0), Pass(BACKWARD, 0, 1), Pass(BACKWARD, 0, 2)]


def test_1f1b_warms_up_with_stages_minus_stage_minus_one_forwards() -> None:
    kinds = ["F" if a.phase == FORWARD else "B" for a in one_f_one_b(4, 6, 0)]
    assert "".join(kinds) == "FFF" + "FB" * 3 + "BBB"
    last = one_f_one_b(4, 6, 3)
    assert "".join("F" if a.phase == FORWARD else "B" for a in last) == "FB" * 6
    assert [a.micro_batch for a in last if a.phase == BACKWARD] == list(range(6))


def test_1f1b_with_fewer_micro_batches_than_stages() -> None:
    assert one_f_one_b(4, 2, 0) == [
        Pass(FORWARD, 0, 0), Pass(FORWARD, 0, 1), Pass(BACKWARD, 0, 0), Pass(BACKWARD, 0, 1)]


def test_interleaved_matches_megatron_order() -> None:
    # Megatron-LM, pp=2, 2 chunks, 4 micro-batches, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards.
    schedule = interleaved(2, 4, 0, 2)
    forwards = [(a.chunk, a.micro_batch) for a in schedule if a.phase == FORWARD]
    backwards = [(a.chunk, a.micro_batch) for a in schedule if a.phase == BACKWARD]
    assert forwards == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert backwards == [(1, 0), (1, 1), (0, 0), (0, 1), (1, 2), (1, 3), (0, 2), (0, 3)]
    assert [a.phase for a in schedule[:5]] == [FORWARD] * 5 and schedule[5].phase == BACKWARD


CASES = [(name, stages, micro_batches)
         for name in ("gpipe", "1f1b", "interleaved") for stages in (1, 2, 3, 4) for micro_batches in (1, 2, 4, 6, 8)
         if name != "interleaved" or (stages > 1 and micro_batches % stages == 0)]


@pytest.mark.parametrize(("name", "stages", "micro_batches"), CASES)
def test_every_schedule_covers_each_micro_batch_once_and_cannot_deadlock(name: str, stages: int,
                                                                         micro_batches: int) -> None:
    for chunks in ([2, 3] if name == "interleaved" else [1]):
        for stage in range(stages):
            schedule = stage_order(name, stages, micro_batches, stage, chunks)
            expected = {(c, mb) for c in range(chunks) for mb in range(micro_batches)}
            for kind in (FORWARD, BACKWARD):
                seen = [(a.chunk, a.micro_batch) for a in schedule if a.phase == kind]
                assert sorted(seen) == sorted(expected)
            first_forward = {(a.chunk, a.micro_batch): i for i, a in enumerate(schedule) if a.phase == FORWARD}
            assert all(first_forward[(a.chunk, a.micro_batch)] < i for i, a in enumerate(schedule) if a.phase == BACKWARD)
        assert run_to_completion(name, stages, chunks, micro_batches)


def test_unknown_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        stage_order("zero-bubble", 2, 4, 0, 1)


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


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    for stage in range(4):
        assert stage_order("interleaved", 4, 8, stage, 1) == stage_order("1f1b", 4, 8, stage, 1)


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1),
                                                       ("1f1b", 1, 5, 1), ("interleaved", 4, 8, 2),
                                                       ("interleaved", 2, 4, 3), ("interleaved", 2, 2, 2)])
def test_peak_in_flight_follows_the_schedule(schedule: str, p: int, m: int, v: int) -> None:
    """GPipe holds every micro-batch, 1F1B ``p - stage`` (at most m), interleaved Megatron's warm-up count + 1 chunk
    passes (at most m micro-batches)."""
    for stage in range(p):
        got = peak_in_flight(schedule, p, m, stage, v)
        if schedule == "gpipe":
            assert got == m
        elif schedule == "1f1b":
            assert got == min(p - stage, m)
        else:
            warmup = m * v if m == p else min((p - stage - 1) * 2 + (v - 1) * p, m * v)
            assert got == min(-(-(warmup + 1) // v), m)


def test_layout_groups() -> None:
    layout = Layout(tp=2, pp=3, dp=2)
    assert layout.tp_group(5) == [4, 5] and layout.dp_group(5) == [5, 7] and layout.pp_group(5) == [1, 5, 9]
    assert [layout.stage(r) for r in range(12)] == [0] * 4 + [1] * 4 + [2] * 4
