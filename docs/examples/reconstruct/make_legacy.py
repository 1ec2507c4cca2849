"""Write legacy.db: the legacy policy system's history table and its monthly snapshots."""

import sqlite3

HISTORY = [  # (policy_id, status, premium, changed_at, effective_from, change_seq), as extracted
    (1001, "active", 420.0, "2024-01-03 09:12", "2024-01-01", 1),
    (1002, "active", 310.0, "2024-01-05 16:40", "2024-01-05", 1),
    (1001, "active", 455.0, "2024-03-02 11:00", "2024-03-01", 2),
    (1003, "active", 980.0, "2024-02-10 08:00", "2024-02-10", 1),
    (1002, "cancelled", 335.0, "2024-04-01 10:00", "2024-03-31", 3),  # recorded before seq 2 below
    (1002, "active", 335.0, "2024-04-02 09:00", "2024-03-31", 2),  # same day: change_seq orders
    (1003, "active", -1.0, "2024-05-01 12:00", "2024-05-01", 2),  # a bad row
    (1001, "active", 470.0, "2024-06-30 23:59", "2024-02-15", 3),  # recorded in June, effective in February
]

SNAPSHOTS = {  # snapshot time → (policy_id, status, premium)
    "2024-01-31": [(1001, "active", 420.0), (1002, "active", 310.0)],
    "2024-02-29": [(1001, "active", 420.0), (1002, "active", 310.0), (1003, "active", 980.0)],
    "2024-03-31": [(1001, "active", 455.0), (1003, "active", 980.0)],
}

with sqlite3.connect("legacy.db") as db:
    db.execute(
        "CREATE TABLE policy_history (policy_id BIGINT, status TEXT, premium REAL, changed_at TEXT, "
        "effective_from TEXT, change_seq INTEGER)"
    )
    db.executemany("INSERT INTO policy_history VALUES (?, ?, ?, ?, ?, ?)", HISTORY)
    db.execute(
        "CREATE TABLE policy_snapshots (snapshot_at TEXT, policy_id BIGINT, status TEXT, premium REAL)"
    )
    for at in sorted(SNAPSHOTS, reverse=True):  # the newest partition was extracted first
        db.executemany("INSERT INTO policy_snapshots VALUES (?, ?, ?, ?)", [(at, *r) for r in SNAPSHOTS[at]])
