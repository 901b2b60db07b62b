//! The file descriptors an in-process job costs. Each rank sends through sockets connected to
//! its peers, and an in-process job of n ranks has n(n - 1) such pairs: without a limit per
//! process, a job of a few dozen ranks would run the process out of descriptors (the soft
//! limit is often 1024). Its own test binary, so that no other test's sockets are counted.

use std::time::{Duration, Instant};

use am_core::{Outgoing, Received, Transport, Tx};
use transport_udp::{Udp, UdpConfig};

/// Connected sockets all of a process's transports hold at most (`CONNECTED_PROCESS_MAX` in
/// the crate).
const PROCESS_MAX: usize = 256;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// 24 ranks in one process, every one sending to every other (552 pairs): everything is
/// delivered, and the process holds no more than its own sockets and the process-wide number
/// of connected ones.
#[test]
fn an_in_process_job_of_many_ranks_stays_within_the_process_limit_of_connected_sockets() {
    const RANKS: u32 = 24;
    let before = open_descriptors();
    let config = UdpConfig::default().linger(Duration::from_millis(50));
    let mut ranks = Udp::cluster(RANKS, 4096, config).expect("UDP cluster");
    for (r, t) in ranks.iter_mut().enumerate() {
        for dest in (0..RANKS).filter(|&d| d != r as u32) {
            t.try_send(dest, &Outgoing::new(&[r as u8; 8], &[]))
                .expect("a first message to each peer");
        }
    }
    let mut got = vec![Vec::new(); RANKS as usize];
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.iter().any(|g| g.len() < RANKS as usize - 1) {
        assert!(
            Instant::now() < deadline,
            "not everything delivered in 60 s: {:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
        for (r, t) in ranks.iter_mut().enumerate() {
            while let Some(src) = t
                .poll_recv(|d, _, _| match d.bytes {
                    Received::Private(m) => {
                        assert_eq!(m, [d.src as u8; 8]);
                        d.src
                    }
                    _ => panic!("a private message"),
                })
                .expect("no peer lost")
            {
                got[r].push(src);
            }
        }
    }
    for (r, g) in got.iter_mut().enumerate() {
        g.sort_unstable();
        let want: Vec<u32> = (0..RANKS).filter(|&s| s != r as u32).collect();
        assert_eq!(*g, want, "rank {r}");
    }
    let held = open_descriptors() - before;
    assert!(
        held <= RANKS as usize + PROCESS_MAX,
        "{held} descriptors for {RANKS} ranks: more than their own sockets and {PROCESS_MAX} \
         connected ones"
    );
    // Some connected sockets were made (the limit is not zero).
    assert!(held > RANKS as usize, "{held} descriptors: none connected");
}
