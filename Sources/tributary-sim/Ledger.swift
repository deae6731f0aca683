import ArgumentParser
import Foundation
import Tributary
import TributaryStore

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
            throw runFailure("Cannot open the ledger \(path): \(String(cString: strerror(errno))).", exitCode: 74)
        }
        descriptor = fd
    }

    deinit { if let descriptor { close(descriptor) } }

    /// Appends the receipt's line: `producer_seq seq event_id "distinct_id"` (the identity the event
    /// was stored under, as a JSON string: the oracle checks that the collector got the event under it).
    func record(_ receipt: TrackReceipt) {
        guard let descriptor else { return }
        let line = "\(receipt.producerSeq) \(receipt.seq) \(receipt.eventID) \(Self.quoted(receipt.distinctID))\n"
        guard let err = writeAll(descriptor, Array(line.utf8)) else { return }
        // The event is stored; its caller cannot be told by a throw (the bridge's receipt handler), and a
        // run whose ledger misses lines must not look like one that lost events.
        let failure = runFailure(
            "Cannot write to the ledger \(path) (event \(receipt.eventID) is stored): \(String(cString: strerror(err))).",
            exitCode: 74)
        exit(failure.rawValue)
    }

    /// `text` as a JSON string literal: one field of a line, whatever spaces or line breaks it holds.
    static func quoted(_ text: String) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: text, options: .fragmentsAllowed)) ?? Data("\"\"".utf8)
        return String(decoding: data, as: UTF8.self)
    }
}
