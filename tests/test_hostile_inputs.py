"""The hostile try's bad inputs: NaN, inf, empty and huge values, flags vLLM refuses, files nested or
aliased without end, edited run.json files, `bench --url` and `sim-server` options. Each is one line
on stderr, exit 2, nothing written (the table of test_bad_inputs.py, run the same way).

The inputs that need a process or a server to try (alias bombs, special files, a server that is not
OpenAI's, `--gpus 0`): tests/test_hostile_runs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from errors import assert_rejected
from test_bad_inputs import HF_CONFIG, space

WORKLOAD = "num_requests: 4\nprompt_len: 64\noutput_len: 8\n"
PARAM = "  max_num_seqs: {type: int, low: 16, high: 64}"
DEEP = "[" * 5000 + "]" * 5000
RUN_JSON = '{"study": "x", "storage": "sqlite:///study.db"}'
MODEL_CONFIG = HF_CONFIG.replace(
    '"num_hidden_layers": 32', '"num_hidden_layers": %s'
)  # layers, heads, extra keys

CASES: list[tuple[str, list[str], dict[str, str | bytes], str]] = [
    # -- numbers and text on the command line -------------------------------------------------------
    (
        "gpu-price-nan",
        ["run", "--gpu-price", "nan"],
        {},
        "argument --gpu-price: value must be a number, got 'nan'",
    ),
    (
        "gpu-price-inf",
        ["run", "--gpu-price", "inf"],
        {},
        "argument --gpu-price: value must be a finite number",
    ),
    (
        "target-rate-nan",
        ["run", "--target-rate", "nan"],
        {},
        "argument --target-rate: value must be a number",
    ),
    (
        "target-rate-inf",
        ["run", "--target-rate", "inf"],
        {},
        "argument --target-rate: value must be a finite number",
    ),
    ("seed-2^32", ["run", "--seed", "4294967296"], {}, "argument --seed: value must be <= 4,294,967,295"),
    ("bench-seed-negative", ["bench", "--seed", "-1"], {}, "argument --seed: value must be >= 0"),
    ("model-empty", ["run", "--model", ""], {}, "argument --model: value must not be empty"),
    ("gpu-empty", ["run", "--gpu", ""], {}, "argument --gpu: value must not be empty"),
    ("study-empty", ["run", "--study", ""], {}, "argument --study: value must not be empty"),
    ("storage-empty", ["run", "--storage", ""], {}, "argument --storage: value must not be empty"),
    ("study-300-chars", ["run", "--study", "x" * 300], {}, "300 characters, at most 100"),
    (
        "storage-in-memory",
        ["run", "--storage", "sqlite://"],
        {},
        "in-memory SQLite database ends with the run",
    ),
    (
        "slo-400-digits",
        ["run", "--slo", "ttft_p99=" + "9" * 400 + "s"],
        {},
        "the limit must be between 1 microsecond and 1 day",
    ),
    (
        "slo-1e-5ms",
        ["run", "--slo", "ttft_p99=0.00001ms"],
        {},
        "the limit must be between 1 microsecond and 1 day",
    ),
    (
        "slo-1e6s",
        ["run", "--slo", "ttft_p99=1000000s"],
        {},
        "the limit must be between 1 microsecond and 1 day",
    ),
    (
        "workload-rate-1e-300",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": WORKLOAD + "request_rate: 1.0e-300\n"},
        "request_rate must be between 0.001 and 1e+06",
    ),
    (
        "workload-seed-2^32",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": WORKLOAD + "seed: 4294967296\n"},
        "seed must be <= 4,294,967,295",
    ),
    # -- flags vLLM refuses ----------------------------------------------------------------------------
    (
        "space-tp-3-of-32-heads",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  tensor_parallel_size: 3"),
        "must be divisible by tensor parallel size (3)",
    ),
    (
        "space-tp-choices-3",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  tensor_parallel_size: {type: categorical, choices: [1, 3]}"),
        "must be divisible by tensor parallel size (3)",
    ),
    (
        "space-block-7",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  block_size: 7"),
        "block_size=7: vLLM's block sizes are",
    ),
    (
        "space-kv-dtype-bogus",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  kv_cache_dtype: bogus"),
        "kv_cache_dtype='bogus': expected one of auto",
    ),
    (
        "space-dtype-mapping",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  dtype: {a: 1}"),
        "dtype={'a': 1}: expected a value",
    ),
    (
        "space-seqs-2^63",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 16, high: 9223372036854775808}"),
        "max_num_seqs=9223372036854775808: expected a whole number from 1 to 2,147,483,647",
    ),
    (
        "space-budget-1e15",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  max_num_batched_tokens: 1000000000000000"),
        "max_num_batched_tokens=1000000000000000: expected a whole number",
    ),
    (  # Optuna would cut the range to 16..80 with raw warnings and the baseline run 100, past it
        "space-step-misses-high",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  max_num_seqs: {type: int, low: 16, high: 100, step: 32}"),
        "max_num_seqs: high 100 is not low + a multiple of step 32: use 80 or 112",
    ),
    ("set-block-7", ["bench", "--set", "block_size=7"], {}, "bad --set: block_size=7"),
    # 1 and 8 pass vLLM's arguments and start on no CUDA GPU: every such config failed at launch
    (
        "space-block-1-8",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  block_size: {type: categorical, choices: [1, 8]}"),
        "block_size=1: vLLM starts on CUDA with block sizes 16, 32, 64 and 128 only",
    ),
    (  # vLLM 0.11's last choice is 128
        "space-block-256",
        ["run", "--space", "{tmp}/s.yaml"],
        space(f"{PARAM}\n  block_size: {{type: categorical, choices: [16, 256]}}"),
        "block_size=256: vLLM's block sizes are 1, 8, 16, 32, 64, 128",
    ),
    (
        "space-block-range-to-64",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  block_size: {type: int, low: 16, high: 64, step: 16}"),
        "block_size=48: vLLM's block sizes are",
    ),
    (  # 17..31 lie between two block sizes
        "space-block-range-16-32",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  block_size: {type: int, low: 16, high: 32}"),
        "block_size=17: vLLM's block sizes are",
    ),
    (
        "space-block-fixed-8",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  block_size: 8"),
        "block_size=8: vLLM starts on CUDA with block sizes",
    ),
    (  # chunked prefill off and every budget below max_model_len: each suggestion was rejected, and the
        # run ended "No feasible config" with exit 0
        "space-every-config-breaks-a-rule",
        ["run", "--space", "{tmp}/s.yaml"],
        space(
            "  max_num_batched_tokens: {type: int, low: 512, high: 4096}",
            "  max_model_len: 8192\n  enable_chunked_prefill: false",
        ),
        "every config of the space breaks vLLM's rule: max_num_batched_tokens (4096) is smaller than",
    ),
    # FlashAttention's pages: 8 passed vLLM's arguments and failed once the model had loaded
    ("set-block-8", ["bench", "--set", "block_size=8"], {}, "bad --set: block_size=8: vLLM starts on CUDA"),
    (
        "space-block-8-16",
        ["run", "--space", "{tmp}/s.yaml"],
        space(f"{PARAM}\n  block_size: {{type: categorical, choices: [8, 16]}}"),
        "block_size=8: vLLM starts on CUDA with block sizes 16, 32, 64 and 128 only",
    ),
    (  # vllm bench serve's median and p50 are one statistic: two identical columns, as the SLOs refuse
        "objectives-median-and-p50",
        ["run", "--objectives", "{tmp}/o.yaml"],
        {
            "o.yaml": "objectives:\n  - {metric: p50_ttft_ms, direction: minimize}\n"
            "  - {metric: output_throughput, direction: maximize}\n"
            "  - {metric: median_ttft_ms, direction: minimize}\n"
        },
        "p50_ttft_ms and median_ttft_ms are one statistic (median and p50): keep one",
    ),
    (
        "set-kv-dtype-bogus",
        ["bench", "--set", "kv_cache_dtype=bogus"],
        {},
        "bad --set: kv_cache_dtype='bogus'",
    ),
    (
        "set-seqs-2^63",
        ["bench", "--set", "max_num_seqs=9223372036854775808"],
        {},
        "bad --set: max_num_seqs=9223372036854775808",
    ),
    (
        "set-budget-1e15",
        ["bench", "--set", "max_num_batched_tokens=1000000000000000"],
        {},
        "bad --set: max_num_batched_tokens=1000000000000000",
    ),
    (
        "set-pp-text",
        ["bench", "--set", "pipeline_parallel_size=two"],
        {},
        "bad --set: pipeline_parallel_size='two'",
    ),
    # vLLM's yes/no flags take no value (`--enforce-eager maybe` is read as a second model)
    ("set-eager-maybe", ["bench", "--set", "enforce_eager=maybe"], {}, "enforce_eager='maybe': expected"),
    ("set-trust-7", ["bench", "--set", "trust_remote_code=7"], {}, "trust_remote_code=7: expected true or"),
    (
        "space-async-fixed-text",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  async_scheduling: 'yes'"),
        "async_scheduling='yes': expected true or false",
    ),
    (
        "space-expert-choices-int",
        ["run", "--space", "{tmp}/s.yaml"],
        space("  enable_expert_parallel: {type: categorical, choices: [true, 0]}"),
        "enable_expert_parallel=0: expected true or false",
    ),
    (
        "space-chunk-cap-text",
        ["run", "--space", "{tmp}/s.yaml"],
        space(PARAM, "  long_prefill_token_threshold: 1k"),
        "long_prefill_token_threshold='1k': expected a whole number from 0 (no cap)",
    ),
    # -- files: nesting, aliases, keys, shapes ---------------------------------------------------------
    (
        "space-deep",
        ["run", "--space", "{tmp}/s.yaml"],
        {"s.yaml": f"params:\n{PARAM}\ndescription: {DEEP}\n"},
        "nested more than 64 levels deep",
    ),
    (
        "objectives-deep",
        ["run", "--objectives", "{tmp}/o.yaml"],
        {"o.yaml": f"objectives: {DEEP}\n"},
        "nested more than 64 levels deep",
    ),
    (
        "workload-deep",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": f"{WORKLOAD}description: {DEEP}\n"},
        "nested more than 64 levels deep",
    ),
    (
        "space-self-alias",
        ["run", "--space", "{tmp}/s.yaml"],
        {"s.yaml": f"params:\n{PARAM}\ndescription: &a [*a]\n"},
        "nested more than 64 levels deep",
    ),
    (
        "space-int-keys",
        ["run", "--space", "{tmp}/s.yaml"],
        {"s.yaml": "params:\n  1: {type: int, low: 1, high: 4}\n"},
        "key 1 is not a name",
    ),
    (
        "model-zero-layers",
        ["run", "--model", "{tmp}/m"],
        {"m/config.json": MODEL_CONFIG % (0, 32, "")},
        "num_hidden_layers must be >= 1, got 0",
    ),
    (
        "model-negative-width",
        ["run", "--model", "{tmp}/m"],
        {"m/config.json": MODEL_CONFIG % (32, -32, "")},
        "num_attention_heads must be >= 1, got -32",
    ),
    (
        "model-config-deep",
        ["run", "--model", "{tmp}/m"],
        {"m/config.json": DEEP},
        "nested more than 64 levels deep",
    ),
    # -- export and dashboard on edited run folders ------------------------------------------------------
    (
        "export-run-json-list",
        ["export", "{tmp}/r"],
        {"r/run.json": "[1, 2]"},
        "unreadable run file (not a JSON object)",
    ),
    (
        "export-run-json-ints",
        ["export", "{tmp}/r"],
        {"r/run.json": '{"study": 1, "storage": 2}'},
        "unreadable run file ('study' is 1)",
    ),
    (
        "export-run-json-null-storage",
        ["export", "{tmp}/r"],
        {"r/run.json": '{"study": "x", "storage": null}'},
        "unreadable run file ('storage' is None)",
    ),
    (
        "export-run-json-deep",
        ["export", "{tmp}/r"],
        {"r/run.json": "[" * 100_000 + "]" * 100_000},
        "nested more than 64 levels deep",
    ),
    ("export-no-database", ["export", "{tmp}/r"], {"r/run.json": RUN_JSON}, "is missing"),
    (
        "dashboard-run-json-list",
        ["dashboard", "{tmp}/r"],
        {"r/run.json": "[1, 2]"},
        "unreadable run file (not a JSON object)",
    ),
    (
        "dashboard-run-json-null-storage",
        ["dashboard", "{tmp}/r"],
        {"r/run.json": '{"study": "x", "storage": null}'},
        "unreadable run file ('storage' is None)",
    ),
    ("dashboard-no-database", ["dashboard", "{tmp}/r"], {"r/run.json": RUN_JSON}, "is missing"),
    (
        "dashboard-relative-run-no-database",
        ["dashboard", "r"],
        {"r/run.json": RUN_JSON},
        "the study file of r is missing",
    ),
    # -- bench --url ---------------------------------------------------------------------------------------
    ("url-empty", ["bench", "--url", ""], {}, "argument --url: value must not be empty"),
    ("url-bad-ipv6", ["bench", "--url", "http://[::1"], {}, "Invalid IPv6 URL"),
    ("url-not-http", ["bench", "--url", "ftp://127.0.0.1/"], {}, "expected http(s)://HOST[:PORT]"),
    # -- sim-server options that would start a broken server (the old code served with them) -------------
    (
        "sim-server-seqs-0",
        ["sim-server", "Qwen/Qwen3-0.6B", "--port", "0", "--max-num-seqs", "0"],
        {},
        "bad flag: max_num_seqs=0",
    ),
    (
        "sim-server-gmu-nan",
        ["sim-server", "Qwen/Qwen3-0.6B", "--port", "0", "--gpu-memory-utilization", "nan"],
        {},
        "bad flag: gpu_memory_utilization=nan",
    ),
    (
        "sim-server-model-unknown",  # the old code logged the server's start first (three lines)
        ["sim-server", "nonexist", "--port", "0"],
        {},
        "unknown model 'nonexist'",
    ),
]


@pytest.mark.parametrize(("argv", "files", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_refused_for_what_it_is(
    argv: list[str],
    files: dict[str, str | bytes],
    expected: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One line, exit 2, nothing written; and the line names the input (not another refusal)."""
    line = assert_rejected(argv, files, tmp_path, capfd, monkeypatch)
    assert expected in line, line
