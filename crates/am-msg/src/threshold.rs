//! The eager/rendezvous threshold of each transport.
//!
//! Below the threshold one AM Medium (a copy through the transport's buffers at each end) is
//! faster than a handshake plus a one-sided write. Each transport's threshold is the largest
//! size at which eager one-way latency still beats a **sender-initiated** rendezvous (the
//! case of a receive not posted in advance; a receive posted early makes rendezvous cheaper
//! still), as `examples/msg_bench.rs` finds it (BENCHMARKS.md, "Eager/rendezvous
//! thresholds"). On loopback, sci, portals and udp eager wins up to their largest Medium;
//! on extoll only up to 1 KiB, above which its VELO packets cost more than one RMA write.
//!
//! [`default_for`] caps the value at the transport's `max_medium` (eager needs one Medium).

/// The threshold (bytes) of the transport named `name`, capped at `max_medium`.
/// Unknown transports get `min(max_medium, 4 KiB)`.
pub fn default_for(name: &str, max_medium: usize) -> usize {
    let threshold = match name {
        "loopback" | "udp" => 64 << 10,
        // Eager wins up to the default max_medium (936 and 944 B); with larger slots it is
        // not known to, so 1 KiB keeps to about that size.
        "sci" | "portals" => 1 << 10,
        "extoll" => 1 << 10,
        _ => 4 << 10,
    };
    threshold.min(max_medium)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_at_max_medium() {
        assert_eq!(default_for("sci", 936), 936);
        assert_eq!(default_for("extoll", 8192), 1024);
        assert_eq!(default_for("udp", 65536), 65536);
        assert_eq!(default_for("something", 100), 100);
    }
}
