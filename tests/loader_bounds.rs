//! The loader model on hostile dynamic tables, through the real `fdl` process: a SysV
//! hash chain that loops, 20,000 DT_RPATH tags, 60,000 missing DT_NEEDED, tables placed
//! past the end of the file, and a library truncated while it is read. Each must end with
//! an answer or an error that says why, within a fixed memory bound, never a signal.
//!
//! The files are laid out by `fdl_synth::dso`. Each `fdl` runs with its address space
//! capped at 2 GiB (so a regression aborts instead of taking the machine's memory) and is
//! reaped with `wait4`. Its `ru_maxrss` also counts this test process's resident pages
//! at the moment of the spawn (the kernel carries a spawning process's high-water mark
//! across `exec`), so the tests run one at a time, return freed memory and reset this
//! process's high-water mark before each spawn: the figure is then the larger of the
//! child's peak and this process's small baseline, an upper bound on the child's own.

use fdl_synth::dso::{self, Dso, Hash, Symbol};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bound the issue sets for each case.
const RSS_LIMIT_KIB: u64 = 100 * 1024;

struct Run {
    /// Exit status, `None` when a signal ended it.
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    maxrss_kib: u64,
    wall: Duration,
}

/// Held by each test for its whole run: no other test's buffers are resident while a
/// child is measured.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn fdl(args: &[&str], cwd: &Path) -> Run {
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    // "5": reset this process's peak RSS to its current RSS (proc(5), clear_refs).
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let out = tempfile::tempdir().unwrap();
    let (so, se) = (out.path().join("out"), out.path().join("err"));
    // The address-space cap and the working directory are set by a shell that then
    // becomes fdl: a `pre_exec` hook or `current_dir` can make std fork this test
    // process, whose pages would count in the child's `ru_maxrss` before the exec.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 2097152 && cd \"$0\" && exec \"$@\"")
        .arg(cwd)
        .arg(env!("CARGO_BIN_EXE_fdl"))
        .args(args)
        .env_remove("FDL_ROOT")
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&so).unwrap())
        .stderr(std::fs::File::create(&se).unwrap());
    let start = Instant::now();
    let child = cmd.spawn().expect("run fdl");
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    loop {
        // SAFETY: `pid` is our own unreaped child; both pointers are to live locals.
        let got = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if got == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "wait4: {e}");
    }
    // Reaped above; dropping `Child` neither waits nor kills.
    drop(child);
    let wall = start.elapsed();
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
        stdout: read(&so),
        stderr: read(&se),
        maxrss_kib: ru.ru_maxrss as u64,
        wall,
    }
}

impl Run {
    /// Finished by itself, within the memory bound; reports what it took.
    fn bounded(&self, what: &str) -> &Self {
        eprintln!(
            "{what}: exit {:?}, signal {:?}, {:?}, peak RSS {} KiB",
            self.code, self.signal, self.wall, self.maxrss_kib
        );
        assert!(
            self.signal.is_none(),
            "{what}: fdl died of signal {:?}; stderr: {}",
            self.signal,
            tail(&self.stderr)
        );
        assert!(
            self.maxrss_kib < RSS_LIMIT_KIB,
            "{what}: peak RSS {} KiB, over {RSS_LIMIT_KIB} KiB",
            self.maxrss_kib
        );
        self
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\nstderr: {}",
                tail(&self.stdout),
                tail(&self.stderr)
            )
        })
    }
}

fn tail(s: &str) -> &str {
    let cut = s.len().saturating_sub(2000);
    let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(0);
    &s[cut..]
}

fn imports_nccl() -> Vec<Symbol> {
    vec![Symbol {
        name: "ncclAllReduce".into(),
        defined: false,
    }]
}

#[test]
fn a_hash_chain_that_loops_is_bounded_and_named() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    Dso {
        soname: Some("libtorch_cuda.so".into()),
        needed: vec!["libloop.so".into()],
        runpath: Some("$ORIGIN".into()),
        symbols: imports_nccl(),
        ..Dso::default()
    }
    .write(&dir.path().join("libtorch_cuda.so"))
    .unwrap();
    // Its .dynsym holds two symbols; its hash table claims 2^32-1 chain entries, and
    // the one bucket's chain is symbol 1, then symbol 1 again, forever.
    Dso {
        soname: Some("libloop.so".into()),
        symbols: vec![Symbol {
            name: "loop_fn".into(),
            defined: true,
        }],
        hash: Hash::SysVSelfLoop { nchain: u32::MAX },
        sections: true,
        ..Dso::default()
    }
    .write(&dir.path().join("libloop.so"))
    .unwrap();
    let r = fdl(
        &["nccl", "detect", "libtorch_cuda.so", "--json"],
        dir.path(),
    );
    r.bounded("looping DT_HASH chain");
    assert_eq!(
        r.code,
        Some(3),
        "unknown answers exit 3: {}",
        tail(&r.stderr)
    );
    let j = r.json();
    assert_eq!(j["answer"], "unknown", "{j}");
    let reason = j["reason"].as_str().unwrap();
    assert!(
        reason.contains("libloop.so") && reason.contains("loops"),
        "the reason names the object and its looping chain: {reason}"
    );
}

#[test]
fn repeated_rpath_tags_are_read_as_the_loader_reads_them() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    // One long list of distinct directories, repeated in 20,000 DT_RPATH tags (one
    // string in .dynstr each, as a linker that was fed the flag 20,000 times writes).
    let list: Vec<String> = (0..200).map(|i| format!("/nonexistent/d{i:05}")).collect();
    let list = list.join(":");
    assert!(list.len() < 4096);
    Dso {
        soname: Some("libtorch_cuda.so".into()),
        needed: vec!["libdep.so".into()],
        rpath_tags: vec![list; 20_000],
        symbols: imports_nccl(),
        ..Dso::default()
    }
    .write(&dir.path().join("libtorch_cuda.so"))
    .unwrap();
    let r = fdl(
        &["nccl", "detect", "libtorch_cuda.so", "--json"],
        dir.path(),
    );
    r.bounded("20,000 DT_RPATH tags");
    assert_eq!(r.code, Some(3), "{}", tail(&r.stderr));
    let j = r.json();
    assert_eq!(j["answer"], "unknown", "{j}");
    let f = &j["failures"][0];
    assert_eq!(f["needed"], "libdep.so", "{j}");
    // glibc keeps one DT_RPATH (the last tag's) and reads each directory once.
    let searched: Vec<&str> = f["searched"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .filter(|p| p.starts_with("/nonexistent/"))
        .collect();
    assert_eq!(searched.len(), 200, "each DT_RPATH directory searched once");
}

#[test]
fn sixty_thousand_missing_needed_are_summarised() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let needed: Vec<String> = (0..60_000).map(|i| format!("libgone{i:05}.so")).collect();
    Dso {
        soname: Some("libtorch_cuda.so".into()),
        needed,
        symbols: imports_nccl(),
        ..Dso::default()
    }
    .write(&dir.path().join("libtorch_cuda.so"))
    .unwrap();
    let r = fdl(
        &["nccl", "detect", "libtorch_cuda.so", "--json"],
        dir.path(),
    );
    r.bounded("60,000 missing DT_NEEDED, --json");
    assert_eq!(r.code, Some(3), "{}", tail(&r.stderr));
    assert!(
        r.stdout.len() < 256 << 10,
        "the JSON answer is {} bytes",
        r.stdout.len()
    );
    let j = r.json();
    assert_eq!(j["answer"], "unknown", "{j}");
    let shown = j["failures"].as_array().unwrap().len();
    let omitted = j["failures_omitted"].as_u64().unwrap();
    assert!(shown > 0 && shown <= 64, "{shown} failures listed");
    assert!(omitted > 0, "the rest are counted");
    assert_eq!(j["failures"][0]["needed"], "libgone00000.so");
    assert!(
        j["reason"].as_str().unwrap().contains("DT_NEEDED"),
        "the reason says the list was not followed to its end: {}",
        j["reason"]
    );

    let r = fdl(&["nccl", "detect", "libtorch_cuda.so"], dir.path());
    r.bounded("60,000 missing DT_NEEDED, text");
    assert_eq!(r.code, Some(3), "{}", tail(&r.stderr));
    let lines = r.stdout.lines().count();
    assert!(lines < 100, "{lines} lines of text:\n{}", tail(&r.stdout));
    assert!(
        r.stdout.contains(&format!("{omitted} more")),
        "the text counts what it leaves out:\n{}",
        r.stdout
    );
}

#[test]
fn tables_outside_the_file_make_the_answer_unknown() {
    let _serial = serial();
    let cases: &[(&str, u64, Hash)] = &[
        ("DT_STRTAB", dso::DT_STRTAB, Hash::SysV),
        ("DT_SYMTAB", dso::DT_SYMTAB, Hash::SysV),
        ("DT_HASH", dso::DT_HASH, Hash::SysV),
        ("DT_GNU_HASH", dso::DT_GNU_HASH, Hash::Gnu),
        ("DT_VERSYM", dso::DT_VERSYM, Hash::SysV),
        ("DT_VERNEED", dso::DT_VERNEED, Hash::SysV),
    ];
    for &(name, tag, ref hash) in cases {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libplain.so");
        let far = 1u64 << 40;
        let mut d = Dso {
            soname: Some("libplain.so".into()),
            symbols: vec![Symbol {
                name: "plain_fn".into(),
                defined: true,
            }],
            hash: hash.clone(),
            override_tags: vec![(tag, far)],
            ..Dso::default()
        };
        if matches!(tag, dso::DT_VERSYM | dso::DT_VERNEED) {
            d.extra_tags = vec![(tag, far), (dso::DT_VERNEEDNUM, 1)];
        }
        d.write(&lib).unwrap();
        let r = fdl(&["nccl", "detect", "libplain.so"], dir.path());
        r.bounded(name);
        assert_eq!(
            r.code,
            Some(3),
            "{name} outside the file is an unknown answer, not 'no NCCL':\n{}{}",
            r.stdout,
            r.stderr
        );
        assert!(
            r.stdout.contains("Unknown") && r.stdout.contains(name),
            "{name}: the answer names the table it cannot read:\n{}",
            r.stdout
        );
        let r = fdl(&["nccl", "detect", "libplain.so", "--json"], dir.path());
        assert_eq!(r.code, Some(3));
        assert_eq!(r.json()["answer"], "unknown", "{name}");
    }
}
/// A library cut short while `fdl nccl detect` walks its 2 million dynamic symbols:
/// the walk touches a memory-mapped file, where a vanished page is SIGBUS. fdl must say
/// the file changed, every time, and never die of the signal. The truncation lands at a
/// random moment; runs repeat until some land during the read.
#[test]
fn a_library_truncated_while_read_is_reported() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libbig.so");
    let whole_copy = dir.path().join("whole");
    let mut symbols = imports_nccl();
    symbols.extend((0..2_000_000).map(|i| Symbol {
        name: format!("f{i:07}"),
        defined: true,
    }));
    Dso {
        soname: Some("libbig.so".into()),
        symbols,
        sections: true,
        ..Dso::default()
    }
    .write(&whole_copy)
    .unwrap();
    // How long an untouched run takes, to aim the truncation inside it.
    std::fs::copy(&whole_copy, &lib).unwrap();
    let whole = fdl(&["nccl", "detect", "libbig.so"], dir.path());
    assert!(whole.signal.is_none(), "{}", whole.stderr);
    assert_eq!(whole.code, Some(3), "{}{}", whole.stdout, whole.stderr);
    let span = whole.wall.as_micros() as u64;
    let mut hit = 0;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..60 {
        std::fs::copy(&whole_copy, &lib).unwrap();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_micros(seed % span.max(1));
        let cut = lib.clone();
        let cutter = std::thread::spawn(move || {
            std::thread::sleep(delay);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&cut)
                .unwrap()
                .set_len(4096)
                .unwrap();
        });
        let r = fdl(&["nccl", "detect", "libbig.so"], dir.path());
        cutter.join().unwrap();
        assert!(
            r.signal.is_none(),
            "round {round}: fdl died of signal {:?}\n{}{}",
            r.signal,
            r.stdout,
            r.stderr
        );
        let said = format!("{}{}", r.stdout, r.stderr);
        // The answer wraps at 100 columns: read with its lines joined.
        let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
        if said.contains("while being read") || said.contains("while being inspected") {
            hit += 1;
            assert_ne!(r.code, Some(0), "round {round}: {said}");
            if hit >= 5 {
                break;
            }
        }
    }
    assert!(
        hit > 0,
        "no truncation landed during a read in 60 rounds: the test did not test anything"
    );
}

/// A 1,000-level DT_NEEDED chain whose every library sits in one directory and has a
/// DT_RPATH of its own (an empty directory): each level's search goes through the
/// DT_RPATH of every level before it, about 500,000 lookups in all, as glibc makes them.
/// The real loader maps the whole chain; fdl answers too (each directory is read once),
/// within the same bounds. The libraries are one `cc` build whose name, needed name and
/// DT_RPATH strings are patched in place, each to a string of the same length.
#[test]
fn a_thousand_level_rpath_chain_is_answered_as_the_loader_answers_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let libs = root.join("A");
    std::fs::create_dir_all(&libs).unwrap();
    const LEVELS: usize = 1000;
    // Placeholders: 6-digit names, and a DT_RPATH long enough for any directory here,
    // padded with slashes (`dir////lib.so` is the same file).
    let rpath_slot = "/".repeat(240);
    let template = root.join("template.so");
    let src = root.join("t.c");
    std::fs::write(&src, "int fdl_level(void) { return 0; }\n").unwrap();
    let needed_stub = root.join("libNNNNNN.so");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&needed_stub)
        .arg(&src)
        .arg("-Wl,-soname,libNNNNNN.so")
        .status()
        .unwrap();
    assert!(ok.success());
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-nostdlib", "-o"])
        .arg(&template)
        .arg(&src)
        .arg("-Wl,-soname,libSSSSSS.so,--no-as-needed,--disable-new-dtags")
        .arg(&needed_stub)
        .arg(format!("-Wl,-rpath,{rpath_slot}"))
        .status()
        .unwrap();
    assert!(ok.success());
    let bytes = std::fs::read(&template).unwrap();
    let patch = |bytes: &mut Vec<u8>, from: &str, to: &str| {
        assert_eq!(from.len(), to.len(), "{to}");
        let at = bytes
            .windows(from.len() + 1)
            .position(|w| w[..from.len()] == *from.as_bytes() && w[from.len()] == 0)
            .unwrap_or_else(|| panic!("{from} is not in the template"));
        bytes[at..at + from.len()].copy_from_slice(to.as_bytes());
    };
    let slot = |dirs: &str| format!("{dirs}{}", "/".repeat(rpath_slot.len() - dirs.len()));
    for k in 0..=LEVELS {
        let own = root.join(format!("e{k}"));
        std::fs::create_dir_all(&own).unwrap();
        let mut lib = bytes.clone();
        patch(&mut lib, "libSSSSSS.so", &format!("lib{k:06}.so"));
        // The last level needs the one before it again: already loaded, no search.
        let next = if k < LEVELS { k + 1 } else { k - 1 };
        patch(&mut lib, "libNNNNNN.so", &format!("lib{next:06}.so"));
        // The first level finds the rest through its own path to A; every other level
        // adds a directory the searches below it go through first.
        let rpath = if k == 0 {
            format!("{}:{}", own.display(), libs.display())
        } else {
            own.display().to_string()
        };
        patch(&mut lib, &rpath_slot, &slot(&rpath));
        std::fs::write(libs.join(format!("lib{k:06}.so")), lib).unwrap();
    }
    // The oracle: the real loader maps every level.
    let ldd = Command::new("ldd")
        .arg(libs.join("lib000000.so"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&ldd.stdout);
    let mapped = (1..=LEVELS)
        .filter(|k| listed.contains(&format!("lib{k:06}.so => ")))
        .count();
    assert_eq!(
        mapped,
        LEVELS,
        "the real loader did not map the chain:\n{}",
        tail(&listed)
    );

    let r = fdl(&["nccl", "detect", "A/lib000000.so", "--json"], &root);
    r.bounded("a 1,000-level DT_RPATH chain");
    let j = r.json();
    assert_ne!(j["answer"], "unknown", "{}", j["reason"]);
    let objects = j["link_map"].as_array().unwrap();
    for k in 1..=LEVELS {
        let name = format!("lib{k:06}.so");
        assert!(
            objects
                .iter()
                .any(|o| o["path"].as_str().is_some_and(|p| p.ends_with(&name))),
            "{name} is not in fdl's link map"
        );
    }
}
