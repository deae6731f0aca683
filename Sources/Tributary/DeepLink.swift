import Foundation

/// Launches from a URL (a custom scheme or a universal link): the `$AppDeeplinkLaunch` event and the
/// channel (`utm_*`) properties it carries into the rest of the launch.
///
/// `myapp://product/42?utm_source=mail&utm_campaign=spring` gives `$AppDeeplinkLaunch` with
/// `$deeplink_url` (the whole URL), `$utm_source` and `$utm_campaign`; every later event of the same
/// launch (this process) carries `$latest_utm_source` and `$latest_utm_campaign`.
public enum DeepLink {
    /// The event a URL launch produces.
    public static let launchEvent = "$AppDeeplinkLaunch"
    /// The channel keys read from the URL's query, in the order they are documented.
    public static let utmKeys = ["utm_source", "utm_medium", "utm_campaign", "utm_content", "utm_term"]

    /// What a launch URL means for analytics.
    public struct Launch: Sendable, Equatable {
        /// The launch event's properties: `$deeplink_url` and `$utm_*`.
        public var eventProperties: [String: PropertyValue]
        /// The properties later events of the launch carry: `$latest_utm_*` (empty when the URL has no utm).
        public var latestProperties: [String: PropertyValue]
    }

    /// Reads `url`'s channel properties.
    ///
    /// Query values are percent-decoded; empty values are ignored; a key given twice keeps its first
    /// value. Keys are matched exactly (`utm_source`, not `UTM_SOURCE`), as the Sensors SDK does.
    /// - Throws: ``TrackingError`` (`invalidURL`) when `url` is not an absolute URL with a scheme, or a
    ///   value breaks the property rules (longer than ``EventRules/maxStringBytes``).
    public static func launch(for url: String) throws -> Launch {
        guard let components = URLComponents(string: url), let scheme = components.scheme, !scheme.isEmpty,
            components.host?.isEmpty == false || !components.path.isEmpty
        else {
            throw TrackingError(
                .invalidURL, field: "$deeplink_url",
                "The launch URL (\(url.utf8.count) bytes) is not an absolute URL with a scheme and a host or path.")
        }
        var event: [String: PropertyValue] = ["$deeplink_url": .string(url)]
        var latest: [String: PropertyValue] = [:]
        for item in components.queryItems ?? [] where utmKeys.contains(item.name) {
            guard let value = item.value, !value.isEmpty, event["$" + item.name] == nil else { continue }
            event["$" + item.name] = .string(value)
            latest["$latest_" + item.name] = .string(value)
        }
        try EventRules.validateProperties(event)
        return Launch(eventProperties: event, latestProperties: latest)
    }
}

extension Tracker {
    /// Records a launch from `url` as `$AppDeeplinkLaunch`, then gives every later event of this
    /// launch the URL's `$latest_utm_*` properties.
    ///
    /// A later deep link of the same launch that carries any `utm_*` key replaces the whole
    /// `$latest_utm_*` set; one without keeps it. `properties` are added to the launch event.
    /// - Throws: ``TrackingError`` for a URL that is not absolute or a property that breaks the rules.
    @discardableResult
    public func trackDeepLinkLaunch(_ url: String, properties: [String: PropertyValue] = [:]) async throws
        -> TrackReceipt
    {
        let launch = try DeepLink.launch(for: url)
        let newChannel = !launch.latestProperties.isEmpty
        // A link with its own channel: its launch event carries that channel's `$utm_*` only, not the
        // previous link's `$latest_utm_*` beside them; the new set applies from the next event on. Other
        // events meanwhile keep the previous set.
        let prepared = try prepare(
            DeepLink.launchEvent, properties: properties.merging(launch.eventProperties) { $1 },
            withoutLaunchPrefix: newChannel ? "$latest_utm_" : nil)
        let receipt = try await committer.commit(prepared)
        if newChannel {
            replaceLaunchProperties(prefix: "$latest_utm_", with: launch.latestProperties, setBy: receipt.seq)
        }
        return receipt
    }
}
