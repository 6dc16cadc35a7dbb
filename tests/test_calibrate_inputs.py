"""`autotune calibrate --points` on files it cannot fit, and options it would ignore: one line, exit 2,
nothing written (tests/test_calibration.py has the well-formed inputs' fit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.cli import main

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
SERVE = {"id": "s", "kind": "serve", "model": LLAMA_8B, "gpu": "H100", "requests": 4, "prompt": 100}
SERVE |= {"output": 8, "measured": {"mean_ttft_ms": 50.0}}


def _points_file(tmp_path: Path, *points: dict[str, Any]) -> str:
    path = tmp_path / "points.yaml"
    path.write_text(yaml.safe_dump({"points": list(points)}))
    return str(path)


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The error line of `autotune calibrate ARGV -o tmp/out/cal.yaml` (exit 2, nothing written)."""
    out = tmp_path / "out"
    assert main(["calibrate", *argv, "-o", str(out / "cal.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not out.exists()
    return err


@pytest.mark.parametrize(
    ("point", "needle"),
    [
        pytest.param(
            {"id": "m", "kind": "memory", "model": LLAMA_8B, "gpu": "H100", "measured": {"starts": True}},
            "nothing to fit: the points measure only `starts`",
            id="starts-only",
        ),
        pytest.param(
            {**SERVE, "model": "Qwen/Qwen3-32B", "gpu": "L4"},
            "nothing to fit: the simulator predicts",
            id="no-start",
        ),
        pytest.param({**SERVE, "prompt": 200000}, "nothing to fit: the simulator predicts", id="too-long"),
    ],
)
def test_points_no_constant_depends_on_are_nothing_to_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], point: dict[str, Any], needle: str
) -> None:
    points = _points_file(tmp_path, point)
    assert needle in _refused(tmp_path, capsys, ["--points", points])


def test_points_vllm_would_refuse_are_named_and_left_out_of_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token budget below max_num_seqs, a prompt past max_model_len: beside a point that replays, they
    showed nan% and -100 % in the report, exit 0, no word of why."""
    budget = {**SERVE, "id": "budget", "flags": {"max_num_seqs": 512, "max_num_batched_tokens": 256}}
    long = {**SERVE, "id": "long", "prompt": 200000, "measured": {"output_throughput": 100.0}}
    argv = ["calibrate", "--points", _points_file(tmp_path, SERVE, budget, long), "--max-evaluations", "2"]
    assert main([*argv, "-o", str(tmp_path / "cal.yaml"), "--quiet"]) == 0
    report = capsys.readouterr().out
    assert (
        "warning: point budget is left out of the fit: vLLM refuses its flags: max_num_batched_tokens (256) "
        "must be greater than or equal to max_num_seqs (512)." in report
    ), report
    assert (
        "warning: point long is left out of the fit: vLLM refuses its request 0: This model's maximum "
        "context length is 131072 tokens. However, your request has 200000 input tokens." in report
    ), report
    assert "nan%" not in report and "-100.0%" not in report, report


@pytest.mark.parametrize(
    ("points", "needle"),
    [
        pytest.param(
            [{**SERVE, "concurency": 1}],
            "point 1 (s): unknown key 'concurency' for a serve point",
            id="typo",
        ),
        pytest.param(
            [{**SERVE, "batch": {"prefill": 1}}], "unknown key 'batch' for a serve point", id="kind"
        ),
        pytest.param(
            [{**SERVE, "split": "trian"}],
            "point 1 (s): split must be train or validation, got 'trian'",
            id="split",
        ),
        pytest.param(
            [{**SERVE, "prompt": {"mean": 100, "sigma": 0.5, "max": 0}}],
            "point 1 (s): prompt's max must be a whole number >= 1, got 0",
            id="max-0",
        ),
        pytest.param(
            [{**SERVE, "output": {"mean": 100, "sigma": 0.5, "std": 2}}],
            "point 1 (s): output: unknown key 'std' (mean, sigma, max)",
            id="length-key",
        ),
        pytest.param([SERVE, SERVE], "point 2 (s): id 's' is point 1's too", id="duplicate-id"),
        pytest.param(
            [{**SERVE, "cached": 5}],
            "point 1 (s): cached: expected a mapping with first, rest",
            id="cached-int",
        ),
        pytest.param(
            [{**SERVE, "cached": {"first": 8, "rest": -1}}],
            "point 1 (s): cached: rest must be a whole number",
            id="cached-negative",
        ),
        # an unhashable id crashed with a traceback
        pytest.param([{**SERVE, "id": [1, 2]}], "id must be a name or a number, got [1, 2]", id="id-list"),
        pytest.param(
            [{**SERVE, "rate": 2.0, "concurrency": 4}],
            "point 1 (s): give a rate or a concurrency, not both",
            id="rate-and-concurrency",
        ),
        pytest.param(  # 200 million requests took 7 GB in 45 s before anything was said
            [{**SERVE, "requests": 200_000_000}],
            "point 1 (s): requests must be at most 1,000,000, got 200,000,000",
            id="requests-huge",
        ),
        pytest.param(
            [
                {
                    "id": "z",
                    "kind": "step",
                    "model": LLAMA_8B,
                    "gpu": "H100",
                    "measured": {"step_ms": 5.0},
                    "batch": {"prefill": 0, "decode": 0, "context": 100},
                }
            ],
            "point 1 (z): batch has no token",
            id="step-empty",
        ),  # fmt: skip
    ],
)
def test_a_points_file_key_that_would_be_ignored_or_misread_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], points: list[dict[str, Any]], needle: str
) -> None:
    path = _points_file(tmp_path, *points)
    err = _refused(tmp_path, capsys, ["--points", path])
    assert needle in err and f"points file {path}" in err, err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        pytest.param({"ranking": []}, "unknown key 'ranking' (points, sources, rankings)", id="top-key"),
        # a list of sources crashed with a traceback
        pytest.param({"sources": [1, 2]}, "sources must map source names to descriptions", id="sources-list"),
        pytest.param(
            {"sources": {"lab": {"fitted": "nope"}}},
            "source lab: fitted must be true or false, got 'nope'",
            id="fitted-text",
        ),
    ],
)
def test_a_points_file_part_beside_the_points_that_would_be_misread_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict[str, Any], needle: str
) -> None:
    path = tmp_path / "points.yaml"
    path.write_text(yaml.safe_dump({"points": [SERVE], **extra}))
    err = _refused(tmp_path, capsys, ["--points", str(path)])
    assert needle in err and f"points file {path}" in err, err


@pytest.mark.parametrize("weight", ["nan", "inf", "0"])
def test_a_prior_weight_that_is_not_a_finite_positive_number_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], weight: str
) -> None:
    argv = ["--points", _points_file(tmp_path, SERVE), "--prior-weight", weight]
    assert "--prior-weight must be a finite number > 0" in _refused(tmp_path, capsys, argv)


def test_an_output_that_cannot_be_written_is_refused_before_the_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found only at the end (after the measuring: 1.17 GPU-minutes lost), naming a temp file."""
    points = "benchmarks/fidelity_points.yaml"
    assert main(["calibrate", "--points", points, "--split", "train", "-o", "/proc/calibrate/cal.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("autotune calibrate: error: cannot write /proc/calibrate/cal.yaml: ")
        and "\n" not in err
    )


@pytest.mark.parametrize(
    "extra",
    [
        ["-o", "x.yaml"],
        ["--points", "p.yaml"],
        ["--url", "http://127.0.0.1:1"],
        ["--sim-calibration", "c.yaml"],
    ],
)
def test_print_defaults_refuses_the_options_it_would_ignore(
    capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    assert main(["calibrate", "--print-defaults", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        f"autotune calibrate: error: --print-defaults prints the built-in calibration and takes no other "
        f"option: {extra[0]} given"
    )


@pytest.mark.parametrize(
    ("option", "what"), [("--points", "points file"), ("--sim-calibration", "calibration file")]
)
def test_a_directory_for_a_file_is_named_so_not_not_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, what: str
) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    argv = [option, str(folder)]
    if option != "--points":
        argv += ["--points", _points_file(tmp_path, SERVE)]
    assert f"{what} {folder} is a directory, not a file" in _refused(tmp_path, capsys, argv)


def test_the_output_help_names_the_default_and_the_files_written_next_to_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default runs/calibration-<--model or server>-<gpu>/calibration.yaml" in text
    assert "<stem>-report.txt and <stem>-points.yaml" in text


def test_an_empty_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o ""` silently wrote the default runs/calibration-points/calibration.yaml."""
    monkeypatch.chdir(tmp_path)
    argv = ["calibrate", "--points", _points_file(tmp_path, SERVE), "-o", "", "--max-evaluations", "2"]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "autotune calibrate: error: -o: an empty path: give a file, or leave -o out for the default"
    assert not (tmp_path / "runs").exists()
