#ifndef CTRIBUTARY_CRASH_H
#define CTRIBUTARY_CRASH_H

// Crash capture for Tributary producers: signal handlers that write one fixed-size crash record with
// async-signal-safe calls only (write, fsync, clock_gettime, sigaction, raise, read on a pre-opened pipe,
// memcpy and memset on static buffers).
// The record format is documented in docs/autotrack.md ("Crash records").

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRIBUTARY_CRASH_MAGIC 0x52435254u   /* "TRCR" little-endian */
#define TRIBUTARY_CRASH_VERSION 2u   /* 1: the same without app_version */
#define TRIBUTARY_CRASH_MAX_FRAMES 64
#define TRIBUTARY_CRASH_MAX_MODULES 32
#define TRIBUTARY_CRASH_MODULE_NAME 96
#define TRIBUTARY_CRASH_SESSION_ID 40
#define TRIBUTARY_CRASH_SCREEN_NAME 128
#define TRIBUTARY_CRASH_APP_VERSION 256

/// One loaded object (executable or shared library), captured when the handlers are installed.
typedef struct {
    uint64_t bias;      // load bias: an address minus `bias` is the offset `addr2line -e name` takes
    uint64_t start;     // lowest mapped address of its PT_LOAD segments
    uint64_t end;       // one past the highest
    char name[TRIBUTARY_CRASH_MODULE_NAME];   // file name without directories, NUL-terminated
} tributary_crash_module;

/// One crash record, as written to the crash file (host byte order, fixed size).
typedef struct {
    uint32_t magic;                 // TRIBUTARY_CRASH_MAGIC
    uint32_t version;               // TRIBUTARY_CRASH_VERSION
    uint32_t size;                  // sizeof(tributary_crash_record)
    int32_t signal;                 // signal number
    int32_t code;                   // si_code
    int32_t pid;
    int32_t tid;
    uint32_t foreground;            // 1: an $AppStart had no $AppEnd yet when the process crashed
    uint64_t fault_address;         // si_addr
    uint64_t instruction;           // program counter at the fault
    int64_t wall_ms;                // CLOCK_REALTIME at the crash, ms since the epoch
    uint64_t boot_ns;               // CLOCK_BOOTTIME at the crash
    uint64_t active_since_ns;       // CLOCK_BOOTTIME when the app became active (valid if foreground)
    uint8_t boot_id[16];
    char session_id[TRIBUTARY_CRASH_SESSION_ID];
    char screen_name[TRIBUTARY_CRASH_SCREEN_NAME];
    uint32_t frame_count;
    uint32_t module_count;
    uint64_t frames[TRIBUTARY_CRASH_MAX_FRAMES];
    tributary_crash_module modules[TRIBUTARY_CRASH_MAX_MODULES];
    char app_version[TRIBUTARY_CRASH_APP_VERSION];   // the crashed run's $app_version, NUL-terminated (version 2)
    uint64_t checksum;              // FNV-1a 64 of every byte before this field
} tributary_crash_record;

// A version 1 record (written by Tributary before app_version) is a version 2 record without
// app_version: its checksum is where app_version begins, and it ends 8 bytes later. Readers take both.

/// Installs the handlers for SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL and SIGTRAP, keeping the
/// previously installed actions to chain to. `fd` is the crash file, opened for appending; it stays
/// open. Also sets up an alternate signal stack for the calling thread. Returns 0 or an errno value.
/// Calling it again replaces (and closes) the file, keeps the original previous actions.
int tributary_crash_install(int fd, const uint8_t *boot_id);

/// The crash file descriptor the handlers write to, or -1 when none is installed.
int tributary_crash_current_fd(void);

/// Restores the actions that were installed before `tributary_crash_install` and closes the crash
/// file. Returns 0 or errno.
int tributary_crash_uninstall(void);

/// Publishes what a crash record needs to know about the app (safe to call from any thread).
void tributary_crash_set_context(uint32_t foreground, uint64_t active_since_ns, const char *session_id,
                                 const char *screen_name);

/// What a crash now would record as `foreground` (and, through `active_since_ns` when not NULL, as
/// `active_since_ns`): the context last published.
uint32_t tributary_crash_context_foreground(uint64_t *active_since_ns);

/// Sets the app version every later record carries (call it before the handlers can run; a
/// longer version is cut at 255 bytes).
void tributary_crash_set_app_version(const char *app_version);

/// FNV-1a 64 of `length` bytes (the record checksum).
uint64_t tributary_crash_checksum(const void *bytes, uint64_t length);

/// Walks the frame-pointer chain of the calling thread into `frames` (for tests). Returns the count.
uint32_t tributary_crash_capture_current(uint64_t *frames, uint32_t max);

/// Executes the CPU's breakpoint instruction (`int3` on x86-64, `brk` on arm64), as a debug trap left in
/// app code does: SIGTRAP, which on x86-64 resumes after the instruction if its handler returns (for
/// tests of that path).
void tributary_crash_breakpoint(void);

#ifdef __cplusplus
}
#endif

#endif
