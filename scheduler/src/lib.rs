//! The kube-scheduler HTTP extender (`/filter`, `/prioritize`) that places
//! pods where their Carina volumes fit, counting volumes in flight. It
//! arrives with the scheduler work; this crate is the place it will live.
