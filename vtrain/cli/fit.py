"""`vtrain fit -o PROFILE_DIR [sources...]`: a profile with a device model fitted to measurements made elsewhere
(nccl-tests, LLMCompass, vidur, ingested traces) and, optionally, to measured iteration times."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from vtrain.cli.errors import user_errors
from vtrain.cli.options import recompute_option
from vtrain.errors import InputError
from vtrain.fit.build import FitSources, build_profile
from vtrain.outputs import check_output
from vtrain.simulate.measured_runs import Hardware
from vtrain.tables.store import write_profile


@user_errors
def fit_command(
    output: Path = typer.Option(..., "-o", "--output", help="Profile folder to write (e.g. profiles/a100)."),
    device: str = typer.Option("A100-40GB", "--device", help="Datasheet device the fit refines."),
    nccl_tests: list[Path] = typer.Option([], "--nccl-tests", help="nccl-tests output (CSV or *_perf stdout), or a "
                                                                    "folder of them; repeatable."),
    llmcompass: Path | None = typer.Option(None, "--llmcompass", help="Folder of LLMCompass *_A100.csv files."),
    vidur_compute: list[Path] = typer.Option([], "--vidur-compute", help="vidur compute/<model>-mlp.csv or its "
                                                                          "folder; repeatable."),
    vidur_network: list[Path] = typer.Option([], "--vidur-network", help="vidur network/<collective>.csv or its "
                                                                          "folder; repeatable."),
    traces: list[Path] = typer.Option([], "--profile", help="A profile from `vtrain ingest` of GPU traces whose "
                                                            "GEMMs and collectives join the fit and whose host's "
                                                            "time per operator (traces with a run.yaml) becomes "
                                                            "the host term; repeatable."),
    measurements: Path | None = typer.Option(None, "--measurements", help="Measured iteration times (CSV, as "
                                                                          "validate --measurements reads) to fit "
                                                                          "host overheads on."),
    fit_every: int = typer.Option(10, "--fit-every", min=1, help="Fit on every k-th row of --measurements."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1),
    recompute: str = recompute_option("Activation recomputation (none, selective or full) of the --measurements "
                                      "rows without that column."),
    parent: Path | None = typer.Option(None, "--parent", help="Profile this one refines (recorded as parent)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing profile folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted parameters as JSON."),
) -> None:
    """Fit a device model to measurements and write it, with the imported tables, as a profile."""
    inputs = [*nccl_tests, *vidur_compute, *vidur_network, *([llmcompass] if llmcompass else []),
              *([measurements] if measurements else []), *traces, parent]
    if not (nccl_tests or llmcompass or vidur_compute or vidur_network or traces):
        raise InputError("nothing to fit: give at least one of --nccl-tests, --llmcompass, --vidur-compute, "
                         "--vidur-network, --profile")
    check_output(output, inputs=inputs, force=force, what="profile folder")
    for path in inputs:
        if path is not None and not path.exists():
            raise InputError("no such file or folder", path)
    nccl_tests, vidur_compute, vidur_network = _files(nccl_tests), _files(vidur_compute), _files(vidur_network)
    sources = FitSources(nccl_tests=nccl_tests, llmcompass=llmcompass, vidur_compute=vidur_compute,
                         vidur_network=vidur_network, traces=traces, measurements=measurements, fit_every=fit_every)
    profile = build_profile(sources, device, Hardware(device=device, gpus_per_node=gpus_per_node,
                                                      recompute=recompute), parent)
    write_profile(profile, output, overwrite=force)
    fitted = profile.metadata["fitted"]
    if as_json:
        print(json.dumps({"profile": str(output), "fitted": fitted, "fit_rows": profile.metadata["fit_rows"]},
                         indent=2))
        return
    print(f"wrote {output}")
    for key, value in fitted["provenance"].items():
        if key in ("gemm", "memory_bound", "collectives", "host"):
            print(f"  {key}: {value}")
    host = fitted["host"]
    if "host" in fitted["provenance"]:
        print(f"  host: {host['op_us']:.1f} µs/op, {host['collective_us']:.1f} µs/collective, "
              f"arrival jitter {host['jitter_us']:.2f} µs (sync = jitter·√(2 ln n))")
    rows = profile.metadata["fit_rows"]
    if rows:
        print(f"  fitted on {len(rows['rows'])} rows of {rows['file']} (every {rows['every']}): MAPE "
              f"{rows['mape_pct']:.2f} % on them (the rest score the profile: validate --measurements)")
    else:
        print("  host: not fitted: no measured iteration times (--measurements) and no GPU timeline that says its "
              "run (--profile): predictions get no host time")
    held_out = fitted.get("kernel_held_out")
    if held_out:
        print("  held-out kernel MAPE (fitted on every other group, scored on this one):")
        for row in held_out["rotations"]:
            print(f"    {row['held_out']:<32} GEMM {_pct(row['gemm_mape_pct'])} ({row['gemm_rows']} kernels)  "
                  f"memory-bound {_pct(row['memory_mape_pct'])} ({row['memory_rows']} kernels)")
        print(f"    {'mean over groups':<32} GEMM {_pct(held_out['gemm_mape_pct'])}  "
              f"memory-bound {_pct(held_out['memory_mape_pct'])}")


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:5.1f} %"


#: the files a folder of measurements is read for
_MEASUREMENT_SUFFIXES = (".csv", ".txt", ".log", ".out")


def _files(paths: list[Path]) -> list[Path]:
    """Files as given; a folder stands for the .csv, .txt, .log and .out (Slurm's) files directly in it, and one
    with none is refused."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in _MEASUREMENT_SUFFIXES and p.is_file())
            if not files:
                raise InputError(f"no {', '.join(_MEASUREMENT_SUFFIXES)} file in the folder: nothing to read", path)
            found.extend(files)
        else:
            found.append(path)
    return found
