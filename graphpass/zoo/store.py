"""The results of a model-zoo run: one SQLite file in the output folder, one row per model and run.

A row is written when a model's worker has finished (whatever its status), in one transaction:
a batch killed halfway leaves the rows of the models that finished and nothing of the ones that
were running, so a rerun with the same options runs exactly those (:meth:`Store.finished`).
Only the process that drives the batch writes the file (the Ray backend's workers return their
results to it).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Store", "DB_NAME", "COLUMNS"]

DB_NAME = "graphpass-zoo.sqlite"

#: (column, SQL type): what a run of one model records
COLUMNS = (
    ("model", "TEXT"),            # the path as given (relative to the folder it was found in, if any)
    ("path", "TEXT"),             # the absolute path read
    ("verb", "TEXT"),             # optimize | evaluate
    ("input_hash", "TEXT"),       # sha256 of the model file and its external data files
    ("options", "TEXT"),          # canonical JSON of the options
    ("options_hash", "TEXT"),
    ("status", "TEXT"),           # ok | verify-failed | bad-input | timeout | memory | crash | internal-error
    ("exit_code", "INTEGER"),     # the worker's (a signal: negative)
    ("nodes_before", "INTEGER"),
    ("nodes_after", "INTEGER"),
    ("target", "TEXT"),
    ("cost_before_us", "REAL"),   # cost-model estimates on the target, not measurements
    ("cost_after_us", "REAL"),
    ("transdata", "INTEGER"),     # TransData left after (estimate)
    ("aicpu_ops", "INTEGER"),     # ops the cost model places on the AI CPU after
    ("verify", "TEXT"),           # the verification's line, when --verify ran
    ("wall_s", "REAL"),
    ("peak_rss_mb", "REAL"),
    ("error", "TEXT"),            # one line
    ("output", "TEXT"),           # the optimized model written (optimize)
    ("backend", "TEXT"),
    ("started", "REAL"),          # unix times
    ("finished", "REAL"),
)


class Store:
    """The SQLite file of one output folder."""

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / DB_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=60)
        cols = ", ".join(f"{c} {t}" for c, t in COLUMNS)
        with self._db:
            self._db.execute(f"CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
            self._db.execute("CREATE INDEX IF NOT EXISTS runs_key ON runs (verb, input_hash, options_hash)")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def finished(self, verb: str, model: str, input_hash: str, options_hash: str) -> dict[str, Any] | None:
        """The last row of this model (its name in the batch and its content) with these options."""
        cur = self._db.execute("SELECT * FROM runs WHERE verb = ? AND model = ? AND input_hash = ? AND options_hash = ? "
                               "ORDER BY id DESC LIMIT 1", (verb, model, input_hash, options_hash))
        row = cur.fetchone()
        return dict(zip([d[0] for d in cur.description], row)) if row else None

    def add(self, result: dict[str, Any]) -> None:
        row = {c: result.get(c) for c, _ in COLUMNS}
        row["finished"] = row["finished"] or time.time()
        names = ", ".join(row)
        with self._db:
            self._db.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' * len(row))})", tuple(row.values()))

    def rows(self, latest: bool = True) -> Iterator[dict[str, Any]]:
        """Every row, or (``latest``) the last row of each (model, verb, options)."""
        if latest:
            sql = ("SELECT * FROM runs WHERE id IN (SELECT MAX(id) FROM runs GROUP BY model, verb, options_hash) "
                   "ORDER BY model")
        else:
            sql = "SELECT * FROM runs ORDER BY id"
        cur = self._db.execute(sql)
        names = [d[0] for d in cur.description]
        for row in cur:
            yield dict(zip(names, row))


def canonical_options(options: dict[str, Any]) -> str:
    """Options as canonical JSON (sorted keys; None and empty values left out)."""
    clean = {k: v for k, v in options.items() if v not in (None, False, [], (), "")}
    return json.dumps(clean, sort_keys=True, default=str)
