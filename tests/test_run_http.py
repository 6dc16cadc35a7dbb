"""`autotune run --backend vllm --serve-cmd ...` end to end over real HTTP on 127.0.0.1.

The study launches real `autotune sim-server` processes (through a fault-injecting wrapper), so it goes
through the whole real serving path: launch, /health, streaming load, /metrics, teardown. One config
cannot start (too little memory for the weights and KV cache) and one server is killed mid-benchmark;
both must be recorded with their reason while the study goes on, and no server process may survive.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest

from autotune.cli import main

MAX_MODEL_LEN = 3072  # an unusual value: marks this test's servers in the process table

SPACE = f"""
fixed:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  max_model_len: {MAX_MODEL_LEN}
params:
  max_num_seqs: {{type: categorical, choices: [8, 64]}}
  gpu_memory_utilization: {{type: categorical, choices: [0.2, 0.9]}}
"""

WORKLOAD = """
name: tiny
num_requests: 24
request_rate: inf
prompt_len: 64
output_len: 32
"""

# The serve command: sim-server, but a server started with --max-num-seqs 8 dies after 3 requests
# (the warm-up and two of the benchmark's), like a server that crashes under load.
WRAPPER = """
import os, sys
args = sys.argv[1:]
if "--max-num-seqs" in args and args[args.index("--max-num-seqs") + 1] == "8":
    args += ["--die-after", "3"]
os.execv(sys.executable, [sys.executable, "-m", "autotune.cli", "sim-server", *args])
"""


def _processes() -> list[tuple[int, int, str, str]]:
    """(pid, parent pid, state, cmdline) of every process."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append((int(proc.name), int(fields[1]), fields[0], cmdline))
    return out


def _our_zombies() -> int:
    """Zombies among this test process's descendants (its Ray cluster, the servers its workers launch):
    other processes on the machine (a parallel test's) are not this run's to reap."""
    procs = _processes()
    ours, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, ppid, _, _ in procs if ppid in ours} - ours
        ours |= more
        grew = bool(more)
    return sum(state == "Z" for pid, _, state, _ in procs if pid in ours)


@pytest.mark.usefixtures("ray_cluster")
def test_study_over_http_records_failures_and_leaves_no_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "tiny.yaml").write_text(WORKLOAD)
    (tmp_path / "serve.py").write_text(WRAPPER)
    zombies_before = _our_zombies()

    args = ["run", "--space", str(tmp_path / "space.yaml"), "--workload", str(tmp_path / "tiny.yaml")]
    args += ["--backend", "vllm", "--serve-cmd", f"{sys.executable} {tmp_path / 'serve.py'}"]
    args += ["--gpus", "1", "--sampler", "grid", "--n-trials", "5", "--no-screen", "--quiet"]
    args += ["--slo", "ttft_p99=10s", "--runs-dir", str(tmp_path), "--study", "http"]
    assert main(args) == 0, capsys.readouterr().err

    with open(tmp_path / "http" / "trials.csv") as f:
        rows = {(int(r["max_num_seqs"]), float(r["gpu_memory_utilization"])): r for r in csv.DictReader(f)}
    assert set(rows) == {(8, 0.2), (8, 0.9), (64, 0.2), (64, 0.9)}  # the study went on after failures
    for seqs in (8, 64):
        failed = rows[(seqs, 0.2)]  # 0.2 of an H100 cannot hold Llama-3.1-8B's weights and a KV cache
        assert failed["reason"] in ("kv_cache_oom", "startup_oom"), failed
        assert failed["feasible"] == "False" and failed["message"]
    crashed = rows[(8, 0.9)]
    assert crashed["reason"] == "crashed" and "server exited" in crashed["message"], crashed
    assert crashed["feasible"] == "False"
    ok = rows[(64, 0.9)]
    assert ok["reason"] == "" and ok["feasible"] == "True" and float(ok["output_throughput"]) > 0
    assert (tmp_path / "http" / "trials").is_dir()  # server logs of each trial

    ours = f"--max-model-len {MAX_MODEL_LEN}"
    leftovers = [c for _, _, _, c in _processes() if "sim-server" in c and ours in c]
    assert leftovers == []
    assert _our_zombies() <= zombies_before


def test_a_serve_command_that_fails_alike_for_every_config_halts_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that rejects a flag whatever the config (here: one the serve command adds) fails the
    defaults and the next configs with one message: the run halts after three, exit 1, and says why."""
    (tmp_path / "tiny.yaml").write_text(WORKLOAD)
    broken = f"{sys.executable} -m autotune.cli sim-server --no-such-flag"
    args = ["run", "--space", "small", "--workload", str(tmp_path / "tiny.yaml"), "--guide", "none"]
    args += ["--backend", "vllm", "--serve-cmd", broken, "--gpus", "1", "--n-trials", "8", "--quiet"]
    args += ["--runs-dir", str(tmp_path), "--study", "broken"]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("autotune run: error: halted: the first 3 configs launched all failed alike")
    assert "unrecognized arguments: --no-such-flag" in err[-1]
    with open(tmp_path / "broken" / "trials.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {r["reason"] for r in rows} == {"invalid_config"}  # kept, not lost
