//! The binaries of the users' image carry no debug sections: hoststack-operator and
//! hoststack-agent built as the Dockerfile's builder builds them (`cargo build --release
//! --locked -p hoststack-operator -p hoststack-agent`, the workspace's release profile, no
//! features) have no DWARF section (`.debug_*`, `.zdebug_*`) in their ELF section headers.
//!
//! Built at `opt-level = 0` (`CARGO_PROFILE_RELEASE_OPT_LEVEL`), everything else the release
//! profile's: which sections a binary carries is set by `debug` and `strip` (and any
//! per-package override of them, which the build keeps), not by the optimizer, and the
//! optimized build cost 450 CPU-seconds of every CI run (13 minutes on a fresh machine, where
//! it also builds every dependency), for this one check.
//!
//! The release build has a target directory of its own under the cache
//! (`${HOSTSTACK_CACHE:-/var/cache/hoststack}/target-release`), outside the repository, so a
//! run rebuilds only the workspace's crates and never waits on the workspace's cargo lock.

use object::{Object, ObjectSection, SectionFlags};
use std::path::PathBuf;
use std::process::Command;

/// The binaries the Dockerfile copies into the users' image.
const IMAGE_BINARIES: [&str; 2] = ["hoststack-operator", "hoststack-agent"];

/// `${HOSTSTACK_CACHE:-/var/cache/hoststack}/target-release`.
fn release_target_dir() -> PathBuf {
    std::env::var_os("HOSTSTACK_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/hoststack"), PathBuf::from)
        .join("target-release")
}

/// Builds the image's binaries as the Dockerfile's builder does, unoptimized (the module's
/// doc says why); their directory.
fn build_as_the_dockerfile_does() -> PathBuf {
    let target = release_target_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--quiet", "--release", "--locked"])
        .args(IMAGE_BINARIES.iter().flat_map(|bin| ["-p", bin]))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("CARGO_TARGET_DIR", &target)
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0");
    // The test's own package variables would leak into the build scripts that watch them
    // (ring's), which would then rebuild on every other run (as in scripts/build-images.sh).
    const TEST_ONLY: [&str; 6] = [
        "PKG_",
        "MANIFEST_",
        "CRATE_",
        "BIN_",
        "PRIMARY_",
        "TARGET_TMPDIR",
    ];
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name
            .strip_prefix("CARGO_")
            .is_some_and(|rest| TEST_ONLY.iter().any(|p| rest.starts_with(p)))
        {
            build.env_remove(&*name);
        }
    }
    let status = build.status().expect("cargo runs");
    assert!(status.success(), "the release build failed: {status}");
    target.join("release")
}

/// The names of the DWARF sections of an ELF file: `.debug_*` and `.zdebug_*` sections that
/// are not loaded (`.debug_gdb_scripts` is loaded: it names gdb's pretty printers, no DWARF).
fn debug_sections(elf: &[u8]) -> Vec<String> {
    let file = object::File::parse(elf).expect("an ELF file");
    file.sections()
        .filter(|s| match s.flags() {
            SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_ALLOC) == 0,
            _ => true,
        })
        .filter_map(|s| s.name().ok().map(str::to_string))
        .filter(|name| name.starts_with(".debug_") || name.starts_with(".zdebug_"))
        .collect()
}

#[test]
fn the_users_image_binaries_carry_no_debug_sections() {
    let dir = build_as_the_dockerfile_does();
    for bin in IMAGE_BINARIES {
        let path = dir.join(bin);
        let elf = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let sections = debug_sections(&elf);
        assert!(
            sections.is_empty(),
            "{} ({} bytes) carries debug sections: {sections:?}",
            path.display(),
            elf.len()
        );
    }
}
