/* Helpers lmdb-baseline's two modes share: the producer (main.c) and the drain (drain.c). */
#ifndef TRIBUTARY_BENCH_BASELINE_H
#define TRIBUTARY_BENCH_BASELINE_H

#include <lmdb.h>
#include <stdint.h>
#include <time.h>

/* The program name errors start with. */
extern const char *program;

/* Prints "program: message" on stderr and exits 1. */
void die(const char *format, ...) __attribute__((noreturn, format(printf, 1, 2)));
/* Dies with LMDB's message unless rc is MDB_SUCCESS. */
void check(int rc, const char *call);
/* A clock reading in nanoseconds. */
uint64_t clock_ns(clockid_t clock);
/* Big-endian integers of `bytes` bytes, as the store keeps them. */
void put_be(uint8_t *out, uint64_t value, int bytes);
uint64_t get_be(const uint8_t *in, int bytes);
/* A non-negative decimal option value; dies naming `flag` otherwise. */
uint64_t parse_count(const char *flag, const char *text);

/* The named databases of a Tributary store. */
struct tables {
    MDB_dbi events, meta, identity, config, producers;
};

/* A C string as an LMDB value (without the terminating NUL). */
MDB_val text_val(const char *text);
/* Reads `key` of `dbi` into `value`; returns 0 when the key is missing. */
int get_optional(MDB_txn *txn, MDB_dbi dbi, const char *key, MDB_val *value);
/* Opens `group`/tributary.mdb as Environment/ does (durable commits), creating what is missing. */
MDB_env *open_store(const char *group, uint64_t map_size, struct tables *t);

/* `lmdb-baseline drain ...` (drain.c). */
int drain_main(int argc, char **argv);

#endif
