// swift-tools-version:6.2
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
        .executable(name: "tributary", targets: ["tributary"]),
        .executable(name: "tributary-sim", targets: ["tributary-sim"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
    ],
    targets: [
        // C libraries from Debian, wrapped as system libraries (see each shim.h).
        .systemLibrary(name: "CLMDB", pkgConfig: "lmdb", providers: [.apt(["liblmdb-dev"])]),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),

        // The shared store: safe LMDB layer and the on-disk record format.
        .target(name: "TributaryStore", dependencies: ["CLMDB", "CZlib"], swiftSettings: strict),
        // The producer library every process links.
        .target(
            name: "Tributary",
            dependencies: ["TributaryStore", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),

        // Executables: wiring only.
        .executableTarget(
            name: "tributary",
            dependencies: ["Tributary", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tributary-sim",
            dependencies: ["Tributary", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            swiftSettings: strict
        ),

        // Benchmarks: built and run only by `make bench`.
        .executableTarget(
            name: "tributary-bench",
            dependencies: ["Tributary", .product(name: "ArgumentParser", package: "swift-argument-parser")],
            path: "Benchmarks/tributary-bench",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "lmdb-baseline",
            path: "Benchmarks/lmdb-baseline",
            linkerSettings: [.linkedLibrary("lmdb")]
        ),

        .target(name: "TributaryTestSupport", dependencies: ["TributaryStore"], path: "Tests/TributaryTestSupport",
                swiftSettings: strict),
        .testTarget(name: "TributaryStoreTests", dependencies: ["TributaryStore", "TributaryTestSupport"],
                    swiftSettings: strict),
        .testTarget(name: "TributaryTests", dependencies: ["Tributary", "TributaryTestSupport"],
                    swiftSettings: strict),
        .testTarget(
            name: "IntegrationTests",
            dependencies: ["Tributary", "TributaryTestSupport", "tributary", "tributary-sim"],
            path: "Integration/Tests",
            swiftSettings: strict
        ),
    ]
)
