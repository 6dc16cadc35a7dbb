"""parse_prometheus reads the text exposition with prometheus_client's parser."""

from __future__ import annotations

from autotune.backends.server_metrics import parse_prometheus


def test_typed_counters_keep_their_total_and_escaped_labels_are_read() -> None:
    text = (
        "# HELP vllm:num_preemptions Preemptions.\n"
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{model_name="m",note="a \\"quoted\\" b"} 3.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
    )
    samples = {s.name: s for s in parse_prometheus(text)}
    assert samples["vllm:num_preemptions_total"].value == 3.0
    assert samples["vllm:num_preemptions_total"].labels["note"] == 'a "quoted" b'
    assert samples["vllm:kv_cache_usage_perc"].value == 0.25


def test_a_malformed_scrape_keeps_what_came_before_it() -> None:
    samples = parse_prometheus('vllm:num_requests_running{model_name="m"} 2\nbroken{ line\n')
    assert [(s.name, s.value) for s in samples] == [("vllm:num_requests_running", 2.0)]
