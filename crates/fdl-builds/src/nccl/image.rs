//! Which `nvidia/cuda` devel image a Docker build of some archs uses, and which CUDA
//! release a plan falls back to: a table of published images, so it sits with the plan
//! that judges requests by it, above the ground floor's arch knowledge (`arch`), which
//! reads archs open-world and knows no images.

use crate::arch::{check_archs_for_cuda, fmt_mm, Arch, ArchCudaError};
use crate::version::CudaVersion;
use serde::{Deserialize, Serialize};

/// The known CUDA release (one with an `nvidia/cuda` image) that compiles every arch and
/// is closest to `wanted`: the newest one not newer than it, else the oldest newer one.
/// `None` when no known release compiles them all.
pub fn closest_cuda_for(archs: &[Arch], wanted: CudaVersion) -> Option<CudaVersion> {
    let fits: Vec<(u32, u32)> = CUDA_IMAGES
        .iter()
        .map(|(mm, _, _)| *mm)
        .filter(|mm| check_archs_for_cuda(archs, CudaVersion::new(mm.0, mm.1)).is_ok())
        .collect();
    let older = fits.iter().filter(|mm| **mm <= wanted.major_minor()).max();
    let newer = fits.iter().filter(|mm| **mm > wanted.major_minor()).min();
    older.or(newer).map(|&(a, b)| CudaVersion::new(a, b))
}

/// The CUDA release fdl builds with when neither `--cuda` nor the libtorch says one:
/// 12.8 is the oldest release that compiles Blackwell (sm_120) and still compiles Pascal
/// (sm_61), so it serves the mixed rigs fdl is for.
pub const DEFAULT_CUDA: CudaVersion = CudaVersion::new(12, 8);

/// Releases with a published `nvidia/cuda` devel image: `major.minor` → the full version
/// and the Ubuntu the image tag names. Source: the nvidia/cuda image's supported-tags list
/// (13.2.0 was published in March 2026). Releases past the end are planned with the
/// newest image of their major that fits (see [`choose_image`]).
const CUDA_IMAGES: &[((u32, u32), &str, &str)] = &[
    ((11, 8), "11.8.0", "ubuntu22.04"),
    ((12, 0), "12.0.1", "ubuntu22.04"),
    ((12, 1), "12.1.1", "ubuntu22.04"),
    ((12, 2), "12.2.2", "ubuntu22.04"),
    ((12, 3), "12.3.2", "ubuntu22.04"),
    ((12, 4), "12.4.1", "ubuntu22.04"),
    ((12, 5), "12.5.1", "ubuntu22.04"),
    ((12, 6), "12.6.3", "ubuntu22.04"),
    ((12, 8), "12.8.1", "ubuntu22.04"),
    ((12, 9), "12.9.1", "ubuntu22.04"),
    ((13, 0), "13.0.2", "ubuntu24.04"),
    ((13, 1), "13.1.1", "ubuntu24.04"),
    ((13, 2), "13.2.0", "ubuntu24.04"),
];

/// The devel base image for a CUDA release: full version (as the user gave it, else the
/// newest patch we know) and the OS part of the tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaImage {
    pub cuda_version: String,
    pub os: String,
}

impl CudaImage {
    pub fn reference(&self) -> String {
        format!("nvidia/cuda:{}-devel-{}", self.cuda_version, self.os)
    }
}

/// The image a Docker build of `archs` for a wanted CUDA uses, and the CUDA it brings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageChoice {
    pub image: CudaImage,
    pub cuda: CudaVersion,
    /// Why this image, when it is not the wanted release's own.
    pub note: Option<String>,
}

/// Why no image could be chosen. `NoImage` is a gap in fdl's knowledge (a dry run still
/// shows the plan); `Arch` is a request no CUDA in the table can satisfy as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error(transparent)]
    Arch(#[from] ArchCudaError),
    #[error("no nvidia/cuda devel image known to fdl fits CUDA {cuda} and {archs}: {fix}")]
    NoImage {
        cuda: CudaVersion,
        archs: String,
        fix: String,
    },
}

/// Picks the `nvidia/cuda` devel image for a build of `archs` that asks for `cuda`.
///
/// The wanted release's own image when the table has it. Otherwise the newest known
/// image of the same major that is not newer and compiles every arch: an NCCL built with
/// an older 13.x runs under a newer 13.x runtime and needs no newer driver, so it serves
/// where the wanted one would. When nothing fits, the error names the `--cuda` values
/// that would.
pub fn choose_image(cuda: CudaVersion, archs: &[Arch]) -> Result<ImageChoice, ImageError> {
    if let Some(&arch) = archs.iter().find(|a| a.support().is_none()) {
        return Err(ArchCudaError::Unknown { arch }.into());
    }
    let image = |full: &str, os: &str| CudaImage {
        cuda_version: full.to_string(),
        os: os.to_string(),
    };
    if let Some((_, full, os)) = CUDA_IMAGES
        .iter()
        .find(|(mm, _, _)| *mm == cuda.major_minor())
    {
        check_archs_for_cuda(archs, cuda)?;
        let full = match cuda.patch {
            Some(_) => cuda.to_string(),
            None => full.to_string(),
        };
        return Ok(ImageChoice {
            image: image(&full, os),
            cuda,
            note: None,
        });
    }
    let fits = |mm: (u32, u32)| check_archs_for_cuda(archs, CudaVersion::new(mm.0, mm.1)).is_ok();
    let older = CUDA_IMAGES
        .iter()
        .filter(|(mm, _, _)| mm.0 == cuda.major && *mm < cuda.major_minor() && fits(*mm))
        .max_by_key(|(mm, _, _)| *mm);
    let names = archs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ");
    match older {
        Some((mm, full, os)) => Ok(ImageChoice {
            image: image(full, os),
            cuda: full.parse().expect("the image table holds valid versions"),
            note: Some(format!(
                "no nvidia/cuda image for CUDA {cuda} is known to fdl; {} is the newest known {}.x image not newer than {cuda} that compiles {names}. An NCCL built with an older {}.x runs under a newer {}.x runtime and needs no newer driver. --base-image IMAGE uses another image",
                fmt_mm(*mm),
                cuda.major,
                cuda.major,
                cuda.major
            )),
        }),
        None => {
            let working: Vec<String> = CUDA_IMAGES
                .iter()
                .filter(|(mm, _, _)| fits(*mm))
                .map(|(mm, _, _)| fmt_mm(*mm))
                .collect();
            let fix = if working.is_empty() {
                "no known image compiles all of them; build the archs separately, give --base-image IMAGE, or build with --backend native and a toolkit that compiles them".to_string()
            } else {
                format!(
                    "pass --cuda {} (known images that compile all of them), give --base-image IMAGE, or build with --backend native and a toolkit that compiles them",
                    working.join(" or ")
                )
            };
            Err(ImageError::NoImage {
                cuda,
                archs: names,
                fix,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_for_known_releases() {
        let sm80 = [Arch::new(8, 0)];
        let img = choose_image(CudaVersion::new(12, 8), &sm80).unwrap();
        assert_eq!(
            img.image.reference(),
            "nvidia/cuda:12.8.1-devel-ubuntu22.04"
        );
        assert_eq!(img.note, None);
        let pinned = choose_image("12.8.0".parse().unwrap(), &sm80).unwrap();
        assert_eq!(pinned.image.cuda_version, "12.8.0");
    }

    #[test]
    fn the_closest_release_that_compiles_every_arch() {
        let mixed = [Arch::new(6, 1), Arch::new(12, 0)];
        let c = closest_cuda_for(&mixed, CudaVersion::new(13, 3)).unwrap();
        assert_eq!(c.to_string(), "12.9");
        let c = closest_cuda_for(&[Arch::new(12, 0)], CudaVersion::new(12, 4)).unwrap();
        assert_eq!(c.to_string(), "12.8");
        assert_eq!(
            closest_cuda_for(&[Arch::new(10, 7)], CudaVersion::new(13, 5)),
            None
        );
    }

    /// A release newer than the table (torch 2.15's NCCL says CUDA 13.3) is planned with
    /// the newest known image of its major that compiles the archs, and says so.
    #[test]
    fn newer_releases_take_the_newest_fitting_image_of_their_major() {
        let img = choose_image(CudaVersion::new(13, 3), &[Arch::new(8, 0)]).unwrap();
        assert_eq!(
            img.image.reference(),
            "nvidia/cuda:13.2.0-devel-ubuntu24.04"
        );
        assert_eq!(img.cuda.to_string(), "13.2.0");
        let note = img.note.unwrap();
        assert!(
            note.contains("CUDA 13.3") && note.contains("no newer driver"),
            "{note}"
        );
        // 12.7 has no image, and 12.6 cannot compile sm_120: nothing older fits.
        let e = choose_image(
            CudaVersion::new(12, 7),
            &[Arch::new(6, 1), Arch::new(12, 0)],
        )
        .unwrap_err();
        assert!(matches!(e, ImageError::NoImage { .. }), "{e}");
        assert!(e.to_string().contains("--cuda 12.8 or 12.9"), "{e}");
        // Pascal under any CUDA 13: no 13.x image compiles it.
        let e = choose_image(
            CudaVersion::new(13, 3),
            &[Arch::new(6, 1), Arch::new(12, 0)],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("--cuda 12.8 or 12.9") && e.to_string().contains("--base-image"),
            "{e}"
        );
        // The wanted release's own image that cannot compile an arch is a conflict.
        let e = choose_image(CudaVersion::new(13, 0), &[Arch::new(6, 1)]).unwrap_err();
        assert!(
            matches!(e, ImageError::Arch(ArchCudaError::Conflict { .. })),
            "{e}"
        );
        let e = choose_image(CudaVersion::new(13, 5), &[Arch::new(10, 7)]).unwrap_err();
        assert!(
            matches!(e, ImageError::Arch(ArchCudaError::Unknown { .. })),
            "{e}"
        );
    }
}
