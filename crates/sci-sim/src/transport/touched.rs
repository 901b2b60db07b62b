//! What a rank's exported segment holds after it talked to a few of many peers: the memory
//! of senders that never wrote to it stays untouched (never read either, since a read of a
//! page of a shared mapping allocates it too). Over anonymous shared memory (memfds, as a
//! multi-process job's), whose allocated bytes the kernel reports; not under Miri, which
//! has no memfds.

use std::os::unix::fs::MetadataExt;

use super::tests::{head, out, reply};
use super::*;
use am_core::wire::MAX_HEAD_LEN;
use am_core::{AmKind, Category};

/// Sci NICs of `ranks` ranks over anonymous shared segments, all in this process, and where
/// each segment's file is.
fn cluster_memfd(ranks: usize, config: SciConfig) -> (Vec<Sci>, Vec<String>) {
    let layout = Sci::layout_for(ranks as u32, 4096, &config).unwrap();
    let segs: Vec<Segment> = (0..ranks)
        .map(|r| {
            Segment::create_anonymous(
                &format!("touched{r}"),
                layout.words_len(),
                layout.bytes_len(),
            )
            .unwrap()
        })
        .collect();
    let files = segs.iter().map(|s| s.handle().unwrap()).collect();
    let peers: Vec<Segment> = segs.iter().map(Segment::share).collect();
    let job = am_nic::wake::in_process_job("sci");
    let nics = segs
        .into_iter()
        .enumerate()
        .map(|(r, seg)| {
            let pids = vec![None; ranks];
            Sci::new(job.clone(), r, layout, config, seg, &peers, pids).unwrap()
        })
        .collect();
    (nics, files)
}

/// Bytes the kernel holds for the segment file at `path`.
fn allocated(path: &str) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// 128 ranks; ranks 0 and 1 exchange round trips, every other rank departs (a ring with no
/// ringer's tag), and both go idle long enough for their takes and liveness sweeps. Each
/// segment then holds the word area, the command segment of the one peer that wrote to it,
/// and little else: a receiver that looked at every sender's slots (on a take, a sweep or a
/// departure's ring) would hold all 128 senders' command segments, 8 MiB.
#[test]
fn a_rank_holds_the_memory_of_the_peers_that_wrote_to_it() {
    let config = SciConfig::default();
    let (mut nics, files) = cluster_memfd(128, config);
    let layout = *nics[0].layout();
    let channel = layout.command_segment(0).count * layout.slot_size;
    let mut rest = nics.split_off(2);
    let (mut b, mut a) = (nics.pop().unwrap(), nics.pop().unwrap());
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    let watchdog = std::time::Instant::now() + Duration::from_secs(20);
    let wait_for = |nic: &mut Sci| loop {
        assert!(
            std::time::Instant::now() < watchdog,
            "a message did not arrive"
        );
        if let Some(route) = nic.poll_recv(|d, _, _| d.route).unwrap() {
            return route;
        }
        nic.wait(Duration::from_millis(5)).unwrap();
    };
    for _ in 0..100 {
        a.try_send(1, &out(&h[..n], &[])).unwrap();
        let route = wait_for(&mut b);
        b.try_send(0, &reply(&r[..rn], &[], route)).unwrap();
        wait_for(&mut a);
    }
    rest.clear();
    // Idle past several liveness sweeps (each after `LIVENESS_AFTER` without progress), with
    // a take before each sleep.
    let idle = std::time::Instant::now();
    while idle.elapsed() < 4 * LIVENESS_AFTER {
        for nic in [&mut a, &mut b] {
            // The departures are reported, one per poll or wait.
            match nic.poll_recv(|_, _, _| ()) {
                Ok(None) | Err(TransportError::PeerDeparted(2..)) => {}
                other => panic!("{other:?}"),
            }
            match nic.wait(Duration::from_millis(10)) {
                Ok(()) | Err(TransportError::PeerDeparted(2..)) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    let page = 4096;
    let bound = (layout.words_len() + channel + 4 * page) as u64;
    for (rank, file) in files.iter().take(2).enumerate() {
        let held = allocated(file);
        assert!(
            held <= bound,
            "rank {rank} holds {held} bytes, more than its word area and one sender's \
             {channel}-byte command segment ({bound} with 4 pages to spare)"
        );
    }
    // The measure can fail: the sender's command segment is there.
    assert!(allocated(&files[1]) >= page as u64);
}

/// 64 ranks each send rank 0 one request, which it answers once all have come (found by
/// looks and takes, since they ring together). Rank 0 then holds, per sender, the page of its
/// first request slot and little more: not the rest of its request slots, nor its reply
/// slots, since rank 0 asked it nothing (a take that scanned whole command segments would
/// hold 64 of 64 KiB).
#[test]
fn a_receiver_reads_only_the_slots_a_sender_can_have_written() {
    let ranks = 65;
    let (mut nics, files) = cluster_memfd(ranks, SciConfig::default());
    let layout = *nics[0].layout();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    for nic in &mut nics[1..] {
        nic.try_send(0, &out(&h[..n], &[])).unwrap();
    }
    let watchdog = std::time::Instant::now() + Duration::from_secs(20);
    let mut routes = Vec::new();
    while routes.len() < ranks - 1 {
        assert!(
            std::time::Instant::now() < watchdog,
            "{} arrived",
            routes.len()
        );
        match nics[0].poll_recv(|d, _, _| (d.src, d.route)).unwrap() {
            Some(got) => routes.push(got),
            None => nics[0].wait(Duration::from_millis(5)).unwrap(),
        }
    }
    for (src, route) in routes {
        nics[0].try_send(src, &reply(&r[..rn], &[], route)).unwrap();
    }
    for nic in &mut nics[1..] {
        loop {
            assert!(
                std::time::Instant::now() < watchdog,
                "a reply did not arrive"
            );
            if nic.poll_recv(|_, _, _| ()).unwrap().is_some() {
                break;
            }
            nic.wait(Duration::from_millis(1)).unwrap();
        }
    }
    // Idle through a take and a liveness sweep.
    let idle = std::time::Instant::now();
    while idle.elapsed() < 2 * LIVENESS_AFTER {
        assert!(nics[0].poll_recv(|_, _, _| ()).unwrap().is_none());
        nics[0].wait(Duration::from_millis(10)).unwrap();
    }
    let page = 4096;
    let per_sender = page + page / 4;
    let bound = (layout.words_len() + (ranks - 1) * per_sender) as u64;
    let held = allocated(&files[0]);
    assert!(
        held <= bound,
        "rank 0 holds {held} bytes, more than its word area and {per_sender} bytes per sender \
         ({bound})"
    );
    assert!(held >= ((ranks - 1) * page) as u64, "the measure can fail");
}
