//! What the kernel tests need from Debian, fetched once: qemu (installed, it is a tool), and
//! the kernels and busybox-static (downloaded with `apt-get download` and unpacked into the
//! cache with `dpkg-deb`, never installed: the host's own kernel and busybox stay as they are).
//! Idempotent: what is in the cache is not fetched again.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Runs apt-get update at most once per xtask run, before the first thing that needs the lists.
#[derive(Default)]
pub struct Apt {
    updated: bool,
}

impl Apt {
    fn update(&mut self) -> anyhow::Result<()> {
        if !self.updated {
            eprintln!("xtask: apt-get update");
            run(Command::new("apt-get").args(["update", "-qq"]), "apt-get update")?;
            self.updated = true;
        }
        Ok(())
    }

    /// Installs qemu-system-x86 unless `qemu-system-x86_64` runs already.
    pub fn ensure_qemu(&mut self) -> anyhow::Result<()> {
        if found("qemu-system-x86_64", "--version") {
            return Ok(());
        }
        self.update()?;
        eprintln!("xtask: installing qemu-system-x86");
        run(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends", "qemu-system-x86"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install qemu-system-x86",
        )
    }

    /// The package the metapackage `linux-image-FLAVOUR` points at now
    /// (`linux-image-6.1.0-56-cloud-amd64` for `cloud-amd64`).
    fn kernel_package(&mut self, flavour: &str) -> anyhow::Result<String> {
        let meta = format!("linux-image-{flavour}");
        let ask = || {
            let out = Command::new("apt-cache").args(["depends", &meta]).stderr(Stdio::null()).output().ok()?;
            parse_depends(&String::from_utf8_lossy(&out.stdout))
        };
        if let Some(p) = ask() {
            return Ok(p);
        }
        self.update()?;
        ask().with_context(|| format!("apt-cache does not know {meta}: is a Debian bookworm (12) source configured?"))
    }

    /// Downloads `package` into `dir` and unpacks the files matching `members` into `dir`;
    /// the .deb is removed afterwards.
    fn unpack(&mut self, package: &str, dir: &Path, members: &[&str]) -> anyhow::Result<()> {
        self.update()?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        eprintln!("xtask: downloading {package}");
        run(Command::new("apt-get").args(["download", "-qq", package]).current_dir(dir), "apt-get download")?;
        let deb = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .with_context(|| format!("apt-get download left no .deb in {}", dir.display()))?;
        // dpkg-deb --fsys-tarfile | tar: only the members asked for (a kernel's modules are
        // ~80 MB the guest does not need).
        let mut tar = Command::new("tar");
        tar.arg("-x").arg("-C").arg(dir).arg("--wildcards").args(members);
        let mut fsys = Command::new("dpkg-deb")
            .arg("--fsys-tarfile")
            .arg(&deb)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot run dpkg-deb")?;
        tar.stdin(fsys.stdout.take().expect("piped"));
        run(&mut tar, "tar (unpacking the .deb)")?;
        let st = fsys.wait()?;
        if !st.success() {
            bail!("dpkg-deb --fsys-tarfile {} failed ({st})", deb.display());
        }
        std::fs::remove_file(&deb).with_context(|| format!("cannot remove {}", deb.display()))
    }
}

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `uname -r` of the kernel (`6.1.0-56-cloud-amd64`).
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// The newest Debian kernel of `flavour`, from the cache or downloaded into it.
pub fn kernel(apt: &mut Apt, cache: &Path, flavour: &str) -> anyhow::Result<Kernel> {
    let package = apt.kernel_package(flavour)?;
    let release = package.strip_prefix("linux-image-").unwrap_or(&package).to_string();
    let dir = cache.join(&package);
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.exists() {
        apt.unpack(&package, &dir, &["./boot/*"])?;
        if !vmlinuz.exists() {
            bail!("{package} has no {}", vmlinuz.strip_prefix(&dir).unwrap_or(&vmlinuz).display());
        }
    }
    Ok(Kernel { release, vmlinuz })
}

/// busybox-static's binary, from the cache or downloaded into it.
pub fn busybox(apt: &mut Apt, cache: &Path) -> anyhow::Result<PathBuf> {
    let dir = cache.join("busybox-static");
    let bin = dir.join("bin/busybox");
    if !bin.exists() {
        apt.unpack("busybox-static", &dir, &["./bin/busybox"])?;
    }
    Ok(bin)
}

/// `Depends: linux-image-6.1.0-56-amd64` in `apt-cache depends` output.
pub fn parse_depends(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && !p.contains('<'))
        .map(str::to_string)
}

fn found(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let st = cmd.status().with_context(|| format!("cannot start {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st}); see the output above");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metapackage_names_the_kernel_package() {
        let text = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-56-cloud-amd64\n";
        assert_eq!(parse_depends(text).as_deref(), Some("linux-image-6.1.0-56-cloud-amd64"));
        // A virtual package (`<...>`) or nothing at all is no answer.
        assert_eq!(parse_depends("x\n  Depends: <linux-image-6.1>\n"), None);
        assert_eq!(parse_depends(""), None);
    }
}
