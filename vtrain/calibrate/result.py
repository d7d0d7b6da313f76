"""What `vtrain calibrate` found: the drift between two profiles, the reference run and the suite re-run with
either profile; the drift report (``report/drift.py``) renders it and ``--json`` prints its summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vtrain.calibrate.drift import EFFECT, GONE, MIN_CHANGE, NEW, RUN_SPREADS, Drift, Z
from vtrain.tables.store import Profile

if TYPE_CHECKING:
    from vtrain.validate.traces import Validation


@dataclass
class SuiteSet:
    """One trace set of a suite validated with the base profile (``old``) and the new one (``new``)."""

    name: str
    traces: str
    replay: dict[str, Any]  # measured_ms, predicted_ms, error_pct: the replay does not use the profile
    old: dict[str, Any] | None  # the model's measured_ms, predicted_ms, error_pct with the base profile
    new: dict[str, Any] | None
    reason: str | None  # why a model prediction is missing

    @classmethod
    def of(cls, name: str, old: Validation, new: Validation) -> SuiteSet:
        """From the validations of one set with either profile."""
        reason = old.model_reason if old.model is None else new.model_reason if new.model is None else None
        return cls(name=name, traces=str(old.trace_dir), replay=old.replay.summary(),
                   old=old.model.summary() if old.model else None, new=new.model.summary() if new.model else None,
                   reason=reason)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "traces": self.traces, "replay": self.replay, "model_old": self.old,
                "model_new": self.new, "reason": self.reason}


@dataclass
class Calibration:
    """Everything the drift report shows, and the new profile to write."""

    trace_dir: Path
    base_path: Path
    output: Path
    report_dir: Path
    base: Profile
    profile: Profile
    drift: Drift
    reference: dict[str, Any] | None
    reference_reason: str | None
    suite_name: str | None
    suite: list[SuiteSet] | None
    warnings: list[str]

    def summary(self) -> dict[str, Any]:
        """What ``--json`` prints."""
        drift = self.drift
        return {
            "profile": str(self.output), "version": self.profile.metadata["version"],
            "parent": str(self.base_path), "parent_sha256": self.profile.metadata["parent"]["sha256"],
            "trace_dir": str(self.trace_dir), "report": str(self.report_dir),
            "rule": {"min_change": MIN_CHANGE, "z": Z, "effect": EFFECT, "run_spreads": RUN_SPREADS,
                     "run_spread": drift.run_spread},
            "scope": _scope(drift),
            "counts": drift.counts(), "drifted": [_public(r) for r in drift.drifted()],
            "unmatched": [_public(r) for r in drift.rows((NEW, GONE))],
            "collective_types": drift.collective_types.to_dicts(),
            "software_changed": drift.software,
            "reference": self.reference, "reference_reason": self.reference_reason,
            "suite": None if self.suite is None else {"name": self.suite_name,
                                                      "sets": [s.to_dict() for s in self.suite]},
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, for ``drift.json``: the summary, every compared row of each kind, and the warnings."""
        return {**self.summary(), "rows": {kind: frame.to_dicts() for kind, frame in self.drift.tables().items()},
                "warnings": self.warnings}


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("kind", "key", "label", "ratio", "band", "threshold", "status", "old_median_us",
                                "new_median_us", "old_count", "new_count")}


def _scope(drift: Drift) -> dict[str, Any]:
    """The ranks compared, those only one profile holds, and the collectives not compared for waiting on them."""
    scope = drift.scope
    return {"ranks": None if scope.compared is None else sorted(scope.compared),
            "ranks_not_given": list(scope.not_given), "ranks_only_new": list(scope.only_new),
            "collectives_not_compared": drift.left_out.drop("label").to_dicts()}
