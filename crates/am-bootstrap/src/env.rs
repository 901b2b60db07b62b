//! Reading the launcher's variables: the process environment, or a map in tests.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::BootstrapError;

/// Where detection reads variables from; tests substitute a map.
pub(crate) trait Env {
    /// The variable's value; unset and empty are the same.
    fn raw(&self, name: &str) -> Option<std::ffi::OsString>;
    /// Called before a PMI connection is used.
    fn claim_pmi(&self) -> Result<(), BootstrapError>;

    fn var(&self, name: &'static str) -> Result<Option<String>, BootstrapError> {
        match self.raw(name) {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => v
                .into_string()
                .map(Some)
                .map_err(|v| BootstrapError::InvalidVar {
                    var: name,
                    value: v.to_string_lossy().into_owned(),
                    reason: "not valid UTF-8".into(),
                }),
        }
    }

    fn has(&self, name: &'static str) -> Result<bool, BootstrapError> {
        Ok(self.var(name)?.is_some())
    }
}

/// The process's own environment.
pub(crate) struct ProcessEnv;

/// A PMI connection can be initialised once per process; a second attempt
/// could even talk to an unrelated file that reused the descriptor number.
static PMI_CLAIMED: AtomicBool = AtomicBool::new(false);

impl Env for ProcessEnv {
    fn raw(&self, name: &str) -> Option<std::ffi::OsString> {
        std::env::var_os(name)
    }
    fn claim_pmi(&self) -> Result<(), BootstrapError> {
        if PMI_CLAIMED.swap(true, Ordering::SeqCst) {
            Err(BootstrapError::AlreadyBootstrapped)
        } else {
            Ok(())
        }
    }
}

/// A non-negative integer variable, if set.
pub(crate) fn num(env: &dyn Env, var: &'static str) -> Result<Option<u32>, BootstrapError> {
    env.var(var)?
        .map(|v| {
            v.parse::<u32>().map_err(|_| BootstrapError::InvalidVar {
                var,
                reason: "expected a non-negative integer".into(),
                value: v,
            })
        })
        .transpose()
}

/// A non-negative integer variable that must be set.
pub(crate) fn required_num(
    env: &dyn Env,
    var: &'static str,
    why: &'static str,
) -> Result<u32, BootstrapError> {
    num(env, var)?.ok_or(BootstrapError::MissingVar { var, why })
}

/// A file descriptor number variable (`PMI_FD`, `AM_PMI_FD`), if set.
pub(crate) fn parse_fd(env: &dyn Env, var: &'static str) -> Result<Option<i32>, BootstrapError> {
    env.var(var)?
        .map(|v| match v.parse::<i32>() {
            Ok(fd) if fd >= 0 => Ok(fd),
            _ => Err(BootstrapError::InvalidVar {
                var,
                reason: "expected a file descriptor number".into(),
                value: v,
            }),
        })
        .transpose()
}
