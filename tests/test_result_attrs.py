"""A result's typed parts in the study: the `info` attr keeps the keys and order every study has had
(old studies resume, reports read them alike), and reads back into the same records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_capacity import CONFIG, QUICK, SLOS, WORKLOAD
from test_study import build_run

from autotune.backends.sim import SimBackend
from autotune.core.errors import FailureKind
from autotune.measure.placement import Placement
from autotune.measure.result import TrialResult
from autotune.measure.server_report import EngineFacts, ServerReport
from autotune.trial.capacity import find_capacity
from autotune.tune.result_attrs import info_attr
from autotune.tune.study import records

ENGINE = [
    "resolved",
    "num_gpu_blocks",
    "kv_cache_tokens",
    "num_preemptions",
    "peak_kv_cache_usage",
    "prefix_cache_hit_rate",
    "num_steps",
]
STEADY = ["offered_rate", "served_rate", "backlog_growth", "backlog_allowed", "backlog_filling", "kept_up"]
CAPACITY = [
    "measured_request_throughput",
    "measured_output_throughput",
    "measured_total_token_throughput",
    "capacity_rate",
    "capacity_bracket",
    "capacity_resolution",
    "capacity_bound_measured",
    "saturation_throughput",
    "capacity_goodput",
    "capacity_probes",
    "capacity_window_s",
    "capacity_limited_by",
    "saturation_bursts",
]


def test_a_fixed_load_result_is_stored_under_its_keys_and_read_back() -> None:
    load = WORKLOAD.with_load(request_rate=8.0, num_requests=400)
    result = SimBackend("H100").evaluate(CONFIG, dataclasses.replace(load, load="fixed"), SLOS)
    assert list(info_attr(result)) == [*ENGINE, *STEADY, "slo_evidence"]


def test_a_capacity_result_survives_the_study(tmp_path: Path) -> None:
    result = find_capacity(SimBackend("H100"), CONFIG, WORKLOAD, SLOS, search=QUICK)
    info = info_attr(result)
    # the search's verdict on keeping up replaces its window's, where the window had put it
    assert list(info) == [*ENGINE, *STEADY, "slo_evidence", *CAPACITY]
    assert info["kept_up"] is result.capacity.kept_up is True
    (record,) = records(build_run(tmp_path, [({"max_num_seqs": 2, "baseline": True}, result)]))
    assert record.capacity == result.capacity  # rounded when made: storing it changes nothing
    assert record.load.slo_evidence == result.load.slo_evidence
    assert record.server.resolved == result.server.resolved
    assert record.kept_up is True and record.info == record.user_attrs["info"]


def test_a_real_servers_failure_replayed_after_it_died() -> None:
    server = ServerReport(
        image="vllm/vllm-openai:latest",
        command=("vllm", "serve", "m"),
        log_path="/runs/s/trials/3/server.log",
        engine=EngineFacts(),  # measured, but its /metrics did not say how many KV blocks
    )
    result = TrialResult(
        config=CONFIG,
        failure=FailureKind.CRASHED,
        server=server,
        failed_in_earlier_measurement=True,
        placement=Placement("n1", "10.0.0.2", gpu_ids=(0, 1), ran_at=(1.5, 2.5)),
    )
    assert info_attr(result) == {
        "image": "vllm/vllm-openai:latest",
        "command": ["vllm", "serve", "m"],
        "server_log": "/runs/s/trials/3/server.log",
        "num_gpu_blocks": None,
        "failed_in_earlier_measurement": True,
        "ran_at": [1.5, 2.5],
        "node_ip": "10.0.0.2",
        "node_id": "n1",
        "gpu_ids": [0, 1],
    }
    lost = dataclasses.replace(result, server=None, placement=Placement("n1", "10.0.0.2", gpu_ids=None))
    assert info_attr(lost) == {"failed_in_earlier_measurement": True, "node_ip": "10.0.0.2", "node_id": "n1"}
