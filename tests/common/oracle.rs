//! NVIDIA's own answers, to hold fdl's against: what `cuobjdump` lists in a file and what
//! a library's `ncclGetVersion` returns once loaded. Shared by the oracle tests
//! (`inspect_oracle.rs`) and the real native build (`native_nvcc.rs`).

use fdl::inspect::{CodeEntry, GpuCode};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// `cuobjdump --list-elf|--list-ptx FILE` → target name → count. Lines look like
/// `ELF file    1: libnccl.so.1.sm_90.cubin` / `PTX file    1: libnccl.so.1.sm_120.ptx`.
pub fn cuobjdump_list(cuobjdump: &Path, file: &Path, flag: &str) -> BTreeMap<String, usize> {
    let out = Command::new(cuobjdump)
        .arg(flag)
        .arg(file)
        .output()
        .expect("run cuobjdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || stderr.contains("No "),
        "cuobjdump {flag} {} failed: {stderr}",
        file.display()
    );
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some((_, name)) = line.split_once(": ") else {
            continue;
        };
        let stem = name
            .trim()
            .trim_end_matches(".cubin")
            .trim_end_matches(".ptx");
        let arch = stem.rsplit('.').next().unwrap_or_default().to_string();
        *m.entry(arch).or_insert(0) += 1;
    }
    m
}

/// fdl's list in cuobjdump's terms: target name (`sm_90a`) → count.
pub fn listing(list: &[CodeEntry]) -> BTreeMap<String, usize> {
    list.iter()
        .map(|e| (e.target.to_string(), e.count))
        .collect()
}

/// How fdl's SASS and PTX lists of `file` differ from cuobjdump's; `None` when equal.
pub fn cuobjdump_mismatch(cuobjdump: &Path, file: &Path, code: &GpuCode) -> Option<String> {
    let elf = cuobjdump_list(cuobjdump, file, "--list-elf");
    let ptx = cuobjdump_list(cuobjdump, file, "--list-ptx");
    let (sass_ours, ptx_ours) = (listing(&code.sass), listing(&code.ptx));
    (sass_ours != elf || ptx_ours != ptx).then(|| {
        format!(
            "{}:\n  cuobjdump --list-elf: {elf:?}\n  fdl SASS:             {sass_ours:?}\n  cuobjdump --list-ptx: {ptx:?}\n  fdl PTX:              {ptx_ours:?}",
            file.display()
        )
    })
}

/// fdl's SASS and PTX lists of `file` must be cuobjdump's, exactly.
pub fn assert_lists_like_cuobjdump(cuobjdump: &Path, file: &Path, code: &GpuCode) {
    if let Some(diff) = cuobjdump_mismatch(cuobjdump, file, code) {
        panic!("fdl's GPU code list differs from cuobjdump's: {diff}");
    }
    eprintln!(
        "{}: SASS {:?}, PTX {:?}: as cuobjdump lists them",
        file.display(),
        listing(&code.sass),
        listing(&code.ptx)
    );
}

/// What `ncclGetVersion` returns in the library at `lib`, loaded with `dlopen` in a child
/// process compiled with `cc` (no GPU needed).
pub fn nccl_get_version(lib: &Path) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("v.c");
    std::fs::write(
        &c,
        r#"#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  int (*get)(int *) = (int (*)(int *))dlsym(h, "ncclGetVersion");
  if (!get) { fprintf(stderr, "no ncclGetVersion\n"); return 3; }
  int v = 0;
  if (get(&v) != 0) return 4;
  printf("%d\n", v);
  return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("v");
    let st = Command::new("cc")
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(st.success());
    let out = Command::new(&exe).arg(lib).output().unwrap();
    assert!(
        out.status.success(),
        "loading {}: {}",
        lib.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}
