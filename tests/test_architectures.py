"""Published architectures by name (vtrain/architectures.py): their shapes against the parameters their authors
published, names as projects and tables write them, and the commands that take a name where a run config goes
(simulate, plan, a measurement table's model column)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process
from tests.test_llama_layers import PUBLISHED_PARAMETERS
from vtrain.architectures import ARCHITECTURES, architecture
from vtrain.errors import InputError, InputWarning
from vtrain.importers import measurement_config, read_measurements
from vtrain.model.memory import model_parameter_count
from vtrain.runconfig import RunConfig, load_given_run, load_run_config, run_config_from_dict

#: the weights of the released checkpoints (the safetensors index's total size over two bytes a bf16 parameter)
RELEASED = {"llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "codellama-34b": 33_743_970_304,
            "llama-2-70b": 68_976_648_192, "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496,
            "llama-3.1-405b": 405_853_388_800}
#: the rounded sizes the papers name them by (GPT-3: Brown et al., Table 2.1; MT-NLG: 530B)
NOMINAL = {"gpt-3-125m": 125e6, "gpt-3-350m": 350e6, "gpt-3-760m": 760e6, "gpt-3-2.7b": 2.7e9,
           "gpt-3-6.7b": 6.7e9, "gpt-3-175b": 175e9, "mt-nlg-530b": 530e9}


def test_every_architecture_is_checked_against_its_published_size() -> None:
    assert {a.name for a in ARCHITECTURES} == set(RELEASED) | set(NOMINAL)


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_llama_architectures_hold_their_released_weights_to_the_parameter(name: str) -> None:
    assert model_parameter_count(architecture(name).model) == RELEASED[name]


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_gpt_architectures_are_within_2_percent_of_the_size_they_are_named_by(name: str) -> None:
    """The papers round (GPT-3 2.7B holds 2.65B here); a wrong width or layer count is off by far more."""
    assert model_parameter_count(architecture(name).model) == pytest.approx(NOMINAL[name], rel=0.02)


def test_the_catalogue_agrees_with_the_hugging_face_configs_of_the_same_models() -> None:
    for ours, theirs in (("llama-2-7b", "Llama-2-7b"), ("llama-3-8b", "Meta-Llama-3-8B")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", InputWarning)
            from_hf = run_config_from_dict(PUBLISHED_PARAMETERS[theirs][0]).model
        assert architecture(ours).model == from_hf


@pytest.mark.parametrize("name", ["LLAMA3_70B", "llama-3-70b", "Llama 3 70B", "meta-llama/Meta-Llama-3-70B",
                                  "llama3.1_70b", "LLAMA3.1-70B"])
def test_names_as_projects_and_tables_write_them(name: str) -> None:
    assert architecture(name).name == "llama-3-70b"


@pytest.mark.parametrize(("name", "meant"), [("meta-llama/Llama-2-7b-hf", "llama-2-7b"), ("GPT3_175B", "gpt-3-175b"),
                                             ("gpt-3-2.7b", "gpt-3-2.7b"), ("LLAMA3_1_405B", "llama-3.1-405b")])
def test_other_spellings(name: str, meant: str) -> None:
    assert architecture(name).name == meant


@pytest.mark.parametrize("name", ["mixtral-8x7b", "llama-4", "gpt-3-1.3b", "", "175b"])
def test_names_of_no_architecture_are_none(name: str) -> None:
    assert architecture(name) is None


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: a.name)
def test_every_architecture_is_a_run_megatron_can_place(arch) -> None:
    run = RunConfig(model=arch.model, precision=arch.precision, framework="megatron")
    run.validate("test")
    assert run.model_errors() == []


# --- commands that take a name ------------------------------------------------------------------------------------

def test_a_name_loads_as_the_model_of_its_architecture_with_a_line_saying_whose(tmp_path: Path) -> None:
    with pytest.warns(InputWarning, match=r"llama-2-70b: llama-2-70b as published \(Touvron et al., 2023"):
        run = load_run_config("llama-2-70b")
    assert run.model == architecture("llama-2-70b").model
    assert (run.precision, run.framework) == ("bf16", "megatron")
    with pytest.warns(InputWarning):
        assert load_given_run("llama-2-70b")[1]  # a model without a run of its own


def test_a_file_of_that_name_is_read_as_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "llama-2-70b").write_text(json.dumps({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32}}))
    monkeypatch.chdir(tmp_path)
    assert load_run_config("llama-2-70b").model.layers == 2
    assert not load_given_run("llama-2-70b")[1]


def test_a_name_of_nothing_is_one_line_listing_the_names() -> None:
    with pytest.raises(InputError, match=r"mixtral-8x7b: no such file, nor a model vtrain knows by name \(gpt-3-125m"):
        load_run_config("mixtral-8x7b")


def test_a_missing_config_file_is_still_a_missing_file() -> None:
    with pytest.raises(InputError, match="no such run config"):
        load_run_config("runs/llama.yaml")


def test_simulate_a_name_is_the_prediction_of_the_same_model_written_out(tmp_path: Path) -> None:
    arch = architecture("gpt-3-350m")
    written = tmp_path / "run.json"
    model = {key: value for key, value in arch.model.__dict__.items()}
    written.write_text(json.dumps({"model": model, "precision": arch.precision, "framework": "megatron",
                                   "parallelism": {"global_batch": 8}, "hardware": {"device": "A100"}}))
    args = ("--profile", REPO / "profiles" / "a100", "--global-batch", "8", "--json")
    named = vtrain_in_process("simulate", "gpt-3-350m", *args)
    assert named.returncode == 0, named.stderr
    assert "gpt-3-350m as published (Brown et al., 2020 (GPT-3), Table 2.1)" in named.stderr
    spelled = vtrain_in_process("simulate", written, *args)
    assert spelled.returncode == 0, spelled.stderr
    assert json.loads(named.stdout)["iteration_time_ms"] == json.loads(spelled.stdout)["iteration_time_ms"]


def test_simulate_an_unknown_name_exits_2_with_one_line() -> None:
    ran = vtrain_in_process("simulate", "mixtral-8x7b", "--profile", REPO / "profiles" / "a100")
    assert ran.returncode == 2 and ran.stdout == ""
    assert ran.stderr.count("\n") == 1 and "nor a model vtrain knows by name" in ran.stderr


def test_plan_a_name_sweeps_its_model(tmp_path: Path) -> None:
    ran = vtrain_in_process("plan", "gpt-3-350m", "--gpus", "8", "--profile", REPO / "profiles" / "a100",
                            "--global-batch", "64", "-o", tmp_path / "out", "--json")
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["simulated"] > 0 and summary["frontier"]


# --- a measurement table's model column --------------------------------------------------------------------------

def read(tmp_path: Path, text: str):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)
        return read_measurements(path)


def test_a_table_naming_its_models_needs_no_shape_columns(tmp_path: Path) -> None:
    rows = read(tmp_path, "Model,#-GPUs,GBS,MBS,TP,PP,Tokens / sec / GPU\nLLAMA3_8B,8,128,1,1,1,4000\n"
                          "GPT3_175B,512,1536,1,8,8,300\n")
    llama, gpt = rows.row(0, named=True), rows.row(1, named=True)
    assert (llama["layers"], llama["hidden"], llama["heads"], llama["seq"]) == (32, 4096, 32, 8192)
    assert (llama["kv_heads"], llama["ffn_hidden"], llama["vocab"], llama["precision"]) == (8, 14336, 128256, "bf16")
    assert measurement_config(llama).model == architecture("llama-3-8b").model
    assert measurement_config(gpt).model == architecture("gpt-3-175b").model
    assert (gpt["precision"], gpt["dp"], llama["problem"], gpt["problem"]) == ("fp16", 8, None, None)


def test_the_tables_own_columns_win_over_the_architecture(tmp_path: Path) -> None:
    """NeMo's table gives the sequence it ran (LLaMA 3 8B at 4,096 here): that is what is simulated."""
    rows = read(tmp_path, "model,gpus,gbs,mbs,tp,pp,seq,precision,iteration time (ms)\n"
                          "llama-3-8b,8,64,1,1,1,4096,fp16,5000\nllama-3-8b,8,64,1,1,1,,,5000\n")
    assert rows["seq"].to_list() == [4096, 8192] and rows["precision"].to_list() == ["fp16", "bf16"]
    assert replace(measurement_config(rows.row(0, named=True)).model, seq=8192) == architecture("llama-3-8b").model


def test_a_row_of_an_unknown_model_without_a_shape_is_refused_the_others_read(tmp_path: Path) -> None:
    rows = read(tmp_path, "model,gpus,gbs,mbs,tp,pp,iteration time (ms)\nMixtral_8x7B,64,256,1,1,4,3000\n"
                          "llama-2-7b,8,64,1,1,1,9000\n,8,64,1,1,1,9000\n")
    problems = rows["problem"].to_list()
    assert problems[0].startswith("model 'Mixtral_8x7B' is not one vtrain knows by name (gpt-3-125m")
    assert problems[0].endswith("and the row gives no layers, hidden, heads, seq")
    assert problems[1] is None and problems[2] == "no model and no layers, hidden, heads, seq"
    assert rows["layers"].to_list() == [None, 32, None]


def test_a_model_column_beside_full_shape_columns_leaves_rows_of_unknown_models_as_given(tmp_path: Path) -> None:
    rows = read(tmp_path, "model,gpus,gbs,mbs,tp,pp,layers,hidden,heads,seq,iteration time (ms)\n"
                          "my-own-7b,8,64,1,1,1,32,4096,32,2048,9000\n")
    row = rows.row(0, named=True)
    assert row["problem"] is None and (row["layers"], row["vocab"], row["mlp"]) == (32, None, None)


def test_validate_reads_a_named_table_end_to_end(tmp_path: Path) -> None:
    table = tmp_path / "runs.md"
    table.write_text("| Model | #-GPUs | GBS | MBS | TP | PP | VP | Tokens / sec / GPU |\n"
                     "|---|---|---|---|---|---|---|---|\n"
                     "| GPT3_350M | 8 | 64 | 4 | 1 | 1 | n/a | 30000 |\n"
                     "| Mixtral_8x7B | 8 | 64 | 1 | 1 | 1 | - | 9000 |\n")
    ran = vtrain_in_process("validate", "--measurements", table, "--profile", REPO / "profiles" / "a100",
                            "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "over 1 rows" in ran.stdout and "Mixtral_8x7B" in ran.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| row | model | GPUs |" in report and "| 1 | gpt3_350m | 8 |" in report  # the worst rows say their model


@pytest.mark.parametrize("given", ["gpt-3-350m", "config.json"])
def test_a_model_without_gpus_of_its_own_runs_on_those_its_layout_needs(tmp_path: Path, given: str) -> None:
    """A published architecture's name or a Hugging Face config says no GPU count: t x d x p is it (a run config
    that says its GPUs keeps them, and a layout that differs from them is an error)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": 24, "n_embd": 1024, "n_head": 16,
                                  "n_positions": 2048}))
    target = config if given == "config.json" else given
    ran = vtrain_in_process("simulate", target, "--profile", REPO / "profiles" / "a100", "--tp", "2", "--dp", "2",
                            "--global-batch", "8", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["parallelism"]["tp"] == 2
    fixed = vtrain_in_process("simulate", REPO / "examples" / "mtnlg-530b.json", "--tp", "4")
    assert fixed.returncode == 2 and "does not equal the number of devices (3360)" in fixed.stderr


def test_plan_of_a_model_without_a_batch_asks_for_one(tmp_path: Path) -> None:
    ran = vtrain_in_process("plan", "gpt-3-350m", "--gpus", "8", "--profile", REPO / "profiles" / "a100",
                            "-o", tmp_path / "out")
    assert ran.returncode == 2 and not (tmp_path / "out").exists()
    assert ran.stderr.splitlines()[-1] == ("error: gpt-3-350m: gives a model, not its batch: give --global-batch "
                                           "(sequences an iteration)")


def test_simulate_of_a_model_without_a_batch_runs_one_micro_batch_a_replica_and_says_so() -> None:
    ran = vtrain_in_process("simulate", "gpt-3-125m", "--profile", REPO / "profiles" / "a100", "--dp", "4",
                            "--micro-batch", "2", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["parallelism"]["global_batch"] == 8
    assert "simulated with one micro-batch a replica, 8 sequence(s)" in ran.stderr


def test_a_cluster_job_may_name_its_model(tmp_path: Path) -> None:
    from vtrain.studies.jobs import read_jobs

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: chat, model: LLAMA2_13B, tokens: 2.0e+9, arrival_h: 0, gpus: 32}\n"
                    "  - {name: small, model: gpt-3-6.7b, seq: 1024, tokens: 1.0e+9, arrival_h: 1}\n")
    chat, small = read_jobs(jobs)
    assert chat.workload.model == architecture("llama-2-13b").model
    assert small.workload.model == replace(architecture("gpt-3-6.7b").model, seq=1024)
    jobs.write_text("jobs:\n  - {name: moe, model: mixtral-8x7b, tokens: 2.0e+9, arrival_h: 0}\n")
    with pytest.raises(InputError, match=r"job 1: model 'mixtral-8x7b' is not one vtrain knows by name"):
        read_jobs(jobs)
