//! Unit tests of StorageClass parameter parsing.
proptest::proptest! {
    /// StorageClass parameters with Carina's keys and any values are
    /// parsed or refused with INVALID_ARGUMENT, never a panic.
    #[test]
    fn parameters_take_any_values(
        values in proptest::collection::vec(carina_sys::testkit::noisy_text(), 9),
        keys in proptest::collection::vec(".{0,40}", 0..4),
    ) {
        let known = [
            "csi.storage.k8s.io/fstype",
            "carina.storage.io/disk-group-name",
            "carina.storage.io/exclusively-raw-disk",
            "carina.storage.io/backend-disk-group-name",
            "carina.storage.io/cache-disk-group-name",
            "carina.storage.io/cache-disk-ratio",
            "carina.storage.io/cache-policy",
            "carina.storage.io/volume-type",
            "carina.storage.io/allow-pod-migration-if-node-notready",
        ];
        let mut raw: HashMap<String, String> =
            known.iter().map(|k| k.to_string()).zip(values).collect();
        for k in keys {
            raw.insert(k, "x".into());
        }
        if let Err(e) = Parameters::parse(&raw) {
            proptest::prop_assert_eq!(e.code(), tonic::Code::InvalidArgument, "{:?}", e);
        }
    }
}
use super::*;

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn carina_storageclass_examples() {
    let p = Parameters::parse(&map(&[
        (DISK_GROUP, "carina-vg-ssd"),
        (FS_TYPE, "xfs"),
        ("csi.storage.k8s.io/pvc/name", "data"),
    ]))
    .expect("valid");
    assert_eq!(p.group.as_deref(), Some("carina-vg-ssd"));
    assert_eq!(p.fs_type, Some(FsType::Xfs));
    assert!(!p.exclusive);
    let p = Parameters::parse(&map(&[(DISK_GROUP, "carina-raw-ssd"), (EXCLUSIVE, "true")]))
        .expect("valid");
    assert!(p.exclusive);
    let p = Parameters::parse(&map(&[
        (BACKEND_GROUP, "carina-vg-hdd"),
        (CACHE_GROUP, "carina-vg-ssd"),
        (CACHE_RATIO, "50"),
        (CACHE_POLICY, "writethrough"),
    ]))
    .expect("valid");
    assert_eq!(p.bcache.expect("bcache").cache_ratio, 50);
    assert_eq!(
        Parameters::parse(&HashMap::new()).expect("empty"),
        Parameters::default()
    );
    // Carina's documentation puts the pod-migration opt-in into a
    // StorageClass too.
    let p = Parameters::parse(&map(&[
        (DISK_GROUP, "carina-lvm"),
        (FS_TYPE, "xfs"),
        (POD_MIGRATION, "true"),
    ]))
    .expect("valid");
    assert!(p.pod_migration);
    let e = Parameters::parse(&map(&[(POD_MIGRATION, "yes")])).expect_err("not a flag");
    assert!(e.to_string().contains(POD_MIGRATION), "{e}");
}

/// The older names Carina's documentation still shows mean the same,
/// and are reported as deprecated.
#[test]
fn deprecated_aliases() {
    let p = Parameters::parse(&map(&[
        (DISK_TYPE_ALIAS, "carina-raw-ssd"),
        (EXCLUSIVITY_ALIAS, "true"),
    ]))
    .expect("valid");
    assert_eq!(p.group.as_deref(), Some("carina-raw-ssd"));
    assert!(p.exclusive);
    assert_eq!(p.deprecated, [DISK_TYPE_ALIAS, EXCLUSIVITY_ALIAS]);
    // Both spellings at once must agree.
    let p =
        Parameters::parse(&map(&[(DISK_TYPE_ALIAS, "a"), (DISK_GROUP, "a")])).expect("agreeing");
    assert_eq!(p.group.as_deref(), Some("a"));
    let err = Parameters::parse(&map(&[(DISK_TYPE_ALIAS, "a"), (DISK_GROUP, "b")]))
        .expect_err("contradicting")
        .to_string();
    assert!(err.contains("carina.storage.io/disk-type"), "{err}");
    assert!(err.contains("contradicts"), "{err}");
    // Bad values name the key the request used.
    let err = Parameters::parse(&map(&[(EXCLUSIVITY_ALIAS, "yes")]))
        .expect_err("not a bool")
        .to_string();
    assert!(err.contains("exclusivity-disk"), "{err}");
}

#[test]
fn bcache_parameters() {
    let p = Parameters::parse(&map(&[
        (BACKEND_TYPE_ALIAS, "hdd"),
        (CACHE_TYPE_ALIAS, "ssd"),
        (CACHE_RATIO, "50"),
        (CACHE_POLICY, "writeback"),
    ]))
    .expect("Carina's older spellings");
    assert_eq!(
        p.bcache,
        Some(BcacheParams {
            backend_group: "hdd".into(),
            cache_group: "ssd".into(),
            cache_ratio: 50,
            cache_policy: "writeback".into(),
        })
    );
    assert_eq!(p.deprecated, [BACKEND_TYPE_ALIAS, CACHE_TYPE_ALIAS]);
    let p = Parameters::parse(&map(&[
        (BACKEND_GROUP, "hdd"),
        (CACHE_GROUP, "ssd"),
        (CACHE_RATIO, "100"),
        (EXCLUSIVE, "false"),
    ]))
    .expect("policy defaults");
    assert_eq!(p.bcache.expect("bcache").cache_policy, "writethrough");
    let bcache = [
        (BACKEND_GROUP, "hdd"),
        (CACHE_GROUP, "ssd"),
        (CACHE_RATIO, "10"),
    ];
    let cases = [
        (
            (EXCLUSIVE, "true"),
            "exclusively-raw-disk\"]: cannot be combined",
        ),
        ((CACHE_RATIO, "101"), "cache-disk-ratio"),
        ((CACHE_RATIO, "1.5"), "cache-disk-ratio"),
        ((CACHE_POLICY, "Writeback"), "cache-policy"),
        ((CACHE_TYPE_ALIAS, "other"), "contradicts"),
    ];
    for (extra, want) in cases {
        let mut pairs = bcache.to_vec();
        pairs.retain(|(k, _)| *k != extra.0);
        pairs.push(extra);
        let err = Parameters::parse(&map(&pairs))
            .expect_err("invalid")
            .to_string();
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    let err = Parameters::parse(&map(&[(CACHE_TYPE_ALIAS, "ssd"), (CACHE_RATIO, "5")]))
        .expect_err("no backend group")
        .to_string();
    assert!(err.contains("backend-disk-group-name"), "{err}");
}

#[test]
fn errors_name_the_key() {
    let cases = [
        (vec![(FS_TYPE, "btrfs")], "unsupported filesystem"),
        (vec![(EXCLUSIVE, "yes")], "exclusively-raw-disk"),
        (vec![(DISK_GROUP, "")], "disk-group-name"),
        (vec![(CACHE_RATIO, "50")], "backend-disk-group-name"),
        (
            vec![
                (BACKEND_GROUP, "a"),
                (CACHE_GROUP, "b"),
                (CACHE_RATIO, "-1"),
            ],
            "cache-disk-ratio",
        ),
        // Known keys keep their checks beside unknown ones.
        (
            vec![("carina.storage.io/volume-type", "lvm"), (EXCLUSIVE, "yes")],
            "exclusively-raw-disk",
        ),
        (
            vec![
                (BACKEND_GROUP, "a"),
                (CACHE_GROUP, "b"),
                (CACHE_RATIO, "5"),
                (CACHE_POLICY, "fast"),
            ],
            "cache-policy",
        ),
    ];
    for (pairs, want) in cases {
        let err = Parameters::parse(&map(&pairs))
            .expect_err("invalid")
            .to_string();
        assert!(err.contains(want), "{pairs:?}: {err}");
    }
}

/// Go Carina accepted any `carina.storage.io/*` key (a StorageClass
/// cannot be changed); so does this driver, listing it for the report.
#[test]
fn unknown_carina_keys_are_accepted_and_listed() {
    let p = Parameters::parse(&map(&[
        ("carina.storage.io/disk-group", "x"),
        ("carina.storage.io/allow-pod-migration-if-notready", "true"),
        (DISK_GROUP, "carina-vg-ssd"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("other.example/key", "kept"),
    ]))
    .expect("accepted");
    assert_eq!(
        p.unknown,
        [
            "carina.storage.io/allow-pod-migration-if-notready",
            "carina.storage.io/disk-group"
        ]
    );
    assert_eq!(p.group.as_deref(), Some("carina-vg-ssd"));
    assert!(!p.pod_migration, "the changelog's spelling is not the key");
    assert_eq!(p.other.len(), 2, "{:?}", p.other);
}

/// Go Carina's documented bcache example gives `disk-group-name` beside
/// the bcache keys: the volume is tiered, backed by the backend group, and
/// `disk-group-name` is reported as without effect.
#[test]
fn go_bcache_example_with_disk_group_name() {
    let p = Parameters::parse(&map(&[
        (FS_TYPE, "xfs"),
        (BACKEND_GROUP, "hdd"),
        (CACHE_GROUP, "carina-vg-ssd"),
        (CACHE_RATIO, "50"),
        (CACHE_POLICY, "writethrough"),
        (DISK_GROUP, "carina-vg-hdd"),
        (EXCLUSIVE, "false"),
    ]))
    .expect("Go's documented example");
    let b = p.bcache.expect("tiered");
    assert_eq!(b.backend_group, "hdd");
    assert_eq!(b.cache_group, "carina-vg-ssd");
    assert_eq!(b.cache_ratio, 50);
    assert_eq!(p.group, None, "the backing group is the backend group");
    assert_eq!(
        p.ignored,
        [(DISK_GROUP.to_string(), super::compat::BESIDE_BCACHE)]
    );
    // The older key name is read the same way.
    let p = Parameters::parse(&map(&[
        (BACKEND_GROUP, "hdd"),
        (CACHE_GROUP, "ssd"),
        (CACHE_RATIO, "10"),
        (DISK_TYPE_ALIAS, "hdd"),
    ]))
    .expect("older key beside bcache");
    assert!(p.bcache.is_some());
    assert_eq!(p.group, None);
}

/// Without a ratio, or with "0", Go Carina made a plain volume in
/// `disk-group-name` and read no bcache key.
#[test]
fn no_cache_ratio_means_no_cache() {
    for ratio in [None, Some(""), Some("0")] {
        let mut pairs = vec![
            (BACKEND_GROUP, "hdd"),
            (CACHE_GROUP, "ssd"),
            (CACHE_POLICY, "anything"),
            (DISK_GROUP, "carina-vg-hdd"),
        ];
        pairs.extend(ratio.map(|r| (CACHE_RATIO, r)));
        let p = Parameters::parse(&map(&pairs)).expect("a plain volume");
        assert_eq!(p.bcache, None, "{ratio:?}");
        assert_eq!(p.group.as_deref(), Some("carina-vg-hdd"));
        assert_eq!(p.ignored.len(), pairs.len() - 1, "{:?}", p.ignored);
    }
}

/// The mkfs options are kept as given and checked for the class's
/// filesystem (ext4 when none) when asked, naming the key.
#[test]
fn mkfs_options_are_checked_for_the_filesystem() {
    let check = |pairs: &[(&str, &str)]| {
        Parameters::parse(&map(pairs))
            .expect("parsed")
            .mkfs_options()
            .map(|o| o.map(|o| o.args().to_vec()))
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        check(&[(FS_TYPE, "xfs"), (MKFS_OPTIONS, "-i size=1024")]),
        Ok(Some(vec!["-i".to_string(), "size=1024".to_string()]))
    );
    assert_eq!(check(&[(MKFS_OPTIONS, "  ")]), Ok(None));
    let e = check(&[(MKFS_OPTIONS, "-d /etc")]).expect_err("refused");
    assert!(e.contains("mkfs-options\"]: -d is not an option"), "{e}");
    let e = check(&[(FS_TYPE, "xfs"), (MKFS_OPTIONS, "-O ^has_journal")]).expect_err("refused");
    assert!(
        e.contains("-O is not an option Carina passes to mkfs.xfs"),
        "{e}"
    );
}
