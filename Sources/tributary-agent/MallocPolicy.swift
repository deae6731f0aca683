#if canImport(Glibc)
import Glibc

/// glibc malloc settings that keep the agent's heap flat however large its backlog.
///
/// Measured (`/proc/PID/smaps` of `tributary-bench agent --parts rss`): what varied between runs was
/// not the backlog but the number of glibc malloc arenas (one per thread that allocates, up to 8 per
/// core), each keeping 3–5 MiB of freed batch buffers: glibc raises its mmap threshold to the size of
/// the largest block freed, so after the first batch every batch-sized buffer came from an arena and
/// stayed resident there. One arena and a fixed mmap threshold make buffers of 256 KiB and more
/// (request bodies, drain chunks) mappings of their own, returned to the kernel when freed.
enum MallocPolicy {
    /// `M_MMAP_THRESHOLD` and `M_ARENA_MAX` of glibc's `<malloc.h>` (which Swift does not import).
    private static let mmapThreshold: Int32 = -3
    private static let arenaMax: Int32 = -8

    /// Applies the settings; call before the agent starts its threads.
    static func apply() {
        // mallopt(3), looked up at run time: <malloc.h> is not part of Swift's Glibc module.
        guard let symbol = dlsym(nil, "mallopt") else { return }
        let mallopt = unsafeBitCast(symbol, to: (@convention(c) (Int32, Int32) -> Int32).self)
        _ = mallopt(arenaMax, 1)
        _ = mallopt(mmapThreshold, 256 << 10)
    }
}
#else
enum MallocPolicy {
    static func apply() {}
}
#endif
