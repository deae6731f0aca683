import Synchronization
import TributaryStore

/// When an event happened, for events recorded after the fact (a crash found at the next start), and
/// the event id to give it so that recording it twice yields the same event. Nil fields take the
/// tracker's clocks and a fresh id, as an event tracked now.
package struct EventMoment: Sendable {
    /// Wall-clock time of the event, ms since the epoch.
    package var wallTimeMillis: Int64?
    /// `CLOCK_BOOTTIME` reading of the event, in `bootID`.
    package var bootTimeNanos: UInt64?
    /// The boot the reading belongs to.
    package var bootID: BootID?
    /// A deterministic event id, or nil for a fresh one.
    package var eventID: String?

    /// Creates a moment.
    package init(wallTimeMillis: Int64? = nil, bootTimeNanos: UInt64? = nil, bootID: BootID? = nil, eventID: String?) {
        self.wallTimeMillis = wallTimeMillis
        self.bootTimeNanos = bootTimeNanos
        self.bootID = bootID
        self.eventID = eventID
    }
}

/// The per-event hooks of a tracker.
final class TrackerHooks: Sendable {
    typealias Provider = @Sendable () -> [String: PropertyValue]
    /// The app's provider and automatic tracking's, read together under one lock for every event.
    private let providers = Mutex<(app: Provider?, automatic: Provider?)>((nil, nil))

    func setDynamic(_ provider: Provider?) { providers.withLock { $0.app = provider } }
    func setAutomatic(_ provider: Provider?) { providers.withLock { $0.automatic = provider } }

    /// The dynamic super properties, computed now: automatic tracking's, under the app's (none without
    /// a provider).
    func dynamicProperties() -> [String: PropertyValue] {
        let (app, automatic) = providers.withLock { $0 }
        let own = automatic?() ?? [:]
        let appOwn = app?() ?? [:]
        if own.isEmpty { return appOwn }
        return own.merging(appOwn) { _, app in app }
    }

    /// `properties` on top of the dynamic super properties (an event's own properties win).
    func withDynamicProperties(_ properties: [String: PropertyValue]) -> [String: PropertyValue] {
        let computed = dynamicProperties()
        if computed.isEmpty { return properties }
        return computed.merging(properties) { _, own in own }
    }
}

extension Tracker {
    /// Registers properties computed afresh for every event of this process (code-tracked, automatic
    /// and a hybrid page's alike), such as `$session_id`. They override presets and super properties;
    /// an event's own properties override them (a page's do not: on a page event the app's
    /// properties win, as its super properties do). Pass nil to remove the provider.
    ///
    /// The provider runs on the tracking thread for each event: keep it cheap and non-blocking.
    public func registerDynamicSuperProperties(_ provider: (@Sendable () -> [String: PropertyValue])?) {
        hooks.setDynamic(provider)
    }

    /// Registers automatic tracking's dynamic properties (`$session_id`), beside the app's own provider
    /// (``registerDynamicSuperProperties(_:)``), which neither replaces nor is replaced by it; on a
    /// shared key the app's value wins.
    package func registerAutomaticProperties(_ provider: (@Sendable () -> [String: PropertyValue])?) {
        hooks.setAutomatic(provider)
    }

    /// Records a preset event produced by automatic tracking (`$lib_method` `autoTrack`), durably, in
    /// its own transaction. `moment` dates an event recorded after the fact.
    @discardableResult
    package func trackAutomatic(
        _ event: String, properties: [String: PropertyValue], moment: EventMoment? = nil
    ) throws -> TrackReceipt {
        try committer.appendAfterQueued(try prepare(event, properties: properties, libMethod: "autoTrack", moment: moment))
    }
}
