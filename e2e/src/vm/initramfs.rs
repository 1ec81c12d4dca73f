//! The guest's initramfs, built by the lab itself: the host's busybox-static, the kernel's own
//! modules for virtio-net, 9p and vfio (with every module they depend on, in dependency order
//! read from each module's `depends=`), busybox `init` as PID 1 and four small scripts:
//!
//! - `/etc/hoststack-setup` (sysinit): loads the modules, mounts the host's root read-only
//!   over 9p at /host and the node's writable share at /share, reads `/share/config.env`,
//!   configures the management NIC (address, default route via the lab bridge), prepares the
//!   chroot (/proc, /sys, devtmpfs, a tmpfs /run, hugetlbfs at /dev/hugepages, the share
//!   bind-mounted at its host path, the agent's state directory bind-mounted from the share),
//!   sets the clock from the host's (`/etc/hoststack-clock`), writes `/share/ready` and starts
//!   the agent (`<share>/agent.sh` inside the chroot).
//! - `/etc/hoststack-clock`: run by the host's python3 in the chroot, it steps the guest's clock
//!   to the host's within milliseconds. The RTC gives the guest whole
//!   seconds only (it boots up to a second behind), and the lab orders what the guest's agent
//!   logs with what the host's API server logs.
//! - `/etc/hoststack-runner` (respawned by init): the command channel, see [`super::channel`],
//!   and the guest's heartbeat, see [`super::progress`].
//! - `/etc/inittab`: the two above.
//!
//! The archive is written as an uncompressed `newc` cpio, which the kernel unpacks itself.

use super::kernel::GuestKernel;
use crate::command::cmd;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The modules the guest needs; their dependencies are added.
pub(crate) const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "9pnet_virtio",
    "9p",
    "vfio_iommu_type1",
    "vfio_pci",
    // The agent's firewall: nf_tables (with its sets, lookups and counters), the SYN rate
    // limit and the notrack rule. nf_tables needs libcrc32c, whose crc32c algorithm is only a
    // soft dependency (no `depends=`): crc32c_generic goes first.
    "crc32c_generic",
    "nf_tables",
    "nft_limit",
    "nft_ct",
    // The evaluation's netem link (userstack-eval link): veth pairs between namespaces,
    // netem feeding tbf, and per-port ACK delays (prio with u32 filters).
    "veth",
    "sch_netem",
    "sch_tbf",
    "sch_prio",
    "cls_u32",
];

/// The host's statically linked busybox (package busybox-static).
const BUSYBOX: &str = "/bin/busybox";

const INITTAB: &str = "\
::sysinit:/bin/sh /etc/hoststack-setup
::respawn:/bin/sh /etc/hoststack-runner
";

const SETUP: &str = r#"# hoststack VM node: set-up (busybox init's sysinit, see e2e/src/vm/initramfs.rs)
/bin/busybox --install -s /bin
export PATH=/bin
log() { echo "hoststack-vm: $*"; }
fail() { log "FAILED: $*"; poweroff -f; }
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
for m in $(cat /modules/order); do
    insmod "/modules/$m.ko" || log "insmod $m failed"
done
log "modules loaded: $(cat /modules/order | tr '\n' ' ')"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro host /host || fail "mounting the host root"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 share /share || fail "mounting the share"
. /share/config.env || fail "reading /share/config.env"
if_of() {
    for d in /sys/class/net/*; do
        [ "$(cat "$d/address")" = "$1" ] && { echo "${d##*/}"; return; }
    done
}
[ "$(if_of "$MGMT_MAC")" = eth0 ] || fail "the management NIC ($MGMT_MAC) is $(if_of "$MGMT_MAC"), not eth0"
[ "$(if_of "$DATA_MAC")" = eth1 ] || fail "the data NIC ($DATA_MAC) is $(if_of "$DATA_MAC"), not eth1"
ip link set lo up
ip addr add "$MGMT_ADDR" dev eth0 || fail "addressing eth0"
ip link set eth0 up
ip route add default via "$GATEWAY" dev eth0 || fail "the default route"
ip link set eth1 up
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs -o mode=755 run /host/run
# The agent's state directory is the share's state/, so that it outlives a reboot as a node's
# disk does.
mkdir -p /share/state "/host$STATE_DIR"
mount --bind /share/state "/host$STATE_DIR" || fail "bind-mounting the state directory at $STATE_DIR"
mkdir -p /host/dev/hugepages
mount -t hugetlbfs hugetlbfs /host/dev/hugepages
mount --bind /share "/host$HOST_SHARE" || fail "bind-mounting the share at $HOST_SHARE"
log "clock: $(/bin/chroot /host /usr/bin/python3 - "$HOST_SHARE/clock" < /etc/hoststack-clock 2>&1)"
log "ready: eth0 $MGMT_ADDR, eth1 up, host root at /host, share at $HOST_SHARE"
cut -d' ' -f1 /proc/uptime > /share/ready
/bin/chroot /host /bin/sh "$HOST_SHARE/agent.sh" </dev/null >/dev/null 2>&1 &
"#;

/// Steps the guest's clock to the host's, in one process (a process started in a slow guest
/// takes longer than the precision sought). A file written on the share gets the host's time as
/// its mtime, read back over 9p: between the guest's clock just before and just after the
/// write, the host's lead is the mtime minus their middle, give or take half their distance,
/// so the narrowest of 20 writes is taken; the clock is stepped by it, then measured and
/// stepped once more (the first step may itself take a moment).
const CLOCK: &str = r#"# hoststack VM node: the clock from the host's (see e2e/src/vm/initramfs.rs)
import os, sys, time
path = sys.argv[1]
def lead():
    best = None
    for _ in range(20):
        before = time.time_ns()
        with open(path, "w") as f:
            f.write("x")
        after = time.time_ns()
        host = os.stat(path).st_mtime_ns
        if best is None or after - before < best[1]:
            best = (host - (before + after) // 2, after - before)
    return best
steps = []
for _ in range(2):
    ahead, width = lead()
    time.clock_settime_ns(time.CLOCK_REALTIME, time.time_ns() + ahead)
    steps.append(ahead)
ahead, width = lead()
os.remove(path)
print("stepped by %s ns; now %d ns behind the host (+/- %d ns)" % (" + ".join(map(str, steps)), ahead, width // 2))
"#;

const RUNNER: &str = r#"# hoststack VM node: the command channel (see e2e/src/vm/channel.rs)
export PATH=/bin
CHROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
while [ ! -f /share/ready ]; do sleep 1; done
cd /share/cmd || exit 1
turn=0
while :; do
    for f in *.sh *.bb; do
        [ -e "$f" ] || continue
        n=${f%.*}
        mv "$f" "$n.run" || continue
        case $f in
        *.sh) ( PATH=$CHROOT_PATH /bin/chroot /host /bin/sh -c "$(cat "$n.run")" >"$n.out" 2>"$n.err" </dev/null
                echo $? >"$n.rc.tmp"; mv "$n.rc.tmp" "$n.rc" ) & ;;
        *.bb) ( /bin/sh "$n.run" >"$n.out" 2>"$n.err" </dev/null
                echo $? >"$n.rc.tmp"; mv "$n.rc.tmp" "$n.rc" ) & ;;
        esac
    done
    # The heartbeat: the host counts the guest's progress in these turns (see
    # e2e/src/vm/progress.rs).
    turn=$((turn+1))
    echo "$turn $(cut -d' ' -f1 /proc/uptime)" > ../heartbeat.tmp && mv ../heartbeat.tmp ../heartbeat
    sleep 0.2
done
"#;

/// Builds the initramfs for `kernel` at `out`.
pub(crate) fn build(kernel: &GuestKernel, out: &Path) -> Result<()> {
    let index = module_index(&kernel.modules)?;
    let mut images = BTreeMap::new();
    let mut order = Vec::new();
    for name in MODULES {
        add_with_dependencies(name, &index, &mut images, &mut order, &mut Vec::new())?;
    }
    let busybox = std::fs::read(BUSYBOX)
        .map_err(|e| Error::io(format!("reading {BUSYBOX} (install busybox-static)"), e))?;
    let mut archive = Cpio::default();
    for dir in [
        "bin", "dev", "etc", "host", "modules", "proc", "run", "share", "sys", "tmp",
    ] {
        archive.dir(dir);
    }
    archive.char_device("dev/console", 5, 1);
    archive.file("bin/busybox", 0o755, &busybox);
    archive.symlink("bin/sh", "busybox");
    archive.symlink("init", "bin/busybox");
    archive.file("etc/inittab", 0o644, INITTAB.as_bytes());
    archive.file("etc/hoststack-setup", 0o755, SETUP.as_bytes());
    archive.file("etc/hoststack-runner", 0o755, RUNNER.as_bytes());
    archive.file("etc/hoststack-clock", 0o644, CLOCK.as_bytes());
    for name in &order {
        archive.file(&format!("modules/{name}.ko"), 0o644, &images[name]);
    }
    let mut list = order.join("\n");
    list.push('\n');
    archive.file("modules/order", 0o644, list.as_bytes());
    std::fs::write(out, archive.finish())
        .map_err(|e| Error::io(format!("writing {}", out.display()), e))
}

/// A module's canonical name: the file name without `.ko[.xz|.zst]`, `-` as `_`.
pub(crate) fn module_name(file: &str) -> Option<String> {
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    Some(stem.replace('-', "_"))
}

/// Every module file under `dir` by canonical name.
fn module_index(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut index = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| Error::io(format!("listing {}", d.display()), e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(name) = module_name(&entry.file_name().to_string_lossy()) {
                index.insert(name, path);
            }
        }
    }
    Ok(index)
}

/// The modules a module's `.modinfo` names in `depends=` (comma separated, possibly empty).
pub(crate) fn dependencies(image: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"depends=";
    image
        .windows(KEY.len())
        .enumerate()
        .filter(|(i, w)| *w == KEY && (*i == 0 || image[i - 1] == 0))
        .filter_map(|(i, _)| {
            let rest = &image[i + KEY.len()..];
            let end = rest.iter().position(|b| *b == 0)?;
            std::str::from_utf8(&rest[..end]).ok()
        })
        .flat_map(|list| list.split(','))
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

/// The module's ELF image, decompressed when the file is `.ko.xz`, `.ko.zst` or `.ko.gz`
/// (busybox insmod loads plain ELF only).
fn module_image(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => std::fs::read(path).map_err(|e| Error::io(format!("reading {name}"), e)),
        Some(tool) => {
            let mut decompress = cmd(tool, &["-dc"]);
            decompress.arg(path);
            let out = crate::command::output(&mut decompress, None)?;
            if !out.status.success() {
                return Err(Error::Setup(format!(
                    "{tool} -dc {name}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(out.stdout)
        }
    }
}

/// Adds `name` after everything it depends on (depth first); `path` detects cycles.
fn add_with_dependencies(
    name: &str,
    index: &BTreeMap<String, PathBuf>,
    images: &mut BTreeMap<String, Vec<u8>>,
    order: &mut Vec<String>,
    path: &mut Vec<String>,
) -> Result<()> {
    if images.contains_key(name) {
        return Ok(());
    }
    if path.iter().any(|p| p == name) {
        return Err(Error::Setup(format!(
            "kernel modules depend on each other in a cycle: {} -> {name}",
            path.join(" -> ")
        )));
    }
    let file = index.get(name).ok_or_else(|| {
        Error::Setup(format!(
            "the guest kernel has no module {name} (needed by {path:?})"
        ))
    })?;
    let image = module_image(file)?;
    path.push(name.to_string());
    for dep in dependencies(&image) {
        add_with_dependencies(&dep, index, images, order, path)?;
    }
    path.pop();
    images.insert(name.to_string(), image);
    order.push(name.to_string());
    Ok(())
}

/// A `newc` cpio archive under construction.
#[derive(Default)]
struct Cpio {
    bytes: Vec<u8>,
    inode: u32,
}

impl Cpio {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[], (0, 0));
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, data, (0, 0));
    }

    fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120_777, target.as_bytes(), (0, 0));
    }

    fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, 0o020_600, &[], (major, minor));
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8], (major, minor): (u32, u32)) {
        self.inode += 1;
        let size = u32::try_from(data.len()).expect("initramfs files are smaller than 4 GiB");
        let name_size = u32::try_from(name.len() + 1).expect("short names");
        let fields = [
            self.inode, mode, 0, 0, 1, 0, size, 0, 0, major, minor, name_size, 0,
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08x}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[], (0, 0));
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_and_dependencies() {
        assert_eq!(module_name("vfio-pci.ko").as_deref(), Some("vfio_pci"));
        assert_eq!(module_name("9p.ko.xz").as_deref(), Some("9p"));
        assert_eq!(
            module_name("virtio_net.ko.zst").as_deref(),
            Some("virtio_net")
        );
        assert_eq!(module_name("modules.order"), None);
        let modinfo = b"\x7fELF...\0license=GPL\0depends=vfio,vfio-pci-core,irqbypass\0intree=Y\0";
        assert_eq!(
            dependencies(modinfo),
            ["vfio", "vfio_pci_core", "irqbypass"]
        );
        assert!(dependencies(b"\0depends=\0name=virtio\0").is_empty());
        // "xdepends=" is another key, not depends=.
        assert!(dependencies(b"\0xdepends=a\0").is_empty());
    }

    #[test]
    fn cpio_entries_are_newc_and_aligned() {
        let mut archive = Cpio::default();
        archive.file("init", 0o755, b"#!/bin/sh\n");
        let bytes = archive.finish();
        assert!(bytes.starts_with(b"070701"));
        assert_eq!(bytes.len() % 4, 0);
        let header = std::str::from_utf8(&bytes[6..110]).expect("hex header");
        // mode (second field) and file size (seventh field).
        assert_eq!(&header[8..16], "000081ed");
        assert_eq!(&header[48..56], "0000000a");
        assert_eq!(&bytes[110..115], b"init\0");
        assert!(bytes.windows(10).any(|w| w == b"TRAILER!!!"));
    }
}
