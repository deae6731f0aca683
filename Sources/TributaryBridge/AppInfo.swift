import Tributary

/// The app to page direction: what the app tells a trusted page about itself and its user (the Sensors
/// iOS SDK's schemes 1 and 2, `docs/hybrid-bridge.md`, "From the app to the page").
extension HybridBridge {
    /// The JavaScript function of the page the app calls with its info (the name the Sensors JavaScript
    /// SDK defines): after each load of a trusted frame, and in answer to `getAppInfo`.
    public static let appInfoFunction = "sensorsdata_app_js_bridge_call_js"

    /// The user as the app knows them: `{"distinct_id":…,"anonymous_id":…,"login_id":…|null,"is_login":…}`.
    public func appIdentity() throws -> JSON {
        let identity = try tracker.identity()
        return .object([
            "distinct_id": .string(identity.distinctID), "anonymous_id": .string(identity.anonymousID),
            "login_id": identity.loginID.map(JSON.string) ?? .null, "is_login": .bool(identity.loginID != nil),
        ])
    }

    /// The app's info for a page: the identity (``appIdentity()``), and `type` (`linux`), `app_version`,
    /// `lib`, `lib_version`, `server_url`.
    public func appInfo() throws -> JSON {
        guard case .object(var info) = try appIdentity() else { return .null }
        let presets = tracker.appPresetProperties()
        func text(_ key: String) -> JSON {
            if case .string(let value)? = presets[key] { return .string(value) }
            return .null
        }
        info["type"] = .string("linux")
        info["app_version"] = text("$app_version")
        info["lib"] = .string(PresetProperties.libName)
        info["lib_version"] = .string(PresetProperties.libVersion)
        info["server_url"] = .string(configuration.serverURL)
        return .object(info)
    }

    /// The script that hands the app's info to the page of a context: calls
    /// ``appInfoFunction`` if the page defined it, and keeps the info in
    /// `window.SensorsData_iOS_JS_Bridge.sensorsdata_app_info` for a page SDK that loads later.
    func appInfoScript() throws -> String {
        let info = try appInfo().text
        return """
            (function (info) {
              var bridge = window.SensorsData_iOS_JS_Bridge = window.SensorsData_iOS_JS_Bridge || {};
              bridge.sensorsdata_app_info = info;
              if (typeof window.\(Self.appInfoFunction) === 'function') { window.\(Self.appInfoFunction)(JSON.stringify(info)); }
            })(\(info));
            """
    }

    /// Counts an app-info delivery: pushed after a load (`origin` nil, ``Counts/pushed``), or asked for
    /// with `getAppInfo` by a frame of `origin` (``Counts/answered``).
    func countAppInfo(askedBy origin: String?) { countAnswered(from: origin) }
}
