import GRDB

// The outbox's schema, built by its migrations v1 to v7 (docs/outbox.md, "Schema history").

extension Outbox {
    /// Every migration, in order: a new outbox runs them all, an older one those it has not run.
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE outbox (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL UNIQUE,
                    event_id TEXT NOT NULL UNIQUE,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL,
                    batch_id TEXT
                );
                CREATE INDEX outbox_batch ON outbox(batch_id) WHERE batch_id IS NOT NULL;
                CREATE TABLE dead_letters (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL,
                    event_id TEXT,
                    producer TEXT,
                    producer_kind INTEGER,
                    producer_seq INTEGER,
                    wall_ms INTEGER,
                    boot_ns INTEGER,
                    boot_id BLOB,
                    status INTEGER NOT NULL,
                    reason TEXT NOT NULL,
                    batch_id TEXT,
                    dead_at_ms INTEGER NOT NULL,
                    body BLOB NOT NULL
                );
                CREATE TABLE agent_state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
                """)
        }
        m.registerMigration("v2: pending counters") { db in
            // Kept in agent_state so that the loop never counts the outbox table (a full scan).
            try db.execute(sql: """
                INSERT OR REPLACE INTO agent_state (key, value) SELECT 'pending_count', COUNT(*) FROM outbox;
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'pending_bytes', COALESCE(SUM(LENGTH(body)), 0) FROM outbox;
                """)
        }
        m.registerMigration("v3: no event_id index, the batch in flight as an id range") { db in
            // Two per-event costs go (docs/outbox.md, "Schema history"):
            // - the UNIQUE index on event_id: random ids dirtied index pages all over the file on every
            //   insert and delete. The drain is idempotent on the store's seq (UNIQUE, and
            //   `last_drained_seq` checked in the same transaction); the collector dedups on event_id.
            // - `batch_id` on every row: each batch rewrote its rows and their partial index once more.
            //   A batch is always a run of consecutive ids, and at most one is in flight: `in_flight`
            //   holds it.
            // SQLite cannot drop a column constraint, so the table is rebuilt, rows and ids unchanged.
            try db.execute(sql: """
                CREATE TABLE in_flight (
                    batch_id TEXT NOT NULL,
                    first_id INTEGER NOT NULL,
                    last_id INTEGER NOT NULL
                );
                INSERT INTO in_flight (batch_id, first_id, last_id)
                    SELECT batch_id, MIN(id), MAX(id) FROM outbox WHERE batch_id IS NOT NULL
                    GROUP BY batch_id ORDER BY MIN(id) LIMIT 1;
                CREATE TABLE outbox_v3 (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL UNIQUE,
                    event_id TEXT NOT NULL,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL
                );
                INSERT INTO outbox_v3 SELECT id, seq, event_id, producer, producer_kind, producer_seq, wall_ms,
                    boot_ns, boot_id, body FROM outbox;
                DROP TABLE outbox;
                ALTER TABLE outbox_v3 RENAME TO outbox;
                """)
        }
        m.registerMigration("v4: no seq index") { db in
            // The UNIQUE index on seq was a second B-tree written on every insert and every delete
            // (about 0.9 µs of SQLite work per event in a model of the drain; docs/outbox.md, "Schema
            // history"). It guarded what `last_drained_seq` already guarantees: the drain inserts only
            // seqs above it, in increasing order, and advances it in the same transaction. Rebuilt as
            // v3 was, rows and ids unchanged.
            try db.execute(sql: """
                CREATE TABLE outbox_v4 (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL,
                    event_id TEXT NOT NULL,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL
                );
                INSERT INTO outbox_v4 SELECT id, seq, event_id, producer, producer_kind, producer_seq, wall_ms,
                    boot_ns, boot_id, body FROM outbox;
                DROP TABLE outbox;
                ALTER TABLE outbox_v4 RENAME TO outbox;
                """)
        }
        m.registerMigration("v5: dead-letter bytes") { db in
            // Dead letters count against the outbox quota with the pending events (promise 4): kept in
            // agent_state like the pending counters, so that no check sums the table.
            try db.execute(sql: """
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'dead_letter_bytes', COALESCE(SUM(LENGTH(body)), 0) FROM dead_letters;
                """)
        }
        m.registerMigration("v6: dead-letter bytes kept by triggers") { db in
            // Kept by SQLite itself, for every program that adds or removes a dead letter: an agent from
            // before v5 knows no such count, and keeping it right after one ran took a sum over the whole
            // table at every start (up to the quota's worth of pages, on a timer's every run). A key of its
            // own: agents from v5 on bump `dead_letter_bytes` themselves, and recount it at their start.
            try db.execute(sql: """
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'dead_letter_body_bytes', COALESCE(SUM(LENGTH(body)), 0) FROM dead_letters;
                -- The record identity an agent before v6 kept is that of the record at last_drained_seq.
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'last_drained_record_seq', value FROM agent_state WHERE key = 'last_drained_seq'
                        AND EXISTS (SELECT 1 FROM agent_state WHERE key = 'last_drained_record' AND value != 0);
                CREATE TRIGGER dead_letter_added AFTER INSERT ON dead_letters BEGIN
                    UPDATE agent_state SET value = value + LENGTH(NEW.body) WHERE key = 'dead_letter_body_bytes';
                END;
                CREATE TRIGGER dead_letter_removed AFTER DELETE ON dead_letters BEGIN
                    UPDATE agent_state SET value = value - LENGTH(OLD.body) WHERE key = 'dead_letter_body_bytes';
                END;
                """)
        }
        m.registerMigration("v7: two tables in turn") { db in
            // Deleting an acknowledged batch's rows rewrote every page they were on into the WAL (as many
            // page writes as their drain had cost); emptying a table whose rows are all delivered frees
            // its pages without writing them (docs/outbox.md, "Two tables in turn"). The rows keep their
            // ids in `outbox_0`, which the drain goes on appending to; the view `outbox` shows what waits.
            try db.execute(sql: """
                ALTER TABLE outbox RENAME TO outbox_0;
                CREATE TABLE outbox_1 (
                    id INTEGER PRIMARY KEY,
                    seq INTEGER NOT NULL,
                    event_id TEXT NOT NULL,
                    producer TEXT NOT NULL,
                    producer_kind INTEGER NOT NULL,
                    producer_seq INTEGER NOT NULL,
                    wall_ms INTEGER NOT NULL,
                    boot_ns INTEGER NOT NULL,
                    boot_id BLOB NOT NULL,
                    body BLOB NOT NULL
                );
                -- What the batch in flight holds, so that its acknowledgement need not read its rows (null:
                -- a batch an agent of v6 made, counted when it is acknowledged).
                ALTER TABLE in_flight ADD COLUMN event_count INTEGER;
                ALTER TABLE in_flight ADD COLUMN body_bytes INTEGER;
                INSERT OR REPLACE INTO agent_state (key, value) VALUES ('newer_table', 0);
                INSERT OR REPLACE INTO agent_state (key, value)
                    SELECT 'delivered_through', COALESCE(MIN(id) - 1, 0) FROM outbox_0;
                CREATE VIEW outbox AS
                    SELECT * FROM outbox_0
                        WHERE id > COALESCE((SELECT value FROM agent_state WHERE key = 'delivered_through'), 0)
                    UNION ALL
                    SELECT * FROM outbox_1
                        WHERE id > COALESCE((SELECT value FROM agent_state WHERE key = 'delivered_through'), 0);
                """)
        }
        return m
    }
}
