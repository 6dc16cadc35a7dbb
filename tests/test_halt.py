"""A run halts when its first launched trials all fail alike (tune/halt.py): the setup is broken."""

from __future__ import annotations

from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.tune.halt import HALT_AFTER, FirstFailures

UNKNOWN_FLAG = "error: unrecognized arguments: --max-num-partial-prefills 2"


def told(
    failure: str | None, message: str = "", state: TrialState = TrialState.COMPLETE, **attrs
) -> FrozenTrial:
    """A trial as the tuner tells it: its failure kind and message in its user attrs."""
    return create_trial(
        state=state,
        value=None if state == TrialState.FAIL else 0.0,
        user_attrs={"failure": failure, "message": message, **attrs},
    )


def outcome(trials: list[FrozenTrial]) -> list[str | None]:
    first = FirstFailures()
    return [first.record(t) for t in trials]


def test_the_first_launched_trials_failing_alike_halt_the_run() -> None:
    reasons = outcome([told("invalid_config", UNKNOWN_FLAG) for _ in range(HALT_AFTER)])
    assert reasons[:-1] == [None] * (HALT_AFTER - 1)
    assert reasons[-1] is not None and UNKNOWN_FLAG in reasons[-1] and "invalid_config" in reasons[-1]


def test_a_port_another_program_holds_for_every_launch_halts_the_run() -> None:
    """A collision is retried on another port before a trial fails on it: three launches failing on one
    port is a serve command pinning a port that another program holds."""
    taken = told("port_in_use", "OSError: [Errno 98] error while attempting to bind on address: in use")
    assert outcome([taken] * HALT_AFTER)[-1] is not None


def test_unlaunched_duplicate_and_cut_short_trials_say_nothing_of_the_setup() -> None:
    crash = ("crashed", "server exited with code 1: RuntimeError: no CUDA device")
    trials = [told(*crash), told("invalid_config", "over max_model_len", launched=False)]
    trials += [told(*crash, duplicate_of=0), told("budget_spent", "cut", state=TrialState.FAIL), told(*crash)]
    assert outcome(trials)[:-1] == [None] * 4
    assert outcome(trials)[-1] is None  # two launched so far
    assert outcome([*trials, told(*crash)])[-1] is not None


def test_failures_a_config_causes_itself_or_that_differ_never_halt() -> None:
    kv = [told("kv_cache_oom", "No available memory for the cache blocks.") for _ in range(5)]
    assert outcome(kv) == [None] * 5  # configs short of memory alike: their own values, not the setup
    differ = [told("crashed", f"server exited with code {code}") for code in (1, 2, 1, 1, 1)]
    assert outcome(differ) == [None] * 5
    after_a_success = [told(None), *[told("crashed", "server exited with code 1") for _ in range(4)]]
    assert outcome(after_a_success) == [None] * 5  # one server worked: the setup can serve


def test_messages_that_differ_only_by_a_container_id_are_alike() -> None:
    """Docker names the container in its refusal: each trial's own id, the same broken setup."""

    def refused(container_id: str) -> FrozenTrial:
        url = f"http+docker://localhost/v1.41/containers/{container_id}/start"
        return told("error", f"server failed: 500 Server Error for {url}: could not select device driver")

    ids = ["089e7e739fd1e7be4a8370e7b78ac5d3", "fb84260a8e4564f77807bfb49641d488", "5d0c93a1b2e4"]
    reason = outcome([refused(i) for i in ids])[-1]
    assert reason is not None and "could not select device driver" in reason
