import CLMDB

// MARK: Map size

extension Environment {
    /// The current map size (what LMDB uses: the larger of ours and the one another process set).
    var mapSize: Int { resizeLock.withReadLock { mapSizeLocked } }

    /// ``mapSize``, for a caller holding the resize lock (shared or exclusive): `mdb_env_info` reads the
    /// meta pages through the memory map, which a resize on another thread unmaps and maps again.
    var mapSizeLocked: Int {
        var info = MDB_envinfo()
        MDB.envInfo(env, &info)
        return info.me_mapsize
    }

    /// The id of the last committed write transaction (`mdb_env_info`'s `me_last_txnid`, read under the
    /// resize lock as ``mapSize`` is).
    var lastTransactionID: Int {
        resizeLock.withReadLock {
            var info = MDB_envinfo()
            MDB.envInfo(env, &info)
            return info.me_last_txnid
        }
    }

    /// How long a read waits to adopt a map another process grew (``adoptMapSize(waitingAtMost:)``).
    static let adoptionWait: Duration = .milliseconds(500)

    /// Adopts the map size another process grew the store to, once no transaction of this process is
    /// running, waiting at most `limit` for that; throws ``StoreError/Code/busy`` after it.
    ///
    /// A read waits no longer: a write of this process waiting for LMDB's writer lock holds the resize
    /// lock shared all along, and the writer lock may be held by a process that is stopped (SIGSTOP, a
    /// debugger). The agent's deletes wait so, on a thread of their own; its loop, whose reads would
    /// otherwise wait with them, skips a drain instead, and goes on uploading and keeping its deadlines.
    func adoptMapSize(waitingAtMost limit: Duration) throws(StoreError) {
        let adopted: Bool? = try resizeLock.withWriteLock(waitingAtMost: limit) { () throws(StoreError) in
            try adoptMapSize()
            return true
        }
        guard adopted != nil else {
            throw StoreError(
                .busy,
                "The shared store \(path) was grown by another process, and this process could not adopt its new size "
                    + "within \(limit): one of its own writes is waiting for the store's writer lock, which another "
                    + "process holds (stopped, or slow). Nothing was read; try again.")
        }
    }

    /// Adopts the size another process grew the map to (lmdb.h: "call mdb_env_set_mapsize() with a size
    /// of zero to adopt the new size"); the resize lock is held exclusively.
    func adoptMapSize() throws(StoreError) {
        try Environment.mapError(mdb.setMapSize(env, 0), "mdb_env_set_mapsize", path: path)
    }

    /// Doubles the map size a transaction found full (`fullAt`), up to the quota; does nothing when the
    /// map is larger already (another thread of this process grew it meanwhile: the caller tries again).
    func grow(from fullAt: Int) throws(StoreError) {
        try resizeLock.withWriteLock { () throws(StoreError) in
            let current = mapSizeLocked
            guard current <= fullAt else { return }
            guard current < quota else {
                throw StoreError(
                    .storeFull,
                    "The shared store \(path) reached its quota of \(quota) bytes. Nothing was written; "
                        + "start the agent to drain it, or raise the quota.")
            }
            let target = min(quota, max(current * 2, current + 1 << 20))
            try Environment.mapError(mdb.setMapSize(env, target), "mdb_env_set_mapsize", path: path)
        }
    }
}
