//! The CRD YAML and the API reference committed in the repository are exactly what the types
//! generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["crds", "charts/hoststack/crds"] {
        for (file, crd) in hoststack_crds::manifests::crds() {
            let path = root.join(dir).join(file);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                committed == hoststack_crds::manifests::to_yaml(&crd),
                "{} differs from what the types generate: run `cargo run -p hoststack-crds --bin crdgen` and commit the result",
                path.display()
            );
        }
    }
    let reference = std::fs::read_to_string(root.join("docs/api.md")).unwrap_or_default();
    assert!(
        reference == hoststack_crds::manifests::api_reference(),
        "docs/api.md differs from what the types generate: run `cargo run -p hoststack-crds --bin crdgen` and commit the result"
    );
}
