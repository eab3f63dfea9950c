//! The GPU code of a library that holds none itself: a split build's.
//!
//! torch ≤ 1.13 ships `libtorch_cuda.so` as a 0.2 MiB bridge with no `.nv_fatbin` of its
//! own: its kernels are in `libtorch_cuda_cu.so` and `libtorch_cuda_cpp.so` beside it,
//! which it names in DT_NEEDED. Judged alone it would run on no GPU at all. So when the
//! inspected file has no fatbin container, its DT_NEEDED closure is laid out as the loader
//! would ([`super::map::load`], in the caller's environment) and the GPU code of
//! the objects that come from the file's own directory is what a GPU must run.
//!
//! Only the file's directory, not the whole closure: the libraries beside it are the same
//! package, built together with it (torch/lib), and a GPU runs the package's kernels only
//! if it runs all of them. cuBLAS, cuDNN or a system libcuda in other directories carry
//! fatbins of their own with other arch lists; counting them would credit the package with
//! kernels it does not have (cuBLAS 11.10 has sm_90 code where torch 1.13.1 has none).
//! The library inspected is followed only when it holds no GPU code: one that has its own
//! is judged by it, as before.

use super::map::{self, FoundBy};
use super::search::LoaderEnv;
use crate::arch::Arch;
use crate::inspect::{coverage, inspect, GpuCode, Inspection, Verdict};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// At most this many libraries of the directory are read: a real split build has two or
/// three; a hostile closure of thousands of objects in one directory must not make one
/// inspection read thousands of files.
pub const MAX_FOLLOWED: usize = 64;

/// One library of the closure, beside the inspected file, that carries GPU code.
#[derive(Debug, Clone, Serialize)]
pub struct NeededCode {
    /// The path the loader opens it by.
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub path: PathBuf,
    /// The DT_NEEDED name that brought it in, and the object that named it.
    pub needed_as: String,
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub needed_by: PathBuf,
    pub gpu_code: GpuCode,
}

/// What following the DT_NEEDED of a file without GPU code found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Followed {
    /// The directory whose libraries were judged (the inspected file's).
    #[serde(serialize_with = "crate::text::json_path::one")]
    pub dir: PathBuf,
    /// The libraries of that directory in the closure that carry GPU code, in link-map
    /// order (the loader's breadth-first order).
    pub libraries: Vec<NeededCode>,
    /// What could not be followed or read: the closure is then judged without it.
    pub warnings: Vec<String>,
}

impl Followed {
    /// Whether anything was found to judge instead of the file.
    pub fn found(&self) -> bool {
        !self.libraries.is_empty()
    }

    /// The verdict for `gpu` of the libraries together: the worst of theirs (not covered,
    /// then PTX JIT, then native), since a GPU runs the package only if it runs each
    /// library's kernels. The first library with that worst verdict gives it.
    pub fn coverage(&self, gpu: Arch) -> Option<Verdict> {
        let rank = |v: &Verdict| match v {
            Verdict::NotCovered => 0,
            Verdict::PtxJit { .. } => 1,
            Verdict::Native { .. } => 2,
        };
        self.libraries
            .iter()
            .map(|l| coverage(&l.gpu_code, gpu))
            .min_by_key(rank)
    }
}

/// Whether `ins` holds no GPU code at all, so that its GPU code must be elsewhere: an ELF
/// file without a single fatbin container.
pub fn holds_no_gpu_code(ins: &Inspection) -> bool {
    ins.elf && ins.gpu_code.containers == 0 && ins.gpu_code.is_empty()
}

/// For a file that holds no GPU code ([`holds_no_gpu_code`]): the GPU code of the
/// libraries of its directory that a process loading it loads, in `env`. `None` when the
/// file holds GPU code of its own, which is then what is judged. A closure that cannot be
/// laid out gives no libraries and says why in the warnings.
pub fn follow(ins: &Inspection, env: &LoaderEnv) -> Option<Followed> {
    if !holds_no_gpu_code(ins) {
        return None;
    }
    let dir = ins.path.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut out = Followed {
        dir: dir.clone(),
        ..Followed::default()
    };
    let same_dir = SameDir::new(&dir, &env.cwd);
    let link_map = match map::load(&ins.path, env) {
        Ok(m) => m,
        Err(e) => {
            out.warnings.push(format!(
                "its DT_NEEDED libraries could not be laid out ({e:#}), so their GPU code is not judged"
            ));
            return Some(out);
        }
    };
    let mut read = 0usize;
    for o in &link_map.objects {
        let FoundBy::Needed {
            name, needed_by, ..
        } = &o.found_by
        else {
            continue;
        };
        if !same_dir.holds(&o.path) {
            continue;
        }
        if read == MAX_FOLLOWED {
            out.warnings.push(format!(
                "more than {MAX_FOLLOWED} libraries of {} are loaded; only the first {MAX_FOLLOWED} were read for GPU code",
                dir.display()
            ));
            break;
        }
        read += 1;
        match inspect(&o.path) {
            Ok(found) if !holds_no_gpu_code(&found) => out.libraries.push(NeededCode {
                path: o.path.clone(),
                needed_as: name.clone(),
                needed_by: needed_by.clone(),
                gpu_code: found.gpu_code,
            }),
            Ok(_) => {}
            Err(e) => out.warnings.push(format!(
                "{} (needed by {}) cannot be read for GPU code: {e:#}",
                o.path.display(),
                needed_by.display()
            )),
        }
    }
    // A library of the package the loader cannot find is code no one judged.
    for f in &link_map.failures {
        if same_dir.holds(&f.needed_by) {
            // An absent library's error is the one the NCCL answer already gives: said once.
            out.warnings.push(if f.is_absent() {
                format!(
                    "{} (needed by {}) is not on this host, so its GPU code, if any, is not judged",
                    f.needed,
                    f.needed_by.display()
                )
            } else {
                format!(
                    "{} (needed by {}) cannot be loaded, so its GPU code, if any, is not judged: {}",
                    f.needed,
                    f.needed_by.display(),
                    f.reason
                )
            });
        }
    }
    if link_map.failures_omitted > 0 {
        out.warnings.push(format!(
            "{} more DT_NEEDED entries are not found (not listed)",
            link_map.failures_omitted
        ));
    }
    Some(out)
}

/// The test "is this object in that directory": its path's parent, compared as written
/// (made absolute) and, when both exist, as the directories they are (device and inode),
/// so that `lib/../lib` or a linked directory is the same directory.
struct SameDir {
    written: PathBuf,
    id: Option<(u64, u64)>,
}

impl SameDir {
    fn new(dir: &Path, cwd: &Path) -> SameDir {
        let written = absolute(dir, cwd);
        let id = dir_id(&written);
        SameDir { written, id }
    }

    fn holds(&self, path: &Path) -> bool {
        let Some(parent) = path.parent() else {
            return false;
        };
        let parent = absolute(parent, Path::new("/"));
        if parent == self.written {
            return true;
        }
        self.id.is_some() && dir_id(&parent) == self.id
    }
}

fn absolute(p: &Path, cwd: &Path) -> PathBuf {
    if p.as_os_str().is_empty() {
        cwd.to_path_buf()
    } else if p.is_absolute() {
        p.to_path_buf()
    } else {
        cwd.join(p)
    }
}

/// A directory's device and inode: `stat` follows links, as the loader does when it
/// opens a path through a linked directory.
fn dir_id(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir).ok()?;
    m.is_dir().then(|| (m.dev(), m.ino()))
}
