//! TCP ports for the programs a test starts.
//!
//! A test picks a port, then a child process binds it later, so the port
//! must stay free in between. A port from `bind(0)` comes from the kernel's
//! ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), the range
//! every outgoing connection on the machine also takes its local port
//! from: kubelet, containerd or an API client may hold it by the time the
//! child binds. So ports come from outside that range, tried on the
//! wildcard address (the one a pod's `0.0.0.0:<port>` listener needs),
//! starting at a point that differs per process and call so parallel test
//! processes do not walk the same sequence.
//!
//! A port is free again the moment it is handed out, until the child
//! binds it, which can be seconds later (a node scans its disks first).
//! Tests of one process run in parallel, so each port is handed out at
//! most once per process: two tests never get the same port, however
//! their windows overlap.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Result, bail};

/// Lowest port handed out: below it are well-known services.
const LOWEST: u16 = 10_000;

/// One port that was free on every address a moment ago, outside the
/// ephemeral range.
pub fn free_port() -> Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` distinct such ports.
pub fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let candidates = candidates(ephemeral_range());
    if candidates.is_empty() {
        bail!(
            "no TCP ports outside the ephemeral range {:?}",
            ephemeral_range()
        );
    }
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(call.wrapping_mul(7_919))
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0),
        );
    let total = candidates.len();
    let start = seed as usize % total;
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    // Hold each free port while looking for the next, so the N differ.
    let mut held = Vec::with_capacity(N);
    for i in 0..total {
        let port = candidates[(start + i) % total];
        if handed_out.contains(&port) {
            continue;
        }
        if let Ok(listener) = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            held.push((port, listener));
            if held.len() == N {
                break;
            }
        }
    }
    if held.len() < N {
        bail!(
            "only {} of {N} free TCP ports outside the ephemeral range",
            held.len()
        );
    }
    let mut ports = [0; N];
    for (slot, (port, _)) in ports.iter_mut().zip(&held) {
        *slot = *port;
        handed_out.insert(*port);
    }
    Ok(ports)
}

/// The kernel's ephemeral port range; Linux's default when unreadable.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| parse_range(&text))
        .unwrap_or((32_768, 60_999))
}

fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut fields = text.split_whitespace().map(str::parse::<u16>);
    match (fields.next(), fields.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// Ports from [`LOWEST`] up, without the ephemeral range.
fn candidates((low, high): (u16, u16)) -> Vec<u16> {
    (LOWEST..=u16::MAX)
        .filter(|port| *port < low || *port > high)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_read_from_the_kernel_format() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32_768, 60_999)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("garbage"), None);
    }

    #[test]
    fn candidates_leave_out_the_ephemeral_range() {
        let ports = candidates((32_768, 60_999));
        assert_eq!(ports.first(), Some(&LOWEST));
        assert!(ports.contains(&32_767));
        assert!(!ports.contains(&32_768));
        assert!(!ports.contains(&60_999));
        assert!(ports.contains(&61_000));
        assert!(candidates((1024, 65_535)).is_empty());
    }

    #[test]
    fn ports_are_distinct_bindable_and_outside_the_range() -> Result<()> {
        let (low, high) = ephemeral_range();
        let ports = free_ports::<4>()?;
        for (i, port) in ports.iter().enumerate() {
            assert!(*port < low || *port > high, "{port} in {low}..={high}");
            assert!(!ports[..i].contains(port), "{port} twice in {ports:?}");
            drop(TcpListener::bind((Ipv4Addr::UNSPECIFIED, *port))?);
        }
        Ok(())
    }

    #[test]
    fn a_port_is_handed_out_once_per_process() -> Result<()> {
        let first = free_ports::<8>()?;
        // Still free (nothing bound them), yet never handed out again.
        for _ in 0..64 {
            let again = free_port()?;
            assert!(!first.contains(&again), "{again} handed out twice");
        }
        Ok(())
    }
}
