/*
 * lmdb-baseline drain: the sync agent's drain (Sources/TributaryAgentCore/Drainer.swift) in plain C,
 * so that `make bench` can print the Swift Drainer's throughput next to the cost of the same
 * LMDB -> SQLite work without Swift, GRDB or Foundation.
 *
 * Each chunk does what Drainer.drainChunk does:
 *
 *   1. one LMDB read transaction: the identity (`anonymous_id`, `device_id`, `login_id`) and the
 *      `config` table (Enricher(store:) reads both per chunk), then up to --chunk events with a
 *      cursor from the first key; every record is checked (format version, header length, CRC-32
 *      over everything after the CRC field, with zlib's crc32 as EventRecord.decode uses) and
 *      copied out;
 *   2. enrich as the Enricher does for app events: the top-level `event_id` is read from the body
 *      and `,"_tributary":{"seq":…,"producer":…,"producer_kind":…,"producer_seq":…}` is inserted
 *      before the closing brace (byte for byte what JSONFields.appending produces, which the driver
 *      checks by comparing the two outboxes);
 *   3. one SQLite transaction (BEGIN IMMEDIATE, as GRDB's DatabasePool.write) doing what
 *      Outbox.insertDrained does: read `last_drained_seq`, INSERT every row whose seq is above it and
 *      above the rows before it, set `last_drained_seq`, add to the `drained` counter, COMMIT;
 *   4. one durable LMDB write transaction deleting the chunk (cursor from the first key, as
 *      Transaction.deleteThrough does);
 *   5. with --gzip-level N: the chunk's enriched bodies, one per line (the agent's NDJSON batch
 *      text), gzipped with libdeflate at level N, as the agent compresses each request body. With
 *      it, this is the C floor of the agent's CPU per delivered event (docs/performance.md, "Energy
 *      per event"): the drain and the compression, and nothing of HTTP.
 *
 * The outbox has the Swift outbox's table (Outbox.swift, migrations v1, v3 and v4), journal_mode=WAL and
 * synchronous=FULL. Since migration v7 the Swift outbox keeps two such tables in turn and gives each
 * row its id itself, reading the tables' bounds with each chunk (Outbox.Tables): those reads are the
 * Swift drain's to carry, and the baseline keeps the one table, its rows numbered by SQLite.
 * (--synchronous normal is there to show what that setting costs.) Only app events are expected
 * (the driver fills the store with them): extension events, whose enrichment re-encodes the JSON
 * with Foundation, and corrupt records (dead letters) are refused, since no benchmark store holds
 * any.
 *
 * Protocol with the driver as for the producer mode: "READY <pid>" once both files are open, "GO"
 * on stdin, then one JSON line: {"lang":"c","producer":"drain","pid":…,"events":…,"txns":…,
 * "start_ns":…,"end_ns":…,"cpu_ns":…,"max_rss_kb":…,"latency_ns":[…]} with one latency per chunk
 * (read to LMDB delete commit).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <libdeflate.h>
#include <lmdb.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "baseline.h"

/* Record format version 1 (EventRecord.swift). */
enum { FORMAT_VERSION = 1, HEADER_FIXED = 54 };

/* Outbox.swift, migrations "v1", "v3" and "v4" (the outbox table as v4 rebuilds it, and in_flight). */
static const char *const SCHEMA =
    "CREATE TABLE outbox ("
    "    id INTEGER PRIMARY KEY,"
    "    seq INTEGER NOT NULL,"
    "    event_id TEXT NOT NULL,"
    "    producer TEXT NOT NULL,"
    "    producer_kind INTEGER NOT NULL,"
    "    producer_seq INTEGER NOT NULL,"
    "    wall_ms INTEGER NOT NULL,"
    "    boot_ns INTEGER NOT NULL,"
    "    boot_id BLOB NOT NULL,"
    "    body BLOB NOT NULL"
    ");"
    "CREATE TABLE in_flight (batch_id TEXT NOT NULL, first_id INTEGER NOT NULL, last_id INTEGER NOT NULL);"
    "CREATE TABLE dead_letters ("
    "    id INTEGER PRIMARY KEY,"
    "    seq INTEGER NOT NULL,"
    "    event_id TEXT,"
    "    producer TEXT,"
    "    producer_kind INTEGER,"
    "    producer_seq INTEGER,"
    "    wall_ms INTEGER,"
    "    boot_ns INTEGER,"
    "    boot_id BLOB,"
    "    status INTEGER NOT NULL,"
    "    reason TEXT NOT NULL,"
    "    batch_id TEXT,"
    "    dead_at_ms INTEGER NOT NULL,"
    "    body BLOB NOT NULL"
    ");"
    "CREATE TABLE agent_state (key TEXT PRIMARY KEY, value INTEGER NOT NULL);";

struct drain_options {
    const char *group;
    const char *outbox;
    uint64_t chunk;
    const char *synchronous; /* "FULL" or "NORMAL" */
    uint64_t map_size;
    int gzip_level; /* 0: no gzip; 1 … 12: gzip each chunk's bodies at this libdeflate level */
};

/* One event of the chunk, ready for the outbox. Strings point into the chunk's arena. */
struct row {
    uint64_t seq, producer_seq, boot_ns;
    int64_t wall_ms;
    int kind;
    uint8_t boot_id[16];
    size_t producer_at, producer_length, event_id_at, event_id_length, body_at, body_length;
};

/* A growable byte buffer; offsets into it stay valid when it grows. */
struct arena {
    uint8_t *bytes;
    size_t count, capacity;
};

static size_t arena_reserve(struct arena *a, size_t more) {
    if (a->count + more > a->capacity) {
        size_t capacity = a->capacity ? a->capacity : 1 << 20;
        while (a->count + more > capacity) capacity *= 2;
        a->bytes = realloc(a->bytes, capacity);
        if (a->bytes == NULL) die("out of memory");
        a->capacity = capacity;
    }
    size_t at = a->count;
    a->count += more;
    return at;
}

static size_t arena_append(struct arena *a, const void *bytes, size_t count) {
    size_t at = arena_reserve(a, count);
    memcpy(a->bytes + at, bytes, count);
    return at;
}

static void sql_check(sqlite3 *db, int rc, int expected, const char *what) {
    if (rc != expected) die("%s failed: %s (%d)", what, sqlite3_errmsg(db), rc);
}

static void sql_exec(sqlite3 *db, const char *sql) {
    char *message = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &message) != SQLITE_OK) die("%s failed: %s", sql, message);
}

static sqlite3_stmt *sql_prepare(sqlite3 *db, const char *sql) {
    sqlite3_stmt *statement = NULL;
    sql_check(db, sqlite3_prepare_v2(db, sql, -1, &statement, NULL), SQLITE_OK, sql);
    return statement;
}

/* This process's own peak RSS in KiB: VmHWM of /proc/self/status. Not getrusage's ru_maxrss, which
 * after a posix_spawn (vfork + exec) also holds the parent's peak at the exec. */
static long own_peak_rss_kb(void) {
    FILE *status = fopen("/proc/self/status", "r");
    if (status == NULL) return 0;
    char line[256];
    long kb = 0;
    while (fgets(line, sizeof line, status) != NULL)
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
    fclose(status);
    return kb;
}

static uint64_t cpu_ns(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return ((uint64_t)usage.ru_utime.tv_sec + (uint64_t)usage.ru_stime.tv_sec) * 1000000000u +
           ((uint64_t)usage.ru_utime.tv_usec + (uint64_t)usage.ru_stime.tv_usec) * 1000u;
}

static void drain_usage(void) {
    fprintf(stderr, "usage: %s --group DIR --outbox PATH [--chunk N] [--synchronous full|normal] [--map-size BYTES] "
            "[--gzip-level N]\n",
            program);
    exit(64);
}

static struct drain_options parse_drain_options(int argc, char **argv) {
    struct drain_options o = {.chunk = 1000, .synchronous = "FULL", .map_size = 1ull << 30};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) drain_usage();
        if (i + 1 >= argc) drain_usage();
        const char *value = argv[++i];
        if (strcmp(flag, "--group") == 0) o.group = value;
        else if (strcmp(flag, "--outbox") == 0) o.outbox = value;
        else if (strcmp(flag, "--chunk") == 0) o.chunk = parse_count(flag, value);
        else if (strcmp(flag, "--map-size") == 0) o.map_size = parse_count(flag, value);
        else if (strcmp(flag, "--gzip-level") == 0) {
            uint64_t level = parse_count(flag, value);
            if (level > 12) die("--gzip-level takes 0 to 12, not %s", value);
            o.gzip_level = (int)level;
        }
        else if (strcmp(flag, "--synchronous") == 0) {
            if (strcmp(value, "full") == 0) o.synchronous = "FULL";
            else if (strcmp(value, "normal") == 0) o.synchronous = "NORMAL";
            else die("--synchronous takes full or normal, not '%s'", value);
        } else drain_usage();
    }
    if (o.group == NULL || o.outbox == NULL) drain_usage();
    if (o.chunk == 0) die("--chunk must be at least 1");
    return o;
}

static int is_space(uint8_t b) { return b == ' ' || b == '\n' || b == '\r' || b == '\t'; }

static const char *kind_name(int kind) {
    switch (kind) {
    case 0: return "app";
    case 1: return "extension";
    case 2: return "hybrid";
    default: return NULL;
    }
}

/* Finds the top-level "event_id" string of an event body (the bench bodies have no nested key of
 * that name, and no escapes in the id). */
static int find_event_id(const uint8_t *body, size_t length, size_t *at, size_t *count) {
    static const char key[] = "\"event_id\":\"";
    const uint8_t *found = memmem(body, length, key, sizeof key - 1);
    if (found == NULL) return 0;
    const uint8_t *start = found + sizeof key - 1;
    const uint8_t *end = memchr(start, '"', length - (size_t)(start - body));
    if (end == NULL) return 0;
    *at = (size_t)(start - body);
    *count = (size_t)(end - start);
    return 1;
}

/* Reads one record into the chunk: checks it, copies the producer id, event id and the enriched body. */
static void take_record(uint64_t seq, const MDB_val *value, struct arena *arena, struct row *row) {
    const uint8_t *r = value->mv_data;
    size_t size = value->mv_size;
    if (size < HEADER_FIXED) die("seq %" PRIu64 ": record of %zu bytes is shorter than its header", seq, size);
    if (r[0] != 1 && r[0] != 2) die("seq %" PRIu64 ": record format %u is not supported", seq, r[0]);
    uint32_t stored_crc = (uint32_t)get_be(r + 4, 4);
    /* Version 2 also covers bytes 0-3 (version, kind, header length); version 1 only bytes 8 … end. */
    uLong head = r[0] == 1 ? 0 : crc32(0, r, 4);
    uint32_t actual_crc = (uint32_t)crc32(head, r + 8, (uInt)(size - 8));
    if (stored_crc != actual_crc) die("seq %" PRIu64 ": CRC mismatch", seq);
    size_t header = (size_t)get_be(r + 2, 2);
    size_t id_length = (size_t)get_be(r + 52, 2);
    if (header != HEADER_FIXED + id_length || header > size) die("seq %" PRIu64 ": bad header length", seq);

    row->seq = seq;
    row->kind = r[1];
    row->producer_seq = get_be(r + 12, 8);
    row->wall_ms = (int64_t)get_be(r + 20, 8);
    row->boot_ns = get_be(r + 28, 8);
    memcpy(row->boot_id, r + 36, 16);
    const char *kind = kind_name(row->kind);
    if (kind == NULL || row->kind != 0) die("seq %" PRIu64 ": only app events are expected in a bench store", seq);
    const uint8_t *id = r + HEADER_FIXED;
    for (size_t i = 0; i < id_length; i++)
        if (id[i] < 0x20 || id[i] == '"' || id[i] == '\\') die("seq %" PRIu64 ": producer id needs escaping", seq);
    row->producer_at = arena_append(arena, id, id_length);
    row->producer_length = id_length;

    const uint8_t *body = r + header;
    size_t body_length = size - header;
    size_t id_at, id_count;
    if (!find_event_id(body, body_length, &id_at, &id_count) || id_count == 0)
        die("seq %" PRIu64 ": the event has no event_id", seq);
    row->event_id_at = arena_append(arena, body + id_at, id_count);
    row->event_id_length = id_count;

    /* JSONFields.appending: `,"_tributary":{…}` before the last non-space byte, which must be '}'. */
    size_t close = body_length;
    while (close > 0 && is_space(body[close - 1])) close--;
    if (close == 0 || body[close - 1] != '}') die("seq %" PRIu64 ": the event body is not a JSON object", seq);
    close--;
    size_t before = close;
    while (before > 0 && is_space(body[before - 1])) before--;
    int empty = before == 0 || body[before - 1] == '{';
    char marker[512];
    int marker_length = snprintf(marker, sizeof marker,
                                 "%s\"_tributary\":{\"seq\":%" PRIu64 ",\"producer\":\"%.*s\",\"producer_kind\":\"%s\","
                                 "\"producer_seq\":%" PRIu64 "}",
                                 empty ? "" : ",", seq, (int)id_length, (const char *)id, kind, row->producer_seq);
    if (marker_length < 0 || (size_t)marker_length >= sizeof marker) die("seq %" PRIu64 ": marker too long", seq);
    row->body_length = body_length + (size_t)marker_length;
    row->body_at = arena_reserve(arena, row->body_length);
    uint8_t *out = arena->bytes + row->body_at;
    memcpy(out, body, close);
    memcpy(out + close, marker, (size_t)marker_length);
    memcpy(out + close + marker_length, body + close, body_length - close);
}

int drain_main(int argc, char **argv) {
    struct drain_options o = parse_drain_options(argc, argv);
    struct tables t;
    MDB_env *env = open_store(o.group, o.map_size, &t);

    sqlite3 *db = NULL;
    if (sqlite3_open_v2(o.outbox, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK)
        die("cannot open %s: %s", o.outbox, db ? sqlite3_errmsg(db) : "out of memory");
    sqlite3_busy_timeout(db, 10000);
    sql_exec(db, "PRAGMA page_size = 16384");  // as the agent's outbox (before WAL, on a new file)
    sql_exec(db, "PRAGMA journal_mode = WAL");
    char pragma[64];
    snprintf(pragma, sizeof pragma, "PRAGMA synchronous = %s", o.synchronous);
    sql_exec(db, pragma);
    sql_exec(db, "PRAGMA foreign_keys = ON");
    sql_exec(db, "BEGIN IMMEDIATE");
    sql_exec(db, SCHEMA);
    sql_exec(db, "COMMIT");

    sqlite3_stmt *begin = sql_prepare(db, "BEGIN IMMEDIATE");
    sqlite3_stmt *commit = sql_prepare(db, "COMMIT");
    sqlite3_stmt *state = sql_prepare(db, "SELECT value FROM agent_state WHERE key = ?");
    sqlite3_stmt *insert = sql_prepare(db,
        "INSERT INTO outbox "
        "(seq, event_id, producer, producer_kind, producer_seq, wall_ms, boot_ns, boot_id, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)");
    sqlite3_stmt *set_state = sql_prepare(db,
        "INSERT INTO agent_state (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value");
    sqlite3_stmt *bump = sql_prepare(db,
        "INSERT INTO agent_state (key, value) VALUES (?, ?) "
        "ON CONFLICT(key) DO UPDATE SET value = value + excluded.value");

    struct row *rows = calloc(o.chunk, sizeof *rows);
    struct arena arena = {0};
    size_t latency_capacity = 1024, chunks = 0;
    uint64_t *latency = malloc(latency_capacity * sizeof *latency);
    if (rows == NULL || latency == NULL) die("out of memory");

    struct libdeflate_compressor *compressor = NULL;
    if (o.gzip_level > 0 && (compressor = libdeflate_alloc_compressor(o.gzip_level)) == NULL) die("out of memory");
    uint8_t *text = NULL, *gzipped = NULL;
    size_t text_capacity = 0, gzipped_capacity = 0;
    const uint32_t pid = (uint32_t)getpid();
    printf("READY %u\n", pid);
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL || strncmp(line, "GO", 2) != 0)
        die("expected GO on stdin, the driver went away");

    const uint64_t cpu_start = cpu_ns();
    const uint64_t start = clock_ns(CLOCK_MONOTONIC);
    uint64_t moved = 0;
    for (;;) {
        uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
        arena.count = 0;

        /* 1. Read the chunk (and what the Enricher reads) in one read transaction. */
        MDB_txn *txn = NULL;
        check(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), "mdb_txn_begin(read)");
        MDB_val identity;
        (void)get_optional(txn, t.identity, "anonymous_id", &identity);
        (void)get_optional(txn, t.identity, "device_id", &identity);
        (void)get_optional(txn, t.identity, "login_id", &identity);
        MDB_cursor *cursor = NULL;
        MDB_val key, value;
        check(mdb_cursor_open(txn, t.config, &cursor), "mdb_cursor_open(config)");
        for (int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST); rc == MDB_SUCCESS;
             rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT))
            arena_append(&arena, value.mv_data, value.mv_size);
        mdb_cursor_close(cursor);
        arena.count = 0;
        check(mdb_cursor_open(txn, t.events, &cursor), "mdb_cursor_open(events)");
        size_t count = 0;
        int rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST);
        while (rc == MDB_SUCCESS && count < o.chunk) {
            if (key.mv_size != 8) die("an events key of %zu bytes", key.mv_size);
            take_record(get_be(key.mv_data, 8), &value, &arena, &rows[count]);
            count++;
            rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
        }
        if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) check(rc, "mdb_cursor_get(events)");
        mdb_cursor_close(cursor);
        mdb_txn_abort(txn);
        if (count == 0) break;
        uint64_t last = rows[count - 1].seq;

        /* 2. One SQLite transaction: insert the chunk and advance last_drained_seq. */
        sql_check(db, sqlite3_step(begin), SQLITE_DONE, "BEGIN IMMEDIATE");
        sqlite3_reset(begin);
        sqlite3_bind_text(state, 1, "last_drained_seq", -1, SQLITE_STATIC);
        int step = sqlite3_step(state);
        uint64_t already = step == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(state, 0) : 0;
        if (step != SQLITE_ROW && step != SQLITE_DONE) sql_check(db, step, SQLITE_ROW, "SELECT last_drained_seq");
        sqlite3_reset(state);
        int64_t inserted = 0, skipped = 0;
        uint64_t highest = already;
        for (size_t i = 0; i < count; i++) {
            const struct row *r = &rows[i];
            if (r->seq <= highest) {
                skipped++;
                continue;
            }
            sqlite3_bind_int64(insert, 1, (sqlite3_int64)r->seq);
            sqlite3_bind_text(insert, 2, (const char *)arena.bytes + r->event_id_at, (int)r->event_id_length, SQLITE_STATIC);
            sqlite3_bind_text(insert, 3, (const char *)arena.bytes + r->producer_at, (int)r->producer_length, SQLITE_STATIC);
            sqlite3_bind_int(insert, 4, r->kind);
            sqlite3_bind_int64(insert, 5, (sqlite3_int64)r->producer_seq);
            sqlite3_bind_int64(insert, 6, r->wall_ms);
            sqlite3_bind_int64(insert, 7, (sqlite3_int64)r->boot_ns);
            sqlite3_bind_blob(insert, 8, r->boot_id, 16, SQLITE_STATIC);
            sqlite3_bind_blob(insert, 9, arena.bytes + r->body_at, (int)r->body_length, SQLITE_STATIC);
            sql_check(db, sqlite3_step(insert), SQLITE_DONE, "INSERT INTO outbox");
            sqlite3_reset(insert);
            highest = r->seq;
            inserted++;
        }
        if (highest > already) {
            sqlite3_bind_text(set_state, 1, "last_drained_seq", -1, SQLITE_STATIC);
            sqlite3_bind_int64(set_state, 2, (sqlite3_int64)highest);
            sql_check(db, sqlite3_step(set_state), SQLITE_DONE, "set last_drained_seq");
            sqlite3_reset(set_state);
        }
        const char *counters[] = {"drained", "duplicates_skipped"};
        const int64_t amounts[] = {inserted, skipped};
        for (int i = 0; i < 2; i++) {
            if (amounts[i] == 0) continue;
            sqlite3_bind_text(bump, 1, counters[i], -1, SQLITE_STATIC);
            sqlite3_bind_int64(bump, 2, amounts[i]);
            sql_check(db, sqlite3_step(bump), SQLITE_DONE, "bump counter");
            sqlite3_reset(bump);
        }
        sql_check(db, sqlite3_step(commit), SQLITE_DONE, "COMMIT");
        sqlite3_reset(commit);

        /* 3. Delete the chunk from the store in one durable write transaction. */
        check(mdb_txn_begin(env, NULL, 0, &txn), "mdb_txn_begin(write)");
        check(mdb_cursor_open(txn, t.events, &cursor), "mdb_cursor_open(events)");
        rc = mdb_cursor_get(cursor, &key, &value, MDB_FIRST);
        while (rc == MDB_SUCCESS && get_be(key.mv_data, 8) <= last) {
            check(mdb_cursor_del(cursor, 0), "mdb_cursor_del");
            rc = mdb_cursor_get(cursor, &key, &value, MDB_NEXT);
        }
        if (rc != MDB_SUCCESS && rc != MDB_NOTFOUND) check(rc, "mdb_cursor_get(delete)");
        mdb_cursor_close(cursor);
        check(mdb_txn_commit(txn), "mdb_txn_commit(delete)");

        /* 4. The request body's compression: the bodies one per line, gzipped. */
        if (compressor != NULL) {
            size_t length = 0;
            for (size_t i = 0; i < count; i++) length += rows[i].body_length + 1;
            if (length > text_capacity) {
                text_capacity = length;
                if ((text = realloc(text, text_capacity)) == NULL) die("out of memory");
            }
            size_t at = 0;
            for (size_t i = 0; i < count; i++) {
                memcpy(text + at, arena.bytes + rows[i].body_at, rows[i].body_length);
                at += rows[i].body_length;
                text[at++] = '\n';
            }
            size_t bound = libdeflate_gzip_compress_bound(compressor, length);
            if (bound > gzipped_capacity) {
                gzipped_capacity = bound;
                if ((gzipped = realloc(gzipped, gzipped_capacity)) == NULL) die("out of memory");
            }
            size_t size = libdeflate_gzip_compress(compressor, text, length, gzipped, gzipped_capacity);
            if (size == 0) die("libdeflate_gzip_compress failed");
        }

        moved += count;
        if (chunks == latency_capacity) {
            latency_capacity *= 2;
            latency = realloc(latency, latency_capacity * sizeof *latency);
            if (latency == NULL) die("out of memory");
        }
        latency[chunks++] = clock_ns(CLOCK_MONOTONIC) - t0;
    }
    const uint64_t end = clock_ns(CLOCK_MONOTONIC);
    const uint64_t cpu = cpu_ns() - cpu_start;
    if (compressor != NULL) {
        libdeflate_free_compressor(compressor);
        free(text);
        free(gzipped);
    }
    printf("{\"lang\":\"c\",\"producer\":\"drain\",\"pid\":%u,\"events\":%" PRIu64 ",\"txns\":%zu,\"start_ns\":%" PRIu64
           ",\"end_ns\":%" PRIu64 ",\"cpu_ns\":%" PRIu64 ",\"max_rss_kb\":%ld,\"latency_ns\":[",
           pid, moved, chunks, start, end, cpu, own_peak_rss_kb());
    for (size_t i = 0; i < chunks; i++) printf(i ? ",%" PRIu64 : "%" PRIu64, latency[i]);
    printf("]}\n");
    if (fflush(stdout) != 0) die("could not write the report: %s", strerror(errno));

    sqlite3_finalize(begin);
    sqlite3_finalize(commit);
    sqlite3_finalize(state);
    sqlite3_finalize(insert);
    sqlite3_finalize(set_state);
    sqlite3_finalize(bump);
    if (sqlite3_close(db) != SQLITE_OK) die("sqlite3_close: %s", sqlite3_errmsg(db));
    free(rows);
    free(arena.bytes);
    free(latency);
    mdb_env_close(env);
    return 0;
}
