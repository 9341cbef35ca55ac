//! Certificates changing under a real `carina-node` while creates run.
//! A client loop makes a fresh mutual-TLS connection for every CreateLV
//! (and the DeleteLV after it), so every call is a handshake with the
//! credentials of that moment:
//!
//! - **CA rotation** in the safe order (the node trusts old and new CA,
//!   clients trust both, the node's certificate is re-issued by the new
//!   CA, clients get new certificates, the node drops the old CA) loses no
//!   create; afterwards a client still holding an old-CA certificate is
//!   refused at the handshake, and nothing of its attempt exists;
//! - a node certificate that **expires** makes new connections fail with
//!   an error that says so, and nothing half-made is left; a renewed
//!   certificate (files replaced, no restart) is served within the reload
//!   interval and the creates go on; the same for a client certificate
//!   that expires and is renewed.
//!
//! The node re-reads its certificate files every second; each step waits
//! for the new state to be served (by a handshake that only it accepts),
//! not for a time.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_proto::devcerts::{CertifiedKey, DevCa, Validity};
use carina_proto::nodestorage as pb;
use carina_proto::tls::{ClientTls, DEFAULT_TRUST_DOMAIN, connect};
use carina_tests::cluster::{NodeArgs, Pki, Service};
use carina_tests::grpc::{Client, create_lv, host_config};
use carina_tests::{have_root, unique};

/// How long one step may take to be served.
const STEP: Duration = Duration::from_secs(30);

fn server(ca: &DevCa, node: &str, validity: Validity) -> CertifiedKey {
    ca.issue_server(
        node,
        &["localhost".to_string()],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        validity,
    )
    .expect("server certificate")
}

fn client(ca: &DevCa, validity: Validity) -> CertifiedKey {
    ca.issue_client(DEFAULT_TRUST_DOMAIN, "controller", validity)
        .expect("client certificate")
}

/// Valid from a minute ago for `secs` seconds.
fn seconds(secs: i64) -> Validity {
    let now = time::OffsetDateTime::now_utc();
    Validity {
        not_before: now - time::Duration::minutes(1),
        not_after: now + time::Duration::seconds(secs),
    }
}

/// A HOST node whose certificate files the test rewrites.
struct Node {
    args: NodeArgs,
    service: Option<Service>,
    _dir: tempfile::TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut s) = self.service.take() {
            s.kill();
        }
    }
}

impl Node {
    async fn start(test: &str, ca_pem: &str, cert: &CertifiedKey) -> Result<Node> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("carina-{test}-"))
            .tempdir()?;
        let root = dir.path().join("host");
        std::fs::create_dir_all(&root)?;
        // The harness's PKI only names the files; the test writes them.
        let pki = Pki::write(&dir.path().join("pki"))?;
        let args = NodeArgs::new(
            "node-a",
            &pki,
            &host_config("g", &root, 0),
            &dir.path().join("node"),
            &dir.path().join("node.log"),
        )?;
        let node = Node {
            args,
            service: None,
            _dir: dir,
        };
        node.trust(ca_pem)?;
        node.serve(cert)?;
        let mut node = node;
        node.service = Some(node.args.start().await?);
        Ok(node)
    }

    /// The CA bundle the node trusts for clients.
    fn trust(&self, ca_pem: &str) -> Result<()> {
        write_atomically(&self.args.ca, ca_pem.as_bytes())
    }

    /// The certificate the node serves.
    fn serve(&self, cert: &CertifiedKey) -> Result<()> {
        write_atomically(&self.args.certs.key, cert.key_pem.as_bytes())?;
        write_atomically(&self.args.certs.cert, cert.cert_pem.as_bytes())
    }

    fn check_running(&mut self) -> Result<()> {
        self.service
            .as_mut()
            .context("not started")?
            .check_running()
    }
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn tls(ca_pem: &str, cert: &CertifiedKey) -> ClientTls {
    ClientTls {
        ca_pem: ca_pem.as_bytes().to_vec(),
        cert_pem: cert.cert_pem.as_bytes().to_vec(),
        key_pem: cert.key_pem.as_bytes().to_vec(),
        server_name: "node-a".into(),
    }
}

/// One create and its delete over a new connection.
async fn cycle(endpoint: &str, tls: &ClientTls) -> Result<()> {
    let channel = connect(endpoint, tls).await.context("connect")?;
    let mut c = Client::new(channel);
    let name = unique("rot");
    c.create_lv(create_lv(&name, "g", 4 << 20))
        .await
        .context("CreateLV")?;
    c.delete_lv(pb::DeleteLvRequest { name })
        .await
        .context("DeleteLV")?;
    Ok(())
}

/// Creates running in a loop with the credentials of the moment; each
/// outcome is kept with the phase it ran in.
struct Creates {
    tls: Arc<RwLock<ClientTls>>,
    phase: Arc<AtomicUsize>,
    /// Cycles finished (either way).
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(usize, Result<(), String>)>>,
}

impl Creates {
    fn start(endpoint: String, first: ClientTls) -> Creates {
        let tls = Arc::new(RwLock::new(first));
        let phase = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let task = {
            let (tls, phase, stop, done) = (tls.clone(), phase.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let now = tls.read().expect("lock").clone();
                    let at = phase.load(Ordering::Relaxed);
                    let outcome = cycle(&endpoint, &now).await.map_err(|e| format!("{e:#}"));
                    if outcome.is_err() {
                        // A failing loop does not spin.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    outcomes.push((at, outcome));
                    done.fetch_add(1, Ordering::Relaxed);
                }
                outcomes
            })
        };
        Creates {
            tls,
            phase,
            done,
            stop,
            task,
        }
    }

    fn credentials(&self, tls: ClientTls) {
        *self.tls.write().expect("lock") = tls;
    }

    fn next_phase(&self) -> usize {
        self.phase.fetch_add(1, Ordering::Relaxed) + 1
    }

    async fn finish(self) -> Vec<(usize, Result<(), String>)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the create loop")
    }
}

/// One call over a new connection with `tls`.
async fn probe(endpoint: &str, tls: &ClientTls) -> Result<()> {
    let mut c = Client::new(connect(endpoint, tls).await?);
    c.capacity(pb::CapacityRequest::default()).await?;
    Ok(())
}

/// Waits until `tls` can make a call on the node (a new handshake each
/// time), at most [`STEP`].
async fn until_accepted(endpoint: &str, tls: &ClientTls, what: &str) -> Result<Duration> {
    let started = Instant::now();
    loop {
        match probe(endpoint, tls).await {
            Ok(()) => return Ok(started.elapsed()),
            Err(e) if started.elapsed() > STEP => {
                bail!("{what}: not served within {STEP:?}: {e:#}")
            }
            // Polling a file-reloading server: nothing to watch.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until `tls` is refused, and returns the refusal.
async fn until_refused(endpoint: &str, tls: &ClientTls, what: &str) -> Result<String> {
    let started = Instant::now();
    loop {
        match probe(endpoint, tls).await {
            Err(e) => return Ok(format!("{e:?}")),
            Ok(()) if started.elapsed() > STEP => bail!("{what}: still accepted after {STEP:?}"),
            Ok(()) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn volumes(endpoint: &str, tls: &ClientTls) -> Result<Vec<String>> {
    let mut c = Client::new(connect(endpoint, tls).await?);
    Ok(c.list_l_vs(pb::ListLVsRequest::default())
        .await?
        .into_inner()
        .volumes
        .into_iter()
        .map(|v| v.name)
        .collect())
}

/// Waits until the loop has finished `n` more cycles, so the phase runs
/// some with its credentials; at most [`STEP`].
async fn cycles_in_phase(creates: &Creates, n: usize) {
    let target = creates.done.load(Ordering::Relaxed) + n;
    let started = Instant::now();
    // Polling a counter of another task: cheap, and bounded.
    while creates.done.load(Ordering::Relaxed) < target && started.elapsed() < STEP {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotation_with_creates_running_loses_no_create() {
    if !have_root("ca_rotation") {
        return;
    }
    let ca1 = DevCa::new("carina CA 1", Validity::days(1)).expect("CA 1");
    let ca2 = DevCa::new("carina CA 2", Validity::days(1)).expect("CA 2");
    let both = format!("{}{}", ca1.cert_pem(), ca2.cert_pem());
    let mut node = Node::start(
        "ca_rotation",
        ca1.cert_pem(),
        &server(&ca1, "node-a", Validity::days(1)),
    )
    .await
    .expect("node");
    let endpoint = node.args.endpoint();
    let old_client = client(&ca1, Validity::days(1));
    let new_client = client(&ca2, Validity::days(1));
    let creates = Creates::start(endpoint.clone(), tls(ca1.cert_pem(), &old_client));
    cycles_in_phase(&creates, 5).await;

    // 1. The node trusts both CAs for clients.
    creates.next_phase();
    node.trust(&both).expect("trust both");
    until_accepted(
        &endpoint,
        &tls(ca1.cert_pem(), &new_client),
        "a new-CA client",
    )
    .await
    .expect("step 1");
    cycles_in_phase(&creates, 5).await;
    // 2. Clients trust both; the node serves a new-CA certificate.
    creates.next_phase();
    creates.credentials(tls(&both, &old_client));
    node.serve(&server(&ca2, "node-a", Validity::days(1)))
        .expect("serve");
    until_accepted(
        &endpoint,
        &tls(ca2.cert_pem(), &old_client),
        "the new server certificate",
    )
    .await
    .expect("step 2");
    cycles_in_phase(&creates, 5).await;
    // 3. Clients present new-CA certificates.
    creates.next_phase();
    creates.credentials(tls(&both, &new_client));
    cycles_in_phase(&creates, 5).await;
    // 4. The node drops the old CA.
    creates.next_phase();
    node.trust(ca2.cert_pem()).expect("trust the new CA only");
    let refusal = until_refused(&endpoint, &tls(&both, &old_client), "an old-CA client")
        .await
        .expect("step 4");
    cycles_in_phase(&creates, 5).await;
    let outcomes = creates.finish().await;
    node.check_running().expect("the node runs");

    let failed: Vec<_> = outcomes.iter().filter(|(_, o)| o.is_err()).collect();
    assert!(
        failed.is_empty(),
        "creates failed during the rotation: {failed:?}"
    );
    for phase in 0..=4 {
        let n = outcomes.iter().filter(|(p, _)| *p == phase).count();
        assert!(n > 0, "no create ran in phase {phase}");
    }
    eprintln!(
        "{} create+delete cycles over the rotation, none failed; the old-CA client is refused: {}",
        outcomes.len(),
        refusal.lines().next().unwrap_or_default()
    );
    // The refused client's attempt made nothing, and every cycle deleted
    // its volume.
    let new = tls(ca2.cert_pem(), &new_client);
    assert_eq!(
        volumes(&endpoint, &new).await.expect("list"),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_certificates_fail_precisely_and_renewal_needs_no_restart() {
    if !have_root("expiry") {
        return;
    }
    let ca = DevCa::new("carina CA", Validity::days(1)).expect("CA");
    // A node certificate that runs out in a few seconds.
    let mut node = Node::start("expiry", ca.cert_pem(), &server(&ca, "node-a", seconds(4)))
        .await
        .expect("node");
    let endpoint = node.args.endpoint();
    let good = tls(ca.cert_pem(), &client(&ca, Validity::days(1)));
    let creates = Creates::start(endpoint.clone(), good.clone());
    let refusal = until_refused(&endpoint, &good, "a client of an expired node certificate")
        .await
        .expect("the node certificate expires");
    assert!(
        refusal.contains("certificate expired"),
        "the refusal does not say why: {refusal}"
    );
    // Renewed in place; served without a restart.
    let expired_phase = creates.next_phase();
    node.serve(&server(&ca, "node-a", Validity::days(1)))
        .expect("renew");
    let recovered = until_accepted(&endpoint, &good, "the renewed node certificate")
        .await
        .expect("renewal served");
    let served_phase = creates.next_phase();
    cycles_in_phase(&creates, 5).await;

    // A client certificate that runs out, then is renewed.
    let short = tls(ca.cert_pem(), &client(&ca, seconds(4)));
    until_accepted(&endpoint, &short, "a short-lived client certificate")
        .await
        .expect("accepted while valid");
    creates.credentials(short.clone());
    let client_refusal = until_refused(&endpoint, &short, "an expired client certificate")
        .await
        .expect("the client certificate expires");
    let renewed_phase = creates.next_phase();
    creates.credentials(good.clone());
    cycles_in_phase(&creates, 5).await;
    let outcomes = creates.finish().await;
    node.check_running().expect("the node runs");

    // Every failure is the connection refused (by the client for an
    // expired server certificate; by the server, which TLS 1.3 tells the
    // client at its first request, for an expired client certificate),
    // never an answer of the node: no call was served half way.
    for (phase, outcome) in &outcomes {
        if let Err(e) = outcome {
            assert!(
                e.starts_with("connect:") || e.contains("transport error"),
                "phase {phase}: not a refused connection: {e}"
            );
        }
    }
    let ok_after = |phase: usize| outcomes.iter().any(|(p, o)| *p >= phase && o.is_ok());
    assert!(
        ok_after(served_phase),
        "no create succeeded after the renewal"
    );
    assert!(
        ok_after(renewed_phase),
        "no create succeeded after the client renewal"
    );
    let failed = outcomes.iter().filter(|(_, o)| o.is_err()).count();
    eprintln!(
        "node certificate renewed and served {recovered:?} after the files were replaced; \
         {failed} of {} cycles refused at the handshake while a certificate was expired \
         (phase {expired_phase} on); client refusal: {}",
        outcomes.len(),
        client_refusal.lines().next().unwrap_or_default()
    );
    assert_eq!(
        volumes(&endpoint, &good).await.expect("list"),
        Vec::<String>::new()
    );
}
