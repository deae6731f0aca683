import Foundation
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

/// The preset properties of a Linux producer: what the iOS SDK reads from `UIDevice`, read here from
/// `/etc/os-release`, `uname` and DMI.
public enum PresetProperties {
    /// The library's name, sent as `$lib`.
    public static let libName = "Linux"
    /// The library's version, sent as `$lib_version`.
    public static let libVersion = "0.1.0"

    /// The preset properties for this machine and app.
    public static func current(appVersion: String, deviceID: String) -> [String: PropertyValue] {
        [
            "$os": .string("Linux"),
            "$os_version": .string(osVersion),
            "$model": .string(dmi("product_name") ?? machine),
            "$manufacturer": .string(dmi("sys_vendor") ?? "unknown"),
            "$app_version": .string(appVersion),
            "$lib": .string(libName),
            "$lib_version": .string(libVersion),
            "$device_id": .string(deviceID),
        ]
    }

    /// `VERSION_ID` (else `PRETTY_NAME`) from os-release, else the kernel release.
    static let osVersion: String = {
        if let text = readSmallFile("/etc/os-release") {
            var fields: [String: String] = [:]
            for line in text.split(separator: "\n") {
                guard let eq = line.firstIndex(of: "=") else { continue }
                let value = line[line.index(after: eq)...].trimmingCharacters(in: CharacterSet(charactersIn: "\"'"))
                fields[String(line[..<eq])] = value
            }
            if let v = fields["VERSION_ID"] ?? fields["PRETTY_NAME"], !v.isEmpty { return v }
        }
        var u = utsname()
        uname(&u)
        return withUnsafeBytes(of: &u.release) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
    }()

    static let machine: String = {
        var u = utsname()
        uname(&u)
        return withUnsafeBytes(of: &u.machine) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
    }()

    static func dmi(_ name: String) -> String? {
        guard let text = readSmallFile("/sys/class/dmi/id/" + name) else { return nil }
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return trimmed.isEmpty ? nil : trimmed
    }
}

