//! The wire of Carina: generated NodeStorage and CSI code (private, re-exported
//! on purpose), mutual-TLS configuration with hot reload, W3C trace-context
//! propagation for tonic clients and servers, and telemetry initialisation.
