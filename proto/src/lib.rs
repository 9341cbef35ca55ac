//! The wire of Carina: generated NodeStorage and CSI code (private, re-exported
//! on purpose), mutual-TLS configuration with hot reload, W3C trace-context
//! propagation for tonic clients and servers, and telemetry initialisation.

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
mod generated {
    pub mod nodestorage {
        tonic::include_proto!("carina.nodestorage.v1");
    }
}

pub mod devcerts;
pub mod telemetry;
pub mod tls;
pub mod trace;

/// NodeStorage v1: messages, the server trait and the client.
pub mod nodestorage {
    pub use crate::generated::nodestorage::*;
}

/// Encoded `FileDescriptorSet` of every Carina proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
