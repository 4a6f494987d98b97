//! The guest's whole root file system: an uncompressed `newc` cpio archive (the format the
//! kernel unpacks into its rootfs) with busybox as /bin/sh, the profiler and the busy helper
//! with the shared libraries `ldd` names, and the init script that runs the checks. No disk, no
//! kernel modules: every kernel tested has what the script mounts built in.

use std::{
    fs::File,
    io::{self, BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

/// One entry of the archive.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    /// A file copied from the host.
    File {
        path: String,
        mode: u32,
        from: PathBuf,
    },
    /// A file with the given contents.
    Text {
        path: String,
        mode: u32,
        text: String,
    },
    Symlink {
        path: String,
        target: String,
    },
    CharDev {
        path: String,
        major: u32,
        minor: u32,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Writes `entries` as a newc cpio archive (owner root, mtime 0).
pub fn write_cpio(entries: &[Entry], out: impl Write) -> io::Result<()> {
    let mut out = Cpio { out, written: 0, ino: 1 };
    for e in entries {
        match e {
            Entry::Dir { path, mode } => out.entry(path, S_IFDIR | mode, &[], (0, 0))?,
            Entry::Text { path, mode, text } => out.entry(path, S_IFREG | mode, text.as_bytes(), (0, 0))?,
            Entry::Symlink { path, target } => out.entry(path, S_IFLNK | 0o777, target.as_bytes(), (0, 0))?,
            Entry::CharDev { path, major, minor } => out.entry(path, S_IFCHR | 0o600, &[], (*major, *minor))?,
            Entry::File { path, mode, from } => {
                let data = std::fs::read(from)
                    .map_err(|e| io::Error::new(e.kind(), format!("cannot read {}: {e}", from.display())))?;
                out.entry(path, S_IFREG | mode, &data, (0, 0))?
            }
        }
    }
    out.entry("TRAILER!!!", 0, &[], (0, 0))?;
    out.out.flush()
}

struct Cpio<W> {
    out: W,
    written: usize,
    ino: u32,
}

impl<W: Write> Cpio<W> {
    fn entry(&mut self, path: &str, mode: u32, data: &[u8], rdev: (u32, u32)) -> io::Result<()> {
        let name = path.trim_start_matches('/');
        let nlink = if mode & S_IFDIR != 0 { 2 } else { 1 };
        let fields =
            [self.ino, mode, 0, 0, nlink, 0, data.len() as u32, 0, 0, rdev.0, rdev.1, name.len() as u32 + 1, 0];
        self.ino += 1;
        let mut header = String::from("070701");
        for f in fields {
            header.push_str(&format!("{f:08x}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.written += b.len();
        self.out.write_all(b)
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - self.written % 4) % 4;
        self.put(&[0; 3][..n])
    }
}

/// The libraries `ldd` lists for a binary (absolute paths; the vDSO has none).
pub fn parse_ldd(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once(" => ") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| path.to_string())
        })
        .collect()
}

fn libraries(bin: &Path) -> anyhow::Result<Vec<String>> {
    let out = std::process::Command::new("ldd").arg(bin).output().context("cannot run ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && !text.contains("statically linked") {
        bail!("ldd {} failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(parse_ldd(&text))
}

/// What the guest runs.
pub struct Guest<'a> {
    pub busybox: &'a Path,
    pub profiler: &'a Path,
    pub helper: &'a Path,
    pub seconds: u64,
    pub busy_cpu: u32,
    pub frequency_hz: u64,
}

/// Every entry of the guest's root.
pub fn entries(g: &Guest) -> anyhow::Result<Vec<Entry>> {
    let mut e: Vec<Entry> =
        ["/bin", "/dev", "/proc", "/sys", "/tmp", "/run", "/var", "/var/lib", "/var/lib/profiler", "/etc"]
            .iter()
            .map(|p| Entry::Dir { path: p.to_string(), mode: 0o755 })
            .collect();
    // The kernel opens /dev/console for init before anything is mounted.
    e.push(Entry::CharDev { path: "/dev/console".into(), major: 5, minor: 1 });
    e.push(Entry::CharDev { path: "/dev/null".into(), major: 1, minor: 3 });
    e.push(Entry::File { path: "/bin/busybox".into(), mode: 0o755, from: g.busybox.to_path_buf() });
    e.push(Entry::Symlink { path: "/bin/sh".into(), target: "busybox".into() });
    e.push(Entry::File { path: "/bin/profiler".into(), mode: 0o755, from: g.profiler.to_path_buf() });
    e.push(Entry::File { path: "/bin/busy-helper".into(), mode: 0o755, from: g.helper.to_path_buf() });
    let mut libs = libraries(g.profiler)?;
    libs.extend(libraries(g.helper)?);
    libs.sort();
    libs.dedup();
    let mut dirs: Vec<String> = Vec::new();
    for lib in &libs {
        let mut dir = String::new();
        for part in Path::new(lib).parent().into_iter().flat_map(Path::components).skip(1) {
            dir.push('/');
            dir.push_str(&part.as_os_str().to_string_lossy());
            if !dirs.contains(&dir) && !e.iter().any(|x| matches!(x, Entry::Dir { path, .. } if *path == dir)) {
                dirs.push(dir.clone());
                e.push(Entry::Dir { path: dir.clone(), mode: 0o755 });
            }
        }
        // The file behind the name (libc.so.6 is a symlink on some systems).
        let from = std::fs::canonicalize(lib).with_context(|| format!("cannot resolve {lib}"))?;
        e.push(Entry::File { path: lib.clone(), mode: 0o755, from });
    }
    e.push(Entry::Text { path: "/init".into(), mode: 0o755, text: init_script(g.seconds, g.busy_cpu, g.frequency_hz) });
    Ok(e)
}

/// Writes the archive for `g` to `path`.
pub fn build(g: &Guest, path: &Path) -> anyhow::Result<()> {
    let entries = entries(g)?;
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    write_cpio(&entries, BufWriter::new(file)).with_context(|| format!("cannot write {}", path.display()))
}

/// The guest's /init: mounts what the daemon uses, runs it while a helper spins on one CPU,
/// then prints each command's output between markers (see `console`) and powers off.
///
/// The daemon is stopped before the store is read (SIGTERM makes it write what it holds), so
/// no sleep waits for a flush; `health` runs while it still samples.
pub fn init_script(seconds: u64, busy_cpu: u32, frequency_hz: u64) -> String {
    format!(
        r#"#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=0700 tmpfs /var/lib/profiler
ip link set lo up
D=/var/lib/profiler
# Progress on the console as it happens, so a guest that hangs shows where (an rt guest once
# printed nothing after its release until the timeout).
step() {{ echo "@@KT step $1 $(cut -d' ' -f1 /proc/uptime)"; }}
section() {{ name=$1; shift; echo "@@KT begin $name"; "$@" 2>&1; rc=$?; echo "@@KT end $name rc=$rc"; }}
echo "@@KT kernel $(uname -r)"
START=$(cut -d' ' -f1 /proc/uptime)
profiler run --data-dir $D --listen off --frequency {frequency_hz} >/tmp/daemon.log 2>&1 &
DAEMON=$!
step daemon-started
i=0
until profiler health --data-dir $D >/dev/null 2>&1; do
  if ! kill -0 $DAEMON 2>/dev/null; then echo "@@KT daemon-exited"; break; fi
  i=$((i+1)); if [ $i -gt 600 ]; then echo "@@KT daemon-not-healthy"; break; fi
  sleep 0.1
done
step daemon-healthy
if kill -0 $DAEMON 2>/dev/null; then
  busy-helper {busy_cpu} {seconds} >/dev/null &
  HELPER=$!
  # Work for the tracepoints while the helper spins: execs, cgroups born and removed, loopback NET_RX.
  for n in 1 2 3 4 5; do mkdir /sys/fs/cgroup/kt$n && rmdir /sys/fs/cgroup/kt$n; ls / >/dev/null; done
  ping -c 5 -i 0.2 127.0.0.1 >/dev/null 2>&1
  wait $HELPER
  step helper-done
  section health profiler health --data-dir $D
  kill -TERM $DAEMON
  wait $DAEMON
  echo "@@KT daemon-stopped rc=$?"
  section status profiler status --data-dir $D
  section folded profiler flamegraph --data-dir $D --from -10m --to now --format folded
  section cputime profiler cputime --data-dir $D --from -10m --to now --bucket 1s --format csv
fi
section daemon-log cat /tmp/daemon.log
echo "@@KT seconds $START $(cut -d' ' -f1 /proc/uptime)"
echo "@@KT done"
poweroff -f
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_names_every_library_but_the_vdso() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
            \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
            \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            ["/lib/x86_64-linux-gnu/libgcc_s.so.1", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"]
        );
        assert!(parse_ldd("\tstatically linked\n").is_empty());
    }

    #[test]
    fn cpio_entries_are_newc_and_four_byte_aligned() {
        let mut out = Vec::new();
        let entries = [
            Entry::Dir { path: "/bin".into(), mode: 0o755 },
            Entry::Text { path: "/init".into(), mode: 0o755, text: "#!/bin/sh\n".into() },
            Entry::Symlink { path: "/bin/sh".into(), target: "busybox".into() },
            Entry::CharDev { path: "/dev/console".into(), major: 5, minor: 1 },
        ];
        write_cpio(&entries, &mut out).unwrap();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        // Names are stored relative, NUL-terminated, and the data starts on a 4-byte boundary
        // (here 116 + 110 + 5 = 231: one byte of padding).
        assert!(text.contains("bin\0") && text.contains("init\0\0#!/bin/sh\n"));
        assert!(text.contains("TRAILER!!!\0"));
        // The second header (the file's) says: regular file 0755, 10 bytes, name of 5 bytes.
        let second = text.match_indices("070701").nth(1).unwrap().0;
        let field = |i: usize| u32::from_str_radix(&text[second + 6 + 8 * i..second + 14 + 8 * i], 16).unwrap();
        assert_eq!(field(1), S_IFREG | 0o755);
        assert_eq!(field(6), 10);
        assert_eq!(field(11), 5);
        // The device's numbers are its rdev.
        let fourth = text.match_indices("070701").nth(3).unwrap().0;
        assert_eq!(&text[fourth + 6 + 8 * 9..fourth + 6 + 8 * 11], "0000000500000001");
    }

    #[test]
    fn the_init_script_frames_every_command_the_checks_read() {
        let s = init_script(8, 1, 99);
        for name in ["health", "status", "folded", "cputime", "daemon-log"] {
            assert!(s.contains(&format!("section {name} ")), "{name}");
        }
        assert!(s.contains("busy-helper 1 8") && s.contains("--frequency 99"));
        assert!(s.trim_end().ends_with("poweroff -f"));
    }
}
