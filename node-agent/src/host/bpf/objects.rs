//! The BPF objects of the bpf port, through aya: loading the built-in programs, attaching them
//! through BPF links, pinning links, programs and maps, and reading and writing the pinned maps;
//! statfs and mount(2) for the bpffs they are pinned on.

use std::borrow::BorrowMut;
use std::fs;
use std::io;
use std::path::Path;

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Map, MapData, PerCpuArray};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::xdp::XdpLink;
use aya::programs::{loaded_programs, Xdp, XdpMode};
use aya::EbpfLoader;

use super::{AttachMode, AttachedProgram, Blocklist, LpmKey, Pins, Prefix, Program, XdpState};
use crate::host::files::c_path;

/// `f_type` of a bpffs in statfs(2).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Where bpffs is conventionally mounted; the agent mounts it there when needed.
const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// An aya error as an io::Error, with its chain of causes in the text.
fn error(what: &str, e: impl std::error::Error) -> io::Error {
    let mut text = format!("{what}: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    let kind = if text.contains("No such device") {
        io::ErrorKind::NotFound
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, text)
}

/// The interface index of `iface`; NotFound when there is none.
fn if_index(iface: &str) -> io::Result<u32> {
    let name = std::ffi::CString::new(iface)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {iface}"),
        ))
    } else {
        Ok(index)
    }
}

/// Whether `path` lies on a bpffs (its nearest existing ancestor does).
fn on_bpffs(path: &Path) -> io::Result<bool> {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let c = c_path(existing)?;
    // SAFETY: statfs fills the zeroed struct; `c` outlives the call.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(stat.f_type as i64 == BPF_FS_MAGIC)
}

/// Makes sure the pins' root lies on a bpffs: mounts one at /sys/fs/bpf when the root is
/// under it and nothing is mounted there; refuses a root elsewhere that is not on a bpffs.
fn ensure_bpffs(root: &Path) -> io::Result<()> {
    if on_bpffs(root)? {
        return Ok(());
    }
    if !root.starts_with(BPFFS_MOUNT) {
        return Err(io::Error::other(format!(
            "the bpffs root {} is not on a bpffs: mount one there (mount -t bpf bpf DIR) \
             or choose a root under {BPFFS_MOUNT}",
            root.display()
        )));
    }
    let target = c_path(Path::new(BPFFS_MOUNT))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("mounting a bpffs at {BPFFS_MOUNT}: {e}"),
        ));
    }
    tracing::info!(path = BPFFS_MOUNT, "mounted a bpffs");
    Ok(())
}

/// Creates the pins' directory on a bpffs.
fn prepare(pins: &Pins) -> io::Result<()> {
    ensure_bpffs(pins.root())?;
    fs::create_dir_all(pins.dir())
}

/// Removes `path` when it exists.
fn remove_pin(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io::Error::new(
            e.kind(),
            format!("unpinning {}: {e}", path.display()),
        )),
        _ => Ok(()),
    }
}

/// Removes the pins' directory when nothing is left in it.
fn remove_dir_if_empty(pins: &Pins) {
    if fs::read_dir(pins.dir()).is_ok_and(|mut d| d.next().is_none()) {
        let _ = fs::remove_dir(pins.dir());
    }
}

/// The name the kernel gives program `id`.
fn program_name(id: u32) -> String {
    loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .and_then(|p| p.name_as_str().map(str::to_string))
        .unwrap_or_default()
}

/// See [`super::Bpf::query_hook`].
pub fn query(iface: &str, pins: &Pins) -> io::Result<XdpState> {
    let index = match if_index(iface) {
        Ok(index) => Some(index),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let attached = match index {
        Some(index) => super::rtnetlink::attached(index)?
            .into_iter()
            .map(|(mode, id)| AttachedProgram {
                id,
                name: program_name(id),
                mode,
            })
            .collect(),
        None => Vec::new(),
    };
    let link_program = if pins.link().exists() {
        let link =
            PinnedLink::from_pin(pins.link()).map_err(|e| error("opening the pinned link", e))?;
        let info = FdLink::from(link)
            .info()
            .map_err(|e| error("reading the pinned link", e))?;
        Some(info.program_id())
    } else {
        None
    };
    Ok(XdpState {
        interface_gone: index.is_none(),
        attached,
        link_program,
        program_pinned: pins.program().exists(),
    })
}

/// See [`super::Bpf::attach`].
pub fn attach(iface: &str, pins: &Pins, program: Program, mode: AttachMode) -> io::Result<()> {
    let index = if_index(iface)?;
    prepare(pins)?;
    let mut ebpf = load(pins, program)?;
    let xdp = loaded(&mut ebpf, program)?;
    let aya_mode = match mode {
        AttachMode::Native => XdpMode::Driver,
        AttachMode::Generic => XdpMode::Skb,
        AttachMode::Offload => XdpMode::Hardware,
    };
    let link_id = xdp
        .attach_to_if_index(index, aya_mode)
        .map_err(|e| error("attaching", e))?;
    let link = xdp
        .take_link(link_id)
        .map_err(|e| error("taking the link", e))?;
    // A link the kernel made (bpf_link_create), not the netlink fallback: only those pin.
    let link = FdLink::try_from(link).map_err(|e| error("the kernel gave no BPF link", e))?;
    // The pinned link keeps the program attached; dropping it unpinned detaches.
    link.pin(pins.link())
        .map_err(|e| error("pinning the link", e))?;
    xdp.pin(pins.program())
        .map_err(|e| error("pinning the program", e))?;
    Ok(())
}

/// Loads a built-in program (the blocklist one with its pinned maps).
fn load(pins: &Pins, program: Program) -> io::Result<aya::Ebpf> {
    let mut loader = EbpfLoader::new();
    if program == Program::Blocklist {
        // The pinned maps are reused; missing ones are created (empty) and pinned. That
        // happens only when an undo re-attaches the program before restoring its list.
        for name in Pins::MAPS {
            loader.map_pin_path(name, pins.map(name));
        }
    }
    loader
        .load(program.object())
        .map_err(|e| error("loading the object", e))
}

/// The XDP program of a loaded object, loaded into the kernel.
fn loaded(ebpf: &mut aya::Ebpf, program: Program) -> io::Result<&mut Xdp> {
    let xdp: &mut Xdp = ebpf
        .program_mut(program.function())
        .ok_or_else(|| io::Error::other(format!("no {} in the object", program.function())))?
        .try_into()
        .map_err(|e| error("the program", e))?;
    xdp.load().map_err(|e| error("loading the program", e))?;
    Ok(xdp)
}

/// See [`super::Bpf::replace`]: `bpf_link_update` on the pinned link, then
/// the new program's pin in place of the old one's.
pub fn replace(pins: &Pins, program: Program) -> io::Result<()> {
    prepare(pins)?;
    let link =
        PinnedLink::from_pin(pins.link()).map_err(|e| error("opening the pinned link", e))?;
    let link = XdpLink::try_from(FdLink::from(link))
        .map_err(|e| error("the pinned link is not an XDP link", e))?;
    let mut ebpf = load(pins, program)?;
    let xdp = loaded(&mut ebpf, program)?;
    let id = xdp
        .attach_to_link(link)
        .map_err(|e| error("replacing the program", e))?;
    // The link stays pinned: closing this descriptor leaves the new program attached.
    drop(xdp.take_link(id).map_err(|e| error("taking the link", e))?);
    remove_pin(&pins.program())?;
    xdp.pin(pins.program())
        .map_err(|e| error("pinning the program", e))
}

/// See [`super::Bpf::detach`]: the program pin first, then the link. The
/// link is opened before its pin is removed, so that closing it drops the last reference:
/// the kernel then detaches the program at once (a link released by unlinking its pin is
/// freed later, from a work queue, and the read-back could still see it attached).
pub fn detach(pins: &Pins) -> io::Result<()> {
    remove_pin(&pins.program())?;
    if pins.link().exists() {
        let link =
            PinnedLink::from_pin(pins.link()).map_err(|e| error("opening the pinned link", e))?;
        let last = link.unpin().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("unpinning {}: {e}", pins.link().display()),
            )
        })?;
        drop(last);
    }
    remove_dir_if_empty(pins);
    Ok(())
}

/// Opens a pinned blocklist trie.
fn open_map(pins: &Pins, name: &str) -> io::Result<Map> {
    let data = MapData::from_pin(pins.map(name))
        .map_err(|e| error(&format!("opening the pinned map {name}"), e))?;
    Map::from_map_data(data).map_err(|e| error(&format!("the pinned map {name}"), e))
}

/// The keys of a trie.
fn keys<K: aya::Pod, T: std::borrow::Borrow<MapData>>(
    trie: &LpmTrie<T, K, u8>,
) -> io::Result<Vec<Key<K>>> {
    trie.keys()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error("listing the blocklist", e))
}

/// See [`super::Bpf::blocklist`].
pub fn blocklist(pins: &Pins) -> io::Result<Blocklist> {
    let present = Pins::MAPS.iter().filter(|m| pins.map(m).exists()).count();
    if present == 0 {
        return Ok(Blocklist::Unpinned);
    }
    if present < Pins::MAPS.len() {
        return Ok(Blocklist::Incomplete);
    }
    let v4: LpmTrie<MapData, [u8; 4], u8> =
        LpmTrie::try_from(open_map(pins, "blocklist_v4")?).map_err(|e| error("blocklist_v4", e))?;
    let v6: LpmTrie<MapData, [u8; 16], u8> =
        LpmTrie::try_from(open_map(pins, "blocklist_v6")?).map_err(|e| error("blocklist_v6", e))?;
    let mut prefixes: Vec<Prefix> = Vec::new();
    for k in keys(&v4)? {
        prefixes.extend(Prefix::from_lpm_key(LpmKey::V4(k.prefix_len(), k.data())));
    }
    for k in keys(&v6)? {
        prefixes.extend(Prefix::from_lpm_key(LpmKey::V6(k.prefix_len(), k.data())));
    }
    prefixes.sort();
    Ok(Blocklist::Pinned(prefixes))
}

/// Makes a trie hold exactly `want`: removes the other keys, inserts the missing ones.
fn sync<K: aya::Pod + PartialEq, T: BorrowMut<MapData>>(
    trie: &mut LpmTrie<T, K, u8>,
    want: &[Key<K>],
) -> io::Result<()> {
    let same = |a: &Key<K>, b: &Key<K>| a.prefix_len() == b.prefix_len() && a.data() == b.data();
    let have = keys(trie)?;
    for k in have.iter().filter(|k| !want.iter().any(|w| same(w, k))) {
        trie.remove(k).map_err(|e| error("removing a prefix", e))?;
    }
    for k in want.iter().filter(|w| !have.iter().any(|k| same(w, k))) {
        trie.insert(k, 1, 0)
            .map_err(|e| error("inserting a prefix", e))?;
    }
    Ok(())
}

/// See [`super::Bpf::set_blocklist`].
pub fn set_blocklist(pins: &Pins, prefixes: &[Prefix]) -> io::Result<()> {
    prepare(pins)?;
    let mut loader = EbpfLoader::new();
    for name in Pins::MAPS {
        loader.map_pin_path(name, pins.map(name));
    }
    // Creates and pins the maps that are not pinned yet, opens the others.
    let mut ebpf = loader
        .load(Program::Blocklist.object())
        .map_err(|e| error("creating the blocklist maps", e))?;
    let mut v4_keys = Vec::new();
    let mut v6_keys = Vec::new();
    for p in prefixes {
        match p.lpm_key() {
            LpmKey::V4(len, a) => v4_keys.push(Key::new(len, a)),
            LpmKey::V6(len, a) => v6_keys.push(Key::new(len, a)),
        }
    }
    let map = ebpf
        .map_mut("blocklist_v4")
        .ok_or_else(|| io::Error::other("no blocklist_v4 in the object"))?;
    let mut v4: LpmTrie<&mut MapData, [u8; 4], u8> =
        LpmTrie::try_from(map).map_err(|e| error("blocklist_v4", e))?;
    sync(&mut v4, &v4_keys)?;
    let map = ebpf
        .map_mut("blocklist_v6")
        .ok_or_else(|| io::Error::other("no blocklist_v6 in the object"))?;
    let mut v6: LpmTrie<&mut MapData, [u8; 16], u8> =
        LpmTrie::try_from(map).map_err(|e| error("blocklist_v6", e))?;
    sync(&mut v6, &v6_keys)
}

/// See [`super::Bpf::unpin_blocklist`].
pub fn unpin_blocklist(pins: &Pins) -> io::Result<()> {
    for name in Pins::MAPS {
        remove_pin(&pins.map(name))?;
    }
    remove_dir_if_empty(pins);
    Ok(())
}

/// The blocklist program's drop counters for the interface of `pins`, summed over CPUs:
/// (packets, bytes).
pub fn drops(pins: &Pins) -> io::Result<(u64, u64)> {
    let counters: PerCpuArray<MapData, u64> =
        PerCpuArray::try_from(open_map(pins, "drops")?).map_err(|e| error("drops", e))?;
    let sum = |index: u32| -> io::Result<u64> {
        let values = counters
            .get(&index, 0)
            .map_err(|e| error("reading the drop counters", e))?;
        Ok(values.iter().copied().fold(0u64, u64::wrapping_add))
    };
    Ok((sum(0)?, sum(1)?))
}
