"""The prefill flags on the simulated engine (autotune/sim/flags.py): `long_prefill_token_threshold`,
which V1's scheduler applies as a cap on every request's prefill chunk, so a long prompt no longer takes
the whole token budget and several requests are mid-prefill at once (vllm/v1/core/sched/scheduler.py),
and the concurrent partial prefills V1 refuses to start with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from cli import autotune
from test_sim_backend import TinyWorkload
from test_sim_flags import SPACE

from autotune.backends.failures import STARTUP, classify
from autotune.backends.sim import SimBackend
from autotune.core.config import EngineConfig, flag_problem
from autotune.core.errors import FailureKind
from autotune.sim.engine import SimEngine
from autotune.sim_server.server import start_sim_server
from autotune.tune.space import violations
from autotune.workloads.spec import Request

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def first_token_steps(prompts: list[int], threshold: int, budget: int = 2048) -> list[int]:
    """The step at which each request (all sent at once, in order) gets its first token."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=8192, max_num_batched_tokens=budget)
    engine = SimEngine(config.replace(long_prefill_token_threshold=threshold), "H100")
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(request_id=i, prompt_len=prompt, output_len=4))
    first: dict[int, int] = {}
    while engine.has_unfinished():
        for rid, _ in engine.step().new_tokens:
            first.setdefault(rid, engine.num_steps)
    return [first[i] for i in range(len(prompts))]


def test_a_burst_of_long_prompts_is_prefilled_side_by_side() -> None:
    """Eight 2,000-token prompts, budget 2,048: without a cap each prompt takes the budget in turn (first
    tokens at steps 1 to 8); capped at 256 every step gives each its 256 and all finish together."""
    assert first_token_steps([2000] * 8, threshold=0) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first_token_steps([2000] * 8, threshold=256) == [8] * 8


def test_short_prompts_behind_a_long_one_get_the_budget_it_leaves() -> None:
    """What the flag is for: a 6,000-token prompt ahead of four short ones. Uncapped it takes the whole
    budget for three steps; capped at 512 the short ones are admitted beside its first chunk."""
    prompts = [6000, 100, 100, 100, 100]
    uncapped, capped = first_token_steps(prompts, 0), first_token_steps(prompts, 512)
    assert min(uncapped[1:]) >= 3 and capped[1:] == [1, 1, 1, 1]
    assert capped[0] > uncapped[0]  # the long prompt pays for it


def test_prompts_within_the_cap_run_exactly_as_without_it() -> None:
    requests = [Request(request_id=i, prompt_len=50 + 7 * i, output_len=20 + i) for i in range(40)]
    runs = []
    for threshold in (0, 512):  # every prompt is at most 323 tokens
        config = EngineConfig(model=LLAMA_8B, max_model_len=4096).replace(
            long_prefill_token_threshold=threshold
        )
        engine = SimEngine(config, "H100")
        for r in requests:
            engine.add_request(r)
        while engine.has_unfinished():
            engine.step()
        runs.append((engine.step_times, engine.finished_records()))
    assert runs[0] == runs[1]


def test_a_cap_past_max_model_len_is_refused_as_vllm_refuses_it() -> None:
    """vLLM checks the cap against max_model_len only with concurrent partial prefills (which V1 then
    refuses too); alone, a cap past every request caps nothing."""
    config = EngineConfig(model=LLAMA_8B, max_model_len=4096).replace(long_prefill_token_threshold=8192)
    assert violations(config) == [] and SimBackend("H100").evaluate(config, TinyWorkload(2)).ok
    concurrent = config.replace(max_num_partial_prefills=2)
    said = "long_prefill_token_threshold (8192) cannot be greater than the max_model_len (4096)."
    assert violations(concurrent)[0] == said  # rejected before launch
    result = SimBackend("H100").evaluate(concurrent, TinyWorkload(2))
    assert not result.ok and said in result.message
    assert flag_problem("long_prefill_token_threshold", "512") is not None
    assert flag_problem("long_prefill_token_threshold", 512) is None


def test_a_simulated_bench_and_the_sim_server_serve_it(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(
        SPACE.format(fixed="  long_prefill_token_threshold: 512\n", params="")
    )
    out = autotune(tmp_path, "bench", "--space", "space.yaml", check=False)
    assert out.returncode == 0, out.stderr
    args = [
        LLAMA_8B,
        "--max-model-len",
        "8192",
        "--time-scale",
        "10",
        "--long-prefill-token-threshold",
        "512",
    ]
    with start_sim_server(args) as proc:
        body = {"model": LLAMA_8B, "prompt": [1] * 2000, "max_tokens": 4}
        assert httpx.post(proc.base_url + "/v1/completions", json=body, timeout=30).status_code == 200
        assert "'long_prefill_token_threshold': 512" in proc.log()
    cmd = [
        sys.executable,
        "-m",
        "autotune.commands.sim_server",
        LLAMA_8B,
        "--long-prefill-token-threshold",
        "-1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "long_prefill_token_threshold=-1" in done.stderr


def test_concurrent_partial_prefills_do_not_start_as_on_vllm_v1() -> None:
    """V1 raises NotImplementedError before the model loads (vLLM 0.11 on): rejected before launch, a
    failed start on the simulator, and recognised as an invalid config in a real server's log."""
    said = (
        "Concurrent Partial Prefill is not supported. We recommend to remove Concurrent Partial Prefill "
        "from your config."
    )
    for flags in ({"max_num_partial_prefills": 4}, {"max_long_partial_prefills": 2}):
        config = EngineConfig(model=LLAMA_8B, max_model_len=4096).replace(**flags)
        assert violations(config) == [said]
        result = SimBackend("H100").evaluate(config, TinyWorkload(2))
        assert result.failure is FailureKind.INVALID_CONFIG and result.message == said
        assert result.log_tail.endswith("NotImplementedError: " + said)
        assert classify(1, result.log_tail, STARTUP) == (FailureKind.INVALID_CONFIG, said)
    ones = EngineConfig(model=LLAMA_8B, max_model_len=4096).replace(max_num_partial_prefills=1)
    assert violations(ones) == [] and SimBackend("H100").evaluate(ones, TinyWorkload(2)).ok
