"""What a wheel ships: the spaces, workloads and objectives a non-editable install finds (`pip install .`
left them out: `autotune run --space vllm` said "search space file not found")."""

from __future__ import annotations

import importlib.util
import shutil
import sysconfig
import tomllib
from pathlib import Path

from autotune.core.bundled import SHIPPED, bundled_dir

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_lists_every_shipped_file() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    for name in SHIPPED:
        listed = {p.name for pattern in data[f"share/autotune/{name}"] for p in ROOT.glob(pattern)}
        assert listed == {p.name for p in (ROOT / name).iterdir() if p.is_file()}, name


def test_outside_a_checkout_the_installed_copy_is_read(tmp_path: Path) -> None:
    """An installed package has no search_spaces/ two folders up: the wheel's data directory serves."""
    installed = tmp_path / "site-packages" / "autotune" / "core" / "bundled.py"
    installed.parent.mkdir(parents=True)
    shutil.copy(ROOT / "autotune" / "core" / "bundled.py", installed)
    spec = importlib.util.spec_from_file_location("installed_bundled", installed)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = Path(sysconfig.get_path("data")) / "share" / "autotune" / "search_spaces"
    assert module.bundled_dir("search_spaces") == expected
    assert bundled_dir("search_spaces") == ROOT / "search_spaces"  # in the checkout: its own
