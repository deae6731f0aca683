#if canImport(Glibc)
import Glibc

/// glibc malloc settings that keep the agent's heap flat however large its backlog, without paying
/// for fresh pages on every batch.
///
/// Measured (`/proc/PID/smaps` of `tributary-bench agent --parts rss`): what varied between runs was
/// not the backlog but the number of glibc malloc arenas (one per thread that allocates, up to 8 per
/// core), each keeping 3–5 MiB of freed batch buffers. One arena (`M_ARENA_MAX`) fixes that.
///
/// The batch-sized buffers (a drain chunk of about 1 MB, a request body of up to `--max-batch-bytes`
/// and its gzip and form encodings) are then reused from that one arena: mmap and trim thresholds
/// of 64 MiB keep glibc from mapping each of them anew and returning it to the kernel when freed,
/// which cost a page fault and a zeroed page per 4 KiB on every chunk and every batch (about 5 µs of
/// CPU per event, 20 % of the agent's). What the arena keeps is bounded by the largest buffers alive
/// at once, which the chunk and batch limits bound, not by the backlog: peak anon 11.1 MiB with
/// 100,000 events waiting, 11.4 MiB with 1,000,000 (docs/performance.md).
enum MallocPolicy {
    /// `M_TRIM_THRESHOLD`, `M_MMAP_THRESHOLD` and `M_ARENA_MAX` of glibc's `<malloc.h>` (which Swift
    /// does not import).
    private static let trimThreshold: Int32 = -1
    private static let mmapThreshold: Int32 = -3
    private static let arenaMax: Int32 = -8

    /// Applies the settings; call before the agent starts its threads.
    static func apply() {
        // mallopt(3), looked up at run time: <malloc.h> is not part of Swift's Glibc module.
        guard let symbol = dlsym(nil, "mallopt") else { return }
        let mallopt = unsafeBitCast(symbol, to: (@convention(c) (Int32, Int32) -> Int32).self)
        _ = mallopt(arenaMax, 1)
        _ = mallopt(mmapThreshold, 64 << 20)
        _ = mallopt(trimThreshold, 64 << 20)
    }
}
#else
enum MallocPolicy {
    static func apply() {}
}
#endif
