//! The engine runs every external tool through the one command runner of
//! the workspace (argv only, a timeout, errors with command line and
//! stderr), shared with the CSI node service's mount and format logic.

pub use carina_csi::command::*;
