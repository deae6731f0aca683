import AsyncHTTPClient
import Foundation
import Logging
import TributaryStore

extension Agent {
    /// The shared store changed (a producer's commit, the app's settings, the file deleted or replaced):
    /// the loop reads the settings again and drains, at its next turn, which comes at once.
    func storeChanged() {
        flags.storeChanged.store(true, ordering: .releasing)
        wakeup.signal()
    }

    /// Whether the group's settings may have changed since the loop last read them: the store changed
    /// since, or nothing tells the loop when it does (no inotify: it reads them every turn, as it polls).
    /// Takes the change.
    func settingsMayHaveChanged(_ loop: LoopRun) -> Bool {
        flags.storeChanged.exchange(false, ordering: .acquiringAndReleasing) || !loop.machine.storeWatched
    }

    /// Reads the group's agent settings (``AgentSettings``, written by the main app) and applies what
    /// changed: where batches go, their format, the bulk size, the flush interval. Settings that are not
    /// valid are logged once, shown in the status, and leave what is in force.
    func applyGroupSettings(session: UploadSession, loop: inout LoopRun) {
        let text: String?
        do {
            text = try store.configurationValue(AgentSettings.configurationKey)
        } catch {
            logger.debug("could not read the group's settings", metadata: ["tributary.reason": "\(error)"])
            return
        }
        if let seen = loop.settingsText, seen == text { return }
        let first = loop.settingsText == nil
        loop.settingsText = .some(text)
        let settings: AgentSettings
        do throws(StoreError) {
            settings = try text.map { json throws(StoreError) in try AgentSettings(json: json) } ?? AgentSettings()
            if loop.settingsProblem != nil { loop.machine.statusChanged() }
            loop.settingsProblem = nil
        } catch {
            loop.settingsProblem = error.message
            loop.machine.statusChanged()
            logger.error("the group's agent settings are not valid; the settings in force stay", metadata: [
                "tributary.reason": "\(error.message)", "tributary.group": "\(store.groupDirectory)",
            ])
            return
        }
        let effective = configuration.effective(settings)
        let old = loop.machine.settings
        if effective.serverURL == nil && (first || old.serverURL != nil) && !loop.machine.limits.once {
            logger.warning(
                "no collector URL yet: events wait in the store and the outbox until --server or the group's server_url gives one")
        }
        guard effective != old else { return }
        if loop.machine.adopt(effective, at: loop.clock.now) {
            session.destination = (effective.serverURL, effective.format)
        }
        logger.notice(first ? "using the agent settings the app set for the group" : "the app changed the group's agent settings", metadata: [
            "tributary.server": "\(effective.serverURL ?? "none")", "tributary.format": "\(effective.format)",
            "tributary.bulk_size": "\(effective.bulkSize)", "tributary.flush_interval_s": "\(effective.flushInterval.seconds)",
        ])
    }
}
