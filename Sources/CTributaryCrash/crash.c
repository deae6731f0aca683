// Crash capture. Everything the signal handler calls is async-signal-safe: write, read, fsync,
// clock_gettime, getpid, syscall(SYS_gettid), nanosleep, sigaction and raise (POSIX.1-2017 2.4.3 lists
// all of them but syscall, which is a plain trap into the kernel). The handler never allocates, never
// takes a lock and never calls back into Swift.
//
// Backtraces walk the frame-pointer chain from the interrupted context instead of calling glibc's
// backtrace(): backtrace() goes through libgcc's unwinder, which takes the dynamic loader's lock
// (dl_iterate_phdr) and may load libgcc_s with malloc on first use, so a crash inside malloc or dlopen
// would deadlock it. Swift keeps frame pointers on every function (the Swift runtime's own backtracer
// relies on them), so the chain covers Swift code; frames in C libraries built without frame pointers
// may end the walk early. Every read of the chain goes through a pre-opened pipe (write then read), so
// a corrupt chain yields EFAULT instead of a second fault inside the handler.
#define _GNU_SOURCE
#include "CTributaryCrash.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static const int tributary_signals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGTRAP};
#define SIGNAL_COUNT (sizeof(tributary_signals) / sizeof(tributary_signals[0]))

static struct sigaction g_previous[SIGNAL_COUNT];
static int g_installed = 0;
static volatile int g_fd = -1;
static int g_pipe[2] = {-1, -1};
static uint8_t g_boot_id[16];
static tributary_crash_module g_modules[TRIBUTARY_CRASH_MAX_MODULES];
static uint32_t g_module_count = 0;
static tributary_crash_record g_record;   // filled by the one thread that claims g_busy
static atomic_int g_busy = 0;              // 0 idle, 1 writing a record, 2 written

// Context published by the app, double-buffered: writers fill the inactive copy, then flip the index.
typedef struct {
    uint32_t foreground;
    uint64_t active_since_ns;
    char session_id[TRIBUTARY_CRASH_SESSION_ID];
    char screen_name[TRIBUTARY_CRASH_SCREEN_NAME];
} crash_context;
static crash_context g_context[2];
static char g_app_version[TRIBUTARY_CRASH_APP_VERSION];
static atomic_uint g_context_index = 0;
static pthread_mutex_t g_context_lock = PTHREAD_MUTEX_INITIALIZER;

uint64_t tributary_crash_checksum(const void *bytes, uint64_t length) {
    const uint8_t *p = (const uint8_t *)bytes;
    uint64_t hash = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < length; i++) {
        hash ^= p[i];
        hash *= 0x100000001b3ull;
    }
    return hash;
}

static void copy_string(char *dst, size_t capacity, const char *src) {
    size_t i = 0;
    if (src) {
        for (; i + 1 < capacity && src[i] != 0; i++) dst[i] = src[i];
    }
    for (; i < capacity; i++) dst[i] = 0;
}

void tributary_crash_set_context(uint32_t foreground, uint64_t active_since_ns, const char *session_id,
                                 const char *screen_name) {
    pthread_mutex_lock(&g_context_lock);
    unsigned next = 1u - atomic_load(&g_context_index);
    crash_context *c = &g_context[next];
    c->foreground = foreground;
    c->active_since_ns = active_since_ns;
    copy_string(c->session_id, sizeof(c->session_id), session_id);
    copy_string(c->screen_name, sizeof(c->screen_name), screen_name);
    atomic_store(&g_context_index, next);
    pthread_mutex_unlock(&g_context_lock);
}

uint32_t tributary_crash_context_foreground(uint64_t *active_since_ns) {
    pthread_mutex_lock(&g_context_lock);
    const crash_context *c = &g_context[atomic_load(&g_context_index)];
    uint32_t foreground = c->foreground;
    if (active_since_ns) *active_since_ns = c->active_since_ns;
    pthread_mutex_unlock(&g_context_lock);
    return foreground;
}

void tributary_crash_set_app_version(const char *app_version) {
    pthread_mutex_lock(&g_context_lock);
    copy_string(g_app_version, sizeof(g_app_version), app_version);
    pthread_mutex_unlock(&g_context_lock);
}

// Reads 16 bytes at `address` without faulting: the kernel copies them into the pipe or says EFAULT.
static int safe_read16(uint64_t address, uint64_t out[2]) {
    if (g_pipe[1] < 0) return 0;
    if (write(g_pipe[1], (const void *)(uintptr_t)address, 16) != 16) return 0;
    return read(g_pipe[0], out, 16) == 16;
}

static uint32_t walk_frames(uint64_t fp, uint64_t *frames, uint32_t count, uint32_t max) {
    while (count < max && fp != 0 && (fp & 7) == 0) {
        uint64_t pair[2];   // [0] = caller's frame pointer, [1] = return address
        if (!safe_read16(fp, pair)) break;
        if (pair[1] == 0) break;
        frames[count++] = pair[1];
        // The stack grows down: each caller's frame is above its callee's, and not absurdly far.
        if (pair[0] <= fp || pair[0] - fp > (64u << 20)) break;
        fp = pair[0];
    }
    return count;
}

static int in_module(uint64_t address) {
    for (uint32_t i = 0; i < g_module_count; i++) {
        if (address >= g_modules[i].start && address < g_modules[i].end) return 1;
    }
    return 0;
}

// When the chain from the interrupted context breaks at once (a fault inside a C library built
// without frame pointers, such as glibc's abort), look for the nearest intact frame on the stack: a
// word just above the stack pointer that points further up the stack at a saved frame pointer whose
// return address lies in a loaded object. Only intact frame records are accepted, so the walk resumes
// in the caller's code (Swift) instead of reporting stray stack words.
static uint64_t find_frame_above(uint64_t sp) {
    for (uint64_t at = sp & ~7ull; at < sp + 8192; at += 16) {
        uint64_t words[2];
        if (!safe_read16(at, words)) return 0;
        for (int k = 0; k < 2; k++) {
            uint64_t candidate = words[k];
            if (candidate <= at || candidate - sp > (1u << 20) || (candidate & 7) != 0) continue;
            uint64_t pair[2];
            if (safe_read16(candidate, pair) && in_module(pair[1]) && pair[0] > candidate) return candidate;
        }
    }
    return 0;
}

uint32_t tributary_crash_capture_current(uint64_t *frames, uint32_t max) {
    if (g_pipe[0] < 0 && pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 0;
    return walk_frames((uint64_t)(uintptr_t)__builtin_frame_address(0), frames, 0, max);
}

static void write_record(int sig, siginfo_t *info, void *uctx) {
    tributary_crash_record *r = &g_record;
    memset(r, 0, sizeof(*r));
    r->magic = TRIBUTARY_CRASH_MAGIC;
    r->version = TRIBUTARY_CRASH_VERSION;
    r->size = (uint32_t)sizeof(*r);
    r->signal = sig;
    r->code = info ? info->si_code : 0;
    r->pid = (int32_t)getpid();
    r->tid = (int32_t)syscall(SYS_gettid);
    r->fault_address = info ? (uint64_t)(uintptr_t)info->si_addr : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r->wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    r->boot_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    memcpy(r->boot_id, g_boot_id, sizeof(r->boot_id));

    const crash_context *c = &g_context[atomic_load(&g_context_index)];
    r->foreground = c->foreground;
    r->active_since_ns = c->active_since_ns;
    memcpy(r->session_id, c->session_id, sizeof(r->session_id));
    memcpy(r->screen_name, c->screen_name, sizeof(r->screen_name));
    r->session_id[sizeof(r->session_id) - 1] = 0;
    r->screen_name[sizeof(r->screen_name) - 1] = 0;
    memcpy(r->app_version, g_app_version, sizeof(r->app_version));
    r->app_version[sizeof(r->app_version) - 1] = 0;

    uint64_t pc = 0, fp = 0, sp = 0;
    if (uctx) {
        const ucontext_t *u = (const ucontext_t *)uctx;
#if defined(__x86_64__)
        pc = (uint64_t)u->uc_mcontext.gregs[REG_RIP];
        fp = (uint64_t)u->uc_mcontext.gregs[REG_RBP];
        sp = (uint64_t)u->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
        pc = (uint64_t)u->uc_mcontext.pc;
        fp = (uint64_t)u->uc_mcontext.regs[29];
        sp = (uint64_t)u->uc_mcontext.sp;
#endif
    }
    r->instruction = pc;
    uint32_t n = 0;
    if (pc != 0) r->frames[n++] = pc;
    n = walk_frames(fp, r->frames, n, TRIBUTARY_CRASH_MAX_FRAMES);
    if (n < 4 && sp != 0) {
        uint64_t above = find_frame_above(sp);
        if (above != 0) n = walk_frames(above, r->frames, n < 2 ? n : 1, TRIBUTARY_CRASH_MAX_FRAMES);
    }
    r->frame_count = n;
    r->module_count = g_module_count;
    memcpy(r->modules, g_modules, sizeof(g_modules[0]) * g_module_count);
    r->checksum = tributary_crash_checksum(r, offsetof(tributary_crash_record, checksum));

    int fd = g_fd;
    if (fd < 0) return;
    const uint8_t *p = (const uint8_t *)r;
    size_t left = sizeof(*r);
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        left -= (size_t)w;
    }
    fsync(fd);
}

static int signal_slot(int sig) {
    for (unsigned i = 0; i < SIGNAL_COUNT; i++) {
        if (tributary_signals[i] == sig) return (int)i;
    }
    return -1;
}

static void crash_handler(int sig, siginfo_t *info, void *uctx) {
    int saved_errno = errno;
    int expected = 0;
    if (atomic_compare_exchange_strong(&g_busy, &expected, 1)) {
        write_record(sig, info, uctx);
        atomic_store(&g_busy, 2);
    } else {
        // Another thread is writing the record: give it up to two seconds before the process goes.
        struct timespec pause = {0, 10 * 1000 * 1000};
        for (int i = 0; i < 200 && atomic_load(&g_busy) == 1; i++) nanosleep(&pause, NULL);
    }
    // Chain: put back whatever was installed before us (another SDK's handler, or the default).
    int slot = signal_slot(sig);
    if (slot >= 0) sigaction(sig, &g_previous[slot], NULL);
    // A signal sent by kill/raise/abort is not repeated by returning, so send it again: it stays
    // pending while this handler runs and reaches the previous action on return. Nor is a breakpoint
    // trap (x86-64's int3 resumes after the instruction). A fault (SIGSEGV, SIGILL from ud2, SIGFPE,
    // ...) repeats by itself when the faulting instruction runs again.
    if ((info && info->si_code <= 0) || sig == SIGABRT || sig == SIGTRAP) raise(sig);
    errno = saved_errno;
}

static int add_module(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (g_module_count >= TRIBUTARY_CRASH_MAX_MODULES) return 1;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uint64_t start = (uint64_t)info->dlpi_addr + ph->p_vaddr;
        if (start < lo) lo = start;
        if (start + ph->p_memsz > hi) hi = start + ph->p_memsz;
    }
    if (hi == 0) return 0;
    tributary_crash_module *m = &g_modules[g_module_count++];
    m->bias = (uint64_t)info->dlpi_addr;
    m->start = lo;
    m->end = hi;
    const char *path = info->dlpi_name;
    char exe[512];
    if (path == NULL || path[0] == 0) {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        exe[n > 0 ? n : 0] = 0;
        path = exe;
    }
    const char *base = strrchr(path, '/');
    copy_string(m->name, sizeof(m->name), base ? base + 1 : path);
    return 0;
}

int tributary_crash_install(int fd, const uint8_t *boot_id) {
    if (g_pipe[0] < 0 && pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return errno;
    g_module_count = 0;
    dl_iterate_phdr(add_module, NULL);
    if (boot_id) memcpy(g_boot_id, boot_id, sizeof(g_boot_id));
    int previous_fd = g_fd;
    g_fd = fd;
    if (previous_fd >= 0 && previous_fd != fd) close(previous_fd);

    // An alternate stack for this thread, so a stack overflow can still be recorded.
    stack_t current;
    if (sigaltstack(NULL, &current) == 0 && (current.ss_flags & SS_DISABLE)) {
        size_t size = 64 * 1024;
        void *stack = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (stack != MAP_FAILED) {
            stack_t alt = {.ss_sp = stack, .ss_flags = 0, .ss_size = size};
            sigaltstack(&alt, NULL);
        }
    }
    if (g_installed) return 0;
    for (unsigned i = 0; i < SIGNAL_COUNT; i++) {
        struct sigaction action;
        memset(&action, 0, sizeof(action));
        action.sa_sigaction = crash_handler;
        sigemptyset(&action.sa_mask);
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        if (sigaction(tributary_signals[i], &action, &g_previous[i]) != 0) {
            int err = errno;
            for (unsigned j = 0; j < i; j++) sigaction(tributary_signals[j], &g_previous[j], NULL);
            return err;
        }
    }
    g_installed = 1;
    atomic_store(&g_busy, 0);
    return 0;
}

int tributary_crash_current_fd(void) { return g_fd; }

int tributary_crash_uninstall(void) {
    if (!g_installed) return 0;
    for (unsigned i = 0; i < SIGNAL_COUNT; i++) {
        if (sigaction(tributary_signals[i], &g_previous[i], NULL) != 0) return errno;
    }
    g_installed = 0;
    int fd = g_fd;
    g_fd = -1;
    if (fd >= 0) close(fd);
    return 0;
}

void tributary_crash_breakpoint(void) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("int3");
#elif defined(__aarch64__)
    __asm__ volatile("brk #0xf000");
#else
    __builtin_trap();
#endif
}
