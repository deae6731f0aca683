#if canImport(Glibc)
import Glibc
#endif

/// glibc malloc settings for a process that handles batch-sized buffers over and over: the agent
/// (drain chunks, request bodies and their gzip and form encodings) and the reference collector
/// (request bodies, their base64 and inflated forms).
///
/// glibc maps every allocation above its mmap threshold (128 KiB to start with) anew and unmaps it
/// when freed, and returns free memory above its trim threshold at the top of the heap to the
/// kernel: every batch then pays a page fault and a zeroed page per 4 KiB of each buffer. Thresholds
/// of 64 MiB keep such buffers in the heap and reuse them. What the heap keeps is bounded by the
/// largest buffers alive at once, not by the backlog: in the agent by the chunk and batch limits, in
/// the collector by its concurrent requests times `--max-body-bytes`.
///
/// Measured (docs/performance.md): in the agent about 5 µs of CPU per event (a fifth of it when
/// introduced), its peak anon memory flat from 100,000 to 1,000,000 events waiting; in the
/// collector about 8 % of its CPU.
public enum MallocPolicy {
    /// `M_TRIM_THRESHOLD`, `M_MMAP_THRESHOLD` and `M_ARENA_MAX` of glibc's `<malloc.h>` (which Swift
    /// does not import).
    private static let trimThreshold: Int32 = -1
    private static let mmapThreshold: Int32 = -3
    private static let arenaMax: Int32 = -8

    /// Applies the thresholds; call first thing in `main`, before any thread but the main one
    /// allocates: the arena limit does not take back an arena a thread already has (after a first
    /// `await`, the cooperative pool's threads have theirs).
    ///
    /// - Parameter singleArena: one malloc arena for all threads. glibc otherwise creates one per
    ///   thread that allocates (up to 8 per core), and each keeps 3–5 MiB of freed batch buffers of
    ///   its own: the agent, whose memory must stay flat (`--parts rss`), uses one; the collector,
    ///   whose event-loop threads allocate concurrently, does not.
    public static func reuseLargeBuffers(singleArena: Bool) {
        #if canImport(Glibc)
        // mallopt(3), looked up at run time: <malloc.h> is not part of Swift's Glibc module.
        guard let symbol = dlsym(nil, "mallopt") else { return }
        let mallopt = unsafeBitCast(symbol, to: (@convention(c) (Int32, Int32) -> Int32).self)
        if singleArena { _ = mallopt(arenaMax, 1) }
        _ = mallopt(mmapThreshold, 64 << 20)
        _ = mallopt(trimThreshold, 64 << 20)
        #endif
    }
}
