//! Carina's `schedulerStrategy` (`binpack`, `spreadout`): which of the
//! nodes that fit a volume comes first. One name for every placement: the
//! direct control plane, the Kubernetes provisioner and the scheduler
//! extender all order nodes by it, so it lives here, knowing neither
//! Kubernetes nor a node's storage.

use std::fmt;
use std::str::FromStr;

/// Carina's `schedulerStrategy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Fill the fullest node that still fits.
    Binpack,
    /// Use the emptiest node.
    #[default]
    Spreadout,
}

impl FromStr for Strategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Strategy, String> {
        match s {
            "binpack" => Ok(Strategy::Binpack),
            "spreadout" => Ok(Strategy::Spreadout),
            other => Err(format!("{other:?} is not binpack or spreadout")),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Binpack => "binpack",
            Strategy::Spreadout => "spreadout",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Strategy;
    use proptest::prelude::{prop_assert_eq, prop_oneof, proptest};

    proptest! {
        /// A strategy of any name is refused or prints back as that name.
        #[test]
        fn strategies_of_any_name(name in prop_oneof![".{0,12}", "(binpack|spreadout) ?"]) {
            if let Ok(s) = name.parse::<Strategy>() {
                prop_assert_eq!(s.to_string(), name);
            }
        }
    }

    #[test]
    fn both_names_read_back() {
        for s in [Strategy::Binpack, Strategy::Spreadout] {
            assert_eq!(s.to_string().parse::<Strategy>(), Ok(s));
        }
    }
}
