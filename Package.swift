// swift-tools-version:6.2
import Foundation
import PackageDescription

/// Settings every Tributary target shares: Swift 6 language mode (strict concurrency) and no warnings.
let strict: [SwiftSetting] = [
    .treatAllWarnings(as: .error),
    .enableUpcomingFeature("ExistentialAny"),
]

let package = Package(
    name: "Tributary",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Tributary", targets: ["Tributary"]),
        .library(name: "TributaryStore", targets: ["TributaryStore"]),
        .library(name: "TributaryAutoTrack", targets: ["TributaryAutoTrack"]),
        .library(name: "TributaryBridge", targets: ["TributaryBridge"]),
        .executable(name: "tributary", targets: ["tributary"]),
        .executable(name: "tributary-sim", targets: ["tributary-sim"]),
        .executable(name: "tributary-agent", targets: ["tributary-agent"]),
        .executable(name: "tributary-collector", targets: ["tributary-collector"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        // Its default traits less ConfigurationSupport (swift-configuration: unused here). With two traits
        // their -D flags came in either order from one SwiftPM run to the next, and SwiftPM compiled
        // HummingbirdCore again (32 s) whenever the order changed.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1", traits: ["FullFoundation"]),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
        // Reading certificates and keys (a client key that matches its certificate, a certificate's dates)
        // and SHA-256 pins; async-http-client already depends on both.
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        // The agent's timers and its threads for blocking I/O (EventLoopSleep, IOExecutor): libdispatch's
        // would wake an idle agent once a second. async-http-client already depends on it.
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        // C libraries from Debian, wrapped as system libraries (see each shim.h).
        .systemLibrary(name: "CLMDB", pkgConfig: "lmdb", providers: [.apt(["liblmdb-dev"])]),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CDeflate", pkgConfig: "libdeflate", providers: [.apt(["libdeflate-dev"])]),
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),

        // The one shape of every public error, its source location, and sysexits exit statuses (no
        // dependencies).
        .target(name: "TributaryErrors", swiftSettings: strict),
        // The one seam through which the package calls SQLite's C API itself (GRDB for the rest).
        .target(
            name: "TributarySQLite", dependencies: [.product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),
        // JSON string literals, written one way by every component (no dependencies).
        .target(name: "TributaryJSON", swiftSettings: strict),
        // The shared store: safe LMDB layer and the on-disk record format.
        .target(name: "TributaryStore", dependencies: ["CLMDB", "CDeflate", "TributaryErrors", "TributaryJSON"], swiftSettings: strict),
        // The producer library every process links.
        .target(
            name: "Tributary",
            dependencies: [
                "TributaryStore", "TributaryJSON", "TributaryErrors", .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // Crash capture: async-signal-safe signal handlers that write crash records (plain C, no Swift).
        .target(name: "CTributaryCrash"),
        // The address of Swift's global-executor hook, for the agent's binary (tributary-agent/GlobalExecutor.swift).
        .target(name: "CTributaryExecutorHook"),
        // Automatic tracking any UI toolkit can feed: lifecycle, sessions, page views, clicks, exposure,
        // timings, crashes.
        .target(
            name: "TributaryAutoTrack", dependencies: ["Tributary", "TributaryErrors", "CTributaryCrash"],
            swiftSettings: strict
        ),
        // System calls the bridge's browser host needs that the Glibc module does not declare (pipe2).
        .target(name: "CTributaryBridge"),
        // The hybrid (H5) bridge: message protocol, verification, enrichment, and a headless Chromium host.
        .target(
            name: "TributaryBridge",
            dependencies: [
                "Tributary", "TributaryStore", "TributaryJSON", "TributaryErrors", "CTributaryBridge",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        // Wire formats shared by the agent and the collector: gzip, Sensors form, NDJSON.
        .target(
            name: "TributaryWire", dependencies: ["CZlib", "CDeflate", "TributaryJSON", "TributaryErrors"],
            swiftSettings: strict
        ),
        // The sync agent: drain, enrich, outbox, batching, upload, retry, flush policies.
        .target(
            name: "TributaryAgentCore",
            dependencies: [
                "TributaryStore", "TributaryWire", "TributaryJSON", "TributaryErrors", "TributarySQLite", "CSystemd",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // The reference collector, as a library so tests run it in-process.
        .target(
            name: "TributaryCollector",
            dependencies: [
                "TributaryWire", "TributaryJSON", "TributaryErrors", "TributarySQLite",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),

        // The reliability oracle: producers' ledgers against the collector's events, and the store's and
        // outbox's health (the test suite's scenarios and `tributary-sim judge` in the system test).
        .target(
            name: "TributaryOracle",
            dependencies: ["TributaryStore", "TributaryCollector", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),

        // The one table from errors to exit statuses, shared by the four executables.
        .target(
            name: "TributaryExitStatus",
            dependencies: [
                "Tributary", "TributaryStore", "TributaryAgentCore", "TributaryBridge", "TributaryCollector",
                "TributaryErrors",
            ],
            swiftSettings: strict
        ),

        // Executables: wiring only.
        .executableTarget(
            name: "tributary",
            dependencies: [
                "Tributary", "TributaryAgentCore", "TributaryErrors", "TributaryExitStatus",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tributary-sim",
            dependencies: [
                "Tributary", "TributaryAutoTrack", "TributaryBridge", "TributaryErrors", "TributaryExitStatus",
                "TributaryOracle", "TributaryCollector",
                "TributaryAgentCore",  // the demo reads the outbox it would remove (read-only)
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Hummingbird", package: "hummingbird"), .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tributary-agent",
            dependencies: [
                "TributaryErrors", "TributaryExitStatus",
                "TributaryAgentCore", "TributaryWire",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                "CTributaryExecutorHook",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tributary-collector",
            dependencies: [
                "TributaryErrors", "TributaryExitStatus",
                "TributaryCollector", "TributaryWire", "TributaryStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),

        .target(
            name: "TributaryTestSupport",
            dependencies: [
                "TributaryStore", "TributaryCollector", "TributaryOracle", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "X509", package: "swift-certificates"), .product(name: "Crypto", package: "swift-crypto"),
                // Serves the browser tests' pages (withTestPages): a frame needs a real http origin to be trusted.
                .product(name: "Hummingbird", package: "hummingbird"),
            ],
            path: "Tests/TributaryTestSupport",
            swiftSettings: strict
        ),
        .testTarget(name: "TributaryStoreTests", dependencies: ["TributaryStore", "TributaryTestSupport"],
                    swiftSettings: strict),
        .testTarget(name: "TributaryTests", dependencies: ["Tributary", "TributaryTestSupport"],
                    swiftSettings: strict),
        .testTarget(name: "TributaryAutoTrackTests", dependencies: ["TributaryAutoTrack", "TributaryTestSupport"],
                    swiftSettings: strict),
        .testTarget(
            name: "TributaryBridgeTests",
            dependencies: [
                "TributaryBridge", "Tributary", "TributaryTestSupport", .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(name: "TributaryWireTests", dependencies: ["TributaryWire", "CZlib"], swiftSettings: strict),
        .testTarget(name: "TributaryJSONTests", dependencies: ["TributaryJSON"], swiftSettings: strict),
        .testTarget(name: "TributaryOracleTests", dependencies: ["TributaryOracle"], swiftSettings: strict),
        .testTarget(
            name: "TributaryExitStatusTests",
            dependencies: [
                "TributaryExitStatus", "TributaryErrors", "Tributary", "TributaryStore", "TributaryAgentCore",
                "TributaryBridge", "TributaryCollector", "TributaryWire",
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "TributaryCollectorTests",
            dependencies: ["TributaryCollector", "TributaryJSON", "TributaryTestSupport",
                           .product(name: "AsyncHTTPClient", package: "async-http-client"),
                           .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "TributaryAgentCoreTests",
            dependencies: ["TributaryAgentCore", "TributaryCollector", "Tributary", "TributaryTestSupport", "TributarySQLite",
                           .product(name: "AsyncHTTPClient", package: "async-http-client"),
                           .product(name: "Hummingbird", package: "hummingbird"),
                           .product(name: "ServiceLifecycle", package: "swift-service-lifecycle")],
            swiftSettings: strict
        ),
        .testTarget(
            name: "IntegrationTests",
            dependencies: [
                "Tributary", "TributaryBridge", "TributaryTestSupport", "TributaryCollector", "tributary", "tributary-sim",
                "tributary-agent", "tributary-collector",
                // A lost wake-up made by hand (MultiProcessTests): the futex wake that ends it if the watch did not.
                "CLMDB",
                // Another program's database held locked (CLITests+StoreFiles).
                "TributarySQLite", .product(name: "GRDB", package: "GRDB.swift"),
            ],
            path: "Integration/Tests",
            swiftSettings: strict
        ),
    ]
)

// The benchmarks (`make bench`, docs/performance.md) exist only when TRIBUTARY_BENCH is set, as
// `make bench` sets it: `swift test` builds every target of the package, and these would add their
// compile and link time to every `make test`. (SwiftPM keys its manifest cache on the environment.)
if ProcessInfo.processInfo.environment["TRIBUTARY_BENCH"] != nil {
    package.targets += [
        .executableTarget(
            name: "tributary-bench",
            dependencies: [
                "Tributary", "TributaryAgentCore", .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Logging", package: "swift-log"),
            ],
            path: "Benchmarks/tributary-bench",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "lmdb-baseline",
            path: "Benchmarks/lmdb-baseline",
            linkerSettings: [
                .linkedLibrary("lmdb"), .linkedLibrary("sqlite3"), .linkedLibrary("z"), .linkedLibrary("deflate"),
            ]
        ),
    ]
}
