// The lost wake-up on LMDB's writer mutex, reproduced with LMDB and glibc alone (docs/store-format.md,
// "A lost wake-up"). Not part of `make test`; build and run it by hand:
//
//   cc -O1 -o /tmp/lost-wakeup scripts/lost-wakeup.c -llmdb -lpthread && /tmp/lost-wakeup 200
//
// Each run: 3 "victim" processes and 2 "survivor" processes, 3 threads each, begin and commit empty
// write transactions in a loop; the victims are SIGKILLed one after another at random moments. A run
// hangs when the survivors have not finished 8 s later: their threads sleep in FUTEX_WAIT on the writer
// mutex's word, which is 0 (free) or 0x40000000 (owner died, no FUTEX_WAITERS), and nobody will wake
// them. One FUTEX_WAKE on the word (what Tributary's LockWordWatch does every second) lets them finish.
// Measured on Linux 6.18, glibc 2.36: 4 and 3 of 200 runs hung, in two batches.
//
// Why: glibc's robust-mutex unlock stores 0 and wakes ONE waiter. If that waiter's process is killed
// before the waiter takes the mutex, and a thread that never waited takes it first (its fast path sets
// no FUTEX_WAITERS), the kernel's make-up wake for the dead waiter (handle_futex_death, Linux 5.5+) does
// not fire, since the word is not 0, and the later unlock (or the owner-died mark of that thread's own
// death) wakes nobody: the other waiters sleep for ever.
#include <fcntl.h>
#include <linux/futex.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *path = "/tmp/lost-wakeup.mdb";
static MDB_env *env;

static void open_env(void) {
    mdb_env_create(&env);
    mdb_env_set_mapsize(env, 1 << 20);
    if (mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOTLS | MDB_NOSYNC, 0660) != 0) { perror("mdb_env_open"); exit(1); }
}

static void *writer(void *count) {
    for (long i = 0; (long)count < 0 || i < (long)count; i++) {
        MDB_txn *txn;
        if (mdb_txn_begin(env, NULL, 0, &txn) != 0) _exit(5);
        mdb_txn_commit(txn);
    }
    return NULL;
}

static pid_t spawn(long count) {
    pid_t pid = fork();
    if (pid == 0) {
        open_env();
        pthread_t threads[3];
        for (int i = 0; i < 3; i++) pthread_create(&threads[i], NULL, writer, (void *)count);
        for (int i = 0; i < 3; i++) pthread_join(threads[i], NULL);
        _exit(0);
    }
    return pid;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 100, hung = 0;
    char lock[256];
    snprintf(lock, sizeof lock, "%s-lock", path);
    srand(time(NULL));
    for (int run = 0; run < runs; run++) {
        unlink(path);
        unlink(lock);
        open_env();
        mdb_env_close(env);
        pid_t victims[3], survivors[2];
        for (int i = 0; i < 3; i++) victims[i] = spawn(-1);
        for (int i = 0; i < 2; i++) survivors[i] = spawn(20000);
        usleep(1000 + rand() % 20000);
        for (int i = 0; i < 3; i++) { kill(victims[i], SIGKILL); usleep(rand() % 2000); }
        for (int i = 0; i < 3; i++) waitpid(victims[i], NULL, 0);
        int left = 2;
        for (double start = now(); left > 0 && now() - start < 8; usleep(1000))
            for (int i = 0; i < 2; i++)
                if (survivors[i] && waitpid(survivors[i], NULL, WNOHANG) == survivors[i]) { survivors[i] = 0; left--; }
        if (left == 0) continue;
        hung++;
        int fd = open(lock, O_RDWR);
        unsigned *words = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        unsigned *wmutex = words + 64 / 4;  // mti_wmutex: the lock file's second cache line
        long woken = syscall(SYS_futex, wmutex, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
        for (double start = now(); left > 0 && now() - start < 3; usleep(1000))
            for (int i = 0; i < 2; i++)
                if (survivors[i] && waitpid(survivors[i], NULL, WNOHANG) == survivors[i]) { survivors[i] = 0; left--; }
        printf("run %d hung: writer mutex word %08x; one FUTEX_WAKE woke %ld, then %s\n", run, *wmutex, woken,
               left == 0 ? "the survivors finished" : "they still wait");
        for (int i = 0; i < 2; i++) if (survivors[i]) { kill(survivors[i], SIGKILL); waitpid(survivors[i], NULL, 0); }
        munmap(words, 4096);
        close(fd);
    }
    printf("%d runs, %d hung\n", runs, hung);
    return hung > 0;
}
