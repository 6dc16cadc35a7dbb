"""Opening a study: the storage, a new study or a resume, and what a resume must keep the same (the
search space, the load, the workload's content, the guide and its budget, the noise, the objectives and
SLOs, the GPU), named in one line when it does not."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from test_study import settings

from autotune.core.errors import AutotuneError
from autotune.store.storage import connect_storage
from autotune.tune.space import load_space
from autotune.tune.study_checks import check_resumable
from autotune.tune.study_open import open_study, sqlite_url
from autotune.workloads.digest import workload_digest
from autotune.workloads.files import load_workload, spec_from_dict


def test_connect_storage(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    storage = connect_storage(url)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert connect_storage(storage) is storage
    assert connect_storage(url) is not None  # a second process opening the same file finds its schema
    with pytest.raises(AutotuneError, match="cannot open storage nosuchdb://x"):
        connect_storage("nosuchdb://x", attempts=2)


def test_a_resumed_study_keeps_its_search_space_and_load(tmp_path: Path) -> None:
    """Trials of two spaces or two loads in one study would be compared as if alike: refused. A study
    from before they were recorded resumes."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    small, wide = load_space("small"), load_space("vllm")
    assert small.digest() != wide.digest() and small.digest() == load_space("small").digest()
    kept = settings(load="capacity", space_digest=small.digest())
    open_study("s", storage, kept, sampler, resume=False)
    with pytest.raises(AutotuneError, match="another search space.*same --space"):
        open_study("s", storage, dataclasses.replace(kept, space_digest=wide.digest()), sampler, resume=True)
    with pytest.raises(AutotuneError, match="was run with load 'capacity', not 'fixed'"):
        open_study("s", storage, dataclasses.replace(kept, load="fixed"), sampler, resume=True)
    assert open_study("s", storage, kept, sampler, resume=True).study_name == "s"
    open_study("old", storage, settings(), sampler, resume=False)
    assert open_study("old", storage, kept, sampler, resume=True).study_name == "old"


def test_a_resumed_study_keeps_its_workloads_content(tmp_path: Path) -> None:
    """A workload file edited since (same name, other lengths or seed) would mix two workloads in one
    front: refused. Its load and description are not its content; a study from before it was recorded
    resumes."""
    chat = load_workload("chat")
    edited = dataclasses.replace(chat, prompt_len=dataclasses.replace(chat.prompt_len, mean=2000.0))
    same = dataclasses.replace(chat, load="fixed", description="another text")
    assert workload_digest(same) == workload_digest(chat) == workload_digest(load_workload("chat"))
    assert workload_digest(dataclasses.replace(chat, seed=1)) != workload_digest(chat)
    assert workload_digest(edited) != workload_digest(chat)
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    kept = settings(workload_digest=workload_digest(chat))
    open_study("s", storage, kept, sampler, resume=False)
    other = dataclasses.replace(kept, workload_digest=workload_digest(edited))
    with pytest.raises(AutotuneError, match="was run with workload chat of other content.*another --study"):
        open_study("s", storage, other, sampler, resume=True)
    assert open_study("s", storage, kept, sampler, resume=True).study_name == "s"
    open_study("old", storage, settings(), sampler, resume=False)  # no digest recorded
    assert open_study("old", storage, other, sampler, resume=True).study_name == "old"


def test_a_jsonl_workloads_digest_is_its_files_content_not_its_path(tmp_path: Path) -> None:
    rows = tmp_path / "a.jsonl"
    rows.write_text('{"prompt_len": 100, "output_len": 10}\n')
    copy = tmp_path / "b.jsonl"
    copy.write_bytes(rows.read_bytes())
    spec = spec_from_dict({"name": "j", "num_requests": 1, "jsonl": str(rows)})
    moved = dataclasses.replace(spec, jsonl=copy)
    assert workload_digest(moved) == workload_digest(spec)
    copy.write_text('{"prompt_len": 200, "output_len": 10}\n')
    assert workload_digest(moved) != workload_digest(spec)


def test_a_guided_study_resumes_guided_within_a_budget(tmp_path: Path) -> None:
    """Unguided trials past a guided study's budget would contradict its guide's files: a resume that
    drops --guide sim or --gpu-hours is refused; another budget, or a guide added, is recorded."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    open_study("g", storage, settings(guide="sim", gpu_hours=1.0), sampler, resume=False)
    said = "was run with --guide sim --gpu-hours 1: pass them again (a larger --gpu-hours continues it)"
    for dropped in (settings(guide="none"), settings(guide="sim")):
        with pytest.raises(AutotuneError, match=re.escape(said)):
            open_study("g", storage, dropped, sampler, resume=True)
    study = open_study("g", storage, settings(guide="sim", gpu_hours=3.0), sampler, resume=True)
    assert study.user_attrs["autotune"]["gpu_hours"] == 3.0
    open_study("u", storage, settings(guide="sim"), sampler, resume=False)  # guided, no budget
    with pytest.raises(AutotuneError, match="was run with --guide sim: pass it again$"):
        open_study("u", storage, settings(guide="none"), sampler, resume=True)
    open_study("plain", storage, settings(guide="none"), sampler, resume=False)
    open_study("plain", storage, settings(guide="sim", gpu_hours=0.5), sampler, resume=True)
    with pytest.raises(AutotuneError, match="--gpu-hours 0.5: pass them again"):
        open_study("plain", storage, settings(guide="none"), sampler, resume=True)
    open_study("old", storage, settings(), sampler, resume=False)  # from before the guide was recorded
    assert open_study("old", storage, settings(guide="none"), sampler, resume=True).study_name == "old"


def test_a_resumed_simulated_study_keeps_its_noise(tmp_path: Path) -> None:
    """Noisy and noise-free measurements in one front would be compared as if alike: refused. A study
    from before the noise was recorded resumes with any."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    open_study("quiet", storage, settings(noise=0.0), sampler, resume=False)
    with pytest.raises(AutotuneError, match="was simulated with --noise 0, not 0.05: resume with the same"):
        open_study("quiet", storage, settings(noise=0.05), sampler, resume=True)
    assert open_study("quiet", storage, settings(noise=0.0), sampler, resume=True).study_name == "quiet"
    open_study("noisy", storage, settings(noise=0.02), sampler, resume=False)
    with pytest.raises(AutotuneError, match="was simulated with --noise 0.02, not 0:"):
        open_study("noisy", storage, settings(noise=0.0), sampler, resume=True)
    open_study("old", storage, settings(), sampler, resume=False)  # no noise recorded
    assert open_study("old", storage, settings(noise=0.05), sampler, resume=True).study_name == "old"


def test_existing_study_needs_resume_and_same_settings(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    sampler = optuna.samplers.RandomSampler()
    study = open_study("s", storage, settings(), sampler, resume=False)
    study.ask()  # left RUNNING, as after a crash
    with pytest.raises(AutotuneError, match="already exists.*--resume"):
        open_study("s", storage, settings(), sampler, resume=False)
    with pytest.raises(AutotuneError, match="optimises"):
        open_study("s", storage, settings(directions=["minimize"] * 3), sampler, resume=True)
    with pytest.raises(AutotuneError, match="slos"):
        open_study("s", storage, settings(slos=["ttft_p99=1s"]), sampler, resume=True)
    resumed = open_study("s", storage, settings(), sampler, resume=True)
    (stale,) = resumed.trials
    assert stale.state == TrialState.FAIL and stale.user_attrs["failure"] == "interrupted"


def test_resume_refuses_a_study_the_storage_lacks_and_knows_a_gpu_by_its_catalog_name(tmp_path: Path) -> None:
    """--resume never starts a new study (a typo, a GPU alias in a default name): one line naming the
    studies there. The GPU is compared as the catalog resolves it, not as typed."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    with pytest.raises(AutotuneError, match=r"^nothing to resume: no study 'typo' in sqlite:///"):
        open_study("typo", storage, settings(), sampler, resume=True)
    assert optuna.study.get_all_study_names(connect_storage(storage)) == []  # nothing created
    for name in ("b", "a"):
        open_study(name, storage, settings(gpu="A100"), sampler, resume=False)
    with pytest.raises(AutotuneError, match=r"no study 'typo' in sqlite:///.* \(it holds a, b\); pass an"):
        check_resumable("typo", storage, None)
    check_resumable("a", storage, None)
    for spelling in ("a100", "A100-80GB"):  # one GPU: resumed
        assert open_study("a", storage, settings(gpu=spelling), sampler, resume=True).study_name == "a"
    with pytest.raises(AutotuneError, match="was run with gpu 'A100', not 'H100'"):
        open_study("a", storage, settings(gpu="H100"), sampler, resume=True)
    # every setting that differs, in the one line: it named only the first
    both = "was run with gpu 'A100', not 'H100'; workload 'chat', not 'azure_conv'"
    with pytest.raises(AutotuneError, match=both):
        open_study("a", storage, settings(gpu="H100", workload="azure_conv"), sampler, resume=True)


def test_resume_in_a_runs_folder_names_its_run_folders(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in ("llama-a100-chat", "llama-h100-chat"):
        (runs / name).mkdir(parents=True)
        open_study(name, sqlite_url(runs / name), settings(), optuna.samplers.RandomSampler(), resume=False)
    missing = sqlite_url(runs / "llama-a100-80gb-chat")
    with pytest.raises(AutotuneError, match=r"in .*/runs/ \(it holds llama-a100-chat, llama-h100-chat\)"):
        check_resumable("llama-a100-80gb-chat", missing, runs)
    assert not (runs / "llama-a100-80gb-chat").exists()
    # a run stopped as it made its study.db left the file without the study: it said the folder held it
    (runs / "cut").mkdir()
    connect_storage(sqlite_url(runs / "cut"))  # Optuna's tables, no study
    with pytest.raises(AutotuneError, match=r"^nothing to resume: .*/cut/study.db holds no study 'cut' \("):
        check_resumable("cut", sqlite_url(runs / "cut"), runs)


def test_a_resumed_sampler_continues_rather_than_replays_its_draws(tmp_path: Path) -> None:
    """Random search over the small space, 5 trials, then resumed to 10: re-seeded as at the start, the
    sampler re-proposed 4 of the 5 configs the study had measured (duplicates, answered for nothing)."""
    from autotune.cli import main

    args = ["run", "--space", "small", "--sampler", "random", "--runs-dir", str(tmp_path), "--quiet"]
    assert main([*args, "--study", "r", "--n-trials", "5"]) == 0
    assert main([*args, "--study", "r", "--n-trials", "10", "--resume"]) == 0
    storage = sqlite_url(tmp_path / "r")
    trials = optuna.load_study(study_name="r", storage=storage).trials
    duplicates = [t.number for t in trials if t.user_attrs.get("duplicate_of") is not None]
    assert len(trials) >= 10 and len(duplicates) <= 1, duplicates


def test_a_resumed_docker_study_keeps_its_image(tmp_path: Path) -> None:
    """Trials measured on one image and then another would be one front (and `export` would deploy the
    second for all): refused, as another backend is. A study from before the image was recorded resumes."""
    storage, sampler = sqlite_url(tmp_path), optuna.samplers.RandomSampler()
    docker = settings(backend="docker", image="vllm/vllm-openai:v0.10.2")
    open_study("d", storage, docker, sampler, resume=False)
    newer = dataclasses.replace(docker, image="vllm/vllm-openai:v0.11.0")
    with pytest.raises(
        AutotuneError,
        match=re.escape("was run with image 'vllm/vllm-openai:v0.10.2', not 'vllm/vllm-openai:v0.11.0'"),
    ):
        open_study("d", storage, newer, sampler, resume=True)
    assert open_study("d", storage, docker, sampler, resume=True).study_name == "d"
    open_study("old", storage, settings(backend="docker"), sampler, resume=False)  # no image recorded
    assert open_study("old", storage, newer, sampler, resume=True).study_name == "old"
    assert "image" not in settings().to_dict()  # a run of another backend records none
