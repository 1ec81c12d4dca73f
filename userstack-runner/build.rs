//! Compiles the AF_XDP redirect program (`bpf/redirect.c`) with clang into the two BPF
//! objects the AF_XDP device embeds (`include_bytes!` of `$OUT_DIR/redirect.o`, which stamps
//! the frames it redirects, and `$OUT_DIR/redirect-unstamped.o`, built with `-DNO_RX_STAMPS`
//! for kernels that refuse the stamping helper to XDP programs).
//!
//! `clang -O2 -g -target bpf`, without CO-RE: the program reads only packet bytes, so it loads
//! on kernels without BTF for vmlinux (as the agent's programs do, see node-agent/build.rs).
//! The headers come from libbpf-dev (`bpf/bpf_helpers.h`) and the kernel UAPI headers.
//! `CLANG` names another clang binary. With the cargo feature `dpdk` it also runs
//! `dpdk/build_dpdk.rs` (DPDK bindings and the C shim).

use std::env;
use std::path::PathBuf;
use std::process::Command;

#[cfg(feature = "dpdk")]
#[path = "dpdk/build_dpdk.rs"]
mod build_dpdk;

fn main() {
    // The DPDK bindings and shim, only with the cargo feature `dpdk` (CARGO_FEATURE_DPDK).
    #[cfg(feature = "dpdk")]
    build_dpdk::build();
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets CARGO_CFG_TARGET_ARCH");
    // Debian keeps asm/types.h under the multiarch include directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let source = "bpf/redirect.c";
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rerun-if-changed={source}");
    // The stamped build, and one without stamps for kernels that refuse its helper
    // (src/device/xdp_redirect.rs loads the second where the first is refused).
    for (object, defines) in [
        ("redirect.o", &[][..]),
        ("redirect-unstamped.o", &["-DNO_RX_STAMPS"][..]),
    ] {
        let result = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
            .args(defines)
            .arg("-I")
            .arg(&multiarch)
            .arg("-c")
            .arg(source)
            .arg("-o")
            .arg(out.join(object))
            .output();
        match result {
            Err(e) => panic!(
                "building the AF_XDP redirect program needs clang (tried {clang:?}: {e}); \
                 install clang, llvm and libbpf-dev (scripts/setup.sh does), or set CLANG"
            ),
            Ok(o) if !o.status.success() => panic!(
                "clang failed to compile {source} {defines:?} ({}):\n{}\n(the program needs \
                 libbpf-dev's bpf/bpf_helpers.h and the kernel UAPI headers)",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(_) => {}
        }
    }
}
