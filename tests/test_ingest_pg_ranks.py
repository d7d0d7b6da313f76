"""A ``Process Group Ranks`` arg written as a JSON list (not Kineto's string) is read, as the replay reads it."""

import json

from vtrain.ingest.pipeline import ingest_traces


def test_process_group_ranks_as_a_list(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5,
         "args": {"External id": 1, "Input Dims": [[2, 2], [2, 2]]}},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 1, "tid": 1, "ts": 6, "dur": 5,
         "args": {"Process Group Ranks": [0, 1]}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2,
         "args": {"stream": 7, "correlation": 3, "External id": 1}},
    ]
    (tmp_path / "rank0.json").write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1},
                                                     "traceEvents": events}))
    assert ingest_traces(tmp_path) is not None
