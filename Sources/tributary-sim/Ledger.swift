import ArgumentParser
import Foundation
import Tributary

/// Appends acknowledged events to a ledger file, one `write` per line so a kill loses at most a line
/// that was never acknowledged to anyone.
///
/// A ledger that cannot be written ends the run with exit 74 (an I/O error), said on stderr: the
/// opening at once, a line later on at the event it was for (stored already, so the test reading the
/// ledger finds one event more than the ledger lists, never one fewer).
final class Ledger: Sendable {
    private let descriptor: Int32?
    private let path: String

    /// Opens `path` for appending, creating it (mode 0644) when missing; no ledger when `path` is nil.
    ///
    /// - Throws: `ExitCode(74)`, the reason on stderr, when the file cannot be opened.
    init(path: String?) throws {
        self.path = path ?? "-"
        guard let path else {
            descriptor = nil
            return
        }
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o644)
        guard fd >= 0 else {
            throw producerFailure(LedgerError("Cannot open the ledger \(path): \(String(cString: strerror(errno)))."))
        }
        descriptor = fd
    }

    deinit { if let descriptor { close(descriptor) } }

    /// Appends the receipt's line (`producer_seq seq event_id`).
    func record(_ receipt: TrackReceipt) {
        guard let descriptor else { return }
        let line = Array("\(receipt.producerSeq) \(receipt.seq) \(receipt.eventID)\n".utf8)
        var written = 0
        while written < line.count {
            let n = line[written...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
            if n > 0 {
                written += n
            } else if n < 0 && errno == EINTR {
                continue
            } else {
                let reason = n < 0 ? String(cString: strerror(errno)) : "nothing written"
                // The event is stored; its caller cannot be told by a throw (the bridge's receipt handler),
                // and a run whose ledger misses lines must not look like one that lost events.
                FileHandle.standardError.write(
                    Data("tributary-sim: Cannot write to the ledger \(path) (event \(receipt.eventID) is stored): \(reason).\n".utf8))
                exit(74)
            }
        }
    }
}

/// A ledger that cannot be opened (exit 74, as any I/O error).
struct LedgerError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
