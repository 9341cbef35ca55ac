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

/// The canonical upper-case name of a gRPC code (`NOT_FOUND`), as grpcurl
/// and the other gRPC tools print it.
pub fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
