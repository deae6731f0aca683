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

/// Whether a link opens the app (universal links: seed 001's rules), and why.
public struct DeepLinkDecision: Sendable, Equatable {
    /// The app opens (and tracks `$AppDeeplinkLaunch`); false: the link opens in the browser.
    public var opensApp: Bool
    /// Whether the link is a universal link (`https`) the association file matched (not excluded);
    /// false for a custom scheme, which the file does not govern.
    public var matched: Bool
    /// The pattern that decided, if one did (an exclusion too).
    public var pattern: String?

    /// A decision.
    public init(opensApp: Bool, matched: Bool, pattern: String?) {
        self.opensApp = opensApp
        self.matched = matched
        self.pattern = pattern
    }

    /// Decides a launch from `url`, tapped in an app or page of `sourceDomain`, given the association
    /// file of the link's host. A custom scheme (`myapp://`) opens the app. A universal link opens it
    /// only when the file's first matching pattern includes it and the link comes from another domain:
    /// one from the same domain as the page it is tapped on opens in the browser (seed 001: iOS opens
    /// universal links across domains only).
    public static func decide(url: String, sourceDomain: String?, association: AppSiteAssociation) -> DeepLinkDecision {
        guard let parts = URLComponents(string: url), parts.scheme?.lowercased() == "https",
            let host = parts.host?.lowercased(), !host.isEmpty
        else { return DeepLinkDecision(opensApp: true, matched: false, pattern: nil) }
        let (decision, pattern) = association.match(for: url)
        guard case .opens = decision else { return DeepLinkDecision(opensApp: false, matched: false, pattern: pattern) }
        let sameDomain = sourceDomain.map { $0.lowercased() == host } ?? false
        return DeepLinkDecision(opensApp: !sameDomain, matched: true, pattern: pattern)
    }
}

extension Tracker {
    /// A launch from `url` as iOS decides it (``DeepLinkDecision/decide(url:sourceDomain:association:)``):
    /// when the link opens the app, tracks `$AppDeeplinkLaunch` as ``trackDeepLinkLaunch(_:properties:)``
    /// does, with `$deeplink_matched` (the association file matched a universal link) and
    /// `$deeplink_pattern` (the pattern that did); when it opens in the browser, tracks nothing.
    /// Returns the decision and the receipt (nil when nothing was tracked).
    @discardableResult
    public func trackDeepLinkLaunch(
        _ url: String, sourceDomain: String?, association: AppSiteAssociation, properties: [String: PropertyValue] = [:]
    ) async throws -> (decision: DeepLinkDecision, receipt: TrackReceipt?) {
        _ = try DeepLink.launch(for: url)  // an invalid URL is refused whatever the file says
        let decision = DeepLinkDecision.decide(url: url, sourceDomain: sourceDomain, association: association)
        guard decision.opensApp else { return (decision, nil) }
        var own = properties
        own["$deeplink_matched"] = .bool(decision.matched)
        if let pattern = decision.pattern { own["$deeplink_pattern"] = .string(pattern) }
        return (decision, try await trackDeepLinkLaunch(url, properties: own))
    }
}
