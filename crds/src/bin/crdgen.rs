//! Writes the CRD YAML generated from the API types to `crds/*.yaml` and to the Helm chart's
//! `charts/hoststack/crds/`, and the API reference to `docs/api.md`. Run from anywhere in the workspace:
//! `cargo run -p hoststack-crds --bin crdgen`.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["crds", "charts/hoststack/crds"] {
        let dir = root.join(dir);
        std::fs::create_dir_all(&dir)?;
        for (file, crd) in hoststack_crds::manifests::crds() {
            let path = dir.join(file);
            std::fs::write(&path, hoststack_crds::manifests::to_yaml(&crd))?;
            println!("wrote {}", path.display());
        }
    }
    let reference = root.join("docs/api.md");
    std::fs::create_dir_all(root.join("docs"))?;
    std::fs::write(&reference, hoststack_crds::manifests::api_reference())?;
    println!("wrote {}", reference.display());
    Ok(())
}
