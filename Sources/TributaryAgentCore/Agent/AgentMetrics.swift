import Metrics

/// The agent's metrics (swift-metrics; exported as Prometheus text with `--metrics-address`).
struct AgentMetrics: Sendable {
    let drained = Counter(label: "tributary_events_drained_total")
    let uploaded = Counter(label: "tributary_events_uploaded_total")
    let requests = Counter(label: "tributary_upload_requests_total")
    let retries = Counter(label: "tributary_upload_retries_total")
    let deadLetters = Counter(label: "tributary_dead_letters_total")
    let deadlineExpirations = Counter(label: "tributary_deadline_expirations_total")
    /// Damaged shared stores moved aside at the start (``StoreCheck``): each one's events are not drained.
    let damagedStores = Counter(label: "tributary_damaged_stores_total")
    let backlog = Gauge(label: "tributary_backlog_events")
    /// 1 while uploads are halted (401/403/404, a TLS problem, event after event refused), else 0.
    let halted = Gauge(label: "tributary_uploads_halted")
    let batchLatency = Metrics.Timer(label: "tributary_batch_latency_seconds", preferredDisplayUnit: .seconds)
}
