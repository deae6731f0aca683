import Tributary
import TributaryStore

#if canImport(Glibc)
import Glibc
#endif

// MARK: Start and crashes

extension AutoTracker {
    /// Turns the crash records of earlier runs into `$AppCrashed` (and the `$AppPageLeave` and `$AppEnd`
    /// each crash kept from being sent), dated at the crash, and installs the crash handlers (unless
    /// ``Configuration/captureCrashes`` is false). Call it once, early, before the app's first signal.
    ///
    /// The records are set aside first and the handlers installed before they are tracked, so a crash
    /// while they are tracked is kept, and a failure to track them (the store full) leaves crash capture
    /// on: the error is thrown after the handlers are in place, and the records wait for the next start.
    /// An event the tracker refuses for itself (a ``TrackingError``: over `maxEventBytes` even with the
    /// shortest backtrace) is given up instead, and its error thrown once the other records are tracked.
    @discardableResult
    public func start() throws -> [TrackReceipt] {
        // Capture goes on even when the records cannot be set aside: a record then left in the file is
        // tracked at a later start, under the same event ids.
        let setAside = Result { try crashLog.setAside() }
        if configuration.captureCrashes {
            try crashLog.install(bootID: .current, appVersion: tracker.configuration.appVersion)
            publishCrashContext()
        }
        try setAside.get()
        var receipts: [TrackReceipt] = []
        // An event no store could ever take (over the tracker's maxEventBytes even with the shortest
        // backtrace) is given up, and said by the error thrown at the end; kept, it would be refused at
        // every start, and every crash after it would wait behind it. The store's own refusals (full)
        // end the start at once, the records kept for the next.
        var refused: TrackingError?
        let visits = visitFile.all()
        var ended: Set<Int32> = []  // processes whose visit a crash record ended
        for record in try crashLog.readSetAside() {
            var effects = LifecycleMachine.crashEffects(
                foreground: record.foreground, activeSince: record.activeSince, crashedAt: record.bootTimeNanos)
            if !configuration.events.contains(.appEnd) {
                effects.removeAll { if case .appEnd = $0 { true } else { false } }
            }
            // The page on screen at the crash, left then: after `$AppCrashed`, before the `$AppEnd`.
            var visit: VisitFile.Content?
            if let open = visits[record.pid], open.bootID == record.bootID, open.startedBoot <= record.bootTimeNanos,
                configuration.events.contains(.appPageLeave)
            {
                visit = open
                ended.insert(record.pid)
            }
            for effect in effects {
                var properties: [String: PropertyValue] = [:]
                if !record.sessionID.isEmpty { properties["$session_id"] = .string(record.sessionID) }
                if !record.screenName.isEmpty { properties["$screen_name"] = .string(record.screenName) }
                // The crashed run's version, not this one's: the app may have been updated since.
                if let version = record.appVersion, !version.isEmpty { properties["$app_version"] = .string(version) }
                let event: String
                // Backtraces of fewer frames, down to the signal's line alone, for an event over the limit.
                var reasonLimits: [Int?] = [nil]
                switch effect {
                case .appEnd(let duration, let reason):
                    if let open = visit {
                        visit = nil
                        do {
                            receipts.append(try backfillLeave(open, record: record))
                        } catch let error as TrackingError {
                            refused = refused ?? error
                        }
                    }
                    event = "$AppEnd"
                    properties["$app_end_reason"] = .string(reason.rawValue)
                    if let duration { properties["$event_duration"] = .double(duration) }
                default:
                    event = "$AppCrashed"
                    reasonLimits = [EventRules.maxStringBytes, 2048, 512, 0]
                }
                let moment = EventMoment(
                    wallTimeMillis: record.wallTimeMillis, bootTimeNanos: record.bootTimeNanos, bootID: record.bootID,
                    eventID: record.eventID(for: event))
                for (attempt, limit) in reasonLimits.enumerated() {
                    if let limit { properties["app_crashed_reason"] = .string(record.reason(limit: limit)) }
                    do {
                        receipts.append(try tracker.trackAutomatic(event, properties: properties, moment: moment))
                        break
                    } catch let error as TrackingError
                        where error.code == .eventTooLarge && attempt + 1 < reasonLimits.count
                    {
                        continue
                    } catch let error as TrackingError {
                        refused = refused ?? error
                        break
                    }
                }
            }
            if let open = visit {  // a crash with no `$AppEnd` to backfill: the leave comes last
                do {
                    receipts.append(try backfillLeave(open, record: record))
                } catch let error as TrackingError {
                    refused = refused ?? error
                }
            }
        }
        visitFile.removeStale(alsoOf: ended)
        // Also when no record was intact: torn bytes alone are not read again at every start.
        try crashLog.discardSetAside()
        if let refused { throw refused }
        return receipts
    }

    /// The `$AppPageLeave` of the visit a crash ended, at the crash, under the live one's event id.
    private func backfillLeave(_ visit: VisitFile.Content, record: CrashRecord) throws -> TrackReceipt {
        var properties = visit.properties
        if !record.sessionID.isEmpty { properties["$session_id"] = .string(record.sessionID) }
        if let version = record.appVersion, !version.isEmpty { properties["$app_version"] = .string(version) }
        if let duration = LifecycleMachine.duration(from: visit.startedBoot, to: record.bootTimeNanos) {
            properties["event_duration"] = .double(duration)
        }
        let moment = EventMoment(
            wallTimeMillis: record.wallTimeMillis, bootTimeNanos: record.bootTimeNanos, bootID: record.bootID,
            eventID: CrashRecord.pageLeaveEventID(pid: record.pid, visitStart: visit.startedBoot, bootID: record.bootID)
        )
        return try tracker.trackAutomatic("$AppPageLeave", properties: properties, moment: moment)
    }
}
