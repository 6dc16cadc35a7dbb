"""The package layout is layered: a module imports only from its own layer or the layers below it.

The order is the data flow of docs/design.md: core records at the bottom, the CLI at the top. An
upward import (the simulator naming a backend, a trial reaching into the tuner) fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

import autotune

# Lowest first. A package may import itself and anything listed before it.
LAYERS = (
    "core",
    "catalog",
    "workloads",
    "measure",
    "sim",
    "sim_server",
    "backends",
    "calibrate",
    "trial",
    "dispatch",
    "store",
    "tune",
    "outputs",
    "commands",
    "cli",
)
ROOT = Path(autotune.__file__).parent


def layer_of(module: str) -> int | None:
    """The rank of `autotune.<package>...` in LAYERS; None for the top-level package itself."""
    parts = module.split(".")
    if parts[0] != "autotune" or len(parts) < 2:
        return None
    return LAYERS.index(parts[1])


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module) of every autotune import in a file, lazy imports inside functions included."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from autotune import sim` names a package, `from autotune import __version__` the top level
            names = [target]
            if target == "autotune":
                names = [target if a.name.startswith("__") else f"{target}.{a.name}" for a in node.names]
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "autotune"]


def upward_imports(root: Path) -> list[str]:
    """Every import from a higher layer (or from a package LAYERS does not name), one line each."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if module == "autotune":
            continue
        try:
            own = layer_of(module)
        except ValueError:
            problems.append(f"{path.relative_to(root.parent)}: package not in LAYERS")
            continue
        for line, target in imported_modules(path, module):
            try:
                rank = layer_of(target)
            except ValueError:
                problems.append(f"{path.relative_to(root.parent)}:{line}: {target} is in no layer")
                continue
            if rank is not None and own is not None and rank > own:
                problems.append(
                    f"{path.relative_to(root.parent)}:{line}: {LAYERS[own]} imports {target} ({LAYERS[rank]})"
                )
    return problems


def test_no_module_imports_from_a_layer_above() -> None:
    assert upward_imports(ROOT) == []


def test_every_package_is_a_layer_with_a_public_face() -> None:
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())
    assert set(packages) <= set(LAYERS)
    for name in packages:
        if name != "commands":
            assert "__all__" in (ROOT / name / "__init__.py").read_text(), name


def test_a_planted_upward_import_is_caught(tmp_path: Path) -> None:
    tree = tmp_path / "autotune"
    for package, source in {
        "sim": "from autotune.backends.base import Backend\n",
        "backends": "from autotune.sim.engine import simulate\n",
        "trial": "def lazy():\n    from autotune.tune.progress import clock\n",
    }.items():
        (tree / package).mkdir(parents=True)
        (tree / package / "__init__.py").write_text("")
        (tree / package / "mod.py").write_text(source)
    (tree / "__init__.py").write_text("")
    assert upward_imports(tree) == [
        "autotune/sim/mod.py:1: sim imports autotune.backends.base (backends)",
        "autotune/trial/mod.py:2: trial imports autotune.tune.progress (tune)",
    ]
