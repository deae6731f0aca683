import Foundation

/// The origins of the browser's execution contexts and frames, and the frames' parents, as the
/// browser reports them: what a page message is credited to, kept by the DevTools reader
/// (``WebViewHost/take(_:origins:queue:trusted:)``).
///
/// Contexts and frames are forgotten when the browser says they are gone: a long-lived page that
/// keeps creating and removing iframes (rotating ads, say) grew these maps for the life of the app.
/// The browser's events come in order, and the reader resolves a message's origin when it reads it:
/// always before the end of the context or frame that sent it.
struct FrameOrigins {
    /// "<session>#<context id>" → the context's origin ("null" for an opaque one).
    private(set) var contexts: [String: String] = [:]
    /// Frame id → the origin of its document.
    private(set) var frames: [String: String] = [:]
    /// Frame id → its parent frame's id.
    private(set) var parents: [String: String] = [:]
    /// Frame id → its document's default execution context (where the app's answers to it go).
    private(set) var defaultContexts: [String: Context] = [:]

    /// One execution context: its session (target) and id there.
    struct Context: Sendable, Equatable {
        var session: String
        var id: Int
        /// `<session>#<id>`, as ``FrameOrigins/contexts`` keys it.
        var key: String { "\(session)#\(id)" }
    }
    /// The session whose events recorded each entry of `frames`, and of `parents`: a target's entries
    /// go with it when it is detached (a tab closed sends no `Page.frameDetached` for its frames).
    private var frameSessions: [String: String] = [:]
    private var parentSessions: [String: String] = [:]
    /// Sessions that attached a frame whose ids could not be read (its event too large): who its parent
    /// is is not known, so no navigation they report is credited.
    private var sessionsWithUnknownFrames: Set<String> = []

    /// Whether a navigation of `frame` reported on `session` was asked for where the frame's document
    /// (or, for a fresh iframe with none yet, its parent's) runs. Chromium reports a navigation on the
    /// session of the renderer that asked for it, naming the frame navigated: a popup setting
    /// `opener.location`, or an out-of-process iframe setting `top.location`, is reported on its own
    /// session for a frame of another, and would be credited with that frame's origin. For a top-level
    /// frame, every frame of the reporting session must be trusted too: a same-process iframe may set
    /// `top.location` as well.
    func reportedByItsOwnRenderer(frame: String, session: String, trusted: Set<String>) -> Bool {
        let owner = frameSessions[frame] ?? parentSessions[frame]  // a frame with a document has both
        guard owner == session, !sessionsWithUnknownFrames.contains(session) else { return false }
        guard parents[frame] == nil else { return true }
        return frameSessions.allSatisfy { other, owner in owner != session || trusted.contains(frames[other] ?? "null") }
    }

    /// The origin of context `id` in `session`; "null" for one not known.
    func context(_ id: Int, session: String) -> String { contexts["\(session)#\(id)"] ?? "null" }

    /// Takes in `message` if it is a frame or context event (contexts created, destroyed or cleared,
    /// frames attached or detached, a target detached, a frame attached too large to read); returns
    /// whether it was.
    mutating func record(_ message: DevToolsMessage) -> Bool {
        let session = message.sessionID ?? ""
        let body = message.body
        switch message.method {
        case "Runtime.executionContextCreated":
            guard let context = body["context"], let id = context["id"]?.int else { return true }
            // Chromium reports an opaque origin (data:, sandboxed frames) as "://"; the web calls it "null".
            let origin = context["origin"]?.string.flatMap { BridgeConfiguration.isOpaque($0) ? nil : $0 } ?? "null"
            contexts["\(session)#\(id)"] = origin
            if context["auxData"]?["isDefault"] == .bool(true), let frame = context["auxData"]?["frameId"]?.string {
                frames[frame] = origin
                frameSessions[frame] = session
                defaultContexts[frame] = Context(session: session, id: id)
            }
        case "Runtime.executionContextDestroyed":
            if let id = body["executionContextId"]?.int {
                contexts["\(session)#\(id)"] = nil
                let gone = Context(session: session, id: id)
                if let frame = defaultContexts.first(where: { $0.value == gone })?.key { defaultContexts[frame] = nil }
            }
        case "Runtime.executionContextsCleared":
            forgetContexts(of: session)
        case "Target.detachedFromTarget":
            // Sent on the parent's session, naming the child's.
            if let child = body["sessionId"]?.string {
                forgetContexts(of: child)
                sessionsWithUnknownFrames.remove(child)
                for (frame, owner) in frameSessions where owner == child {
                    frames[frame] = nil
                    frameSessions[frame] = nil
                    defaultContexts[frame] = nil
                }
                for (frame, owner) in parentSessions where owner == child {
                    parents[frame] = nil
                    parentSessions[frame] = nil
                }
            }
        case "Page.frameAttached", DevToolsPipe.frameTooLargeEvent:
            // One too large to read (a huge creation stack) has its ids read from its first bytes. Without
            // them, no navigation reported on this session is trusted. Other frames too large: not ours.
            let tooLarge = message.method == DevToolsPipe.frameTooLargeEvent
            if tooLarge && body["method"]?.string != "Page.frameAttached" { return false }
            if let frame = body["frameId"]?.string, let parent = body["parentFrameId"]?.string {
                parents[frame] = parent
                parentSessions[frame] = session
            } else if tooLarge {
                sessionsWithUnknownFrames.insert(session)
            }
        case "Page.frameDetached":
            // A frame swapped into another process is detached with reason "swap" and lives on there.
            if let frame = body["frameId"]?.string, body["reason"]?.string != "swap" {
                frames[frame] = nil
                parents[frame] = nil
                frameSessions[frame] = nil
                parentSessions[frame] = nil
                defaultContexts[frame] = nil
            }
        default:
            return false
        }
        return true
    }

    private mutating func forgetContexts(of session: String) {
        let prefix = session + "#"
        contexts = contexts.filter { !$0.key.hasPrefix(prefix) }
        defaultContexts = defaultContexts.filter { $0.value.session != session }
    }
}
