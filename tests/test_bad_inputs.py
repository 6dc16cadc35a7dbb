"""Every bad input a user can give: one line on stderr, exit 2, nothing written (the issue-11 table).

Each case drives the real `autotune` CLI in process (`autotune.cli.main`, the console script's entry):
files it needs are written to a temporary folder first, and the runs folder must not exist afterwards
(tests/errors.py's `assert_rejected`). What the line says of particular inputs:
tests/test_bad_input_messages.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from errors import assert_rejected

SPACE = "params:\n  max_num_seqs: {type: int, low: 16, high: 64}\n"
WORKLOAD = "num_requests: 4\nprompt_len: 64\noutput_len: 8\n"
OBJECTIVES = "objectives:\n  - {metric: output_throughput, direction: maximize}\n"
BINARY = bytes(range(256)) * 4
HF_CONFIG = (
    '{"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": %s, "num_key_value_heads": 8, '
    '"intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192%s}'
)


def space(params: str, fixed: str = "") -> dict[str, str | bytes]:
    """A search-space file `s.yaml` with these params (and fixed flags)."""
    return {"s.yaml": (f"fixed:\n{fixed}\n" if fixed else "") + f"params:\n{params}\n"}


# (id, argv, files): `{tmp}` in an argument is the case's temporary folder.
CASES: list[tuple[str, list[str], dict[str, str | bytes]]] = [
    # -- autotune bench --set -------------------------------------------------------------------------
    ("set-seqs-abc", ["bench", "--set", "max_num_seqs=abc"], {}),
    ("set-seqs-0", ["bench", "--set", "max_num_seqs=0"], {}),
    ("set-seqs-float", ["bench", "--set", "max_num_seqs=1.5"], {}),
    ("set-gmu-nan", ["bench", "--set", "gpu_memory_utilization=nan"], {}),
    ("set-gmu-2", ["bench", "--set", "gpu_memory_utilization=2"], {}),
    ("set-tp-0", ["bench", "--set", "tensor_parallel_size=0"], {}),
    ("set-chunked-maybe", ["bench", "--set", "enable_chunked_prefill=maybe"], {}),
    ("set-maxlen-0", ["bench", "--set", "max_model_len=0"], {}),
    ("set-block-x", ["bench", "--set", "block_size=x"], {}),
    ("set-no-value", ["bench", "--set", "max_num_seqs"], {}),
    ("set-unknown", ["bench", "--set", "max_num_seq=8"], {}),
    ("set-twice", ["bench", "--set", "max_num_seqs=8", "--set", "max_num_seqs=16"], {}),
    ("set-twice-dashes", ["bench", "--set", "max_num_seqs=8", "--set", "max-num-seqs=8"], {}),
    (
        "bench-prompt-too-long",
        ["bench", "--workload", "{tmp}/w.yaml", "--set", "max_model_len=1024"],
        {"w.yaml": "num_requests: 2\nprompt_len: 2000\noutput_len: 8\n"},
    ),
    # -- search spaces -------------------------------------------------------------------------------
    ("space-fixed-list", ["run", "--space", "{tmp}/s.yaml"], {"s.yaml": "fixed: [1, 2]\n" + SPACE}),
    ("space-fixed-string", ["run", "--space", "{tmp}/s.yaml"], {"s.yaml": "fixed: abc\n" + SPACE}),
    (
        "space-negative",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: -5, high: 64}"),
    ),
    (
        "space-nan",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  gpu_memory_utilization: {type: float, low: .nan, high: 0.9}"),
    ),
    (
        "space-inf",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_batched_tokens: {type: float, low: 1, high: .inf}"),
    ),
    (
        "space-float-on-int",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: float, low: 16, high: 64}"),
    ),
    (
        "space-gmu-over-1",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  gpu_memory_utilization: {type: float, low: 0.8, high: 1.5}"),
    ),
    (
        "space-gmu-fixed-0",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 16, high: 64}", "  gpu_memory_utilization: 0"),
    ),
    (
        "space-block-strings",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  block_size: {type: categorical, choices: ['16', x]}"),
    ),
    (
        "space-step-too-big",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 16, high: 64, step: 100}"),
    ),
    (
        "space-bool-choices",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  enable_chunked_prefill: {type: categorical, choices: [yes, maybe]}"),
    ),
    (
        "space-fixed-seqs-str",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  block_size: {type: categorical, choices: [16, 32]}", "  max_num_seqs: many"),
    ),
    (
        "space-log-quoted",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 16, high: 64, log: 'false'}"),
    ),
    ("space-params-list", ["run", "--space", "{tmp}/s.yaml"], {"s.yaml": "params: [1, 2]\n"}),
    ("space-binary", ["run", "--space", "{tmp}/s.yaml"], {"s.yaml": BINARY}),
    ("space-missing", ["run", "--space", "{tmp}/nope.yaml"], {}),
    # -- workloads -----------------------------------------------------------------------------------
    (
        "workload-1e11",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 1e11\nprompt_len: 64\noutput_len: 8\n"},
    ),
    ("workload-binary", ["run", "--workload", "{tmp}/w.yaml"], {"w.yaml": BINARY}),
    (
        "workload-rate-nan",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": WORKLOAD + "request_rate: .nan\n"},
    ),
    (
        "workload-exceeds-max-model-len",
        ["run", "--space", "small", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\nprompt_len: 9000\noutput_len: 8\n"},
    ),
    (
        "workload-exceeds-model",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\nprompt_len: 200000\noutput_len: 8\n"},
    ),
    ("workload-missing", ["run", "--workload", "nope"], {}),
    # -- run options ---------------------------------------------------------------------------------
    ("gpus-huge", ["run", "--gpus", "1000000000"], {}),
    ("gpus-comma", ["run", "--gpus", ","], {}),
    ("gpus-negative", ["run", "--gpus", "-1"], {}),
    ("gpus-dup", ["run", "--gpus", "0,0"], {}),
    # a fixed load is not guided, which the run says before it starts: not before a bad --gpus' line
    ("gpus-dup-fixed-load", ["run", "--backend", "vllm", "--gpus", "0,0", "--load", "fixed"], {}),
    ("timeout-negative", ["run", "--timeout", "-5"], {}),
    ("timeout-nan", ["run", "--timeout", "nan"], {}),
    ("trial-timeout-negative", ["run", "--trial-timeout", "-1"], {}),
    ("trial-timeout-0", ["run", "--trial-timeout", "0"], {}),
    ("startup-timeout-0", ["run", "--startup-timeout", "0"], {}),
    ("n-trials-0", ["run", "--n-trials", "0"], {}),
    ("parallel-0", ["run", "--parallel", "0"], {}),
    ("parallel-huge", ["run", "--parallel", "100000"], {}),
    ("seed-negative", ["run", "--seed", "-1"], {}),
    ("study-bad-name", ["run", "--study", "../x"], {}),
    ("model-unknown", ["run", "--model", "no/such-model"], {}),
    ("gpu-unknown", ["run", "--gpu", "B9000"], {}),
    ("slo-duplicate", ["run", "--slo", "ttft_p99=2s,ttft_p99=1s"], {}),
    ("slo-empty", ["run", "--slo", ""], {}),
    ("slo-comma", ["run", "--slo", ","], {}),
    ("slo-zero", ["run", "--slo", "ttft_p99=0s"], {}),
    ("slo-metric", ["run", "--slo", "foo_p99=2s"], {}),
    ("slo-no-unit", ["run", "--slo", "ttft_p99=2"], {}),
    ("serve-cmd-quotes", ["run", "--backend", "vllm", "--serve-cmd", "vllm 'serve"], {}),
    ("serve-cmd-empty", ["run", "--backend", "vllm", "--serve-cmd", ""], {}),
    ("serve-cmd-missing", ["run", "--backend", "vllm", "--serve-cmd", "no-such-binary-xyz serve"], {}),
    ("storage-garbage", ["run", "--storage", "foo://bar"], {}),
    ("storage-password", ["run", "--storage", "postgresql://u:hunter2pass@127.0.0.1:1/db"], {}),
    ("storage-dir", ["run", "--storage", "sqlite:///{tmp}"], {}),
    ("runs-dir-file", ["run", "--runs-dir", "{tmp}/f"], {"f": "x"}),
    # -- objectives ----------------------------------------------------------------------------------
    ("objectives-slos-5", ["run", "--objectives", "{tmp}/o.yaml"], {"o.yaml": OBJECTIVES + "slos: 5\n"}),
    ("objectives-unknown-key", ["run", "--objectives", "{tmp}/o.yaml"], {"o.yaml": OBJECTIVES + "slo: []\n"}),
    (
        "objectives-dup-slo",
        ["run", "--objectives", "{tmp}/o.yaml"],
        {"o.yaml": OBJECTIVES + "slos: [ttft_p99=2s, ttft_p99=3s]\n"},
    ),
    ("objectives-binary", ["run", "--objectives", "{tmp}/o.yaml"], {"o.yaml": BINARY}),
    ("objectives-empty", ["run", "--objectives", "{tmp}/o.yaml"], {"o.yaml": ""}),
    # -- a local Hugging Face model folder -----------------------------------------------------------
    ("model-zero-heads", ["run", "--model", "{tmp}/m"], {"m/config.json": HF_CONFIG % (0, "")}),
    (
        "model-text-config-list",
        ["run", "--model", "{tmp}/m"],
        {"m/config.json": HF_CONFIG % (32, ', "text_config": [1]')},
    ),
    ("model-config-binary", ["run", "--model", "{tmp}/m"], {"m/config.json": BINARY}),
    # -- other commands ------------------------------------------------------------------------------
    (
        "dashboard-port",
        ["dashboard", "{tmp}/r", "--port", "99999"],
        {"r/run.json": '{"study": "x", "storage": "sqlite:///x.db"}'},
    ),
    ("sim-server-port", ["sim-server", "meta-llama/Llama-3.1-8B-Instruct", "--port", "99999"], {}),
    ("export-not-a-run", ["export", "{tmp}"], {}),
    ("export-bad-run-json", ["export", "{tmp}/r"], {"r/run.json": BINARY}),
    # -- more workload fields ------------------------------------------------------------------------
    (
        "workload-prompt-negative",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\nprompt_len: -5\noutput_len: 8\n"},
    ),
    (
        "workload-output-0",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\nprompt_len: 5\noutput_len: 0\n"},
    ),
    (
        "workload-rate-negative",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": WORKLOAD + "request_rate: -1\n"},
    ),
    (
        "workload-burstiness-0",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": WORKLOAD + "burstiness: 0\n"},
    ),
    (
        "workload-concurrency-0",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": WORKLOAD + "max_concurrency: 0\n"},
    ),
    ("workload-seed-negative", ["run", "--workload", "{tmp}/w.yaml"], {"w.yaml": WORKLOAD + "seed: -1\n"}),
    ("workload-seed-float", ["run", "--workload", "{tmp}/w.yaml"], {"w.yaml": WORKLOAD + "seed: 1.5\n"}),
    (
        "workload-num-abc",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: abc\nprompt_len: 5\noutput_len: 5\n"},
    ),
    (
        "workload-lognormal-no-mean",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\nprompt_len: {dist: lognormal, sigma: 0.5}\noutput_len: 8\n"},
    ),
    (
        "workload-std-of-lognormal",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\nprompt_len: {dist: lognormal, mean: 64, std: 9}\noutput_len: 8\n"},
    ),
    (
        "workload-trace-missing",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\ntrace: nope.csv\n"},
    ),
    (
        "workload-trace-binary",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\ntrace: t.csv\n", "t.csv": BINARY},
    ),
    (
        "workload-jsonl-binary",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": "num_requests: 4\njsonl: p.jsonl\noutput_len: 4\n", "p.jsonl": BINARY},
    ),
    ("workload-list", ["run", "--workload", "{tmp}/w.yaml"], {"w.yaml": "[1, 2]\n"}),
    ("workload-is-dir", ["run", "--workload", "{tmp}"], {}),
    ("workload-load-bogus", ["run", "--workload", "{tmp}/w.yaml"], {"w.yaml": WORKLOAD + "load: bogus\n"}),
    # -- more options --------------------------------------------------------------------------------
    ("n-trials-negative", ["run", "--n-trials", "-1"], {}),
    ("n-trials-huge", ["run", "--n-trials", "99999999999999999999999"], {}),  # it ran as "0/9999..."
    ("n-trials-abc", ["run", "--n-trials", "abc"], {}),
    ("load-bogus", ["run", "--load", "bogus"], {}),
    ("sampler-bogus", ["run", "--sampler", "bogus"], {}),
    ("backend-bogus", ["run", "--backend", "bogus"], {}),
    ("timeout-inf", ["run", "--timeout", "inf"], {}),
    ("gpus-word", ["run", "--gpus", "two"], {}),
    ("gpus-99999", ["run", "--gpus", "99999"], {}),
    ("storage-missing-dir", ["run", "--storage", "sqlite:///{tmp}/no/such/x.db"], {}),
    (
        "storage-not-sqlite-file",
        ["run", "--storage", "sqlite:///{tmp}/x.db", "--resume"],
        {"x.db": "not a db"},
    ),
    (
        "resume-zero-byte",
        ["run", "--study", "z", "--resume", "--runs-dir", "{tmp}/runs"],
        {"runs/z/study.db": ""},
    ),
    ("resume-no-such-study", ["run", "--study", "never-existed", "--resume"], {}),
    ("space-is-dir", ["run", "--space", "{tmp}"], {}),
    ("space-param-no-type", ["run", "--space", "{tmp}/s.yaml"], space("  max_num_seqs: {low: 1, high: 8}")),
    (
        "space-both-fixed-and-tuned",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 16, high: 64}", "  max_num_seqs: 32"),
    ),
    (
        "space-huge-int-as-string",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 1, high: 1e12}"),
    ),
    (
        "space-tp-0",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  tensor_parallel_size: {type: categorical, choices: [0, 1]}"),
    ),
    (
        "objectives-list-of-strings",
        ["run", "--objectives", "{tmp}/o.yaml"],
        {"o.yaml": "objectives: [output_throughput]\n"},
    ),
    (
        "objectives-bad-direction",
        ["run", "--objectives", "{tmp}/o.yaml"],
        {"o.yaml": "objectives:\n  - {metric: output_throughput, direction: up}\n"},
    ),
    ("bench-capacity-rate", ["bench", "--capacity", "--rate", "5"], {}),
    ("bench-capacity-concurrency", ["bench", "--capacity", "--concurrency", "32"], {}),
    ("run-capacity-concurrency-workload", ["run", "--load", "capacity", "--workload", "concurrency"], {}),
    ("bench-model-unknown", ["bench", "--model", "no/such"], {}),
    ("bench-gpu-unknown", ["bench", "--gpu", "B9000"], {}),
    ("bench-slo-bad", ["bench", "--slo", "ttft_p99=fast"], {}),
    ("bench-workload-missing", ["bench", "--workload", "nope"], {}),
    ("sim-server-no-model", ["sim-server"], {}),
    (
        "sim-server-gpu-unknown",
        ["sim-server", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "B9000", "--port", "0"],
        {},
    ),
    (
        "export-trial-missing",
        ["export", "{tmp}/r", "--trial", "7"],
        {"r/run.json": '{"study": "x", "storage": "sqlite:///study.db"}'},
    ),
    ("export-format-bogus", ["export", "{tmp}", "--format", "bogus"], {}),
    ("dashboard-not-a-run", ["dashboard", "{tmp}"], {}),
    ("no-command", [], {}),
    ("unknown-command", ["tune"], {}),
]


@pytest.mark.parametrize(("argv", "files"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(
    argv: list[str],
    files: dict[str, str | bytes],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert_rejected(argv, files, tmp_path, capfd, monkeypatch)
