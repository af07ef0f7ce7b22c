//! Unit tests of `inventory`'s removal: a revision, a whole model and a quantized
//! variant, in caches laid out on disk as the tools write them.

use super::*;

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// A model folder with two snapshots sharing one blob, as huggingface_hub lays it out.
fn hub(root: &Path) -> PathBuf {
    let model = root.join("models--org--m");
    fs::create_dir_all(model.join("blobs")).expect("mkdir");
    for (blob, body) in [("shared", "s"), ("only-a", "aa"), ("only-b", "bbb")] {
        fs::write(model.join("blobs").join(blob), body).expect("write");
    }
    for (commit, blobs) in [(A, ["shared", "only-a"]), (B, ["shared", "only-b"])] {
        let snap = model.join("snapshots").join(commit);
        fs::create_dir_all(&snap).expect("mkdir");
        for (i, blob) in blobs.iter().enumerate() {
            std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(format!("f{i}")))
                .expect("link");
        }
    }
    fs::create_dir_all(model.join("refs")).expect("mkdir");
    fs::write(model.join("refs/main"), B).expect("write");
    model
}

#[test]
fn a_revision_goes_with_its_own_blobs_and_the_shared_one_stays() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = hub(root.path());
    let listing = list(root.path(), &root.path().join("q")).expect("list");
    assert_eq!(listing.models.len(), 1);
    assert_eq!(listing.models[0].repo, "org/m");
    assert_eq!(listing.models[0].size_on_disk, 6);
    let revs = &listing.models[0].revisions;
    assert_eq!(
        (revs[1].refs.clone(), revs[1].status, revs[1].size),
        (vec!["main".to_owned()], "unverified", 4)
    );
    let removal = plan_removal(&listing, &Target::parse("org/m@main")).expect("plan");
    assert_eq!(removal.bytes, 3);
    remove(&removal).expect("remove");
    assert!(model.join("blobs/shared").exists() && model.join("blobs/only-a").exists());
    assert!(!model.join("blobs/only-b").exists() && !model.join("refs/main").exists());
    assert!(!model.join("snapshots").join(B).exists());
    assert!(model.join("snapshots").join(A).join("f0").exists());
}

#[test]
fn a_model_goes_whole_but_what_sous_did_not_write_stays() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = hub(root.path());
    fs::write(model.join("notes.txt"), "mine").expect("write");
    let listing = list(root.path(), &root.path().join("q")).expect("list");
    let removal = plan_removal(&listing, &Target::parse("org/m")).expect("plan");
    assert_eq!(removal.kept, [model.join("notes.txt")]);
    remove(&removal).expect("remove");
    assert!(model.join("notes.txt").exists());
    assert!(!model.join("blobs").exists() && !model.join("snapshots").exists());
    let err = plan_removal(&listing, &Target::parse("org/n")).expect_err("unknown");
    assert!(
        matches!(err, InventoryError::Unknown { suggestion: Some(ref s), .. } if s == "org/m"),
        "{err}"
    );
}

#[test]
fn a_variant_needs_its_marker_and_its_lock() {
    let root = tempfile::tempdir().expect("tempdir");
    let q = root.path().join("quantized");
    fs::create_dir_all(q.join("done")).expect("mkdir");
    fs::create_dir_all(q.join("foreign")).expect("mkdir");
    fs::write(
        q.join("done").join(QUANTIZE_MARKER),
        r#"{"fingerprint":"f","summary":{"scheme":"nvfp4a16","repo":"org/m"}}"#,
    )
    .expect("write");
    fs::write(q.join("foreign/x"), "x").expect("write");
    let listing = list(root.path(), &q).expect("list");
    assert_eq!(listing.variants.len(), 2);
    assert_eq!(listing.variants[0].scheme.as_deref(), Some("nvfp4a16"));
    let foreign = plan_removal(&listing, &Target::parse("foreign")).expect("plan");
    assert!(foreign.paths.is_empty());
    let done = plan_removal(&listing, &Target::parse("done")).expect("plan");
    let held = variant_lock(&q.join("done")).expect("lock");
    assert!(matches!(remove(&done), Err(InventoryError::Busy { .. })));
    drop(held);
    remove(&done).expect("remove");
    assert!(!q.join("done").exists() && q.join("foreign/x").exists());
}
