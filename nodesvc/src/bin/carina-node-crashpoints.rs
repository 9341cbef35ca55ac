//! `carina-node-crashpoints`: `carina-node` built with the cargo feature
//! `crashpoints`, so `CARINA_TEST_KILL_AT` kills it at the step it names
//! (`carina_sys::crashpoint`). Only the fault tests run it; it is in no
//! image, and `carina-node` itself ignores the variable.

#[path = "carina-node.rs"]
mod node;

fn main() -> anyhow::Result<()> {
    node::main()
}
