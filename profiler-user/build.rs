//! Builds the eBPF program (profiler-ebpf, for bpfel-unknown-none with nightly and bpf-linker)
//! so that `include_bytes_aligned!` can embed it. `cargo xtask setup` installs the toolchain.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "profiler-ebpf")
        .ok_or_else(|| anyhow!("profiler-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("profiler-ebpf manifest has no parent directory"))?
        .to_string();
    aya_build::build_ebpf(
        [Package { name: ebpf.name.as_str(), root_dir: &root_dir, ..Default::default() }],
        Toolchain::default(),
    )
    .context("building the eBPF program failed; `cargo xtask setup` installs nightly's rust-src and bpf-linker")
}
