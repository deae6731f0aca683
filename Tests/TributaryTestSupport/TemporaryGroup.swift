import Foundation

/// A fresh app group directory path for one test, removed afterwards (even when the test fails).
///
/// The directory itself is not created, so the store's own creation path (mode 2770) is exercised.
/// It lives under the system temporary directory, which on this project's machines is a real disk
/// (never put a durable store on tmpfs).
public func withTemporaryGroup<T>(_ body: (String) async throws -> T) async throws -> T {
    let root = FileManager.default.temporaryDirectory
        .appendingPathComponent("tributary-test-\(UUID().uuidString.prefix(8))", isDirectory: true)
    try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: root) }
    return try await body(root.appendingPathComponent("group").path)
}

/// Synchronous form of ``withTemporaryGroup(_:)-7ptq3``.
public func withTemporaryGroup<T>(_ body: (String) throws -> T) throws -> T {
    let root = FileManager.default.temporaryDirectory
        .appendingPathComponent("tributary-test-\(UUID().uuidString.prefix(8))", isDirectory: true)
    try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: root) }
    return try body(root.appendingPathComponent("group").path)
}
