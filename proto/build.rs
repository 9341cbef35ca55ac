//! Compiles the `.proto` files with protox (pure Rust, no system `protoc`)
//! and generates prost messages and tonic services from the descriptors.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "carina/nodestorage/v1/nodestorage.proto",
        "csi/v1/csi.proto",
        "kubelet/pluginregistration/v1/registration.proto",
        "carina/identity/v1/identity.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed=proto/{f}");
    }
    // One compile: the descriptor set (served by gRPC reflection) holds every
    // file and the well-known types they import.
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptor.bin"), fds.encode_to_vec())?;
    // The node's NodeStorage port reflects only what it serves.
    let nodestorage = protox::compile([files[0]], ["proto"])?;
    std::fs::write(
        out.join("nodestorage_descriptor.bin"),
        nodestorage.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
