"""The folders autotune ships beside its package: search_spaces/, workloads/ and objectives/.

In a checkout (and an editable install) they are the repository's own; a wheel installs them under
`<prefix>/share/autotune/` (pyproject.toml, `data-files`), since they are not Python packages.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

SHIPPED = ("search_spaces", "workloads", "objectives")


def bundled_dir(name: str) -> Path:
    """The shipped folder `name` (one of SHIPPED): the source tree's, else the installed copy."""
    source = Path(__file__).resolve().parents[2] / name
    if source.is_dir():
        return source
    return Path(sysconfig.get_path("data")) / "share" / "autotune" / name
