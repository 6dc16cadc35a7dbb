"""Reading a run's study database while the run writes it, read only.

Optuna's `load_study` creates the file and its schema when they are missing: a test polling a run that
is creating them races it (UNIQUE constraint failed on alembic_version, in either process). This
helper opens the SQLite file read-only and counts with plain SQL on Optuna's tables instead.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

# Finished trials that count toward --n-trials: not rejected before launch, not a duplicate answered
# from an earlier result (the attrs tune/tuner.py sets).
_COUNTED = """
SELECT
  SUM(t.state = 'COMPLETE'
      AND NOT EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id
                      AND ((a.key = 'launched' AND a.value_json = 'false') OR a.key = 'duplicate_of'))),
  SUM(t.state = 'RUNNING')
FROM trials t JOIN studies s ON s.study_id = t.study_id
WHERE s.study_name = ?
"""


def counted_trials(db: Path, study: str) -> tuple[int, int]:
    """(COMPLETE trials counted toward --n-trials, RUNNING trials) of `study` in the SQLite file `db`;
    (0, 0) while the file, its tables or the study do not exist yet."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as conn:
            done, running = conn.execute(_COUNTED, (study,)).fetchone()
    except sqlite3.Error:  # no file or no tables yet
        return 0, 0
    return int(done or 0), int(running or 0)
