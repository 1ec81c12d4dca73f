//! The CRD YAML committed in the repository is exactly what the types generate.

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
}
