//! Leader election when the wall clocks of the replicas disagree, on a
//! real kube-apiserver. The Lease's `renewTime` is written with the
//! holder's wall clock, so a holder whose clock jumped writes times an
//! hour off. The candidate must judge the lease by whether its record
//! changes, timed on its own monotonic clock, never by `renewTime`:
//!
//! - a holder whose clock runs an hour **behind** and that keeps renewing
//!   is never displaced, although every `renewTime` it writes is long
//!   past;
//! - a holder whose clock runs an hour **ahead** and then dies is replaced
//!   one lease duration after its last write, not an hour later; and not
//!   before that duration either.
//!
//! (The leader's own renew deadline is timed on the monotonic clock, which
//! a wall-clock step does not move.)

use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_controlplane::kube::leader::LeaseConfig;
use carina_tests::kube::{Candidate, KubeCluster};
use carina_tests::{have_root, unique};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

const LEASE_SECONDS: u64 = 3;
const HOUR: SignedDuration = SignedDuration::from_hours(1);

fn config(name: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(LEASE_SECONDS),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new("kube-system", name, identity)
    }
}

/// Writes the Lease as a holder `ghost` whose wall clock is `skew` off.
async fn write_as_ghost(leases: &Api<Lease>, name: &str, skew: SignedDuration) -> Result<()> {
    let now = MicroTime(Timestamp::now() + skew);
    let spec = LeaseSpec {
        holder_identity: Some("ghost".into()),
        lease_duration_seconds: Some(LEASE_SECONDS as i32),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        ..Default::default()
    };
    match leases.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await?;
        }
        Some(mut lease) => {
            lease.spec = Some(spec);
            leases
                .replace(name, &PostParams::default(), &lease)
                .await
                .context("renew as ghost")?;
        }
    }
    Ok(())
}

async fn cluster(test: &str) -> Result<Option<KubeCluster>> {
    if !have_root(test) {
        return Ok(None);
    }
    Ok(Some(KubeCluster::start().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_holder_an_hour_behind_is_never_displaced() -> Result<()> {
    let Some(cluster) = cluster("lease_behind").await? else {
        return Ok(());
    };
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
    let name = unique("lease-behind");
    write_as_ghost(&leases, &name, -HOUR).await?;
    let candidate = Candidate::start(&cluster.client(), config(&name, "carina-a"))?;
    // The ghost renews every half second for four lease durations, each
    // time an hour in the past by the apiserver's clock.
    let until = Instant::now() + Duration::from_secs(4 * LEASE_SECONDS);
    let mut last_write = Instant::now();
    while Instant::now() < until {
        write_as_ghost(&leases, &name, -HOUR).await?;
        last_write = Instant::now();
        if *candidate.leading.borrow() {
            bail!("the candidate took a lease whose holder keeps renewing");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The ghost stops: the candidate takes over.
    let stopped = last_write;
    let mut leading = candidate.leading.clone();
    tokio::time::timeout(Duration::from_secs(30), leading.wait_for(|l| *l))
        .await
        .context("not leading within 30 s of the ghost's last renewal")??;
    let waited = stopped.elapsed();
    eprintln!("took over {waited:?} after the last renewal");
    assert!(
        waited >= Duration::from_secs(LEASE_SECONDS),
        "took over after {waited:?}, before the lease duration ran out"
    );
    let holder = leases
        .get(&name)
        .await?
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("carina-a"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holder_an_hour_ahead_is_replaced_after_one_lease_duration() -> Result<()> {
    let Some(cluster) = cluster("lease_ahead").await? else {
        return Ok(());
    };
    let leases: Api<Lease> = Api::namespaced(cluster.client(), "kube-system");
    let name = unique("lease-ahead");
    // The ghost's last write, an hour ahead; it never writes again.
    write_as_ghost(&leases, &name, HOUR).await?;
    let written = Instant::now();
    let candidate = Candidate::start(&cluster.client(), config(&name, "carina-a"))?;
    let mut leading = candidate.leading.clone();
    tokio::time::timeout(Duration::from_secs(30), leading.wait_for(|l| *l))
        .await
        .context("not leading within 30 s of a dead holder's last write")??;
    let waited = written.elapsed();
    eprintln!("took over {waited:?} after the last write");
    assert!(
        waited >= Duration::from_secs(LEASE_SECONDS),
        "took over after {waited:?}, before the lease duration ran out"
    );
    Ok(())
}
