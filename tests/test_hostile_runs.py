"""The hostile try's inputs that need a process or a server to try. Inputs that made the old code read
forever (a FIFO, /dev/zero) or allocate gigabytes (alias bombs, a two-billion-value range, sim-server
limits it then served forever with) run as subprocesses under a 2 GiB address-space limit and a
timeout, so that a regression fails, not hangs; `bench --url` meets a web server that is not an
OpenAI-compatible one; `--gpus 0` runs on a Ray cluster. (The in-process table of hostile inputs:
tests/test_hostile_inputs.py.)
"""

from __future__ import annotations

import http.server
import os
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from errors import assert_rejected, materialize
from test_hostile_inputs import PARAM, WORKLOAD

# 10 values, each level 10 aliases of the one before: 10**9 values once expanded ("billion laughs"),
# anchored where each file allows a free value; `*i` is the whole.
BOMB = (
    "[&a [x, x, x, x, x, x, x, x, x, x], "
    + ", ".join(f"&{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "]"
)
# Alias bombs: the old code expanded them (tens of GB); run as subprocesses under the memory limit.
BOMB_CASES: list[tuple[str, list[str], dict[str, str | bytes], str]] = [
    (
        "space-alias-bomb",
        ["run", "--space", "{tmp}/s.yaml"],
        {"s.yaml": f"description: {BOMB}\nparams:\n{PARAM}\nfixed:\n  dtype: *i\n"},
        "more than 1,000,000 values (aliases expanded)",
    ),
    (
        "workload-alias-bomb",
        ["run", "--workload", "{tmp}/w.yaml"],
        {"w.yaml": f"{WORKLOAD}description: {BOMB}\n"},
        "more than 1,000,000 values (aliases expanded)",
    ),
    (
        "objectives-alias-bomb",
        ["run", "--objectives", "{tmp}/o.yaml"],
        {"o.yaml": f"description: {BOMB}\nobjectives: [{{metric: *i, direction: maximize}}]\n"},
        "more than 1,000,000 values (aliases expanded)",
    ),
]
# Accepted by the old code: it then served forever. Each runs as a subprocess with a timeout.
SERVER_CASES = [
    ("read-timeout-negative", ["--request-read-timeout", "-1"]),
    ("read-timeout-nan", ["--request-read-timeout", "nan"]),
    ("max-request-bytes-negative", ["--max-request-bytes", "-1"]),
    ("startup-delay-nan", ["--startup-delay", "nan"]),
    ("startup-delay-negative", ["--startup-delay", "-5"]),
    ("die-after-negative", ["--die-after", "-1"]),
]


def _limited() -> None:
    """In the child: at most 2 GiB of address space (a 16 GiB grid or reading /dev/zero fails fast)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))


def _cli(argv: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "autotune.cli", *argv]
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    return subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, preexec_fn=_limited
    )


def _assert_one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "files", "expected"), [c[1:] for c in BOMB_CASES], ids=[c[0] for c in BOMB_CASES]
)
def test_an_alias_bomb_is_refused_before_it_is_expanded(
    argv: list[str], files: dict[str, str | bytes], expected: str, tmp_path: Path
) -> None:
    materialize(tmp_path, files)
    proc = _cli([a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--n-trials", "1", "--quiet"], tmp_path)
    assert expected in _assert_one_line(proc)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("name", "workload"),
    [
        ("trace-dev-zero", "num_requests: 4\ntrace: /dev/zero\n"),
        ("jsonl-dev-zero", "num_requests: 4\njsonl: /dev/zero\noutput_len: 4\n"),
        ("jsonl-fifo", "num_requests: 4\njsonl: p.jsonl\noutput_len: 4\n"),
        ("trace-fifo", "num_requests: 4\ntrace: t.csv\n"),
    ],
)
def test_special_files_are_refused_not_read(name: str, workload: str, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p.jsonl")  # nobody writes it: opening it would wait forever
    os.mkfifo(tmp_path / "t.csv")
    (tmp_path / "w.yaml").write_text(workload)
    proc = _cli(["run", "--workload", "w.yaml", "--n-trials", "1", "--quiet"], tmp_path)
    assert "not a regular file" in _assert_one_line(proc)
    assert not (tmp_path / "runs").exists()


def test_a_stepped_range_of_two_billion_values_runs_in_little_memory(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "params:\n  max_num_batched_tokens: {type: int, low: 1024, high: 2147483647, step: 1}\n"
    )
    proc = _cli(["run", "--space", "s.yaml", "--n-trials", "1", "--quiet", "--repeats", "0"], tmp_path, 120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("name", "extra"), SERVER_CASES, ids=[c[0] for c in SERVER_CASES])
def test_sim_server_refuses_bad_limits(name: str, extra: list[str], tmp_path: Path) -> None:
    proc = _cli(["sim-server", "Qwen/Qwen3-0.6B", "--port", "0", *extra], tmp_path, timeout=30)
    assert _assert_one_line(proc).startswith("autotune sim-server: error: argument")


class _NotOpenAI(http.server.BaseHTTPRequestHandler):
    """A web server that is not an OpenAI-compatible one: 404 on every path, in HTML (a page: 200)."""

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        if self.server.page:  # type: ignore[attr-defined]
            body = b"<html><body>a web page</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return


@pytest.fixture(params=[False, True], ids=["404", "page"])
def not_openai(request: pytest.FixtureRequest) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotOpenAI)
    server.page = request.param  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_bench_url_of_a_server_that_is_not_openai_is_one_line(
    not_openai: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = assert_rejected(["bench", "--url", not_openai], {}, tmp_path, capfd, monkeypatch)
    # a page said the JSON parser's "Expecting value: line 1 column 1 (char 0)"
    assert "no OpenAI-compatible server" in line and ("404" in line or "text/html, not JSON" in line), line


@pytest.mark.usefixtures("ray_cluster")
def test_gpus_0_is_device_0(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """`--gpus 0` is what CUDA_VISIBLE_DEVICES=0 means (a count of none would run nothing)."""
    import optuna

    from autotune.cli import main

    (tmp_path / "w.yaml").write_text("num_requests: 8\nload: fixed\nprompt_len: 64\noutput_len: 8\n")
    argv = ["run", "--gpus", "0", "--space", "small", "--workload", str(tmp_path / "w.yaml"), "--quiet"]
    assert main([*argv, "--n-trials", "2", "--runs-dir", str(tmp_path), "--study", "g"]) == 0, (
        capfd.readouterr()
    )
    study = optuna.load_study(study_name="g", storage=f"sqlite:///{tmp_path / 'g' / 'study.db'}")
    assert {g for t in study.trials for g in t.user_attrs.get("gpu_ids", ())} == {0}
