"""What vtrain derives from a profile is kept between runs (vtrain/cache.py): a profile read again predicts the same
without reading its tables or importing polars, and nothing stale, broken or unwritable in the cache changes a
prediction."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO
from vtrain.runconfig import load_run_config
from vtrain.simulate import simulate
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"
GPT_1_3B = REPO / "examples" / "gpt-1.3b-a100.yaml"
A100 = REPO / "profiles" / "a100"

#: `vtrain simulate --json` in a fresh process, then whether it imported polars
_SIMULATE = """
import json, runpy, sys
sys.argv = ["vtrain", "simulate", sys.argv[1], "--profile", sys.argv[2], "--json"]
try:
    runpy.run_module("vtrain.cli.main", run_name="__main__")
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps({"polars": "polars" in sys.modules, "sklearn": "sklearn" in sys.modules}))
"""


def _simulate_process(profile: Path, cache: Path) -> tuple[dict, dict]:
    env = {**os.environ, "VTRAIN_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", _SIMULATE, str(MTNLG), str(profile)], capture_output=True,
                          text=True, cwd=REPO, env=env, check=True)
    summary, _, imported = done.stdout.rpartition("\n{")
    return json.loads(summary), json.loads("{" + imported)


def test_a_profile_read_again_predicts_the_same_without_polars(tmp_path: Path) -> None:
    first, first_imports = _simulate_process(A100, tmp_path / "cache")
    again, again_imports = _simulate_process(A100, tmp_path / "cache")
    assert first_imports["polars"] and not again_imports["polars"] and not again_imports["sklearn"]
    assert again == first
    fresh, _ = _simulate_process(A100, tmp_path / "another cache")
    assert fresh == first


def _iteration_ms(profile_dir: Path) -> float:
    return simulate(load_run_config(MTNLG), load_profile(profile_dir)).iteration_us / 1e3


def test_a_changed_profile_is_read_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    profile = tmp_path / "a100"
    shutil.copytree(A100, profile)
    before = _iteration_ms(profile)
    table = pl.read_parquet(profile / "op_benchmarks.parquet")  # what the kernel models are fitted to
    table.with_columns(pl.col("median_us") * 3).write_parquet(profile / "op_benchmarks.parquet")
    after = _iteration_ms(profile)
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path / "fresh cache"))
    assert after == _iteration_ms(profile) and after > before * 1.01


def test_tables_replaced_in_memory_are_what_is_predicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    config = load_run_config(GPT_1_3B)  # on the profile's links, its collectives timed by nccl_latency's curves
    config = replace(config, hardware=replace(config.hardware, intra_node_gbps=None, inter_node_gbps=None))
    load_profile(A100)  # kept in the cache
    profile = load_profile(A100)
    before = simulate(config, profile).iteration_us
    profile.tables["nccl_latency"] = profile.nccl_latency.with_columns(pl.col("median_us") * 3,
                                                                       pl.col("mean_us") * 3)
    assert profile.content_key() is None
    assert simulate(config, profile).iteration_us > before * 1.01


def test_a_broken_or_unwritable_cache_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(cache))
    expected = _iteration_ms(A100)
    entries = sorted(cache.glob("*.pickle"))
    assert [entry.name.split("-")[0] for entry in entries] == ["digest", "kernel", "nccl"]
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[:100])  # cut short, as by a full disk
    assert _iteration_ms(A100) == expected
    assert all(entry.stat().st_size > 100 for entry in entries)  # derived again and replaced
    not_a_folder = tmp_path / "a file"
    not_a_folder.write_text("not a folder")
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(not_a_folder))
    assert _iteration_ms(A100) == expected
    assert not_a_folder.read_text() == "not a folder"


def test_a_bad_table_is_refused_whatever_was_read_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain.errors import InputError

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    profile = tmp_path / "a100"
    shutil.copytree(A100, profile)
    load_profile(profile)
    table = pl.read_parquet(profile / "op_benchmarks.parquet")
    table.with_columns(pl.lit(-1.0).alias("median_us")).write_parquet(profile / "op_benchmarks.parquet")
    with pytest.raises(InputError, match="op_benchmarks.parquet: .*median_us"):
        load_profile(profile)


def test_an_entry_others_could_have_written_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickle runs code when loaded: an entry in a shared cache folder that other users may write is derived
    again rather than read."""
    from vtrain import cache

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path))
    cache.keep("some contents", "test", {"derived": 1})
    assert cache.lookup("some contents", "test") == {"derived": 1}
    (entry,) = tmp_path.glob("test-*.pickle")
    entry.chmod(0o666)
    assert cache.lookup("some contents", "test") is None
    assert cache.derived("some contents", "test", lambda: {"derived": 2}) == {"derived": 2}
    assert entry.stat().st_mode & 0o777 == 0o600  # replaced by an entry of the user's alone


def test_a_planted_link_a_renamed_entry_or_an_open_folder_is_not_read(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry replaced by a link to a user's file of pickle bytes (mode 644, the user's own) was loaded, and its
    code run; an entry renamed over another's gave another profile's rows, silently; a folder others may write to
    lets them do both (an audit). None of them is read."""
    import pickle

    from vtrain import cache

    folder = tmp_path / "cache"
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(folder))
    cache.keep("profile A", "test", {"rows": "A"})
    cache.keep("profile B", "test", {"rows": "B"})
    entries = {key: cache._entry(key, "test") for key in ("profile A", "profile B")}
    shutil.copyfile(entries["profile B"], entries["profile A"])  # renamed over A's
    assert cache.lookup("profile A", "test") is None and cache.lookup("profile B", "test") == {"rows": "B"}

    class Payload:
        def __reduce__(self) -> tuple:
            return (Path.touch, (tmp_path / "ran",))

    download = tmp_path / "rank-0.json"
    download.write_bytes(pickle.dumps(("profile A", "test", Payload())))
    download.chmod(0o644)
    entries["profile A"].unlink()
    entries["profile A"].symlink_to(download)
    assert cache.lookup("profile A", "test") is None and not (tmp_path / "ran").exists()
    folder.chmod(0o777)
    assert cache.lookup("profile B", "test") is None
    folder.chmod(0o1777)  # sticky, as /tmp: others may not take or replace the user's files
    assert cache.lookup("profile B", "test") == {"rows": "B"}


def test_one_entry_per_profile_is_kept_whatever_vtrain_wrote_it(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """vtrain's code is part of an entry's key (an edited kernel model must not be served an old fit); entries of
    the same contents written by another vtrain are removed, so the folder does not grow with every upgrade."""
    from vtrain import cache

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path))
    cache.keep("contents", "test", 1)
    cache.keep("other contents", "test", 2)
    monkeypatch.setattr(cache, "_CODE_KEY", ["another vtrain"])
    assert cache.lookup("contents", "test") is None
    cache.keep("contents", "test", 3)
    assert cache.lookup("contents", "test") == 3 and cache.lookup("other contents", "test") is None
    assert len(list(tmp_path.glob("test-*.pickle"))) == 2


def test_the_cache_keeps_what_was_used_last_within_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from vtrain import cache

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "MAX_CACHE_BYTES", 350_000)
    for age, name in ((300, "first"), (200, "second"), (100, "third")):
        cache.keep(name, "test", bytes(100_000))
        written = time.time_ns() - age * 10**9  # (file times are coarser than one test's steps)
        os.utime(cache._entry(name, "test"), ns=(written, written))
    assert cache.lookup("first", "test") is not None  # used: now the most recent
    cache.keep("fourth", "test", bytes(100_000))
    assert [cache.lookup(name, "test") is not None for name in ("first", "second", "third", "fourth")] == [
        True, False, True, True]


def test_a_pipe_in_a_profile_folder_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key of a folder's contents reads its Parquet files whole: a named pipe or a device among them would never
    end. Such a folder gets no key (nothing kept) and is read as before: a table that is a device is refused, a
    pipe beside the tables is left alone."""
    from vtrain.errors import InputError

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    profile = tmp_path / "a100"
    shutil.copytree(A100, profile)
    os.mkfifo(profile / "notes.parquet")
    assert load_profile(profile).content_key() is None
    assert _iteration_ms(profile) == _iteration_ms(A100)
    (profile / "kernels.parquet").unlink()
    (profile / "kernels.parquet").symlink_to("/dev/zero")
    with pytest.raises(InputError, match="kernels.parquet: not a regular file"):
        load_profile(profile)
    (profile / "kernels.parquet").unlink()
    os.mkfifo(profile / "kernels.parquet")  # read, a table that is a pipe never ended (an audit's hang)
    with pytest.raises(InputError, match="kernels.parquet: not a regular file"):
        load_profile(profile)


def test_another_tables_file_under_a_tables_name_is_refused(tmp_path: Path) -> None:
    """nccl_latency.parquet copied over op_latency.parquet shares a few columns (count, median_us, ...): it was read
    as 16,122 operators of no name, which `simulate` used without a word and `vtrain tables` crashed on."""
    from vtrain.errors import InputError

    profile = tmp_path / "a100"
    shutil.copytree(A100, profile)
    shutil.copy(profile / "nccl_latency.parquet", profile / "op_latency.parquet")
    with pytest.raises(InputError, match="op_latency.parquet: wrong schema: no op, input_dims, input_types column"):
        load_profile(profile)


def test_processes_reading_one_profile_at_once_agree(tmp_path: Path) -> None:
    """Plan workers, or several jobs of a CI, read the same new profile at the same moment: each derives and keeps
    the entries; they replace each other atomically, and nothing half-written is left or read."""
    cache = tmp_path / "cache"
    env = {**os.environ, "VTRAIN_CACHE_DIR": str(cache)}
    command = [sys.executable, "-m", "vtrain.cli.main", "simulate", str(MTNLG), "--profile", str(A100), "--json"]
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
                                env=env) for _ in range(3)]
    outputs = [process.communicate(timeout=300)[0] for process in running]
    assert all(process.returncode == 0 for process in running)
    assert len(set(outputs)) == 1 and outputs[0].startswith("{")
    assert sorted(entry.name.split("-")[0] for entry in cache.iterdir()) == ["digest", "kernel", "nccl"]  # no .tmp left
    again, _ = _simulate_process(A100, cache)
    assert again == json.loads(outputs[0])


def test_a_cache_made_under_a_group_writable_umask_is_read(tmp_path: Path) -> None:
    """Under umask 002 (Ubuntu's default for its users) the cache folder was made 775: a folder others may write
    to, so no entry was ever read back and every run derived again, silently. It is made the user's alone."""
    script = ("import os, sys; os.umask(0o002); from vtrain import cache; "
              "cache.keep('contents', 'test', {'derived': 1}); print(cache.lookup('contents', 'test'))")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "VTRAIN_CACHE_DIR": str(tmp_path / "fresh" / "cache")})
    assert ran.stdout.strip() == "{'derived': 1}", ran.stderr
    assert (tmp_path / "fresh" / "cache").stat().st_mode & 0o777 == 0o700


def test_vtrains_own_folder_left_open_by_an_older_vtrain_is_read_again(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An older vtrain made ~/.cache/vtrain 775 under umask 002, and the rule that a folder others may write is
    not read then kept every run of the user's from it, silently, for good. vtrain's own folder is made the user's
    alone again (each entry is still checked on its own); nothing is said."""
    from vtrain import cache

    monkeypatch.delenv("VTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache.keep("contents", "test", {"derived": 1})
    folder = tmp_path / "vtrain"
    folder.chmod(0o775)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert cache.lookup("contents", "test") == {"derived": 1}
    assert not said and folder.stat().st_mode & 0o777 == 0o700


def test_a_chosen_folder_others_may_write_is_said_once_and_not_read(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder the user chose ($VTRAIN_CACHE_DIR) that others may write is theirs to set: left as it is,
    nothing read from it, and said once a process (not once a profile table)."""
    from vtrain import cache
    from vtrain.errors import InputWarning

    folder = tmp_path / "team-cache"
    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(folder))
    cache.keep("contents", "test", {"derived": 1})
    folder.chmod(0o775)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert cache.lookup("contents", "test") is None
        assert cache.lookup("contents", "test") is None
    assert folder.stat().st_mode & 0o777 == 0o775
    assert [w.category for w in said] == [InputWarning]
    assert str(folder) in str(said[0].message) and "chmod go-w" in str(said[0].message)


def test_an_entry_with_a_second_name_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hard link made to an entry (or an entry made a hard link to a user's own file) is a file someone else
    may have named: only an entry of one name is read."""
    from vtrain import cache

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path))
    cache.keep("contents", "test", {"derived": 1})
    os.link(cache._entry("contents", "test"), tmp_path / "elsewhere")
    assert cache.lookup("contents", "test") is None
