//! Compiles the built-in XDP programs (`bpf/*.c`) with clang into BPF objects that the agent
//! embeds (`include_bytes!` of `$OUT_DIR/<name>.o`).
//!
//! `clang -O2 -g -target bpf`, without CO-RE: the programs read only packet bytes, so they load
//! on kernels without BTF for vmlinux. The headers come from libbpf-dev (`bpf/bpf_helpers.h`)
//! and the kernel UAPI headers. `CLANG` names another clang binary.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The built-in programs, by source file stem.
const PROGRAMS: [&str; 2] = ["blocklist", "pass"];

fn main() {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    // Debian keeps asm/types.h under the multiarch include directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    println!("cargo:rerun-if-env-changed=CLANG");
    for program in PROGRAMS {
        let source = format!("bpf/{program}.c");
        println!("cargo:rerun-if-changed={source}");
        let object = out.join(format!("{program}.o"));
        let result = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .arg("-I")
            .arg(&multiarch)
            .arg("-c")
            .arg(&source)
            .arg("-o")
            .arg(&object)
            .output();
        match result {
            Err(e) => panic!(
                "building the built-in XDP programs needs clang (tried {clang:?}: {e}); install \
                 clang, llvm and libbpf-dev (scripts/setup.sh does), or set CLANG"
            ),
            Ok(o) if !o.status.success() => panic!(
                "clang failed to compile {source} ({}):\n{}\n(the programs need libbpf-dev's \
                 bpf/bpf_helpers.h and the kernel UAPI headers)",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(_) => {}
        }
    }
}
