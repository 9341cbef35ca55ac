//! The human output of `carinactl migrate plan`: one table per kind of
//! object, then a summary line. The JSON output is the plan itself.

use carina_controlplane::migrate::apply::{ApplyOutcome, ApplyReport};
use carina_controlplane::migrate::{HandleKind, Plan, VolumeAction};
use carina_node::cli::size::format_size;
use carina_node::cli::table::{Table, left, right};

fn action_name(a: VolumeAction) -> &'static str {
    match a {
        VolumeAction::Ours => "ours",
        VolumeAction::Adopted => "adopted",
        VolumeAction::TakeOver => "take-over",
        VolumeAction::RefusedThin => "refused-thin",
        VolumeAction::Refused => "refused",
        VolumeAction::Orphan => "orphan",
        VolumeAction::Failed => "failed",
    }
}

fn handle_name(h: HandleKind) -> &'static str {
    match h {
        HandleKind::Ours => "ours",
        HandleKind::Go => "go",
        HandleKind::GoThin => "go-thin",
        HandleKind::Unknown => "unknown",
    }
}

/// Every section, headed by its title, and the summary.
pub fn plan_table(plan: &Plan) -> String {
    let mut out = String::new();
    let mut section = |title: &str, table: Table| {
        if !table.is_empty() {
            out.push_str(&format!("{title}\n{}\n", table.render()));
        }
    };

    let mut t = Table::new(&[
        left("KIND"),
        left("NAMESPACE"),
        left("NAME"),
        left("CONTAINER"),
        left("PROGRAM"),
        left("REASON"),
    ]);
    for b in &plan.blockers {
        t.row([
            b.kind.as_str(),
            &b.namespace,
            &b.name,
            &b.container,
            &b.program,
            &b.reason,
        ]);
    }
    section("BLOCKERS (Go Carina still runs; migrate apply refuses)", t);

    let mut t = Table::new(&[
        left("LOGICVOLUME"),
        left("ACTION"),
        left("POLICY"),
        left("NODE"),
        left("GROUP"),
        right("SIZE"),
        left("CLAIM"),
        left("REASON"),
    ]);
    for v in &plan.volumes {
        t.row([
            v.name.clone(),
            action_name(v.action).to_string(),
            v.policy.clone().unwrap_or_default(),
            v.node.clone(),
            v.group.clone(),
            v.size_bytes.map(format_size).unwrap_or_default(),
            v.claim.clone().unwrap_or_default(),
            v.reason.clone(),
        ]);
    }
    section("LOGIC VOLUMES", t);

    let mut t = Table::new(&[
        left("PERSISTENTVOLUME"),
        left("HANDLE"),
        left("VOLUMEHANDLE"),
        left("CLAIM"),
        left("CLASS"),
        left("LOGICVOLUME"),
        left("REASON"),
    ]);
    for p in &plan.persistent_volumes {
        t.row([
            p.name.clone(),
            handle_name(p.handle).to_string(),
            p.volume_handle.clone(),
            p.claim.clone().unwrap_or_default(),
            p.storage_class.clone().unwrap_or_default(),
            if p.logic_volume { "yes" } else { "no" }.to_string(),
            p.reason.clone(),
        ]);
    }
    section("PERSISTENT VOLUMES (driver carina.storage.io)", t);

    let mut t = Table::new(&[left("STORAGECLASS"), left("VERDICT"), left("REASON")]);
    for c in &plan.storage_classes {
        let mut reason = c.reason.clone();
        if !c.deprecated.is_empty() {
            reason.push_str(&format!(" (deprecated keys: {})", c.deprecated.join(", ")));
        }
        t.row([
            c.name.clone(),
            if c.accepted { "accepted" } else { "refused" }.to_string(),
            reason,
        ]);
    }
    section("STORAGE CLASSES (provisioner carina.storage.io)", t);

    let mut t = Table::new(&[
        left("KIND"),
        left("NAMESPACE"),
        left("NAME"),
        left("ACTION"),
    ]);
    for l in &plan.leftovers {
        t.row([
            l.kind.clone(),
            l.namespace.clone().unwrap_or_default(),
            l.name.clone(),
            l.action.clone(),
        ]);
    }
    section("GO LEFTOVERS", t);

    out.push_str(&summary(plan));
    out
}

/// `plan: 2 to take over, 1 adopted, ...; blocked: ...` on one line.
pub fn summary(plan: &Plan) -> String {
    let count = |a: VolumeAction| plan.volumes.iter().filter(|v| v.action == a).count();
    let parts: Vec<String> = [
        VolumeAction::TakeOver,
        VolumeAction::Adopted,
        VolumeAction::Ours,
        VolumeAction::RefusedThin,
        VolumeAction::Refused,
        VolumeAction::Orphan,
        VolumeAction::Failed,
    ]
    .into_iter()
    .map(|a| format!("{} {}", count(a), action_name(a)))
    .collect();
    let verdict = if plan.blocking {
        format!(
            "BLOCKED: {} Go Carina program(s) still run; remove Go Carina first",
            plan.blockers.len()
        )
    } else {
        "nothing blocks migrate apply".to_string()
    };
    format!("plan: {}; {verdict}\n", parts.join(", "))
}

/// One row per LogicVolume, then a summary line.
pub fn apply_table(report: &ApplyReport) -> String {
    let mut t = Table::new(&[
        left("LOGICVOLUME"),
        left("OUTCOME"),
        left("NODE"),
        left("VOLUMEID"),
        left("DETAIL"),
    ]);
    let name = |o: ApplyOutcome| match o {
        ApplyOutcome::Adopted => "adopted",
        ApplyOutcome::AlreadyAdopted => "already-adopted",
        ApplyOutcome::Skipped => "skipped",
        ApplyOutcome::Error => "error",
    };
    for v in &report.volumes {
        t.row([
            v.name.clone(),
            name(v.outcome).to_string(),
            v.node.clone(),
            v.volume_id.clone().unwrap_or_default(),
            v.detail.clone(),
        ]);
    }
    let count = |o: ApplyOutcome| report.volumes.iter().filter(|v| v.outcome == o).count();
    format!(
        "{}\napply: {} adopted, {} already adopted, {} skipped, {} error\n",
        t.render(),
        count(ApplyOutcome::Adopted),
        count(ApplyOutcome::AlreadyAdopted),
        count(ApplyOutcome::Skipped),
        count(ApplyOutcome::Error)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_controlplane::migrate::apply::ApplyEntry;
    use carina_controlplane::migrate::{Blocker, VolumeEntry};

    #[test]
    fn apply_rows_and_summary() {
        let entry = |name: &str, outcome| ApplyEntry {
            name: name.into(),
            outcome,
            node: "node-a".into(),
            volume_id: Some(format!("volume-{name}")),
            detail: "d".into(),
        };
        let report = ApplyReport {
            volumes: vec![
                entry("pvc-a", ApplyOutcome::Adopted),
                entry("pvc-b", ApplyOutcome::AlreadyAdopted),
                entry("pvc-c", ApplyOutcome::Error),
            ],
            errors: 1,
        };
        let text = apply_table(&report);
        assert!(
            text.contains("pvc-b        already-adopted  node-a  volume-pvc-b  d"),
            "{text}"
        );
        assert!(
            text.ends_with("apply: 1 adopted, 1 already adopted, 0 skipped, 1 error\n"),
            "{text}"
        );
        let json = serde_json::to_value(&report).expect("serialises");
        assert_eq!(json["volumes"][1]["outcome"], "already-adopted");
        assert_eq!(json["errors"], 1);
    }

    #[test]
    fn sections_and_summary() {
        let mut plan = Plan::default();
        assert_eq!(
            plan_table(&plan),
            "plan: 0 take-over, 0 adopted, 0 ours, 0 refused-thin, 0 refused, 0 orphan, \
             0 failed; nothing blocks migrate apply\n"
        );
        plan.volumes.push(VolumeEntry {
            name: "pvc-a".into(),
            action: VolumeAction::TakeOver,
            policy: Some("lvm".into()),
            node: "node-a".into(),
            group: "carina-vg-ssd".into(),
            size_bytes: Some(3 << 30),
            volume_id: Some("volume-pvc-a".into()),
            persistent_volume: Some("pvc-a".into()),
            claim: Some("app/data".into()),
            reason: "adopt".into(),
        });
        plan.blockers.push(Blocker {
            kind: "DaemonSet".into(),
            namespace: "kube-system".into(),
            name: "csi-carina-node".into(),
            container: "csi-carina-node".into(),
            program: "carina-node".into(),
            reason: "exists".into(),
        });
        plan.blocking = true;
        let text = plan_table(&plan);
        assert!(
            text.contains("BLOCKERS (Go Carina still runs; migrate apply refuses)\nKIND"),
            "{text}"
        );
        assert!(
            text.contains(
                "pvc-a        take-over  lvm     node-a  carina-vg-ssd  3 GiB  app/data  adopt"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(
                "0 failed; BLOCKED: 1 Go Carina program(s) still run; remove Go Carina first\n"
            ),
            "{text}"
        );
        assert!(
            !text.contains("GO LEFTOVERS"),
            "empty sections are left out"
        );
    }
}
