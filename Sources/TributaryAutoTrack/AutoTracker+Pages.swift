import Tributary
import TributaryStore

// MARK: Pages, page leave and exposure

extension AutoTracker {
    /// A page instance was created (its view starts loading): the start of its `$page_load_duration`.
    public func pageCreated(_ instanceID: String) {
        let now = configuration.monotonicNanos()
        box.state.withLock { $0.pages.created(instanceID, at: now) }
    }

    /// A page appeared (pushed, or shown again by a back navigation: see ``PageFlow``): tracks the
    /// `$AppPageLeave` of the page on screen, then this page's `$AppViewScreen` (unless the app is in
    /// the background, as after a passive launch: the page view is then sent when the user opens the
    /// app), resets exposures, and with a `viewport` reports the elements already visible. An ignored
    /// page (``Configuration/ignoredPages``) sends nothing, but the page before it is left all the same.
    ///
    /// - Throws: ``TrackingError`` when the page's ``PageDescription/properties`` break the property
    ///   rules (nothing is tracked, and the page flow is unchanged); the first error of a refused event.
    @discardableResult
    public func pageAppeared(_ page: PageDescription, viewport: Rect? = nil) throws -> [TrackReceipt] {
        try EventRules.validateProperties(page.properties)
        return try operation.withLock { _ in
            let now = configuration.monotonicNanos()
            let actions: [Action] = box.state.withLock { s in
                var actions = Self.endVisit(&s, at: now)
                let properties = s.pages.appeared(page, at: now)
                s.exposure.reset()
                if let viewport { s.viewport = viewport }
                let ignored = s.pages.isIgnored(page)
                guard s.machine.pageViewsVisible else {
                    // With its load time: sent when the user opens the app.
                    s.pageViewOwed = ignored ? nil : properties
                    return actions
                }
                s.pageViewOwed = nil
                guard !ignored else { return actions }
                actions.append(.track("$AppViewScreen", properties))
                actions += Self.beginVisit(&s, properties, at: now)
                if let viewport { actions += Self.exposures(&s, viewport: viewport, at: now, configuration) }
                return actions
            }
            return try perform(actions)
        }
    }

    /// The visible area or the current page's views changed (scroll, layout, show/hide): tracks an
    /// `$AppExposure` for each element exposed now. `root` replaces the page's view tree.
    @discardableResult
    public func layoutChanged(viewport: Rect, root: ViewNode? = nil) throws -> [TrackReceipt] {
        try operation.withLock { _ in
            let now = configuration.monotonicNanos()
            let actions: [Action] = try box.state.withLock { s in
                guard s.pages.current != nil else {
                    throw AutoTrackError(.noPage, "A layout change was reported before any page appeared.")
                }
                if let root { s.pages.replaceCurrentRoot(root) }
                s.viewport = viewport
                guard s.machine.pageViewsVisible else { return [] }
                return Self.exposures(&s, viewport: viewport, at: now, configuration)
            }
            return try perform(actions)
        }
    }

    /// When an element in view reaches its minimum stay (``ExposureRule/minStay``), on the configured
    /// monotonic clock (ns): call ``checkExposures()`` then (a toolkit's timer), or report the next layout
    /// change. Nil when no exposure waits for time alone.
    public var nextExposureDue: UInt64? { box.state.withLock { $0.exposure.nextDue } }

    /// Exposes the elements that have now stayed in view long enough, with the last view tree and
    /// visible area reported.
    @discardableResult
    public func checkExposures() throws -> [TrackReceipt] {
        try operation.withLock { _ in
            let now = configuration.monotonicNanos()
            let actions: [Action] = box.state.withLock { s in
                guard s.machine.pageViewsVisible, let viewport = s.viewport else { return [] }
                return Self.exposures(&s, viewport: viewport, at: now, configuration)
            }
            return try perform(actions)
        }
    }

    /// The page was refreshed (pull to refresh): everything visible is exposed again at the next update.
    public func refresh() { box.state.withLock { $0.exposure.reset() } }

    static func exposures(
        _ s: inout State, viewport: Rect, at now: UInt64, _ configuration: Configuration
    ) -> [Action] {
        guard let current = s.pages.current, let root = current.page.root, !s.pages.isIgnored(current.page)
        else { return [] }
        let fresh = s.exposure.update(
            root: root, viewport: viewport, pageType: current.page.className, now: now,
            rule: configuration.exposureRule, ignoring: configuration.ignores)
        let screen = s.pages.screenProperties(current.page)
        return fresh.map { element in
            var p = current.page.properties.merging(element.exposureData ?? [:]) { _, data in data }
            p.merge(element.properties) { _, own in own }
            p.merge(screen) { _, page in page }
            return .track("$AppExposure", p, ifFailed: .exposure(ExposureTracker.Key(element)))
        }
    }

    // MARK: Page visits

    /// Begins the visit of the page whose page view `properties` describe, at `now`.
    static func beginVisit(_ s: inout State, _ properties: [String: PropertyValue], at now: UInt64) -> [Action] {
        var properties = properties
        properties["$page_load_duration"] = nil
        // `now` is the configured clock's reading of this moment; the crash handler reads CLOCK_BOOTTIME.
        let visit = PageVisit(properties: properties, startedAt: now, startedBoot: BootClock.nowNanos())
        s.visit = visit
        return [.visitBegan(visit)]
    }

    /// Ends the open visit, if any, at `now`: its `$AppPageLeave`.
    static func endVisit(_ s: inout State, at now: UInt64) -> [Action] {
        guard let visit = s.visit else { return [] }
        s.visit = nil
        return [.track("$AppPageLeave", visit.leaveProperties(at: now), eventID: visit.eventID), .visitEnded]
    }
}
