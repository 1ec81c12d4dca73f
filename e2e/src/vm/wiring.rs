//! A VM node's namespace wiring: the node's veth (eth0, the lab bridge's port) gives up its
//! address to the guest and joins a bridge `br0` in the namespace together with the two taps
//! qemu opens there (`tapm` and the multi-queue `tapd`), so both guest NICs sit on the lab
//! bridge. Everything lives in the node's namespace and goes with it.

use super::qemu::{DATA_TAP, MGMT_TAP};
use crate::command::{cmd, output, run};
use crate::Result;

/// Wires namespace `ns` for a VM (see the module doc).
pub(crate) fn wire(ns: &str) -> Result<()> {
    let batch = format!(
        "addr flush dev eth0\n\
         link add br0 type bridge\n\
         link set eth0 master br0\n\
         tuntap add dev {MGMT_TAP} mode tap\n\
         tuntap add dev {DATA_TAP} mode tap multi_queue\n\
         link set {MGMT_TAP} master br0 up\n\
         link set {DATA_TAP} master br0 up\n\
         link set br0 up\n"
    );
    run(
        &mut cmd("ip", &["-n", ns, "-batch", "-"]),
        Some(batch.as_bytes()),
    )
    .map(drop)
}

/// Deletes the taps in `ns` (after qemu has exited); the failures.
pub(crate) fn unwire(ns: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for tap in [MGMT_TAP, DATA_TAP] {
        match output(&mut cmd("ip", &["-n", ns, "link", "delete", tap]), None) {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let gone = stderr.contains("Cannot find device")
                    || stderr.contains("Cannot open network namespace");
                if !gone {
                    errors.push(format!("deleting {tap} in {ns}: {}", stderr.trim()));
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    errors
}
