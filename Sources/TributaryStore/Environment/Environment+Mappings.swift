import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: This process's mappings of the store

extension Environment {
    /// Drops this process's page-table entries for the store's memory map (`madvise(MADV_DONTNEED)`).
    ///
    /// LMDB maps the file read-only and `MAP_SHARED` (no `MDB_WRITEMAP`), so the pages stay in the
    /// kernel's page cache with their data; the next access to one maps it again (a minor fault). Only
    /// this process's resident set shrinks: a reader that has walked the whole store otherwise keeps
    /// every page it read counted in its RSS. LMDB does not publish where it mapped the file
    /// (`mdb_env_info`'s `me_mapaddr` is only set with `MDB_FIXEDMAP`), so the ranges come from
    /// `/proc/self/maps`, read again only when the map size changed (a resize may move the map):
    /// reading and parsing it on every drain chunk cost 4 % of the agent's CPU. The resize lock, held
    /// shared, keeps the map where it is meanwhile.
    func releaseMappedPages() {
        resizeLock.withReadLock {
            let mapSize = mapSizeLocked
            let ranges = mappedRanges.withLock { cached in
                if let cached, cached.mapSize == mapSize { return cached.ranges }
                let found = storeMappings()
                cached = found.isEmpty ? nil : (mapSize, found)
                return found
            }
            for range in ranges {
                _ = madvise(UnsafeMutableRawPointer(bitPattern: range.start), Int(range.end - range.start), MADV_DONTNEED)
            }
        }
    }

    /// The read-only shared mappings of the store's data file in `/proc/self/maps`. Only those
    /// ("r--s"): MADV_DONTNEED would discard a private mapping's written pages, never a shared read-only
    /// one's.
    private func storeMappings() -> [(start: UInt, end: UInt)] {
        var st = stat()
        guard stat(path, &st) == 0 else { return [] }
        return Self.sharedMappings(ofInode: UInt64(st.st_ino), permissions: "r--s").map { ($0.start, $0.end) }
    }

    /// This process's mappings of the file with inode `inode` and permissions `permissions` (as
    /// `/proc/self/maps` writes them), with the file offset each begins at and the path it names.
    static func sharedMappings(
        ofInode inode: UInt64, permissions: String
    ) -> [(start: UInt, end: UInt, offset: UInt, path: String)] {
        guard let maps = fopen("/proc/self/maps", "r") else { return [] }
        defer { fclose(maps) }
        var buffer: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(buffer) }
        var ranges: [(start: UInt, end: UInt, offset: UInt, path: String)] = []
        // Lines: "start-end perms offset dev inode path"; a file's maps are the ones with its inode.
        // (getline, not String(contentsOfFile:): /proc files report size 0 and may be read short.)
        while getline(&buffer, &capacity, maps) > 0, let buffer {
            let line = String(cString: buffer)
            let fields = line.split(separator: " ", maxSplits: 5, omittingEmptySubsequences: true)
            guard fields.count == 6, fields[1] == permissions, UInt64(fields[4]) == inode,
                let offset = UInt(fields[2], radix: 16)
            else { continue }
            let bounds = fields[0].split(separator: "-")
            guard bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16),
                end > start, start != 0
            else { continue }
            ranges.append((start, end, offset, fields[5].trimmingCharacters(in: .whitespacesAndNewlines)))
        }
        return ranges
    }
}
