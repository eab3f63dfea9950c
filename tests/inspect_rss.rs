//! Memory and speed on a large library: a ~600 MB synthetic libtorch_cuda.so-like file
//! (250 MB of .rodata with the self-id at its very end, 2,400 fatbin entries) must be
//! inspected with peak RSS under 32 MiB. Alone in its own test binary so the peak is ours.
//! Set FDL_SKIP_LARGE=1 to skip on machines short of disk.

use fdl::arch::{Arch, GpuTarget, Variant};
use fdl::inspect;
use fdl_synth as synth;

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn large_file_bounded_rss() {
    let g = |n| GpuTarget {
        arch: Arch::from_number(n),
        variant: Variant::Generic,
    };
    let sass: Vec<GpuTarget> = [50, 60, 61, 70, 75, 80, 86, 90, 100, 120]
        .into_iter()
        .map(g)
        .chain([GpuTarget {
            arch: Arch::new(9, 0),
            variant: Variant::Specific,
        }])
        .collect();
    let mut spec = synth::Spec::torch_like(&sass, &[g(120)], 200, 140_000, true);
    spec.rodata_padding = 250 << 20;
    spec.self_id = Some("2.27.5+cuda12.9".into());
    spec.floor_messages = true;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libtorch_cuda.so");
    let size = synth::write_file(&spec, &path).unwrap();
    let before = vm_hwm_kib();
    let t = std::time::Instant::now();
    let ins = inspect::inspect(&path).unwrap();
    let took = t.elapsed();
    let after = vm_hwm_kib();
    eprintln!(
        "{} MB inspected in {took:?}; VmHWM {before} kB before, {after} kB after",
        size >> 20
    );
    assert_eq!(ins.nccl.unwrap().version.to_string(), "2.27.5");
    assert_eq!(ins.gpu_code.sass_total(), 2200);
    assert_eq!(ins.gpu_code.ptx_total(), 200);
    assert!(after < 32 * 1024, "peak RSS {after} kB exceeds 32 MiB");
}
