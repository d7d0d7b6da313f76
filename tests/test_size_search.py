"""The sizing search against budgets whose answer is known in closed form."""

from __future__ import annotations

import math

import pytest

from vtrain.runconfig import ModelConfig
from vtrain.studies.sizing import (
    LOSS_MODELS,
    Budget,
    best,
    parameter_count,
    practice_shapes,
    size_with_fixed_mfu,
    size_with_plans,
)
from vtrain.studies.throughput import Prediction

A100_PEAK = 312e12
CHINCHILLA = LOSS_MODELS["chinchilla"]


def dense_grid(aspect: int = 128) -> list[ModelConfig]:
    """Shapes from 0.1B to ~1T parameters, 2 % apart in hidden size (layers = hidden / aspect)."""
    shapes, hidden = [], 768.0
    while hidden < 40000:
        h = round(hidden / 64) * 64
        shapes.append(ModelConfig(layers=max(1, h // aspect), hidden=h, heads=h // 64, seq=2048, vocab=51200))
        hidden *= 1.02
    return shapes


def fixed_rate(flops_per_gpu: float):
    """A throughput that spends exactly 6·N FLOPs per token at a fixed rate per GPU."""
    def throughput(workload, gpus):
        return Prediction(gpus * flops_per_gpu / (6 * parameter_count(workload.model)))
    return throughput


@pytest.mark.parametrize("gpus,days", [(64, 7), (1024, 30), (8192, 90)])
@pytest.mark.parametrize("name", sorted(LOSS_MODELS))
def test_search_at_a_fixed_flop_rate_finds_chinchillas_closed_form_optimum(gpus, days, name):
    loss = LOSS_MODELS[name]
    budget = Budget(gpus=gpus, days=days, peak_flops=A100_PEAK)
    flops = budget.flops(0.5)
    n_opt, d_opt = loss.optimum(flops)
    found = best(size_with_plans(dense_grid(), budget, fixed_rate(0.5 * A100_PEAK), global_batch=512, loss_model=loss))
    # the grid is ~4 % apart in parameters near the optimum, and the loss is flat there
    assert found.parameters == pytest.approx(n_opt, rel=0.05)
    assert found.tokens == pytest.approx(d_opt, rel=0.05)
    assert found.loss == pytest.approx(loss.loss(n_opt, d_opt), abs=1e-4)
    assert 6 * found.parameters * found.tokens == pytest.approx(flops, rel=1e-9)


def test_the_fixed_mfu_search_agrees_with_the_plan_search_at_that_rate():
    budget = Budget(gpus=256, days=10, peak_flops=A100_PEAK)
    grid = dense_grid()
    planned = best(size_with_plans(grid, budget, fixed_rate(0.4 * A100_PEAK), global_batch=512,
                                   loss_model=CHINCHILLA))
    fixed = best(size_with_fixed_mfu(grid, budget, 0.4, CHINCHILLA))
    assert planned.model == fixed.model


@pytest.mark.parametrize("name", sorted(LOSS_MODELS))
def test_chinchilla_closed_form_is_the_minimum_along_the_compute_curve(name):
    loss = LOSS_MODELS[name]
    flops = 5.76e23  # Chinchilla's own budget
    n_opt, d_opt = loss.optimum(flops)
    assert 6 * n_opt * d_opt == pytest.approx(flops)
    for factor in (0.8, 0.95, 1.05, 1.25):
        assert loss.loss(n_opt * factor, d_opt / factor) > loss.loss(n_opt, d_opt)


def test_chinchilla_loss_values():
    # Chinchilla itself, 70B parameters on 1.4T tokens: either fit gives about 1.94
    published = LOSS_MODELS["chinchilla-published"]
    assert published.loss(70e9, 1.4e12) == pytest.approx(1.69 + 406.4 / 70e9 ** 0.34 + 410.7 / 1.4e12 ** 0.28)
    for loss in LOSS_MODELS.values():
        assert 1.9 < loss.loss(70e9, 1.4e12) < 2.0


def test_the_default_loss_models_optimum_is_chinchillas_twenty_tokens_a_parameter():
    """`vtrain size` answered with the constants Hoffmann et al. printed, whose optimum is 50-120 tokens per
    parameter (an audit: 25.1B parameters on 2,202B tokens for 1,024 A100s x 30 days at 40 % MFU, where Chinchilla's
    own rule, 20 tokens a parameter, gives 52.5B on 1.05T). Its default is the refit of Chinchilla's data by
    Besiroglu et al. (2024): at Chinchilla's own budget (5.76e23 FLOPs) its optimum is Chinchilla itself, 70B
    parameters on 1.4T tokens (within 15 %); at 1e21 to 1e25 FLOPs 17-22 tokens a parameter."""
    n_opt, d_opt = CHINCHILLA.optimum(5.76e23)
    assert n_opt == pytest.approx(70e9, rel=0.15) and d_opt == pytest.approx(1.4e12, rel=0.15)
    for flops in (1e21, 1e23, 1e25):
        n_opt, d_opt = CHINCHILLA.optimum(flops)
        assert 17 < d_opt / n_opt < 22, (flops, d_opt / n_opt)
    n_opt, d_opt = LOSS_MODELS["chinchilla-published"].optimum(5.76e23)
    assert d_opt / n_opt > 50  # why it is not the default


def test_parameter_counts_of_published_models():
    gpt3 = ModelConfig(layers=96, hidden=12288, heads=96, seq=2048, vocab=50257)
    assert parameter_count(gpt3) / 1e9 == pytest.approx(175, rel=0.01)
    mtnlg = ModelConfig(layers=105, hidden=20480, heads=128, seq=2048, vocab=51200)
    assert parameter_count(mtnlg) / 1e9 == pytest.approx(530, rel=0.01)


def test_gpt_and_llama_shapes_are_counted_by_the_models_own_parameters():
    """One count of parameters: a GPT's is Narayanan et al.'s formula (its output projection the word embedding),
    a LLaMA's the published one (LLaMA 2 70B: 68,976,648,192 parameters in its released weights)."""
    gpt = practice_shapes(2048, 51200)
    assert [parameter_count(m) for m in gpt] == [12 * m.layers * m.hidden ** 2 + 13 * m.layers * m.hidden
                                                 + (m.vocab + m.seq) * m.hidden + 2 * m.hidden for m in gpt]
    llama_2_70b = next(m for m in practice_shapes(4096, 32000, "llama") if m.layers == 80)
    assert parameter_count(llama_2_70b) == 68_976_648_192


def test_a_shape_with_no_plan_is_never_chosen():
    grid = [ModelConfig(layers=24, hidden=2048, heads=16, seq=2048), ModelConfig(layers=40, hidden=5120, heads=40,
                                                                                 seq=2048)]
    def only_small(workload, gpus):
        return Prediction(1e5) if workload.model.hidden == 2048 else None
    sized = size_with_plans(grid, Budget(8, 1, A100_PEAK), only_small, global_batch=512, loss_model=CHINCHILLA)
    assert math.isinf(sized[1].loss) and best(sized).model.hidden == 2048


def test_slower_plans_for_large_models_shift_the_optimum_smaller():
    # MFU falling with model size (as real plans' do) moves the optimum below the fixed-MFU one
    budget = Budget(gpus=1024, days=30, peak_flops=A100_PEAK)
    grid = dense_grid()
    def falling(workload, gpus):
        n = parameter_count(workload.model)
        mfu = 0.5 if n < 5e9 else 0.5 * (5e9 / n) ** 0.3
        return Prediction(gpus * mfu * A100_PEAK / (6 * n))
    planned = best(size_with_plans(grid, budget, falling, global_batch=512, loss_model=CHINCHILLA))
    fixed = best(size_with_fixed_mfu(grid, budget, 0.5, CHINCHILLA))
    assert planned.parameters < fixed.parameters
