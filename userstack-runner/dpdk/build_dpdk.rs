//! The build step of the cargo feature `dpdk`, included by `build.rs` (as a module) only with
//! that feature: asks `pkg-config libdpdk` for DPDK's flags, generates Rust bindings for the
//! functions the DPDK device calls (`$OUT_DIR/dpdk_bindings.rs`, bindgen over `dpdk/shim.h`)
//! and compiles `dpdk/shim.c`, the real functions around DPDK's inline ones; the PMD
//! directory goes to the crate as `HOSTSTACK_DPDK_PMD_DIR`.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// `pkg-config <args> libdpdk`, split on whitespace.
fn pkg_config(args: &[&str]) -> Vec<String> {
    let out = Command::new("pkg-config")
        .args(args)
        .arg("libdpdk")
        .output()
        .unwrap_or_else(|e| panic!("the feature dpdk needs pkg-config ({e})"));
    assert!(
        out.status.success(),
        "`pkg-config {} libdpdk` failed: the feature dpdk needs DPDK's development files \
         (Debian: dpdk-dev; scripts/setup.sh installs it):\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Generates the bindings, compiles the shim and tells cargo what to link.
pub fn build() {
    println!("cargo:rerun-if-changed=dpdk/shim.c");
    println!("cargo:rerun-if-changed=dpdk/shim.h");
    println!("cargo:rerun-if-changed=dpdk/build_dpdk.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // -I dirs, `-include rte_config.h` and `-march=corei7`: DPDK's headers need all of them.
    let cflags = pkg_config(&["--cflags"]);

    let mut shim = cc::Build::new();
    shim.file("dpdk/shim.c")
        .warnings(true)
        .warnings_into_errors(true);
    for flag in &cflags {
        shim.flag(flag);
    }
    shim.compile("hoststack_dpdk_shim");

    let bindings = bindgen::Builder::default()
        .header("dpdk/shim.h")
        .clang_args(&cflags)
        .allowlist_function("hs_.*")
        .allowlist_function("rte_eal_init")
        .allowlist_function("rte_eal_cleanup")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_eth_dev_get_port_by_name")
        .allowlist_function("rte_eth_dev_info_get")
        .allowlist_function("rte_eth_dev_configure")
        .allowlist_function("rte_eth_dev_socket_id")
        .allowlist_function("rte_eth_rx_queue_setup")
        .allowlist_function("rte_eth_tx_queue_setup")
        .allowlist_function("rte_eth_dev_start")
        .allowlist_function("rte_eth_dev_stop")
        .allowlist_function("rte_eth_dev_close")
        .allowlist_function("rte_eth_macaddr_get")
        .allowlist_function("rte_eth_dev_get_mtu")
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_mempool_free")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen over dpdk/shim.h failed ({e}); it needs libclang (Debian: \
                 libclang-dev or clang) and DPDK's headers"
            )
        });
    bindings
        .write_to_file(out.join("dpdk_bindings.rs"))
        .expect("writing the DPDK bindings");

    println!("cargo:rustc-env=HOSTSTACK_DPDK_PMD_DIR={}", pmd_dir());
    for flag in pkg_config(&["--libs"]) {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
}

/// The directory of DPDK's driver plugins (`<libdir>/dpdk/pmds-<ABI>`), which the device
/// names with EAL's `-d` (Debian's shared build loads no PMD by itself).
fn pmd_dir() -> String {
    let libdir = pkg_config(&["--variable=libdir"]).concat();
    let base = PathBuf::from(libdir).join("dpdk");
    let entries = std::fs::read_dir(&base)
        .unwrap_or_else(|e| panic!("DPDK's plugin directory {}: {e}", base.display()));
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("pmds-"))
        })
        .collect();
    dirs.sort();
    let dir = dirs
        .pop()
        .unwrap_or_else(|| panic!("no pmds-* directory in {}", base.display()));
    dir.display().to_string()
}
