"""The job store's SQLite schema: its tables, its version and how an older store is brought
up to it. Data only; controller/store.py applies it."""

from __future__ import annotations

SCHEMA_VERSION = 7

_NODES_TABLE = """CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY, host TEXT NOT NULL, state TEXT NOT NULL, agent_pid INTEGER,
    slot INTEGER, reason TEXT, updated_at TEXT NOT NULL, backend TEXT NOT NULL,
    times_implicated INTEGER NOT NULL DEFAULT 0
    )"""

_PROGRESS_TABLE = """CREATE TABLE IF NOT EXISTS progress (
    attempt INTEGER NOT NULL, step INTEGER NOT NULL, at REAL NOT NULL
    )"""

# memory snapshots' blocking as rank 0 reported it, a row per report (trainguard.goodput)
_SNAPSHOT_BLOCKING_TABLE = """CREATE TABLE IF NOT EXISTS snapshot_blocking (
    attempt INTEGER NOT NULL, rank INTEGER, at REAL NOT NULL, blocked_s REAL NOT NULL,
    snapshots INTEGER NOT NULL
    )"""

# Version 1 -> 2: events carry structured data; worker rows say whether the OOM killer ran.
# Version 2 -> 3: the nodes of a multi-node job.
# Version 3 -> 4: the step ledger (when each attempt reached which step; trainguard.goodput).
# Version 4 -> 5: worker rows say when the rank reached the step before its latest (an error
#   its log showed well before that, it trained past: diagnosis.verdict).
# Version 5 -> 6: the memory snapshots' blocking (walk-through 34 #3).
# Version 6 -> 7: worker rows say who stopped a stopped rank (the launcher, or its node agent
#   on a SIGTERM from outside: diagnosis.stopped_first; review 53).
MIGRATIONS = {
    1: ("ALTER TABLE events ADD COLUMN data TEXT",
        "ALTER TABLE workers ADD COLUMN oom_killed INTEGER"),
    2: (_NODES_TABLE,),
    3: (_PROGRESS_TABLE,),
    4: ("ALTER TABLE workers ADD COLUMN second_last_step_at TEXT",),
    5: (_SNAPSHOT_BLOCKING_TABLE,),
    6: ("ALTER TABLE workers ADD COLUMN stopped_by TEXT",),
}

# the version that added a worker column (a store older than that reads it as NULL)
WORKER_COLUMN_SINCE = {"oom_killed": 2, "second_last_step_at": 5, "stopped_by": 7}

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL, level TEXT NOT NULL, reason TEXT NOT NULL, message TEXT NOT NULL,
    job TEXT NOT NULL, node TEXT, rank INTEGER, attempt INTEGER, data TEXT
    )""",
    "CREATE TABLE IF NOT EXISTS running_records (attempt INTEGER PRIMARY KEY, data TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS workers (
    attempt INTEGER NOT NULL, rank INTEGER NOT NULL, local_rank INTEGER NOT NULL,
    node TEXT NOT NULL, pid INTEGER, state TEXT NOT NULL, exit_code INTEGER, signal TEXT,
    started_at TEXT, ended_at TEXT, start_count INTEGER NOT NULL, oom_killed INTEGER,
    second_last_step_at TEXT, stopped_by TEXT,
    PRIMARY KEY (attempt, rank)
    )""",
    _NODES_TABLE,
    _PROGRESS_TABLE,
    _SNAPSHOT_BLOCKING_TABLE,
)

# made by every writer that opens a store, whatever its version (an index changes no reader):
# the newest event of a reason (the last checkpoint, a stop under way) is read for each row of
# the dashboard every few seconds; without it each read scanned every event (review 45 #7: a
# long job has hundreds of thousands)
INDEXES = ("CREATE INDEX IF NOT EXISTS events_by_reason ON events (reason, id)",)
