import Foundation
import Tributary

/// Appends acknowledged events to a ledger file, one `write` per line so a kill loses at most a line
/// that was never acknowledged to anyone.
final class Ledger: Sendable {
    private let handle: FileHandle?

    init(path: String?) throws {
        guard let path else {
            handle = nil
            return
        }
        if !FileManager.default.fileExists(atPath: path) {
            _ = FileManager.default.createFile(atPath: path, contents: nil)
        }
        let h = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        h.seekToEndOfFile()
        handle = h
    }

    func record(_ receipt: TrackReceipt) {
        handle?.write(Data("\(receipt.producerSeq) \(receipt.seq) \(receipt.eventID)\n".utf8))
    }
}
