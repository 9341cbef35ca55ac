//! Reading `lvm` JSON reports: `pvs --segments` into a [`VgSnapshot`] (the
//! VG's sizes, PVs, every segment and the LVs on them) and `pvs -o
//! pv_name,vg_name` into the VG of each disk. Pure functions, tested on
//! captured real output; the arithmetic on a snapshot is in
//! [`super::extents`].

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Deserialize;

use crate::engine::error::{Error, Result};

use super::cli::OWNER_TAG;

#[derive(Debug, Deserialize)]
struct Report<T> {
    report: Vec<T>,
}

#[derive(Debug, Deserialize)]
struct PvsegReport {
    #[serde(default)]
    pvseg: Vec<PvsegRow>,
}

#[derive(Debug, Deserialize)]
struct PvsegRow {
    pv_name: String,
    pe_start: String,
    pv_size: String,
    /// Absent from reports of older callers; 0 then (never grown).
    #[serde(default)]
    dev_size: String,
    pvseg_start: String,
    pvseg_size: String,
    #[serde(default)]
    lv_name: String,
    #[serde(default)]
    lv_tags: String,
    #[serde(default)]
    lv_size: String,
    vg_name: String,
    vg_extent_size: String,
    vg_size: String,
    vg_free: String,
    #[serde(default)]
    vg_tags: String,
}

#[derive(Debug, Deserialize)]
struct PvReport {
    #[serde(default)]
    pv: Vec<PvRow>,
}

#[derive(Debug, Deserialize)]
struct PvRow {
    pv_name: String,
    #[serde(default)]
    vg_name: String,
}

/// A physical volume of the VG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pv {
    pub path: PathBuf,
    /// Byte offset of extent 0 on the device.
    pub pe_start: u64,
    /// The extents' bytes (what the VG has of this PV).
    pub size: u64,
    /// The device's bytes as the kernel sees them now (0: not reported).
    pub dev_size: u64,
}

impl Pv {
    /// Whether the device has grown by at least one extent past what the
    /// PV holds (a disk grown under it, waiting for `pvresize`).
    pub fn grown(&self, extent_size: u64) -> bool {
        extent_size > 0
            && self
                .dev_size
                .saturating_sub(self.pe_start)
                .saturating_sub(self.size)
                >= extent_size
    }
}

/// A run of extents on one PV, free (`lv == None`) or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub pv: PathBuf,
    pub start: u64,
    pub len: u64,
    pub lv: Option<String>,
}

/// One logical volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lv {
    pub name: String,
    pub size: u64,
    pub tags: Vec<String>,
    /// (pv, first extent, extent count) in PV order of appearance.
    pub segments: Vec<(PathBuf, u64, u64)>,
}

impl Lv {
    pub fn owned(&self) -> bool {
        self.tags.iter().any(|t| t == OWNER_TAG)
    }
}

/// Everything about one VG from one `pvs --segments` report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VgSnapshot {
    pub vg: String,
    pub extent_size: u64,
    pub size: u64,
    pub free: u64,
    pub tags: Vec<String>,
    pub pvs: Vec<Pv>,
    pub segments: Vec<Segment>,
    pub lvs: BTreeMap<String, Lv>,
}

fn num(field: &str, value: &str) -> Result<u64> {
    value
        .trim()
        .parse()
        .map_err(|e| Error::parse(format!("lvm report field {field}={value:?}"), e))
}

fn tags(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses `pvs --segments --reportformat json --units b --nosuffix -o
/// <REPORT_FIELDS> -S vg_name=<vg>`. An empty report is an empty snapshot
/// (the VG does not exist yet).
pub fn parse_pvsegs(json: &str) -> Result<VgSnapshot> {
    let report: Report<PvsegReport> =
        serde_json::from_str(json).map_err(|e| Error::parse("lvm pvs report", e))?;
    let mut snap = VgSnapshot::default();
    for row in report.report.into_iter().flat_map(|r| r.pvseg) {
        if snap.vg.is_empty() {
            snap.vg = row.vg_name.clone();
            snap.extent_size = num("vg_extent_size", &row.vg_extent_size)?;
            snap.size = num("vg_size", &row.vg_size)?;
            snap.free = num("vg_free", &row.vg_free)?;
            snap.tags = tags(&row.vg_tags);
        }
        let pv = PathBuf::from(&row.pv_name);
        if !snap.pvs.iter().any(|p| p.path == pv) {
            snap.pvs.push(Pv {
                path: pv.clone(),
                pe_start: num("pe_start", &row.pe_start)?,
                size: num("pv_size", &row.pv_size)?,
                dev_size: if row.dev_size.is_empty() {
                    0
                } else {
                    num("dev_size", &row.dev_size)?
                },
            });
        }
        let start = num("pvseg_start", &row.pvseg_start)?;
        let len = num("pvseg_size", &row.pvseg_size)?;
        let lv = (!row.lv_name.is_empty()).then(|| row.lv_name.clone());
        if let Some(name) = &lv {
            let entry = snap.lvs.entry(name.clone()).or_insert_with(|| Lv {
                name: name.clone(),
                size: 0,
                tags: tags(&row.lv_tags),
                segments: Vec::new(),
            });
            entry.size = num("lv_size", &row.lv_size)?;
            entry.segments.push((pv.clone(), start, len));
        }
        snap.segments.push(Segment { pv, start, len, lv });
    }
    Ok(snap)
}

/// Parses `pvs -o pv_name,vg_name` JSON into path → VG name (empty for an
/// orphan PV).
pub fn parse_pv_vgs(json: &str) -> Result<HashMap<PathBuf, String>> {
    let report: Report<PvReport> =
        serde_json::from_str(json).map_err(|e| Error::parse("lvm pvs report", e))?;
    Ok(report
        .report
        .into_iter()
        .flat_map(|r| r.pv)
        .map(|r| (PathBuf::from(r.pv_name), r.vg_name))
        .collect())
}

impl VgSnapshot {
    /// Our LVs only.
    pub fn owned_lvs(&self) -> impl Iterator<Item = &Lv> {
        self.lvs.values().filter(|lv| lv.owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const PVSEGS: &str = include_str!("../testdata/pvs_segments.json");

    #[test]
    fn parses_real_report() {
        let s = parse_pvsegs(PVSEGS).expect("parses");
        assert_eq!(s.vg, "tvg");
        assert_eq!(s.extent_size, 4 << 20);
        assert_eq!(s.size, 1_602_224_128);
        assert_eq!(s.free, 1_392_508_928);
        assert_eq!(s.pvs.len(), 2);
        assert_eq!(s.pvs[0].pe_start, 1 << 20);
        assert_eq!(s.lvs.len(), 2);
        assert!(s.lvs["lv1"].owned());
        assert_eq!(
            s.lvs["lv3"].segments,
            vec![(PathBuf::from("/dev/loop0"), 25, 25)]
        );
    }

    #[test]
    fn a_pv_has_grown_once_its_device_holds_another_extent() {
        // `pvs` of a 64 MiB loop device in a VG of 4 MiB extents, then of
        // the same device grown to 256 MiB (lvm 2.03.16).
        let row = |dev_size: &str| {
            format!(
                r#"{{"report": [{{"pvseg": [{{"pv_name":"/dev/loop0", "pe_start":"1048576",
                "pv_size":"62914560", "dev_size":"{dev_size}", "pvseg_start":"0",
                "pvseg_size":"15", "vg_name":"g", "vg_extent_size":"4194304",
                "vg_size":"62914560", "vg_free":"62914560"}}]}}]}}"#
            )
        };
        let as_made = parse_pvsegs(&row("67108864")).expect("parses");
        assert!(
            !as_made.pvs[0].grown(as_made.extent_size),
            "3 MiB left over"
        );
        let grown = parse_pvsegs(&row("268435456")).expect("parses");
        assert_eq!(grown.pvs[0].dev_size, 256 << 20);
        assert!(grown.pvs[0].grown(grown.extent_size));
        let unreported = parse_pvsegs(PVSEGS).expect("parses");
        assert!(
            unreported
                .pvs
                .iter()
                .all(|pv| pv.dev_size == 0 && !pv.grown(unreported.extent_size))
        );
    }

    #[test]
    fn empty_report_is_no_vg() {
        let s = parse_pvsegs(r#"{"report": [{"pvseg": []}]}"#).expect("parses");
        assert!(s.vg.is_empty());
        assert_eq!(s.largest_free_extents(), 0);
    }

    #[test]
    fn pv_vg_report() {
        let m = parse_pv_vgs(r#"{"report":[{"pv":[{"pv_name":"/dev/loop0","vg_name":"tvg"},{"pv_name":"/dev/loop4","vg_name":""}]}]}"#)
            .expect("parses");
        assert_eq!(m[Path::new("/dev/loop0")], "tvg");
        assert_eq!(m[Path::new("/dev/loop4")], "");
    }
}
