"""The vocabulary of a run whose word embedding is whole on every tensor-parallel rank (``tests/data/audit-ddp/tp2``:
PyTorch's ``parallelize_module`` splits the blocks' linear layers over 2 ranks and leaves the embedding and the
output layer whole, a ``[512, 256]`` table on each).

On one rank it looks like Megatron's vocabulary-parallel embedding of a 1,024-word vocabulary, and it was read as
that. Megatron's (and vtrain's reference model's) vocabulary-parallel embedding all-reduces its lookup's output over
the tensor-parallel ranks (reduce-scatters it, with sequence parallelism) before the first attention; a whole table
is reduced first after the attention's output projection. The vocabulary is then the table's, and its placement as
a vocabulary-parallel one (vtrain's model splits it) is said."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, TRACES
from vtrain.ingest.inferred_run import InferredRun, infer_run
from vtrain.tables.store import Profile


def _inferred(profile: Profile, folder: Path) -> InferredRun:
    """The run ``folder``'s traces (ingested: ``profile``) show, read as ingest reads it."""
    first = sorted(folder.glob("rank-*.json.gz"))[0]
    groups = (json.loads(gzip.decompress(first.read_bytes())).get("distributedInfo") or {}).get("pg_config")
    return infer_run(profile["cpu_ops"], profile.metadata["world_size"], "cpu", groups)


def test_a_whole_table_is_the_vocabulary(shipped_profile: Callable[[Path], Profile]) -> None:
    folder = REPO / "tests" / "data" / "audit-ddp" / "tp2"
    inferred = _inferred(shipped_profile(folder), folder)
    assert inferred.config is not None, inferred.reason
    assert (inferred.config.parallelism.tp, inferred.config.model.vocab) == (2, 512)
    assert ("its word embedding whole on each of the 2 tensor-parallel ranks (512 rows; no all-reduce after the "
            "lookup) placed as a vocabulary-parallel one") in inferred.assumed


@pytest.mark.parametrize("name", ["t2p1d1", "t2p2d2"])
def test_a_vocabulary_parallel_table_is_a_share(name: str, shipped_profile: Callable[[Path], Profile]) -> None:
    """vtrain's own tensor-parallel recordings (a vocabulary-parallel embedding, all-reduced after the lookup): the
    vocabulary is the table's rows times t, nothing said of it."""
    inferred = _inferred(shipped_profile(TRACES / name), TRACES / name)
    assert inferred.config is not None, inferred.reason
    assert (inferred.config.parallelism.tp, inferred.config.model.vocab) == (2, 512)
    assert "word embedding whole" not in inferred.assumed


def test_a_trace_without_collective_events_says_nothing_of_a_whole_table(tmp_path: Path) -> None:
    """t2p1d1 (a vocabulary-parallel table, 256 rows a rank) with every collective event taken out, as a trace of a
    PyTorch that records none, or a filtered one, has it: no all-reduce after the lookup is no evidence of a whole
    table (it read 256 words, half the vocabulary); the table is taken as split, as Megatron's is."""
    folder = tmp_path / "t2p1d1"
    folder.mkdir()
    collective = ("all_reduce", "allreduce", "record_param_comms", "reduce_scatter", "nccl:", "gloo:")
    for path in sorted((TRACES / "t2p1d1").glob("rank-*.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        trace["traceEvents"] = [e for e in trace["traceEvents"]
                                if not any(word in str(e.get("name", "")) for word in collective)]
        (folder / path.name).write_bytes(gzip.compress(json.dumps(trace).encode(), 1))
    from vtrain.ingest.pipeline import ingest_traces
    inferred = _inferred(ingest_traces(folder), folder)
    assert inferred.config is not None, inferred.reason
    assert (inferred.config.parallelism.tp, inferred.config.model.vocab) == (2, 512)
    assert "word embedding whole" not in inferred.assumed
