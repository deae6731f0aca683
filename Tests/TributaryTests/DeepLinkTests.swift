import Foundation
import Testing
import Tributary
import TributaryStore
import TributaryTestSupport

@Suite("Deep links")
struct DeepLinkTests {
    struct LaunchCase: Sendable, CustomStringConvertible {
        var url: String
        var utm: [String: String]
        var description: String { url }
    }

    static let launches: [LaunchCase] = [
        LaunchCase(
            url: "myapp://product/42?utm_source=mail&utm_campaign=spring",
            utm: ["utm_source": "mail", "utm_campaign": "spring"]),
        LaunchCase(
            url: "https://shop.example.com/p/1?utm_medium=cpc&utm_term=red%20shoes&utm_content=banner&other=1",
            utm: ["utm_medium": "cpc", "utm_term": "red shoes", "utm_content": "banner"]),
        LaunchCase(url: "myapp://open", utm: [:]),
        LaunchCase(url: "myapp://open?utm_source=&utm_medium=push", utm: ["utm_medium": "push"]),
        LaunchCase(url: "myapp://open?utm_source=first&utm_source=second", utm: ["utm_source": "first"]),
        LaunchCase(url: "myapp://open?UTM_SOURCE=upper&utm_sourcex=no", utm: [:]),
    ]

    @Test("launch properties: $deeplink_url, $utm_* on the launch, $latest_utm_* for later events", arguments: launches)
    func launchProperties(_ c: LaunchCase) throws {
        let launch = try DeepLink.launch(for: c.url)
        var expected: [String: PropertyValue] = ["$deeplink_url": .string(c.url)]
        var latest: [String: PropertyValue] = [:]
        for (key, value) in c.utm {
            expected["$" + key] = .string(value)
            latest["$latest_" + key] = .string(value)
        }
        #expect(launch.eventProperties == expected)
        #expect(launch.latestProperties == latest)
    }

    @Test("a launch URL that is not absolute is a typed error", arguments: ["", "not a url", "/relative/path", "://x"])
    func invalidURL(_ url: String) {
        #expect(throws: TrackingError.self) { try DeepLink.launch(for: url) }
        do {
            _ = try DeepLink.launch(for: url)
        } catch let error as TrackingError {
            #expect(error.code == .invalidURL)
        } catch {
            Issue.record("unexpected \(error)")
        }
    }

    @Test("deep links tracked at once: later events carry the channel of the launch stored last, whatever order the calls return in")
    func concurrentLaunches() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            // Committed together by the group commit, the calls resume in any order: in a round the last
            // to resume is now and then not the last stored, and 200 rounds make that all but certain.
            var wrongRounds: [Int] = []
            for round in 0..<200 {
                let receipts = try await withThrowingTaskGroup(of: (String, TrackReceipt).self) { tasks in
                    for i in 0..<20 {
                        let source = "r\(round)s\(i)"
                        tasks.addTask { (source, try await tracker.trackDeepLinkLaunch("myapp://p?utm_source=\(source)")) }
                    }
                    return try await tasks.reduce(into: []) { $0.append($1) }
                }
                let last = try #require(receipts.max { $0.1.seq < $1.1.seq })
                if tracker.launchProperties["$latest_utm_source"] != .string(last.0) { wrongRounds.append(round) }
            }
            #expect(wrongRounds.isEmpty, "rounds whose later events would carry another launch's channel: \(wrongRounds)")
        }
    }

    @Test(
        "the AASA decides launches: cross-domain universal links open the app (matched, with the pattern); same domain, excluded or unmatched ones the browser"
    )
    func associationDecidesLaunch() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            let file = try AppSiteAssociation(
                json:
                    #"{"applinks":{"details":[{"appIDs":["T.app"],"components":[{"/":"/old/*","exclude":true},{"/":"/p/*"}]}]}}"#
            )
            let opened = try await tracker.trackDeepLinkLaunch(
                "https://oia.example.com/p/42?utm_source=mail", sourceDomain: "www.example.com", association: file)
            #expect(opened.decision == DeepLinkDecision(opensApp: true, matched: true, pattern: "/p/*"))
            let sameDomain = try await tracker.trackDeepLinkLaunch(
                "https://oia.example.com/p/42", sourceDomain: "OIA.example.com", association: file)
            #expect(sameDomain.decision.opensApp == false && sameDomain.receipt == nil, "same domain: the browser")
            let excluded = try await tracker.trackDeepLinkLaunch(
                "https://oia.example.com/old/1", sourceDomain: nil, association: file)
            #expect(excluded.decision == DeepLinkDecision(opensApp: false, matched: false, pattern: "NOT /old/*"))
            let unmatched = try await tracker.trackDeepLinkLaunch(
                "https://oia.example.com/other", sourceDomain: nil, association: file)
            #expect(unmatched.receipt == nil)
            let scheme = try await tracker.trackDeepLinkLaunch("myapp://p/1", sourceDomain: nil, association: file)
            #expect(scheme.decision == DeepLinkDecision(opensApp: true, matched: false, pattern: nil))
            let bodies = try tracker.store.events(limit: 10).map { entry in
                try JSONSerialization.jsonObject(with: Data(try entry.record.get().body)) as? [String: Any] ?? [:]
            }
            let properties = bodies.map { $0["properties"] as? [String: Any] ?? [:] }
            #expect(bodies.map { $0["event"] as? String } == ["$AppDeeplinkLaunch", "$AppDeeplinkLaunch"])
            #expect(properties[0]["$deeplink_matched"] as? Bool == true)
            #expect(properties[0]["$deeplink_pattern"] as? String == "/p/*")
            #expect(properties[0]["$utm_source"] as? String == "mail")
            #expect(properties[1]["$deeplink_matched"] as? Bool == false)
            #expect(properties[1]["$deeplink_pattern"] == nil)
        }
    }

    @Test("$AppDeeplinkLaunch, then every later event of the launch carries $latest_utm_*")
    func trackerCarriesLatestUTM() async throws {
        try await withTemporaryGroup { group in
            let tracker = try Tracker(configuration: .init(groupDirectory: group))
            try await tracker.trackDeepLinkLaunch("myapp://p?utm_source=mail&utm_campaign=spring")
            try await tracker.track("Viewed")
            try await tracker.trackDeepLinkLaunch("myapp://p/2")  // no utm: the launch's channel stays
            try await tracker.track("Viewed")
            try await tracker.trackDeepLinkLaunch("https://example.com/x?utm_source=push")  // replaces the set
            try await tracker.track("Viewed")
            let events = try tracker.store.events(limit: 10).map { entry in
                let body = try JSONSerialization.jsonObject(with: Data(try entry.record.get().body)) as? [String: Any]
                return (body?["event"] as? String ?? "", body?["properties"] as? [String: Any] ?? [:])
            }
            #expect(
                events.map(\.0) == [
                    "$AppDeeplinkLaunch", "Viewed", "$AppDeeplinkLaunch", "Viewed", "$AppDeeplinkLaunch", "Viewed",
                ])
            #expect(events[0].1["$deeplink_url"] as? String == "myapp://p?utm_source=mail&utm_campaign=spring")
            #expect(events[0].1["$utm_source"] as? String == "mail")
            #expect(events[0].1["$latest_utm_source"] == nil, "the launch event itself carries $utm_*")
            #expect(events[1].1["$latest_utm_source"] as? String == "mail")
            #expect(events[1].1["$latest_utm_campaign"] as? String == "spring")
            #expect(events[1].1["$utm_source"] == nil)
            #expect(events[3].1["$latest_utm_campaign"] as? String == "spring")
            // The third link has a channel of its own: its launch event does not mix in the first one's.
            #expect(events[4].1["$utm_source"] as? String == "push")
            #expect(events[4].1["$latest_utm_source"] == nil && events[4].1["$latest_utm_campaign"] == nil)
            #expect(events[5].1["$latest_utm_source"] as? String == "push")
            #expect(events[5].1["$latest_utm_campaign"] == nil, "a new channel replaces the whole set")
            #expect(tracker.launchProperties == ["$latest_utm_source": "push"])
        }
    }
}

@Suite("apple-app-site-association matcher")
struct AppSiteAssociationTests {
    /// Apple's `components` example ("Supporting associated domains").
    static let components = """
        {"applinks": {"details": [{
          "appIDs": ["ABCDE12345.com.example.app", "ABCDE12345.com.example.app2"],
          "components": [
            {"#": "no_universal_links", "exclude": true, "comment": "fragment no_universal_links: never"},
            {"/": "/buy/*", "comment": "paths that start with /buy/"},
            {"/": "/help/website/*", "exclude": true, "comment": "not /help/website/"},
            {"/": "/help/*", "?": {"articleNumber": "????"}, "comment": "/help/ with a four-character articleNumber"}
          ]}]},
         "webcredentials": {"apps": ["ABCDE12345.com.example.app"]}}
        """

    /// Apple's older `paths` example: order matters, `NOT` excludes, `?` is one character.
    static let paths = """
        {"applinks": {"apps": [], "details": [
          {"appID": "9JA89QQLNQ.com.apple.wwdc", "paths": ["/wwdc/news/", "NOT /videos/wwdc/2010/*", "/videos/wwdc/201?/*"]},
          {"appID": "ABCD1234.com.apple.wwdc2", "paths": ["*"]}
        ]}}
        """

    static let settings = """
        {"applinks": {"defaults": {"caseSensitive": false}, "details": [
          {"appIDs": ["T.app"], "components": [
            {"/": "/Buy/*"},
            {"/": "/café/*", "percentEncoded": false},
            {"/": "/a%20b"},
            {"/": "/Exact", "caseSensitive": true},
            {"/": "/search", "?": "q=*"}
          ]},
          {"appIDs": ["T.strict"], "defaults": {"caseSensitive": true}, "components": [{"/": "/Strict/*"}]}
        ]}}
        """

    struct Case: Sendable, CustomStringConvertible {
        var file: String
        var url: String
        var decision: AppSiteAssociation.Decision
        var description: String { url }
    }

    static let app = ["ABCDE12345.com.example.app", "ABCDE12345.com.example.app2"]
    static let cases: [Case] = [
        Case(file: components, url: "https://example.com/buy/shoes", decision: .opens(appIDs: app)),
        Case(file: components, url: "https://example.com/buy/", decision: .opens(appIDs: app)),
        Case(file: components, url: "https://example.com/buy", decision: .noMatch),
        Case(file: components, url: "https://example.com/buy/shoes#no_universal_links", decision: .excluded),
        Case(file: components, url: "https://example.com/buy/shoes#other", decision: .opens(appIDs: app)),
        Case(file: components, url: "https://example.com/help/website/faq", decision: .excluded),
        Case(file: components, url: "https://example.com/help/app?articleNumber=1234", decision: .opens(appIDs: app)),
        Case(
            file: components, url: "https://example.com/help/app?x=1&articleNumber=abcd", decision: .opens(appIDs: app)),
        Case(file: components, url: "https://example.com/help/app?articleNumber=12345", decision: .noMatch),
        Case(file: components, url: "https://example.com/help/app", decision: .noMatch),
        Case(file: components, url: "https://example.com/about", decision: .noMatch),
        Case(file: components, url: "https://example.com/BUY/shoes", decision: .noMatch),
        Case(file: components, url: "http://example.com/buy/shoes", decision: .noMatch),
        Case(file: components, url: "myapp://buy/shoes", decision: .noMatch),
        Case(
            file: paths, url: "https://developer.apple.com/wwdc/news/",
            decision: .opens(appIDs: ["9JA89QQLNQ.com.apple.wwdc"])),
        Case(file: paths, url: "https://developer.apple.com/videos/wwdc/2010/x", decision: .excluded),
        Case(
            file: paths, url: "https://developer.apple.com/videos/wwdc/2015/x",
            decision: .opens(appIDs: ["9JA89QQLNQ.com.apple.wwdc"])),
        Case(
            file: paths, url: "https://developer.apple.com/videos/wwdc/2020/x",
            decision: .opens(appIDs: ["ABCD1234.com.apple.wwdc2"])),
        Case(
            file: paths, url: "https://developer.apple.com/wwdc/news",
            decision: .opens(appIDs: ["ABCD1234.com.apple.wwdc2"])),
        Case(file: settings, url: "https://example.com/buy/x", decision: .opens(appIDs: ["T.app"])),
        Case(file: settings, url: "https://example.com/caf%C3%A9/menu", decision: .opens(appIDs: ["T.app"])),
        Case(file: settings, url: "https://example.com/a%20b", decision: .opens(appIDs: ["T.app"])),
        Case(file: settings, url: "https://example.com/exact", decision: .noMatch),
        Case(file: settings, url: "https://example.com/Exact", decision: .opens(appIDs: ["T.app"])),
        Case(file: settings, url: "https://example.com/search?q=shoes", decision: .opens(appIDs: ["T.app"])),
        Case(file: settings, url: "https://example.com/search?p=1", decision: .noMatch),
        Case(file: settings, url: "https://example.com/Strict/1", decision: .opens(appIDs: ["T.strict"])),
        Case(file: settings, url: "https://example.com/strict/1", decision: .noMatch),
    ]

    @Test("Apple's documented examples", arguments: cases)
    func decision(_ c: Case) throws {
        let association = try AppSiteAssociation(json: c.file)
        #expect(association.decision(for: c.url) == c.decision)
    }

    @Test("percentEncoded: the default compares against the encoded URL")
    func percentEncodedDefault() throws {
        let association = try AppSiteAssociation(
            json: #"{"applinks":{"details":[{"appID":"T.a","components":[{"/":"/café/*"}]}]}}"#)
        #expect(association.decision(for: "https://example.com/caf%C3%A9/menu") == .noMatch)
        #expect(association.appID(for: "https://example.com/caf%C3%A9/menu") == nil)
    }

    @Test(
        "`*` and `?` wildcards",
        arguments: [
            ("*", "", true), ("*", "/any/thing", true), ("/a/*", "/a/", true), ("/a/*", "/a", false),
            ("/?", "/x", true), ("/?", "/", false), ("/?", "/xy", false), ("/*/b", "/x/y/b", true),
            ("/a*c", "/abxc", true),
            ("/a*c", "/abxd", false), ("**", "x", true),
            // A literal `*` in the path is matched by the wildcard, not taken as the literal it looks like.
            ("/a/*", "/a/*b", true), ("/*b", "/*xb", true),
        ])
    func wildcards(pattern: String, path: String, matches: Bool) throws {
        let file = #"{"applinks":{"details":[{"appID":"T.a","components":[{"/":"\#(pattern)"}]}]}}"#
        let association = try AppSiteAssociation(json: file)
        #expect((association.appID(for: "https://example.com" + path) != nil) == matches, "\(pattern) vs \(path)")
    }

    @Test(
        "unreadable files name the key",
        arguments: [
            ("[]", "not a JSON object"), (#"{"applinks":{}}"#, "applinks.details"),
            (#"{"applinks":{"details":[{"components":[]}]}}"#, "neither appID nor appIDs"),
            (#"{"applinks":{"details":[{"appID":"T.a"}]}}"#, "neither a components nor a paths"),
            (#"{"applinks":{"details":[{"appID":"T.a","components":[{"exclude":"yes"}]}]}}"#, "exclude is a string"),
            (#"{"applinks":{"substitutionVariables":{},"details":[]}}"#, "substitutionVariables"),
            ("{", "not valid JSON"),
        ])
    func errors(file: String, fragment: String) {
        do {
            _ = try AppSiteAssociation(json: file)
            Issue.record("\(file) was accepted")
        } catch {
            #expect("\(error)".contains(fragment), "\(error)")
        }
    }
}
