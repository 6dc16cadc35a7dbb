"""Bad inputs whose one line names what is wrong: a --set or a file's key given twice, a directory given
for a file, goodput without an SLO it counts, a tensor-parallel size or max_model_len the GPUs or the
model cannot take, an unknown flag, a bad trace timestamp, an option the command would ignore, a
time-scaled sim-server as the launched server, an export tag that is not Docker's.

Each runs the CLI in process as the table of tests/test_bad_inputs.py does: exit 2, one line, nothing
written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from errors import assert_rejected
from test_bad_inputs import HF_CONFIG, SPACE, WORKLOAD, space

SIM_SERVER = f"{sys.executable} -m autotune.cli sim-server"


def test_a_repeated_set_names_the_flag_and_both_values(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["bench", "--rate", "5", "--set", "max_num_seqs=8", "--set", "max_num_seqs=16"]
    line = assert_rejected(argv, {}, tmp_path, capfd, monkeypatch)
    assert "--set max_num_seqs given twice (8 and 16)" in line


@pytest.mark.parametrize(
    ("argv", "files", "named"),
    [
        (
            ["run", "--space", "{tmp}/s.yaml"],
            {"s.yaml": SPACE + "  max_num_seqs: {type: int, low: 16, high: 32}\n"},
            "search space {tmp}/s.yaml: key 'max_num_seqs' given twice (lines 2 and 3)",
        ),
        (
            ["run", "--workload", "{tmp}/w.yaml"],
            {"w.yaml": WORKLOAD + "request_rate: 5\nrequest_rate: 10\n"},
            "workload {tmp}/w.yaml: key 'request_rate' given twice (lines 4 and 5)",
        ),
        (
            ["run", "--objectives", "{tmp}/o.yaml"],
            {"o.yaml": "objectives:\n  - {metric: p99_ttft_ms, direction: maximize, direction: minimize}\n"},
            "objectives {tmp}/o.yaml: key 'direction' given twice (line 2)",
        ),
    ],
    ids=["space", "workload", "objectives"],
)
def test_a_key_given_twice_names_the_file_the_key_and_its_lines(
    argv: list[str],
    files: dict[str, str | bytes],
    named: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyYAML keeps the last of two equal keys: the first range or rate would be dropped unseen."""
    line = assert_rejected(argv, files, tmp_path, capfd, monkeypatch)
    assert named.replace("{tmp}", str(tmp_path)) in line


@pytest.mark.parametrize(
    ("option", "what"),
    [("--space", "search space"), ("--workload", "workload"), ("--objectives", "objectives")],
)
def test_a_directory_given_for_a_file_is_named_a_directory_not_missing(
    option: str, what: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = assert_rejected(["run", option, "{tmp}/d"], {"d/x.yaml": SPACE}, tmp_path, capfd, monkeypatch)
    assert f"{what} {tmp_path / 'd'} is a directory, not a file" in line


GOODPUT = "objectives:\n  - {metric: request_goodput, direction: maximize}\n"


@pytest.mark.parametrize(
    ("argv", "files"),
    [
        (["run", "--objectives", "{tmp}/o.yaml"], {"o.yaml": GOODPUT}),
        (["run", "--objectives", "{tmp}/o.yaml", "--slo", "itl_p99=50ms"], {"o.yaml": GOODPUT}),
        (
            ["run", "--objectives", "{tmp}/o.yaml"],
            {"o.yaml": GOODPUT.replace("goodput", "goodput_per_gpu") + "slos: [itl_p99=50ms]\n"},
        ),
    ],
    ids=["no-slo", "itl-slo-flag", "itl-slo-in-file"],
)
def test_goodput_without_an_slo_it_counts_is_refused(
    argv: list[str],
    files: dict[str, str | bytes],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Goodput counts requests meeting the ttft/tpot/e2el SLOs: without one every trial reads 0."""
    line = assert_rejected(argv, files, tmp_path, capfd, monkeypatch)
    assert "needs an SLO on ttft, tpot, e2el (--slo or the file's slos)" in line
    # with one it counts, the objectives pass: the run stops at the next bad input, an unknown GPU
    line = assert_rejected(
        [*argv, "--slo", "ttft_p99=2s", "--gpu", "B9000"], {}, tmp_path, capfd, monkeypatch
    )
    assert "goodput" not in line and "B9000" in line


def test_a_space_whose_every_tp_needs_more_gpus_than_given_is_refused_before_the_study(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = assert_rejected(["run", "--space", "tp", "--gpus", "1"], {}, tmp_path, capfd, monkeypatch)
    assert line.endswith("error: tensor_parallel_size 2..4 needs 2..4 GPUs; --gpus gives 1")


@pytest.mark.parametrize(
    ("argv", "files", "needle"),
    [
        (
            ["run", "--space", "{tmp}/s.yaml"],
            space("  max_num_seqs: {type: int, low: 16, high: 64}", "  max_model_len: 1000000"),
            "max_model_len 1000000 is more than meta-llama/Llama-3.1-8B-Instruct's context "
            "(max_position_embeddings 131072)",
        ),
        (  # a local model whose config.json allows 8192 tokens, a space tuning 16384 to 32768
            ["run", "--space", "{tmp}/s.yaml", "--model", "{tmp}/m"],
            {
                **space("  max_model_len: {type: categorical, choices: [16384, 32768]}"),
                "m/config.json": HF_CONFIG % (32, ""),
            },
            "max_model_len 16384..32768 is more than",
        ),
    ],
    ids=["fixed-catalog-model", "tuned-local-model"],
)
def test_a_max_model_len_past_the_models_context_is_refused_before_the_study(
    argv: list[str],
    files: dict[str, str | bytes],
    needle: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = assert_rejected(argv, files, tmp_path, capfd, monkeypatch)
    assert needle in line and "lower max_model_len to" in line


@pytest.mark.parametrize("command", ["run", "bench", "sim-server"])
def test_an_unknown_flag_points_to_its_commands_help(
    command: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subcommand's --help lists its flags; the top level's names none of them."""
    line = assert_rejected([command, "--no-such-flag"], {}, tmp_path, capfd, monkeypatch)
    assert line == (
        f"autotune {command}: error: unrecognized arguments: --no-such-flag (see autotune {command} --help)"
    )


def test_a_bad_trace_timestamp_names_the_file_and_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = "TIMESTAMP,ContextTokens,GeneratedTokens\n0,9,3\nsoon,9,3\n"
    files = {"w.yaml": "num_requests: 2\ntrace: t.csv\n", "t.csv": trace}
    line = assert_rejected(["run", "--workload", "{tmp}/w.yaml"], files, tmp_path, capfd, monkeypatch)
    assert f"trace {tmp_path / 't.csv'} line 3: TIMESTAMP 'soon' is neither seconds (a number) nor" in line


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["run", "--serve-cmd", "autotune sim-server"], "--serve-cmd needs --backend vllm"),
        (["run", "--backend", "docker", "--serve-cmd", "vllm serve -q"], "--serve-cmd needs --backend vllm"),
        (["run", "--image", "my/vllm:1"], "--image needs --backend docker"),
        (["run", "--startup-timeout", "60"], "--startup-timeout needs --backend vllm|docker"),
        (["run", "--backend", "vllm", "--noise"], "--noise needs --backend sim"),
        (["run", "--trial-timeout", "60"], "--trial-timeout needs --backend vllm|docker, or --gpus/--ray"),
        (["bench", "--serve-cmd", "autotune sim-server"], "--serve-cmd needs --backend vllm"),
        (
            ["bench", "--backend", "vllm", "--sim-calibration", "c.yaml"],
            "--sim-calibration needs --backend sim",
        ),
        (["bench", "--max-probes", "3"], "--max-probes needs --capacity"),
        (
            ["bench", "--min-window", "5", "--min-window-requests", "9"],
            "--min-window, --min-window-requests need",
        ),
        (
            ["calibrate", "--url", "http://127.0.0.1:9", "--serve-cmd", "x"],
            "--serve-cmd needs --backend vllm",
        ),
        (
            ["calibrate", "--url", "http://127.0.0.1:9", "--image", "my/vllm:1"],
            "--image needs --backend docker",
        ),
        (["calibrate", "--backend", "vllm", "--image", "my/vllm:1"], "--image needs --backend docker"),
        (["calibrate", "--url", "http://127.0.0.1:9", "--gpus", "2"], "--gpus needs --backend vllm|docker"),
        (["calibrate", "--url", "http://127.0.0.1:9", "--split", "train"], "--split needs --points"),
        (["calibrate", "--points", "p.yaml", "--gpu", "H100"], "--gpu needs --url or --backend"),
        (["export", "{tmp}", "--replicas", "3"], "--replicas needs --format k8s|helm"),
        (["export", "{tmp}", "--format", "docker", "--replicas", "3"], "--replicas needs --format k8s|helm"),
        (["export", "{tmp}", "--format", "yaml", "--tag", "v1"], "--tag needs --format docker|k8s|helm"),
        (["export", "{tmp}", "--secret", "hf"], "--secret needs --format k8s|helm"),
    ],
)
def test_an_option_the_command_would_ignore_names_what_it_needs(
    argv: list[str],
    named: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Silently ignored, --serve-cmd without --backend vllm would run the simulator in process and exit 0."""
    line = assert_rejected(argv, {}, tmp_path, capfd, monkeypatch)
    assert named in line


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--backend", "vllm", "--serve-cmd", f"{SIM_SERVER} --time-scale 20"],
        ["run", "--backend", "vllm", "--serve-cmd", f"{SIM_SERVER} --time-scale=20", "--gpus", "1"],
        ["bench", "--backend", "vllm", "--serve-cmd", f"{SIM_SERVER} --time-sc 20"],  # a prefix: argparse's
    ],
)
def test_a_time_scaled_sim_server_is_refused_as_a_launched_server(
    argv: list[str], tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its clock runs 20x the simulated GPU's: a run would report 20x the GPU's throughput as measured."""
    line = assert_rejected(argv, {}, tmp_path, capfd, monkeypatch)
    assert "--serve-cmd runs sim-server at --time-scale 20: a launched server is measured on its own" in line


@pytest.mark.parametrize("tag", ["bad tag", "-v1", "v1:x", "a" * 129])
def test_an_export_tag_must_be_a_docker_tag(
    tag: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = assert_rejected(
        ["export", "{tmp}", "--format", "docker", f"--tag={tag}"], {}, tmp_path, capfd, monkeypatch
    )
    assert "argument --tag:" in line and "is not a Docker image tag" in line


@pytest.mark.parametrize("command", ["run", "bench", "calibrate"])
@pytest.mark.parametrize("image", ["", "UPPER:1", "a b"])
def test_a_launched_image_must_be_a_docker_reference(
    command: str,
    image: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused before anything starts, as `export --image` refuses it: the engine would answer late
    with a traceback ('') or a bare 400 Bad Request (upper case)."""
    line = assert_rejected(
        [command, "--backend", "docker", f"--image={image}"], {}, tmp_path, capfd, monkeypatch
    )
    assert "argument --image:" in line and f"{image!r} is not a Docker image reference" in line
