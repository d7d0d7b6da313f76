"""``vtrain calibrate``: ingest new traces as a version of a base profile, compare the two, predict a reference
run and re-run a validation suite with both, then write the drift report and the new profile.

:func:`calibrate` checks every input before it reads the traces and writes nothing but temporary files;
:func:`write_calibration` writes the report folder and the profile folder, each atomically, the profile last
inside the report's staging step, so a failure leaves neither behind.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vtrain.calibrate.drift import compare_profiles
from vtrain.calibrate.profile import derive_profile, load_base_profile, with_base_benchmarks
from vtrain.calibrate.result import Calibration, SuiteSet
from vtrain.devices.catalog import canonical_device_name
from vtrain.errors import InputError
from vtrain.fit.device import refit
from vtrain.ingest.pipeline import ingest_traces
from vtrain.outputs import REPORT, check_apart, check_output, followed, resolved, restored_on_failure, staged
from vtrain.report.drift import write_drift_report
from vtrain.runconfig import RunConfig, described_run, load_run_config
from vtrain.tables.store import Profile, write_profile
from vtrain.validate.suite import Suite, load_suite
from vtrain.validate.traces import validate_traces

Warn = Callable[[str], None]


def calibrate(trace_dir: str | Path, base: str | Path, output: str | Path, *, report_dir: str | Path,
              reference: str | Path | None = None, suite: str | Path | None = None, force: bool = False,
              warn: Warn = lambda _: None) -> Calibration:
    """Ingest ``trace_dir`` as a new version of the profile ``base`` (to be written to ``output``) and compare.

    The reference run is ``reference``, else ``trace_dir/run.yaml`` when there is one; ``suite`` is a validation
    suite re-run with both profiles. Bad input raises :class:`InputError` before anything is written.
    """
    trace_dir, base, output = Path(trace_dir), Path(base), Path(output)
    base_profile = load_base_profile(base)
    _check_outputs(output, Path(report_dir), trace_dir, base, force)
    config, config_source, reference_reason = _reference_config(reference, trace_dir)
    loaded_suite = load_suite(suite) if suite is not None else None
    warnings: list[str] = []

    def note(line: str) -> None:
        if line not in warnings:
            warnings.append(line)
            warn(line)

    ingested, carried = with_base_benchmarks(ingest_traces(trace_dir, warn=note), base_profile)
    if carried:
        note(carried)
    profile = derive_profile(ingested, base, version=output.name, fitted=refit(ingested, base_profile.metadata))
    for line in _another_job(base_profile.metadata, profile.metadata, base):
        note(line)
    drift = compare_profiles(base_profile, profile)
    for line in drift.said(base):
        note(line)
    predicted = None
    if config is not None:
        predicted, reference_reason = predict_reference(config, str(config_source), base_profile, profile)
    for line in _measured_otherwise(base_profile, profile, base):
        note(line)
    sets = rerun_suite(loaded_suite, base, profile, note) if loaded_suite is not None else None
    return Calibration(trace_dir=trace_dir, base_path=base, output=output, report_dir=Path(report_dir),
                       base=base_profile, profile=profile, drift=drift, reference=predicted,
                       reference_reason=reference_reason, suite_name=loaded_suite.name if loaded_suite else None,
                       suite=sets, warnings=warnings)


def _another_job(base: dict[str, Any], new: dict[str, Any], base_path: Path) -> list[str]:
    """One line when the new traces are of another job than the base profile's (its device, its number of ranks,
    its model or its parallelism): their operators then differ by shape and their times by work, which the drift
    report would show as the software's doing."""
    def job(metadata: dict[str, Any]) -> dict[str, Any]:
        run = metadata.get("run") or {}
        parallelism = run.get("parallelism") or {}
        model = run.get("model") or {}
        name = (metadata.get("device") or {}).get("name")
        return {"device": canonical_device_name(str(name)) or name if name else None,
                "ranks": metadata.get("world_size"),
                "model": {key: model.get(key) for key in _SHAPE} if model else None,
                "t x p x d": tuple(parallelism.get(k) for k in ("tp", "pp", "dp")) if parallelism else None}

    old, now = job(base), job(new)
    differ = [key for key in old if old[key] is not None and now[key] is not None and old[key] != now[key]]
    if not differ:
        return []
    shown = "; ".join(f"{key} {_said(now[key])} against {_said(old[key])}" for key in differ)
    return [f"the traces are of another job than the base profile {base_path}'s ({shown}): operators of other "
            "shapes show as gone and new, and the reference's change is the job's, not the software's"]


def _measured_otherwise(old: Profile, new: Profile, base_path: Path) -> list[str]:
    """What the two profiles cannot be compared on: kernels, where the base holds none (a profile `vtrain fit` made
    from measurements: every kernel is "new"); the host's issue of operators, where one holds its traces' timeline
    and the other none: the first times it from its timeline, the second from its device model's host terms, so
    the reference run moves with that too (an audit: -1.0 % on an identical copy of the traces profiles/h100 was
    made from)."""
    said = []
    if old.tables["kernels"].height == 0 and new.tables["kernels"].height > 0:
        said.append(f"the base profile {base_path} holds no kernels (a profile fitted to measurements): every kernel "
                    "of the new traces shows as new; a base ingested from traces tells kernels that moved")
    timed = [profile.tables["cpu_ops"].height > 0 for profile in (old, new)]
    if timed[0] != timed[1]:
        with_timeline, without = ("the new traces", f"the base profile {base_path}") if timed[1] else (
            f"the base profile {base_path}", "the new traces")
        said.append(f"{with_timeline} time the host's issue of operators from their own timeline, {without} from "
                    "the device model's host terms: the reference run's change holds that difference, not only the "
                    "software's")
    return said


#: what a model is, for telling jobs apart
_SHAPE = ("layers", "hidden", "heads", "seq", "vocab")


def _said(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key} {value[key]}" for key in _SHAPE)
    if isinstance(value, tuple):
        return " x ".join(map(str, value))
    return str(value)


def _check_outputs(output: Path, report_dir: Path, trace_dir: Path, base: Path, force: bool) -> None:
    if resolved(output) == resolved(base):
        raise InputError("the new profile would replace its own base profile; give another -o", output)
    check_apart(output, report_dir, "drift report folder", "--report-dir")
    check_output(output, inputs=[trace_dir, base], force=force, what="profile folder")
    check_output(report_dir, inputs=[trace_dir, base, output], replaces=REPORT, command="calibrate",
                 what="report folder", option="--report-dir")


def _reference_config(reference: str | Path | None,
                      trace_dir: Path) -> tuple[RunConfig | None, Path | None, str | None]:
    """The reference run config and its path, or the reason there is none (a ``--reference`` that does not load is
    an error; a ``run.yaml`` beside the traces that does not load is a reason, as for validate)."""
    if reference is not None:
        return load_run_config(reference).validate(reference), Path(reference), None
    config, source, problem = described_run(trace_dir)
    if problem:
        return None, None, f"{problem}: no reference run to predict"
    if config is None:
        return None, None, f"no --reference given and no run.yaml in {trace_dir}: no reference run to predict"
    return config, Path(source), None


def predict_reference(config: RunConfig, source: str, old: Profile,
                      new: Profile) -> tuple[dict[str, Any] | None, str | None]:
    """Iteration time of the reference run simulated from either profile, or ``None`` and why not."""
    # imports the model (and torch): only when there is a reference run
    from vtrain.simulate import simulate

    try:
        before, after = (simulate(config, profile, source=source) for profile in (old, new))
    except InputError:
        raise
    except Exception as exc:  # the simulator is another package: report its failure, keep the drift report
        return None, f"vtrain simulate failed: {type(exc).__name__}: {exc}"
    old_ms, new_ms = before.iteration_us / 1e3, after.iteration_us / 1e3
    return {"config": source, "old_ms": old_ms, "new_ms": new_ms,
            "change_pct": 100.0 * (new_ms / old_ms - 1.0) if old_ms > 0 else None,
            "coverage_old": before.coverage_share, "coverage_new": after.coverage_share}, None


def rerun_suite(suite: Suite, base: Path, new: Profile, warn: Warn) -> list[SuiteSet]:
    """Validate every set of ``suite`` with the base profile and with ``new`` (each set's own ``profile:`` is
    replaced by these two); HTA's side-by-side analysis is skipped."""
    sets = []
    with tempfile.TemporaryDirectory(prefix="vtrain-calibrate-") as scratch:
        new_dir = write_profile(Profile(tables=new.tables, metadata=new.metadata), Path(scratch) / "profile")
        for entry in suite.entries:
            validations = []
            for side, profile_dir in (("old", base), ("new", new_dir)):
                work = Path(scratch) / side / entry.name
                work.mkdir(parents=True)
                validations.append(validate_traces(entry.traces, work, config_path=entry.config,
                                                   profile_dir=profile_dir, with_hta=False, warn=warn))
            sets.append(SuiteSet.of(entry.name, *validations))
    return sets


def write_calibration(calibration: Calibration, *, force: bool = False) -> None:
    """Write the drift report folder, then the new profile, each atomically. The profile is written last, so that
    no failure of the report (a file added to its folder meanwhile, an interrupt) loses the profile it would
    replace; if the profile cannot be written, the new report is removed and the one it replaced put back: neither
    output changes."""
    report = followed(Path(calibration.report_dir))
    with restored_on_failure(report):
        with staged(report, REPORT, "calibrate") as staging:
            write_drift_report(calibration, staging)
        write_profile(calibration.profile, calibration.output, overwrite=force)
