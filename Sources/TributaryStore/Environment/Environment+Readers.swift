import CLMDB

// MARK: Reader table

extension Environment {
    /// lmdb.h: "mdb_reader_check: Check for stale entries in the reader lock table." Returns how many
    /// slots of dead processes were cleared.
    func clearStaleReaders() throws(StoreError) -> Int {
        var dead: Int32 = 0
        try Environment.mapError(MDB.readerCheck(env, &dead), "mdb_reader_check", path: path)
        return Int(dead)
    }

    /// The lines of `mdb_reader_list` ("pid thread txnid"), without its header; one per occupied slot.
    func readerSlots() -> [String] {
        final class Lines { var text = "" }
        let lines = Lines()
        _ = MDB.readerList(env, { message, context in
            guard let message, let context else { return 0 }
            Unmanaged<Lines>.fromOpaque(context).takeUnretainedValue().text += String(cString: message)
            return 0
        }, Unmanaged.passUnretained(lines).toOpaque())
        return withExtendedLifetime(lines) {
            lines.text.split(separator: "\n").map { String($0.drop(while: { $0 == " " })) }
                .filter { !$0.isEmpty && !$0.hasPrefix("pid") && $0 != "(no active readers)" }
        }
    }
}
