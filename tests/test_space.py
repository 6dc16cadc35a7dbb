"""Search-space YAML: parsing, clear errors, vLLM's validity rules, baseline defaults, grids."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from cli import autotune

from autotune.core.config import EngineConfig
from autotune.core.errors import AutotuneError
from autotune.tune.space import Param, load_space, space_from_dict, violations
from autotune.tune.study_open import _same_setting


@pytest.mark.parametrize("name", ["vllm", "small", "tp"])
def test_bundled_spaces_load_and_suggest_valid_types(name: str) -> None:
    space = load_space(name)
    trial = optuna.create_study().ask()
    params = space.suggest(trial)
    assert list(params) == space.names
    config = space.config(params)
    assert config.model == space.model
    for param in space.params:
        assert param.contains(params[param.name]), (param, params[param.name])


def test_fixed_section_and_overrides() -> None:
    space = load_space("vllm").with_overrides(model="Qwen/Qwen2.5-7B-Instruct", gpu="A100-80GB")
    assert space.model == "Qwen/Qwen2.5-7B-Instruct" and space.gpu == "A100-80GB"
    assert space.config({}).max_model_len == 8192  # fixed flag kept
    assert "gpu" not in space.config({}).params()  # the GPU is not a vLLM flag


@pytest.mark.parametrize(
    ("typed", "launched"),
    [
        ("Qwen3-8B", "Qwen/Qwen3-8B"),
        ("qwen3-8b", "Qwen/Qwen3-8B"),  # the catalog's spelling, not only its organization
        ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),  # an org/name id: as given
        ("my-finetune", "my-finetune"),  # not in the catalog: as given (a real backend serves it)
    ],
)
def test_a_catalog_model_typed_without_its_organization_is_launched_and_exported_with_it(
    typed: str, launched: str, tmp_path: Path
) -> None:
    """`vllm serve Qwen3-8B` finds no such model on the Hub: the id a trial launches and the exports
    print carries the organization, from --model or a space file's fixed model."""
    assert load_space("vllm").with_overrides(model=typed).config({}).model == launched
    (tmp_path / "space.yaml").write_text(
        f"fixed: {{model: {typed}}}\nparams: {{max_num_seqs: {{type: int, low: 8, high: 64}}}}\n"
    )
    assert load_space(str(tmp_path / "space.yaml")).model == launched


def test_a_local_model_folder_keeps_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Qwen3-8B").mkdir()  # a folder named like a catalog model, given by a relative path
    monkeypatch.chdir(tmp_path)
    assert load_space("vllm").with_overrides(model="Qwen3-8B").model == str(tmp_path / "Qwen3-8B")
    # a study that recorded the relative path resumes from the folder it ran in
    assert _same_setting("model", "Qwen3-8B", str(tmp_path / "Qwen3-8B"))


def test_baseline_is_vllms_default_for_the_gpu() -> None:
    space = load_space("vllm")
    h100 = space.baseline_params(79.2, 131072)
    assert (h100["max_num_seqs"], h100["max_num_batched_tokens"]) == (1024, 8192)
    assert h100["enable_chunked_prefill"] is True and h100["gpu_memory_utilization"] == 0.9
    a100 = space.with_overrides(gpu="A100-80GB").baseline_params(79.2, 131072)
    assert (a100["max_num_seqs"], a100["max_num_batched_tokens"]) == (256, 2048)


def test_baseline_of_a_tuned_pass_through_flag_is_vllms_default_too(tmp_path: Path) -> None:
    """Not a value the sampler happens to pick: vLLM's own default (eager off, no chunk cap)."""
    (tmp_path / "space.yaml").write_text(
        "params:\n"
        "  enforce_eager: {type: bool}\n"
        "  long_prefill_token_threshold: {type: categorical, choices: [512, 0, 2048]}\n"
    )
    baseline = load_space(tmp_path / "space.yaml").baseline_params(79.2, 131072)
    assert baseline == {"enforce_eager": False, "long_prefill_token_threshold": 0}


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"max-num-seqs": {"type": "int", "low": 1, "high": 2}}, "unknown parameter 'max-num-seqs'"),
        ({"max_num_sequences": {"type": "int", "low": 1, "high": 2}}, "unknown parameter"),
        # gone from vLLM 0.11: `vllm serve` exits "unrecognized arguments" on either
        ({"num_scheduler_steps": {"type": "int", "low": 1, "high": 8}}, "removed with vLLM's V0 engine"),
        ({"max_seq_len_to_capture": {"type": "int", "low": 1, "high": 8}}, "vllm-project/vllm#25543"),
        ({"max_num_seqs": {"type": "int", "low": 10, "high": 2}}, "greater than high"),
        ({"max_num_seqs": {"type": "int", "low": 1.5, "high": 2}}, "low must be an integer"),
        ({"max_num_seqs": {"type": "int", "low": 0, "high": 2, "log": True}}, "log range needs low > 0"),
        # truthiness would read a quoted 'false' (or a 2) as log scale on
        (
            {"max_num_seqs": {"type": "int", "low": 1, "high": 2, "log": "false"}},
            "max_num_seqs: log must be true",
        ),
        ({"gpu_memory_utilization": {"type": "float", "low": 0.8, "high": 0.9, "log": 2}}, "got 2"),
        ({"max_num_seqs": {"type": "integer", "low": 1, "high": 2}}, "unknown type"),
        ({"max_num_seqs": {"type": "int", "low": 1, "high": 2, "choices": [1]}}, "unknown key"),
        ({"block_size": {"type": "categorical", "choices": []}}, "choices must be"),
        ({"block_size": [16, 32]}, "expected a mapping"),
        ({}, "at least one"),
    ],
)
def test_bad_spaces_are_one_line_errors(params: dict, needle: str) -> None:
    with pytest.raises(AutotuneError) as err:
        space_from_dict({"params": params})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_unknown_fixed_flag_and_duplicate_fixed_tuned() -> None:
    with pytest.raises(AutotuneError, match="unknown parameter 'turbo'"):
        space_from_dict({"fixed": {"turbo": True}, "params": {"block_size": {"type": "bool"}}})
    with pytest.raises(AutotuneError, match="both fixed and tuned"):
        space_from_dict({"fixed": {"block_size": 16}, "params": {"block_size": {"type": "bool"}}})


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(AutotuneError, match="not found"):
        load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("params:\n  max_num_seqs: {type: int, low: 1\n")
    with pytest.raises(AutotuneError, match="malformed YAML"):
        load_space(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(AutotuneError, match="expected a mapping"):
        load_space(scalar)


def test_validity_rules_match_vllm_messages() -> None:
    ok = EngineConfig(model="m", max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=8192)
    assert violations(ok) == []
    small_budget = ok.replace(max_num_batched_tokens=128)
    assert violations(small_budget) == [
        "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)."
    ]
    no_chunk = ok.replace(enable_chunked_prefill=False, max_num_batched_tokens=4096)
    assert "is smaller than max_model_len (8192)" in violations(no_chunk)[0]
    # vLLM checks a prefill cap longer than max_model_len only for concurrent partial prefills
    assert violations(ok.replace(long_prefill_token_threshold=10000)) == []
    concurrent = ok.replace(long_prefill_token_threshold=10000, max_num_partial_prefills=2)
    assert violations(concurrent)[0] == (
        "long_prefill_token_threshold (10000) cannot be greater than the max_model_len (8192)."
    )
    # max_model_len from the model when the config leaves it unset; unknown model: rule skipped
    unset = no_chunk.replace(max_model_len=None)
    assert violations(unset, max_position_embeddings=131072)
    assert violations(unset, max_position_embeddings=None) == []


def test_grid_values() -> None:
    space = load_space("small")
    grid = space.grid()
    assert grid["max_num_seqs"] == [16, 32, 64, 128, 256, 512, 1024]
    assert grid["gpu_memory_utilization"][0] == 0.85 and grid["gpu_memory_utilization"][-1] == 0.95
    assert len(grid["gpu_memory_utilization"]) == 11


def test_baseline_outside_the_space_takes_the_nearest_allowed_value() -> None:
    space = load_space("tp")  # tensor_parallel_size choices [2, 4]; vLLM's default is 1
    baseline = space.baseline_params(79.2, 131072)
    assert baseline["tensor_parallel_size"] == 2
    assert baseline["max_num_seqs"] == 256 and baseline["max_num_batched_tokens"] == 2048  # A100 defaults
    assert all(p.contains(baseline[p.name]) for p in space.params)


@pytest.mark.parametrize(
    ("name", "spec", "needle"),
    [
        (
            "max_num_seqs",
            {"low": 16, "high": 100, "step": 32},
            "high 100 is not low + a multiple of step 32: use 80 or 112",
        ),
        (
            "gpu_memory_utilization",
            {"low": 0.8, "high": 0.95, "step": 0.04},
            "high 0.95 is not low + a multiple of step 0.04: use 0.92 or 0.96",
        ),
        # a high past what vLLM takes is not offered
        (
            "gpu_memory_utilization",
            {"low": 0.9, "high": 0.99, "step": 0.04},
            "high 0.99 is not low + a multiple of step 0.04: use 0.98",
        ),
    ],
)
def test_a_step_that_misses_high_is_refused_with_the_nearest_highs(
    name: str, spec: dict, needle: str
) -> None:
    """Optuna would cut the range to its last step (four raw warnings) and the baseline run past it."""
    kind = "int" if isinstance(spec["step"], int) else "float"
    with pytest.raises(AutotuneError) as err:
        space_from_dict({"params": {name: {"type": kind, **spec}}})
    assert str(err.value).endswith(f"{name}: {needle}") and "\n" not in str(err.value)


def test_a_float_step_lands_on_high_within_rounding() -> None:
    """0.1 + 2 * 0.1 is 0.30000000000000004: high 0.3 is on the lattice, and Optuna is given 0.3."""
    spec = {"type": "float", "low": 0.1, "high": 0.3, "step": 0.1}
    param = space_from_dict({"params": {"gpu_memory_utilization": spec}}).params[0]
    assert param.high == 0.3 and param.grid_values() == [0.1, 0.2, 0.3]


def _param(space: str, name: str) -> Param:
    return next(p for p in load_space(space).params if p.name == name)


STEPPED = (
    "fixed: {model: meta-llama/Llama-3.1-8B-Instruct, gpu: H100, max_model_len: 4096}\n"
    "params:\n"
    "  gpu_memory_utilization: {type: float, low: 0.80, high: 0.96, step: 0.04}\n"
    "  max_num_seqs: {type: int, low: 16, high: 1040, step: 64}\n"
)


def test_a_default_off_the_step_lattice_takes_its_nearest_step() -> None:
    """vLLM's 0.9 is not on 0.80..0.96 by 0.04 (a tie: it goes up), nor 1024 on 16..1040 by 64."""
    gmu, seqs = space_from_dict(yaml.safe_load(STEPPED)).params
    assert not gmu.contains(0.9) and gmu.contains(0.92) and gmu.nearest(0.9) == 0.92
    assert not seqs.contains(1024) and seqs.contains(1040) and seqs.nearest(1024) == 1040
    assert seqs.nearest(20) == 16 and seqs.nearest(5000) == 1040 and gmu.nearest(0.5) == 0.8
    # a log range has no lattice; a float a rounding off a step is on it
    log = space_from_dict({"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True}}})
    assert log.params[0].contains(100) and _param("vllm", "gpu_memory_utilization").contains(0.8 + 10 * 0.01)


def test_a_baseline_moved_onto_the_step_lattice_is_named_so_and_optuna_takes_it(tmp_path: Path) -> None:
    """The baseline ran vLLM's off-lattice 0.9 and 1024 under raw Optuna warnings ("Fixed parameter ...
    is out of range"), labelled as vLLM's defaults: it runs the nearest steps and says so."""
    (tmp_path / "space.yaml").write_text(STEPPED)
    (tmp_path / "tiny.yaml").write_text(
        "name: tiny\nnum_requests: 40\nload: fixed\nrequest_rate: 10\nprompt_len: {dist: fixed, mean: 64}\n"
        "output_len: {dist: fixed, mean: 16}\n"
    )
    args = ["--space", "space.yaml", "--workload", "tiny.yaml", "--n-trials", "2", "--study", "m", "--quiet"]
    done = autotune(tmp_path, "run", *args, "--slo", "ttft_p99=2s")
    assert "Warning" not in done.stderr, done.stderr
    moved = "vLLM's defaults at gpu_memory_utilization=0.92, max_num_seqs=1040"
    assert f"the baseline is {moved}:" in done.stderr
    best = json.loads((tmp_path / "runs/m/best.json").read_text())
    assert best["baseline"]["label"] == moved
