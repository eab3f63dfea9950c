//! Arbitrary text as a shipped build's manifest, with the name it is installed as before
//! the first NUL byte: the manifest parser and `receive`'s check that the manifest
//! describes that build. Never a panic; and whatever the check accepts names that build
//! in an absolute, plain `libtorch/nccl/builds/<name>` path.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Component;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (name, manifest) = match text.split_once('\0') {
        Some((n, m)) => (n.to_string(), m.to_string()),
        None => ("v2.27.5-sm86-sm107".to_string(), text.to_string()),
    };
    if fdl::nccl::store::BuildName::parse(&name).is_err() {
        return;
    }
    let Ok(m) = fdl::nccl::store::parse_manifest(&manifest) else {
        return;
    };
    match fdl::cluster::receive::manifest_fits(&m, &name) {
        Ok(()) => {
            assert_eq!(m.plan.name, name);
            let out = &m.plan.output_dir;
            assert!(out.is_absolute(), "{out:?}");
            assert!(
                out.components()
                    .all(|c| matches!(c, Component::RootDir | Component::Normal(_))),
                "{out:?}"
            );
            assert!(out.ends_with(format!("libtorch/nccl/builds/{name}")), "{out:?}");
            assert!(!m.checked.library.contains('/'), "{:?}", m.checked.library);
        }
        Err(e) => {
            let _ = format!("{e:#}");
        }
    }
});
