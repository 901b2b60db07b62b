//! The eager/rendezvous threshold of each transport, measured with `examples/msg_bench.rs`.
//!
//! Below the threshold one AM Medium (a copy through the transport's buffers at each end) is
//! faster than a handshake plus a one-sided write. The threshold is the largest measured size
//! (powers of two and 1.5× steps) at which eager one-way latency still beats a
//! **sender-initiated** rendezvous (the case of a receive not posted in advance; a receive
//! posted early makes rendezvous cheaper still). Medians of 3 runs, two rank threads, spin:
//!
//! | transport | `max_medium` | eager wins up to | eager / rendezvous at the largest size |
//! |---|---|---|---|
//! | loopback | 64 KiB | 64 KiB (= `max_medium`) | 14.5 / 15.9 µs |
//! | sci      | 936 B  | 936 B (= `max_medium`)  | 1.03 / 1.20 µs |
//! | extoll   | 8 KiB  | 1 KiB (VELO packets cost more than one RMA write above it) | 1.35 / 1.48 µs; at 8 KiB 2.49 / 1.60 µs |
//! | portals  | 944 B  | 944 B (= `max_medium`)  | 1.42 / 2.09 µs |
//! | udp      | 64 KiB | 64 KiB (= `max_medium`) | 175 / 180 µs |
//!
//! [`default_for`] caps the value at the transport's `max_medium` (eager needs one Medium).

/// The measured threshold (bytes) of the transport named `name`, capped at `max_medium`.
/// Unknown transports get `min(max_medium, 4 KiB)`.
pub fn default_for(name: &str, max_medium: usize) -> usize {
    let measured = match name {
        "loopback" | "udp" => 64 << 10,
        // Eager wins up to the default max_medium (936 and 944 B); a larger slot was not measured.
        "sci" | "portals" => 1 << 10,
        "extoll" => 1 << 10,
        _ => 4 << 10,
    };
    measured.min(max_medium)
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
