//! The transport's settings.

use std::time::Duration;

use am_core::Credits;

use crate::error::OfiTransportError;

/// Settings of the ofi transport.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OfiConfig {
    /// The provider (`tcp`, `shm`, `tcp;ofi_rxm`, `verbs;ofi_rxm`, ...): `AM_OFI_PROVIDER`,
    /// else `FI_PROVIDER`; `None` takes the first libfabric lists.
    pub provider: Option<String>,
    /// The credit policy (`AM_CREDITS`), which sizes the posted receive buffers.
    pub credits: Credits,
    /// The largest AM Medium payload (`AM_OFI_MAX_MEDIUM`, default 8192).
    pub max_medium: usize,
    /// How long an RMA or atomic may wait for its completion before its target counts as
    /// lost (`AM_PEER_TIMEOUT_MS`, default 30 s).
    pub peer_timeout: Duration,
    /// Whether remote atomics may use the provider's own (`AM_OFI_ATOMICS=native`, the
    /// default) or always travel as AMs (`AM_OFI_ATOMICS=am`).
    pub provider_atomics: bool,
}

impl Default for OfiConfig {
    fn default() -> OfiConfig {
        OfiConfig {
            provider: None,
            credits: Credits::default(),
            max_medium: 8192,
            peer_timeout: Duration::from_secs(30),
            provider_atomics: true,
        }
    }
}

impl OfiConfig {
    /// The defaults, overridden by `AM_OFI_PROVIDER` (or `FI_PROVIDER`), `AM_CREDITS`,
    /// `AM_OFI_MAX_MEDIUM`, `AM_OFI_ATOMICS` and `AM_PEER_TIMEOUT_MS` where set.
    pub fn from_env() -> Result<OfiConfig, OfiTransportError> {
        let mut c = OfiConfig::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        c.provider = var("AM_OFI_PROVIDER").or_else(|| var("FI_PROVIDER"));
        c.credits = am_core::Config::from_env()
            .map_err(|e| OfiTransportError::Config(e.to_string()))?
            .credits
            .unwrap_or_default();
        let num = |name: &'static str| -> Result<Option<u64>, OfiTransportError> {
            var(name)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        OfiTransportError::Config(format!("{name}={v:?}: not a number"))
                    })
                })
                .transpose()
        };
        if let Some(m) = num("AM_OFI_MAX_MEDIUM")? {
            if !(64..=1 << 20).contains(&m) {
                return Err(OfiTransportError::Config(format!(
                    "AM_OFI_MAX_MEDIUM={m}: between 64 and 1048576"
                )));
            }
            c.max_medium = m as usize;
        }
        match var("AM_OFI_ATOMICS").as_deref() {
            None | Some("native") => {}
            Some("am") => c.provider_atomics = false,
            Some(v) => {
                return Err(OfiTransportError::Config(format!(
                    "AM_OFI_ATOMICS={v:?}: native or am"
                )))
            }
        }
        if let Some(ms) = num("AM_PEER_TIMEOUT_MS")? {
            c.peer_timeout = Duration::from_millis(ms.max(1));
        }
        Ok(c)
    }

    /// With this provider.
    pub fn provider(mut self, provider: impl Into<String>) -> OfiConfig {
        self.provider = Some(provider.into());
        self
    }

    /// Whether remote atomics may use the provider's own (`true`, the default) or always
    /// travel as AMs (`false`, `AM_OFI_ATOMICS=am`).
    pub fn provider_atomics(mut self, native: bool) -> OfiConfig {
        self.provider_atomics = native;
        self
    }

    /// With this credit policy.
    pub fn credits(mut self, credits: Credits) -> OfiConfig {
        self.credits = credits;
        self
    }
}
