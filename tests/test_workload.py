"""Workloads: length distributions, vLLM-style arrivals, trace replay, JSONL, shared prefixes, YAML errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from errors import one_line_error

from autotune.core.errors import AutotuneError
from autotune.workloads.files import load_workload, spec_from_dict
from autotune.workloads.lengths import LengthDist
from autotune.workloads.spec import Request, WorkloadSpec, prompt_token_ids, rate_arrivals

N = 4000  # large enough that sample means are within a few percent


def synthetic(**kw) -> WorkloadSpec:
    base = {
        "name": "t",
        "num_requests": N,
        "prompt_len": LengthDist("fixed", 100),
        "output_len": LengthDist("fixed", 10),
    }
    return WorkloadSpec(**{**base, **kw})


def lengths(dist: LengthDist, n: int = N) -> np.ndarray:
    return dist.sample(np.random.default_rng(1), n)


def test_fixed_length():
    assert set(lengths(LengthDist("fixed", 512)).tolist()) == {512}


def test_uniform_length_matches_vllm_random_range():
    values = lengths(LengthDist("uniform", 1000, range_ratio=0.25))
    assert values.min() >= 750 and values.max() <= 1250
    assert values.min() < 760 and values.max() > 1240  # the whole range is used
    assert abs(values.mean() - 1000) < 10


def test_normal_length_mean_std_and_clipping():
    values = lengths(LengthDist("normal", 500, std=100))
    assert abs(values.mean() - 500) < 10 and abs(values.std() - 100) < 5
    clipped = lengths(LengthDist("normal", 500, std=400, min=200, max=700))
    assert clipped.min() == 200 and clipped.max() == 700


@pytest.mark.parametrize("kind", ["mean", "median"])
def test_lognormal_length_mean_or_median(kind):
    dist = (
        LengthDist("lognormal", 1000, sigma=0.8)
        if kind == "mean"
        else LengthDist("lognormal", median=1000, sigma=0.8)
    )
    values = lengths(dist, 40000)
    center = values.mean() if kind == "mean" else np.median(values)
    assert abs(center - 1000) / 1000 < 0.04
    if kind == "median":  # a right-skewed distribution: mean = median * exp(sigma^2/2)
        assert abs(values.mean() / 1000 - math.exp(0.32)) < 0.05


def test_lengths_never_below_one():
    assert lengths(LengthDist("normal", 20, std=15)).min() == 1  # a tenth of the draws fall below 1


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        # sigma 50 puts nearly all the mass below one token: every length was 1
        (dict(dist="lognormal", mean=100, sigma=50), "draws lengths with a mean of 1 tokens"),
        (
            dict(dist="fixed", mean=100, min=200),
            "100 draws lengths with a mean of 200 tokens (whole, at least 200)",
        ),
        (dict(dist="normal", mean=5, std=50), "normal(5, std 50) draws lengths with a mean of"),
        (
            dict(dist="lognormal", median=500, sigma=1, max=100),
            "a median of 100 tokens (whole, 1 to 100), not 500",
        ),
    ],
)
def test_a_spec_that_does_not_draw_what_it_says_is_refused(spec: dict, said: str):
    with pytest.raises(AutotuneError, match=re.escape(said)):
        LengthDist(**spec)


def test_requests_reproducible_per_seed():
    spec = synthetic(prompt_len=LengthDist("lognormal", 800, sigma=1.0), request_rate=5.0)
    assert spec.requests(seed=3) == spec.requests(seed=3)
    assert spec.requests(seed=3) != spec.requests(seed=4)
    assert spec.requests() != WorkloadSpec(**{**spec.__dict__, "seed": 1}).requests()


def test_with_load_keeps_lengths_and_changes_arrivals():
    spec = synthetic(prompt_len=LengthDist("uniform", 300, range_ratio=0.5), request_rate=4.0)
    slow, fast = spec.requests(), spec.with_load(request_rate=8.0, max_concurrency=16).requests()
    assert [r.prompt_len for r in slow] == [r.prompt_len for r in fast]
    assert fast[-1].arrival_time == pytest.approx(slow[-1].arrival_time / 2)
    assert spec.with_load(max_concurrency=16).max_concurrency == 16
    assert spec.with_load(max_concurrency=16).request_rate == 4.0


def test_rate_inf_sends_everything_at_zero():
    assert {r.arrival_time for r in synthetic().requests()} == {0.0}


def test_poisson_last_arrival_and_mean_gap():
    rate = 10.0
    times = np.array([r.arrival_time for r in synthetic(request_rate=rate).requests()])
    assert times[-1] == pytest.approx(N / rate)  # vLLM rescales the last arrival to N / rate
    assert np.all(np.diff(times) >= 0)
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert gaps.mean() == pytest.approx(1 / rate)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.06)  # exponential gaps: CV = 1


def test_burstiness_changes_variance_not_rate():
    def cv(burstiness: float) -> float:
        times = rate_arrivals(N, 10.0, burstiness, np.random.default_rng(0))
        gaps = np.diff(np.concatenate([[0.0], times]))
        assert times[-1] == pytest.approx(N / 10.0)
        return gaps.std() / gaps.mean()

    # gamma(shape k) gaps have a coefficient of variation 1 / sqrt(k)
    assert cv(0.25) == pytest.approx(2.0, rel=0.1)
    assert cv(4.0) == pytest.approx(0.5, rel=0.1)
    assert cv(math.inf) == pytest.approx(0.0, abs=1e-9)


def test_fixed_concurrency_is_rate_inf_with_a_cap():
    spec = load_workload("concurrency")
    assert spec.max_concurrency == 64 and math.isinf(spec.request_rate)
    assert {r.arrival_time for r in spec.requests()} == {0.0}


def test_jsonl_token_counts_and_text(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    rows = [
        {"prompt_len": 100, "output_len": 20},
        {"prompt": "x" * 401, "output_len": 7},
        {"prompt": "hi there"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    spec = WorkloadSpec(name="j", num_requests=5, jsonl=path, output_len=LengthDist("fixed", 33))
    requests = spec.requests()
    assert [(r.prompt_len, r.output_len) for r in requests] == [
        (100, 20),
        (101, 7),
        (2, 33),
        (100, 20),
        (101, 7),
    ]
    assert requests[0].prompt is None and requests[1].prompt == "x" * 401  # text kept for the HTTP client


def test_jsonl_texts_keep_unicode_line_separators(tmp_path: Path):
    """JSON writers leave U+2028, U+2029 and U+0085 raw in strings (ensure_ascii=False); only \n ends a
    JSON Lines record. A text's own tokenizer count (prompt_len) may stand beside it."""
    path = tmp_path / "u.jsonl"
    rows = [{"prompt": "para1\u2028para2\u0085x\u2029y", "output_len": 4}, {"prompt": "hé", "prompt_len": 3}]
    path.write_text("\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    spec = WorkloadSpec(name="u", num_requests=2, jsonl=path, output_len=LengthDist("fixed", 9))
    assert [(r.prompt, r.prompt_len) for r in spec.requests()] == [(rows[0]["prompt"], 4), ("hé", 3)]


def test_a_jsonl_file_may_start_with_a_byte_order_mark(tmp_path: Path):
    path = tmp_path / "bom.jsonl"
    path.write_text('{"prompt_len": 7, "output_len": 2}\n', encoding="utf-8-sig")
    spec = WorkloadSpec(name="b", num_requests=1, jsonl=path)
    assert [(r.prompt_len, r.output_len) for r in spec.requests()] == [(7, 2)]


def test_jsonl_row_without_output_len_needs_a_default(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_len": 100, "output_len": 20}\n{"prompt": "hello"}\n')
    message = one_line_error(WorkloadSpec(name="j", num_requests=1, jsonl=path).requests)
    assert message == f"{path}:2: a row has no output_len and the workload sets no output_len"


def test_only_text_prompts_and_shared_prefixes_can_share_a_cached_prefix(tmp_path: Path):
    counts, text = tmp_path / "counts.jsonl", tmp_path / "text.jsonl"
    counts.write_text('{"prompt_len": 100, "output_len": 20}\n')
    text.write_text('{"prompt_len": 100, "output_len": 20}\n{"prompt": "hello", "output_len": 5}\n')
    assert not WorkloadSpec(name="c", num_requests=4, jsonl=counts).shares_prefixes  # salted random ids
    assert WorkloadSpec(name="t", num_requests=4, jsonl=text).shares_prefixes  # one text row is enough
    assert not synthetic().shares_prefixes
    assert synthetic(num_prefixes=2, prefix_len=8).shares_prefixes


def test_shared_prefix_token_ids():
    spec = synthetic(num_requests=40, num_prefixes=4, prefix_len=64, prompt_len=LengthDist("fixed", 32))
    requests = spec.requests()
    assert {r.prefix_id for r in requests} == {0, 1, 2, 3}
    assert all(r.prompt_len == 96 and r.prefix_len == 64 for r in requests)
    by_group: dict[int, list[Request]] = {}
    for r in requests:
        by_group.setdefault(r.prefix_id, []).append(r)
    a, b = by_group[0][:2]
    ids_a, ids_b = prompt_token_ids(a), prompt_token_ids(b)
    assert len(ids_a) == a.prompt_len
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=True)) if x != y)
    assert shared == 64  # exactly the prefix
    other = prompt_token_ids(by_group[1][0])
    assert other[:64] != ids_a[:64]  # another group, another prefix
    assert prompt_token_ids(a) == ids_a  # deterministic


def test_salt_changes_the_ids_but_keeps_lengths_and_shared_prefixes():
    spec = synthetic(num_requests=12, num_prefixes=2, prefix_len=32, prompt_len=LengthDist("fixed", 16))
    requests = spec.requests()
    plain = [prompt_token_ids(r) for r in requests]
    assert [prompt_token_ids(r, salt=0) for r in requests] == plain  # salt 0: today's ids
    salted = [prompt_token_ids(r, salt=1) for r in requests]
    assert [len(ids) for ids in salted] == [len(ids) for ids in plain]
    for before, after in zip(plain, salted, strict=True):
        assert after[:32] != before[:32] and after[32:] != before[32:]  # neither prefix nor own ids reused
    prefixes: dict[int | None, set[tuple[int, ...]]] = {}
    for r, ids in zip(requests, salted, strict=True):
        prefixes.setdefault(r.prefix_id, set()).add(tuple(ids[: r.prefix_len]))
    assert all(len(group) == 1 for group in prefixes.values())  # a group still shares its prefix
    assert prefixes[0] != prefixes[1]  # and each group has its own
    assert len({tuple(ids[32:]) for ids in salted}) == len(salted)  # own tokens stay unique
    assert prompt_token_ids(requests[0], salt=2) != salted[0]  # every salt its own ids


def test_token_ids_without_prefix_differ_from_the_first_token():
    r1, r2 = Request(0, 50, 5), Request(1, 50, 5)
    ids1 = prompt_token_ids(r1, vocab_size=1000)
    assert ids1[0] != prompt_token_ids(r2, vocab_size=1000)[0]
    assert all(250 <= t < 1000 for t in ids1)


@pytest.mark.parametrize("name", ["chat", "prefill_heavy", "decode_heavy", "azure_conv", "azure_code",
                                  "shared_prefix", "concurrency", "capacity"])  # fmt: skip
def test_bundled_workloads_load(name: str):
    spec = load_workload(name)
    requests = spec.requests()
    assert len(requests) == spec.num_requests and spec.describe().startswith(name)


def test_chat_workload_shape():
    requests = load_workload("chat").requests()
    assert 800 < np.mean([r.prompt_len for r in requests]) < 1200
    assert 200 < np.mean([r.output_len for r in requests]) < 300
    assert max(r.prompt_len + r.output_len for r in requests) <= 8192


def test_yaml_file_with_relative_jsonl(tmp_path: Path):
    (tmp_path / "rows.jsonl").write_text('{"prompt_len": 10, "output_len": 3}\n')
    (tmp_path / "w.yaml").write_text("num_requests: 2\njsonl: rows.jsonl\nrequest_rate: inf\n")
    spec = load_workload(tmp_path / "w.yaml")
    assert spec.name == "w" and [r.prompt_len for r in spec.requests()] == [10, 10]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("num_requests: [1\n", "malformed YAML"),
        ("- a\n- b\n", "mapping"),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\nrate: 3\n", "unknown key"),
        ("prompt_len: 5\noutput_len: 5\n", "missing required key num_requests"),
        ("num_requests: 0\nprompt_len: 5\noutput_len: 5\n", "num_requests must be >= 1"),
        ("num_requests: 2.5\nprompt_len: 5\noutput_len: 5\n", "whole number"),
        (
            "num_requests: 10\nprompt_len: 5\noutput_len: 5\nrequest_rate: fast\n",
            "request_rate must be a number",
        ),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\nrequest_rate: -1\n", "request_rate must be > 0"),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\nburstiness: 0\n", "burstiness"),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\nload: max\n", "load must be one of"),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\nmax_concurrency: 0\n", "max_concurrency"),
        (
            "num_requests: 10\nprompt_len: 5\noutput_len: 5\nload: capacity\nmax_concurrency: 8\n",
            "max_concurrency 8 with a capacity load",
        ),
        ("num_requests: 10\n", "exactly one length source"),
        ("num_requests: 10\nprompt_len: 5\n", "needs an output_len"),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\ntrace: conv\n", "exactly one length source"),
        (
            "num_requests: 10\nprompt_len: {dist: zipf, mean: 5}\noutput_len: 5\n",
            "unknown length distribution",
        ),
        ("num_requests: 10\nprompt_len: {mean: 5}\noutput_len: 5\n", "needs dist"),
        ("num_requests: 10\nprompt_len: {dist: normal, mean: 5, stdev: 1}\noutput_len: 5\n", "unknown key"),
        (
            "num_requests: 10\nprompt_len: {dist: uniform, mean: 5, range_ratio: 1.5}\noutput_len: 5\n",
            "range_ratio",
        ),
        (
            "num_requests: 10\nprompt_len: {dist: fixed, mean: 5, min: 9, max: 3}\noutput_len: 5\n",
            "min <= max",
        ),
        (
            "num_requests: 10\noutput_len: 5\n"
            "prompt_len: {dist: lognormal, mean: 1000, std: 500, max: 4000}\n",
            "prompt_len: std does not apply to lognormal (its keys: mean, median, sigma, min, max)",
        ),
        (
            "num_requests: 10\nprompt_len: 5\noutput_len: {dist: normal, mean: 200, sigma: 0.5}\n",
            "output_len: sigma does not apply to normal (its keys: mean, std, min, max)",
        ),
        (
            "num_requests: 10\nprompt_len: {dist: uniform, mean: 1000, std: 500}\noutput_len: 5\n",
            "prompt_len: std does not apply to uniform (its keys: mean, range_ratio, min, max)",
        ),
        (
            "num_requests: 10\noutput_len: 5\n"
            "prompt_len: {dist: fixed, mean: 9, sigma: 1, range_ratio: 0.5}\n",
            "prompt_len: sigma, range_ratio do not apply to fixed (its keys: mean, min, max)",
        ),
        (
            "num_requests: 10\noutput_len: 5\nprompt_len: {dist: normal, mean: 1000, max: 4000}\n",
            "prompt_len: normal needs std (its spread; without it every length is the mean",
        ),
        (
            "num_requests: 10\nprompt_len: 5\noutput_len: {dist: lognormal, median: 200}\n",
            "output_len: lognormal needs sigma",
        ),
        (
            "num_requests: 10\noutput_len: 5\nprompt_len: {dist: uniform, mean: 64}\n",
            "uniform needs range_ratio",
        ),
        (
            "num_requests: 10\noutput_len: 5\n"
            "prompt_len: {dist: lognormal, mean: 900, median: 800, sigma: 1}\n",
            "prompt_len: give a lognormal its mean or its median, not both",
        ),
        (
            "num_requests: 5\nprompt_len: 100000000000000000000\noutput_len: 10\n",
            "prompt_len must be <= 2,147,483,647, got 100000000000000000000",
        ),
        (
            "num_requests: 5\nprompt_len: {dist: fixed, mean: 1e20}\noutput_len: 10\n",
            "prompt_len: mean must be at most 2,147,483,647 tokens, got 1e+20",
        ),
        ("num_requests: 5\nprompt_len: {dist: fixed, mean: 9, max: 1e20}\noutput_len: 9\n", "max must be <="),
        (
            "num_requests: 5\nprompt_len: 10\noutput_len: {dist: normal, mean: 100, std: 1e300}\n",
            "output_len: normal(100, std 1e+300) can draw lengths up to 7.03e+300 tokens, more than 2,147",
        ),
        (
            "num_requests: 5\nprompt_len: {dist: lognormal, median: 100, sigma: 1e200}\noutput_len: 10\n",
            "can draw lengths up to inf tokens",
        ),
        (
            "num_requests: 5\nprompt_len: 10\noutput_len: 10\n"
            "shared_prefix: {num_prefixes: 2, prefix_len: 100000000000000000000}\n",
            "prefix_len must be <= 2,147,483,647",
        ),
        (
            "num_requests: 5\nprompt_len: 10\noutput_len: 10\n"
            "shared_prefix: {num_prefixes: 100000000000000000000, prefix_len: 4}\n",
            "num_prefixes must be <= 1,000,000",
        ),
        ("num_requests: 10\nprompt_len: 5\noutput_len: 5\nshared_prefix: {num_prefixes: 4}\n", "both"),
        ("num_requests: 10\ntrace: {name: conv, arrivals: replay}\n", "arrivals"),
        ("num_requests: 10\ntrace: {name: conv, time_scale: 0}\n", "time_scale"),
        ("num_requests: 10\ntrace: {name: conv, arrivals: rate, time_scale: 2}\n", "only applies"),
        (
            "num_requests: 10\nrequest_rate: 5\ntrace: {name: conv, time_scale: 2}\n",
            "trace.time_scale 2 with request_rate 5: the rate rescales the replayed times to its mean rate",
        ),
        ("num_requests: 10\ntrace: missing.csv\n", "cannot read trace"),
        ("num_requests: 100000\ntrace: conv\n", "fewer than num_requests"),
        (
            "num_requests: 10\ntrace: {name: conv, max_len: 5}\n",
            "the trace has 0 requests after 0s with prompt and output of 1 token or more, prompt + output of "
            "at most max_len=5 tokens, fewer than num_requests=10",
        ),
        (
            "num_requests: 10\nrequest_rate: 1\ntrace: {name: conv, arrivals: rate, max_len: 5}\n",
            "the trace has no rows after 0s with prompt and output of 1 token or more, prompt + output of "
            "at most max_len=5 tokens",
        ),
        ("num_requests: 10\njsonl: missing.jsonl\n", "cannot read JSONL"),
    ],
)
def test_bad_workload_yaml(tmp_path: Path, text: str, expected: str):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert expected in one_line_error(lambda: load_workload(path))


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["{not json"], "not valid JSON"),
        (["[1, 2]"], "JSON object"),
        (['{"output_len": 3}'], "needs prompt"),
        (['{"prompt_len": 0, "output_len": 3}'], "prompt_len must be >= 1"),
        (['{"prompt_len": 100000000000000000000}'], "p.jsonl:1: prompt_len must be <= 2,147,483,647"),
        (['{"prompt": "a", "output_len": 1e30}'], "p.jsonl:1: output_len must be <= 2,147,483,647"),
        (['{"prompt": 5}'], "prompt must be a string"),
        ([""], "no rows"),
        # an OpenAI request body's output cap, once silently replaced by the workload's default length
        (
            ['{"prompt_len": 100, "max_tokens": 500}'],
            "p.jsonl:1: max_tokens is not read: name the length output_len",
        ),
        (['{"input_tokens": 100, "output_len": 5}'], "input_tokens is not read: name the length prompt_len"),
        # the server is sent the text: an empty one is refused there, and "hello" is never 500 tokens
        (['{"prompt": "", "output_len": 3}'], "p.jsonl:1: prompt is empty"),
        (['{"prompt": "hello", "prompt_len": 500}'], "prompt_len 500 is more tokens than its text's 5 bytes"),
        (['{"prompt_len": 100, "output_len": 5, "prompt_len": 200}'], "the key 'prompt_len' is given twice"),
        (
            ['{"prompt_len": 100, "timestamp": 1.5}'],
            "timestamp is not read: a JSONL workload's requests arrive",
        ),
    ],
)
def test_bad_jsonl(tmp_path: Path, lines: list[str], expected: str):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    spec = WorkloadSpec(name="j", num_requests=1, jsonl=path, output_len=LengthDist("fixed", 4))
    assert expected in one_line_error(spec.requests)


def test_text_prompts_reject_shared_prefix(tmp_path: Path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello", "output_len": 3}\n')
    spec = WorkloadSpec(name="j", num_requests=2, jsonl=path, num_prefixes=1, prefix_len=8)
    assert "text prompts" in one_line_error(spec.requests)


def test_unknown_workload_name_lists_bundled_ones():
    message = one_line_error(lambda: load_workload("no_such_workload"))
    assert "not found" in message and "chat" in message


def test_a_folder_is_not_a_workload_file(tmp_path: Path):
    assert (
        one_line_error(lambda: load_workload(tmp_path)) == f"workload {tmp_path} is a directory, not a file"
    )


def test_a_bundled_name_wins_over_a_folder_of_that_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "chat").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_workload("chat").name == "chat"


def test_spec_from_dict_accepts_inf_and_fixed_lengths():
    spec = spec_from_dict({"num_requests": 3, "request_rate": "inf", "prompt_len": 7, "output_len": 2})
    assert math.isinf(spec.request_rate) and spec.prompt_len == LengthDist("fixed", 7)
