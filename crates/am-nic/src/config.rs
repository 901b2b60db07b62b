//! Reading a NIC's configuration through a variable lookup: the environment where a job
//! starts, a list of variables in the tests of a configuration (a process's environment is
//! shared by a test binary's threads, so a test does not set it).

use am_core::config::ConfigError;
use am_core::Credits;

/// The credits `AM_CREDITS` chooses, as `var` gives it (`None`: not set), or `default`
/// where it is not set. A value the core refuses is refused here too, naming the variable,
/// so that a NIC never lays out its receive memory for credits the core will not give.
pub fn credits(
    var: &impl Fn(&str) -> Option<String>,
    default: Credits,
) -> Result<Credits, ConfigError> {
    Ok(am_core::config::parse_var(var, "AM_CREDITS")?.unwrap_or(default))
}

/// The environment's variable `k`, if it is set (and valid Unicode): the lookup a job's
/// configuration reads through.
pub fn env(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// A lookup of the `(name, value)` pairs in `vars`: a variable not among them is not set.
pub fn lookup<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| (*v).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a credit value the core refuses taken as the default, and a set one ignored.
    #[test]
    fn am_credits_or_the_default() {
        let none = lookup(&[]);
        assert_eq!(credits(&none, Credits::DYNAMIC), Ok(Credits::DYNAMIC));
        let set = lookup(&[("AM_WAIT", "spin"), ("AM_CREDITS", "dynamic:4:64")]);
        assert_eq!(
            credits(&set, Credits::default()),
            Ok(Credits::Dynamic {
                initial: 4,
                bank: 64
            })
        );
        for bad in ["0", "lots", "256", "dynamic:0:1", ""] {
            let e = credits(&lookup(&[("AM_CREDITS", bad)]), Credits::default()).unwrap_err();
            assert_eq!((e.var, e.value.as_str()), ("AM_CREDITS", bad));
        }
    }
}
