//! The PMI-1 key-value server amrun offers its ranks (no I/O: lines in, actions out).

use std::collections::HashMap;

use am_bootstrap::wire::{self, format_v1};

/// What the launcher must do after a rank's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send this line to this rank.
    Reply(u32, String),
    /// The rank asked to end the job with this code.
    Abort { rank: u32, code: i32 },
}

/// Job-wide key-value store and barrier state.
#[derive(Debug)]
pub(crate) struct KvsServer {
    size: u32,
    kvsname: String,
    store: HashMap<String, String>,
    in_barrier: Vec<bool>,
    waiting: u32,
}

impl KvsServer {
    pub(crate) fn new(size: u32, kvsname: &str) -> Self {
        Self {
            size,
            kvsname: kvsname.to_owned(),
            store: HashMap::new(),
            in_barrier: vec![false; size as usize],
            waiting: 0,
        }
    }

    /// Whether some rank waits in a barrier that `exited` ranks can never
    /// join; returns such an exited rank.
    pub(crate) fn stuck_barrier(&self, exited: impl Fn(u32) -> bool) -> Option<u32> {
        if self.waiting == 0 {
            return None;
        }
        (0..self.size).find(|&r| !self.in_barrier[r as usize] && exited(r))
    }

    /// Handles one line (without its newline) from `rank`.
    pub(crate) fn handle(&mut self, rank: u32, line: &str) -> Vec<Action> {
        let reply =
            |cmd: &str, fields: &[(&str, &str)]| vec![Action::Reply(rank, format_v1(cmd, fields))];
        let msg = match wire::parse_v1(line) {
            Ok(m) => m,
            Err(e) => {
                let e = e.replace(' ', "_");
                return reply("error", &[("rc", "-1"), ("msg", &e)]);
            }
        };
        let field = |k: &str| msg.get(k).unwrap_or("");
        match msg.cmd.as_str() {
            "init" => reply(
                "response_to_init",
                &[("pmi_version", "1"), ("pmi_subversion", "1"), ("rc", "0")],
            ),
            "get_maxes" => reply(
                "maxes",
                &[
                    ("kvsname_max", &wire::KVSNAME_MAX.to_string()),
                    ("keylen_max", &wire::KEY_MAX.to_string()),
                    ("vallen_max", &wire::VALUE_MAX.to_string()),
                    ("rc", "0"),
                ],
            ),
            "get_my_kvsname" => reply("my_kvsname", &[("kvsname", &self.kvsname), ("rc", "0")]),
            "get_universe_size" => reply(
                "universe_size",
                &[("size", &self.size.to_string()), ("rc", "0")],
            ),
            "get_appnum" => reply("appnum", &[("appnum", "0"), ("rc", "0")]),
            "put" => {
                let (key, value) = (field("key"), field("value"));
                let bad = if field("kvsname") != self.kvsname {
                    Some("wrong_kvsname")
                } else if key.is_empty() || value.is_empty() {
                    Some("missing_key_or_value")
                } else if key.len() > wire::KEY_MAX || value.len() > wire::VALUE_MAX {
                    Some("key_or_value_too_long")
                } else {
                    None
                };
                match bad {
                    Some(why) => reply("put_result", &[("rc", "-1"), ("msg", why)]),
                    None => {
                        self.store.insert(key.to_owned(), value.to_owned());
                        reply("put_result", &[("rc", "0"), ("msg", "success")])
                    }
                }
            }
            "get" => {
                let key = field("key");
                if field("kvsname") != self.kvsname {
                    return reply("get_result", &[("rc", "-1"), ("msg", "wrong_kvsname")]);
                }
                match self.store.get(key) {
                    Some(v) => reply(
                        "get_result",
                        &[("rc", "0"), ("msg", "success"), ("value", v)],
                    ),
                    None => {
                        let msg = format!("key_{key}_not_found");
                        reply(
                            "get_result",
                            &[("rc", "-1"), ("msg", &msg), ("value", "unknown")],
                        )
                    }
                }
            }
            "barrier_in" => {
                let entered = &mut self.in_barrier[rank as usize];
                if !*entered {
                    *entered = true;
                    self.waiting += 1;
                }
                if self.waiting < self.size {
                    return Vec::new();
                }
                self.in_barrier.fill(false);
                self.waiting = 0;
                (0..self.size)
                    .map(|r| Action::Reply(r, format_v1("barrier_out", &[("rc", "0")])))
                    .collect()
            }
            "abort" => {
                let code = field("exitcode").parse::<i32>().unwrap_or(1);
                vec![Action::Abort { rank, code }]
            }
            "finalize" => reply("finalize_ack", &[("rc", "0")]),
            other => {
                let resp = format!("{other}_result");
                reply(&resp, &[("rc", "-1"), ("msg", "unsupported_command")])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replies(actions: Vec<Action>) -> Vec<(u32, String)> {
        actions
            .into_iter()
            .map(|a| match a {
                Action::Reply(r, s) => (r, s),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    fn one(actions: Vec<Action>) -> String {
        let mut r = replies(actions);
        assert_eq!(r.len(), 1);
        r.pop().unwrap().1
    }

    #[test]
    fn init_sequence_matches_hydra() {
        let mut s = KvsServer::new(2, "job1");
        assert_eq!(
            one(s.handle(0, "cmd=init pmi_version=1 pmi_subversion=1")),
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
        );
        assert_eq!(
            one(s.handle(0, "cmd=get_maxes")),
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n"
        );
        assert_eq!(
            one(s.handle(1, "cmd=get_my_kvsname")),
            "cmd=my_kvsname kvsname=job1 rc=0\n"
        );
        assert_eq!(one(s.handle(1, "cmd=finalize")), "cmd=finalize_ack rc=0\n");
    }

    #[test]
    fn put_get_and_barrier() {
        let mut s = KvsServer::new(3, "j");
        assert_eq!(
            one(s.handle(0, "cmd=put kvsname=j key=k0 value=a=b")),
            "cmd=put_result rc=0 msg=success\n"
        );
        assert!(s.handle(0, "cmd=barrier_in").is_empty());
        assert!(
            s.handle(0, "cmd=barrier_in").is_empty(),
            "re-entry counts once"
        );
        assert!(s.handle(2, "cmd=barrier_in").is_empty());
        assert_eq!(s.stuck_barrier(|r| r == 1), Some(1));
        assert_eq!(
            s.stuck_barrier(|r| r == 0),
            None,
            "rank 0 is in the barrier"
        );
        let out = replies(s.handle(1, "cmd=barrier_in"));
        assert_eq!(
            out.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert!(out.iter().all(|(_, l)| l == "cmd=barrier_out rc=0\n"));
        assert_eq!(s.stuck_barrier(|_| true), None, "nobody waits any more");
        assert_eq!(
            one(s.handle(2, "cmd=get kvsname=j key=k0")),
            "cmd=get_result rc=0 msg=success value=a=b\n"
        );
        assert_eq!(
            one(s.handle(2, "cmd=get kvsname=j key=zz")),
            "cmd=get_result rc=-1 msg=key_zz_not_found value=unknown\n"
        );
        // The next barrier works the same way.
        assert!(s.handle(1, "cmd=barrier_in").is_empty());
        assert!(s.handle(2, "cmd=barrier_in").is_empty());
        assert_eq!(replies(s.handle(0, "cmd=barrier_in")).len(), 3);
    }

    #[test]
    fn bad_requests_get_error_replies() {
        let mut s = KvsServer::new(1, "j");
        assert!(one(s.handle(0, "cmd=put kvsname=other key=k value=v")).contains("rc=-1"));
        assert!(one(s.handle(0, "cmd=put kvsname=j key=k")).contains("rc=-1"));
        assert!(one(s.handle(0, "cmd=get kvsname=other key=k")).contains("rc=-1"));
        assert!(one(s.handle(0, "cmd=spawn")).starts_with("cmd=spawn_result rc=-1"));
        assert!(one(s.handle(0, "garbage here")).starts_with("cmd=error rc=-1"));
        let long = format!(
            "cmd=put kvsname=j key=k value={}",
            "v".repeat(wire::VALUE_MAX + 1)
        );
        assert!(one(s.handle(0, &long)).contains("rc=-1"));
    }

    #[test]
    fn abort_carries_the_exit_code() {
        let mut s = KvsServer::new(2, "j");
        assert_eq!(
            s.handle(1, "cmd=abort exitcode=7"),
            vec![Action::Abort { rank: 1, code: 7 }]
        );
        assert_eq!(
            s.handle(0, "cmd=abort"),
            vec![Action::Abort { rank: 0, code: 1 }]
        );
    }
}
