/*
 * lmdb-baseline: one producer process doing, in plain C, the LMDB work of Tributary's
 * SharedStore.append (Sources/TributaryStore/SharedStore/SharedStore+Append.swift), so that `make bench` can print
 * Swift's figures next to what the same work costs without Swift.
 *
 * Same store layout and flags as Tributary (docs/store-format.md): file `tributary.mdb` in the group
 * directory, MDB_NOSUBDIR | MDB_NOTLS, durable commits (no MDB_NOSYNC), maxdbs 8, the named
 * databases `events`, `meta`, `identity`, `config`, `producers`. Every write transaction does what
 * an append does:
 *
 *   1. read the identity (`anonymous_id`, `device_id`, `login_id`),
 *   2. read this producer's 29-byte registration and `meta/last_seq` (u64 big-endian),
 *   3. for each event: next global seq, next producer seq, put a format-1 record (header with CRC-32,
 *      producer id, body) under the 8-byte big-endian seq with MDB_APPEND | MDB_RESERVE,
 *   4. write `last_seq` and the updated registration back, commit (fsync).
 *
 * The records are byte-compatible with Tributary's, so the benchmark driver verifies a C run with
 * the same Swift reader it uses for a Swift run. The body is filler JSON of the size the driver
 * passes (--record-size, measured from the Swift run it is paired with); building the event JSON is
 * not LMDB work and is the part of Tributary's cost that has no C counterpart here.
 *
 * Protocol with the driver (tributary-bench): open the store, print "READY <pid>", wait for a "GO"
 * line on stdin (so that every process of a run starts together), write the events, then print one
 * JSON line: {"lang":"c","producer":…,"pid":…,"events":…,"txns":…,"start_ns":…,"end_ns":…,
 * "latency_ns":[…]} where each latency is one transaction, mdb_txn_begin to mdb_txn_commit return,
 * and the times are CLOCK_MONOTONIC (comparable between processes).
 *
 * `lmdb-baseline drain` (drain.c) is the other baseline: the agent's drain, store -> SQLite outbox.
 *
 * lmdb.h: "Use an MDB_env* in the process which opened it, without fork()ing." This program is
 * always started with posix_spawn by the driver and never forks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "baseline.h"

/* Record format version 1 (EventRecord.swift): fixed header size before the producer id. */
enum { RECORD_VERSION = 1, FIXED_HEADER = 54, REGISTRATION_SIZE = 29, MAX_PRODUCER_ID = 255 };

const char *program = "lmdb-baseline";

/* ---- errors ---------------------------------------------------------------------------------- */

void die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(1);
}

/* Every mdb_* call goes through here: a non-zero code ends the process with LMDB's message. */
void check(int rc, const char *call) {
    if (rc != MDB_SUCCESS) die("%s failed: %s (%d)", call, mdb_strerror(rc), rc);
}

/* ---- clocks and byte order ------------------------------------------------------------------- */

uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) die("clock_gettime: %s", strerror(errno));
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void put_be(uint8_t *out, uint64_t value, int bytes) {
    for (int i = bytes - 1; i >= 0; i--) {
        out[i] = (uint8_t)value;
        value >>= 8;
    }
}

uint64_t get_be(const uint8_t *in, int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; i++) value = (value << 8) | in[i];
    return value;
}

/* ---- CRC-32 (zlib's: reflected polynomial 0xEDB88320), one table lookup per byte -------------- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc32_of(const uint8_t *bytes, size_t count) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < count; i++) c = crc_table[(c ^ bytes[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* ---- options --------------------------------------------------------------------------------- */

struct options {
    const char *group;        /* app group directory holding tributary.mdb */
    const char *producer_id;  /* producer id, as the Swift worker of the same slot uses */
    uint64_t events;          /* events this process writes */
    uint64_t batch;           /* events per write transaction (1 = single track) */
    uint64_t record_size;     /* bytes per event record, header included */
    uint64_t map_size;        /* LMDB map size in bytes */
};

uint64_t parse_count(const char *flag, const char *text) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-')
        die("%s needs a non-negative whole number, not '%s'", flag, text);
    return (uint64_t)value;
}

static void usage(void) {
    fprintf(stderr,
            "usage: %s --group DIR --producer-id ID --events N --batch B --record-size BYTES "
            "[--map-size BYTES]\n"
            "       %s drain --group DIR --outbox PATH [--chunk N] [--synchronous full|normal] "
            "[--map-size BYTES]\n",
            program, program);
    exit(64);
}

static struct options parse_options(int argc, char **argv) {
    struct options o = {.events = 0, .batch = 1, .record_size = 0, .map_size = 1ull << 30};
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) usage();
        if (i + 1 >= argc) usage();
        const char *value = argv[++i];
        if (strcmp(flag, "--group") == 0) o.group = value;
        else if (strcmp(flag, "--producer-id") == 0) o.producer_id = value;
        else if (strcmp(flag, "--events") == 0) o.events = parse_count(flag, value);
        else if (strcmp(flag, "--batch") == 0) o.batch = parse_count(flag, value);
        else if (strcmp(flag, "--record-size") == 0) o.record_size = parse_count(flag, value);
        else if (strcmp(flag, "--map-size") == 0) o.map_size = parse_count(flag, value);
        else usage();
    }
    if (o.group == NULL || o.producer_id == NULL) usage();
    size_t id_length = strlen(o.producer_id);
    if (id_length == 0 || id_length > MAX_PRODUCER_ID)
        die("--producer-id must have 1 to %d bytes; it has %zu", MAX_PRODUCER_ID, id_length);
    if (o.batch == 0) die("--batch must be at least 1");
    /* The body must hold at least the filler JSON's fixed part ({"bench":""}). */
    if (o.record_size < FIXED_HEADER + id_length + 12)
        die("--record-size %" PRIu64 " is too small for a %zu-byte producer id", o.record_size, id_length);
    return o;
}

/* ---- the store ------------------------------------------------------------------------------- */

MDB_val text_val(const char *text) { return (MDB_val){.mv_size = strlen(text), .mv_data = (void *)text}; }

/* Reads `key` of `dbi`; a missing key is not an error (login_id is absent while logged out). */
int get_optional(MDB_txn *txn, MDB_dbi dbi, const char *key, MDB_val *value) {
    MDB_val k = text_val(key);
    int rc = mdb_get(txn, dbi, &k, value);
    if (rc == MDB_NOTFOUND) return 0;
    check(rc, "mdb_get");
    return 1;
}

/* Opens the environment and tables exactly as Environment/ does, creating what is missing. */
MDB_env *open_store(const char *group, uint64_t map_size, struct tables *t) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/tributary.mdb", group) >= (int)sizeof path) die("--group path is too long");
    MDB_env *env = NULL;
    check(mdb_env_create(&env), "mdb_env_create");
    check(mdb_env_set_maxdbs(env, 8), "mdb_env_set_maxdbs");
    check(mdb_env_set_mapsize(env, (size_t)map_size), "mdb_env_set_mapsize");
    check(mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOTLS, 0660), "mdb_env_open");
    int dead = 0;
    check(mdb_reader_check(env, &dead), "mdb_reader_check");

    MDB_txn *txn = NULL;
    check(mdb_txn_begin(env, NULL, 0, &txn), "mdb_txn_begin");
    check(mdb_dbi_open(txn, "events", MDB_CREATE, &t->events), "mdb_dbi_open(events)");
    check(mdb_dbi_open(txn, "meta", MDB_CREATE, &t->meta), "mdb_dbi_open(meta)");
    check(mdb_dbi_open(txn, "identity", MDB_CREATE, &t->identity), "mdb_dbi_open(identity)");
    check(mdb_dbi_open(txn, "config", MDB_CREATE, &t->config), "mdb_dbi_open(config)");
    check(mdb_dbi_open(txn, "producers", MDB_CREATE, &t->producers), "mdb_dbi_open(producers)");
    /* The driver creates the identity beforehand; a store made by this program alone gets one too,
     * so every append reads an identity of the usual size. */
    const char *identity_keys[] = {"anonymous_id", "device_id"};
    for (int i = 0; i < 2; i++) {
        MDB_val existing;
        if (!get_optional(txn, t->identity, identity_keys[i], &existing)) {
            MDB_val k = text_val(identity_keys[i]);
            MDB_val v = text_val("00000000-0000-4000-8000-000000000000");
            check(mdb_put(txn, t->identity, &k, &v, MDB_NOOVERWRITE), "mdb_put(identity)");
        }
    }
    check(mdb_txn_commit(txn), "mdb_txn_commit");
    return env;
}

/* The boot id (16 bytes) from /proc, as BootID.current reads it; zeros when unavailable. */
static void read_boot_id(uint8_t out[16]) {
    memset(out, 0, 16);
    FILE *file = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (file == NULL) return;
    char text[64] = {0};
    if (fgets(text, sizeof text, file) != NULL) {
        int n = 0;
        for (const char *p = text; *p != '\0' && n < 32; p++) {
            int digit;
            if (*p >= '0' && *p <= '9') digit = *p - '0';
            else if (*p >= 'a' && *p <= 'f') digit = *p - 'a' + 10;
            else continue;
            out[n / 2] = (uint8_t)(out[n / 2] << 4 | digit);
            n++;
        }
    }
    fclose(file);
}

/* A record with everything but the per-event fields filled in: header, producer id, filler body. */
static uint8_t *record_template(const struct options *o) {
    size_t id_length = strlen(o->producer_id);
    size_t header = FIXED_HEADER + id_length;
    uint8_t *record = malloc(o->record_size);
    if (record == NULL) die("out of memory");
    memset(record, 0, header);
    record[0] = RECORD_VERSION;
    record[1] = 0; /* producer kind: app */
    put_be(record + 2, header, 2);
    read_boot_id(record + 36);
    put_be(record + 52, id_length, 2);
    memcpy(record + FIXED_HEADER, o->producer_id, id_length);
    /* Body: {"bench":"xxxx…"} padded to the requested size. */
    uint8_t *body = record + header;
    size_t body_size = o->record_size - header;
    memcpy(body, "{\"bench\":\"", 10);
    memset(body + 10, 'x', body_size - 12);
    memcpy(body + body_size - 2, "\"}", 2);
    return record;
}

/* Record header offsets (EventRecord.encode). */
enum { AT_CRC = 4, AT_PID = 8, AT_PRODUCER_SEQ = 12, AT_WALL = 20, AT_BOOT = 28 };

/* ---- main ------------------------------------------------------------------------------------ */

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "drain") == 0) {
        program = "lmdb-baseline drain";
        return drain_main(argc - 1, argv + 1);
    }
    struct options o = parse_options(argc, argv);
    crc_init();
    struct tables t;
    MDB_env *env = open_store(o.group, o.map_size, &t);
    uint8_t *template = record_template(&o);
    const uint32_t pid = (uint32_t)getpid();
    put_be(template + AT_PID, pid, 4);

    uint64_t txn_count = (o.events + o.batch - 1) / o.batch;
    uint64_t *latency = calloc(txn_count ? txn_count : 1, sizeof *latency);
    if (latency == NULL) die("out of memory");

    /* Ready; wait for the driver's common start signal. */
    printf("READY %u\n", pid);
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL || strncmp(line, "GO", 2) != 0)
        die("expected GO on stdin, the driver went away");

    const uint64_t start = clock_ns(CLOCK_MONOTONIC);
    uint64_t written = 0;
    for (uint64_t txn_index = 0; txn_index < txn_count; txn_index++) {
        uint64_t count = o.events - written < o.batch ? o.events - written : o.batch;
        uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
        MDB_txn *txn = NULL;
        check(mdb_txn_begin(env, NULL, 0, &txn), "mdb_txn_begin");

        /* 1. The identity, read inside the transaction as every append does. */
        MDB_val anonymous, device, login;
        if (!get_optional(txn, t.identity, "anonymous_id", &anonymous) ||
            !get_optional(txn, t.identity, "device_id", &device))
            die("the store has no identity");
        (void)get_optional(txn, t.identity, "login_id", &login);

        /* 2. This producer's registration and the global counter. */
        uint8_t registration[REGISTRATION_SIZE] = {0};
        MDB_val found;
        if (get_optional(txn, t.producers, o.producer_id, &found)) {
            if (found.mv_size < REGISTRATION_SIZE) die("registration of %s is truncated", o.producer_id);
            memcpy(registration, found.mv_data, REGISTRATION_SIZE);
        }
        uint64_t producer_seq = get_be(registration, 8);
        uint64_t last_seq = 0;
        if (get_optional(txn, t.meta, "last_seq", &found)) {
            if (found.mv_size != 8) die("meta/last_seq is %zu bytes, not 8", found.mv_size);
            last_seq = get_be(found.mv_data, 8);
        }

        /* 3. The events: reserve each record in place and fill it (no extra copy). */
        for (uint64_t i = 0; i < count; i++) {
            last_seq++;
            producer_seq++;
            uint8_t key_bytes[8];
            put_be(key_bytes, last_seq, 8);
            MDB_val key = {.mv_size = 8, .mv_data = key_bytes};
            MDB_val value = {.mv_size = o.record_size, .mv_data = NULL};
            check(mdb_put(txn, t.events, &key, &value, MDB_APPEND | MDB_RESERVE), "mdb_put(events)");
            uint8_t *record = value.mv_data;
            memcpy(record, template, o.record_size);
            put_be(record + AT_PRODUCER_SEQ, producer_seq, 8);
            put_be(record + AT_WALL, clock_ns(CLOCK_REALTIME) / 1000000u, 8);
            put_be(record + AT_BOOT, clock_ns(CLOCK_BOOTTIME), 8);
            put_be(record + AT_CRC, crc32_of(record + 8, o.record_size - 8), 4);
        }

        /* 4. Counter and registration back, then the durable commit. */
        uint8_t seq_bytes[8];
        put_be(seq_bytes, last_seq, 8);
        MDB_val meta_key = text_val("last_seq");
        MDB_val meta_value = {.mv_size = 8, .mv_data = seq_bytes};
        check(mdb_put(txn, t.meta, &meta_key, &meta_value, 0), "mdb_put(meta)");

        uint64_t now_ms = clock_ns(CLOCK_REALTIME) / 1000000u;
        put_be(registration, producer_seq, 8);
        registration[8] = 0; /* kind: app */
        put_be(registration + 9, pid, 4);
        if (get_be(registration + 13, 8) == 0) put_be(registration + 13, now_ms, 8);
        put_be(registration + 21, now_ms, 8);
        MDB_val producer_key = text_val(o.producer_id);
        MDB_val producer_value = {.mv_size = REGISTRATION_SIZE, .mv_data = registration};
        check(mdb_put(txn, t.producers, &producer_key, &producer_value, 0), "mdb_put(producers)");

        check(mdb_txn_commit(txn), "mdb_txn_commit");
        latency[txn_index] = clock_ns(CLOCK_MONOTONIC) - t0;
        written += count;
    }
    const uint64_t end = clock_ns(CLOCK_MONOTONIC);

    /* The report: one JSON line (the producer id is a plain token chosen by the driver). */
    printf("{\"lang\":\"c\",\"producer\":\"%s\",\"pid\":%u,\"events\":%" PRIu64 ",\"txns\":%" PRIu64
           ",\"start_ns\":%" PRIu64 ",\"end_ns\":%" PRIu64 ",\"latency_ns\":[",
           o.producer_id, pid, written, txn_count, start, end);
    for (uint64_t i = 0; i < txn_count; i++) printf(i ? ",%" PRIu64 : "%" PRIu64, latency[i]);
    printf("]}\n");
    if (fflush(stdout) != 0) die("could not write the report: %s", strerror(errno));

    free(latency);
    free(template);
    mdb_env_close(env);
    return 0;
}
