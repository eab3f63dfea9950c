//! `fdl cluster status`: every worker's own report, fetched through the transport (all
//! workers at once: in parallel over SSH, one step through srun), then
//! the verdicts that decide whether a multi-host run can start: one NCCL version
//! everywhere (NCCL refuses to form a communicator otherwise, patch included), code for
//! every GPU in both the effective NCCL and the libtorch a rank loads, drivers new enough for that NCCL's CUDA, every symbol each libtorch needs,
//! and a preload that takes effect where one is set.

use super::config::Worker;
use super::host::{Facts, HostReport, REPORT_SCHEMA};
use super::transport::{self, Transport, Unreachable, Unreached};
use anyhow::{anyhow, bail, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the controller knows of one worker.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStatus {
    pub host: String,
    pub target: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<HostReport>,
    /// Why there is no report: the SSH failure, or what the remote side said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Which engine could not reach it, when that is the error: the next step to name.
    #[serde(skip)]
    pub unreached: Option<Unreached>,
    /// The controller's fdl was copied there for this query.
    pub shipped_fdl: bool,
    /// The worker's `env.LD_PRELOAD` from the cluster file: whether a bridge is wanted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ld_preload: Option<String>,
}

/// A verdict's state. `ok` rests on every fact it needs; anything missing (a worker that
/// did not answer, an NCCL the loader model cannot name) is `unknown`, never `ok`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok,
    Red,
    Unknown,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub name: &'static str,
    pub state: State,
    /// `state == ok`, for scripts of fdl 0.1.
    pub ok: bool,
    pub detail: String,
}

impl Verdict {
    fn new(name: &'static str, state: State, detail: String) -> Verdict {
        Verdict {
            name,
            state,
            ok: state == State::Ok,
            detail,
        }
    }
}

/// Red on findings, else unknown on missing facts, else ok.
fn judge(red: &[String], unknown: &[String]) -> State {
    if !red.is_empty() {
        State::Red
    } else if !unknown.is_empty() {
        State::Unknown
    } else {
        State::Ok
    }
}

/// The controller's own fdl, to run on workers that lack a compatible one.
#[derive(Debug, Clone)]
pub struct OwnBinary {
    pub path: PathBuf,
    pub sha256: String,
}

impl OwnBinary {
    /// `cache`: fdl's cache directory, where the digest is kept by the file's identity.
    pub fn current(cache: Option<&std::path::Path>) -> Result<OwnBinary> {
        let path = std::env::current_exe()?;
        Ok(OwnBinary {
            sha256: crate::cache::sha256_file_kept(cache, &path)?,
            path,
        })
    }

    /// Where a worker keeps this binary: named by its digest, so two fdl versions never
    /// share a file and a present file is known to be this one.
    pub(super) fn remote_path_expr(&self) -> String {
        format!(
            "\"${{XDG_CACHE_HOME:-$HOME/.cache}}/fdl/bin/fdl-{}\"",
            &self.sha256[..16]
        )
    }
}

/// The worker-side POSIX sh that refuses fdl's cache directory `$d` when `$m` (its
/// `stat -c %A` mode, of the entry itself, not what a link names) and `$u` (its owner)
/// are not those of a directory of this user (`$me`) that no one else may write, as
/// [`crate::cache::own_dir`] wants of the local cache: it says why on stderr and exits
/// [`UNSAFE_CACHE`]. A directory others may write is refused, not chmod-ed: whoever could
/// write it may have planted anything.
fn refuse_unsafe_dir() -> String {
    format!(
        "if [ \"${{m#d}}\" = \"$m\" ]; then why='is not a directory (a link or a file is there)'; \
         elif [ \"$u\" != \"$me\" ]; then why=\"belongs to another user (uid $u)\"; \
         else case \"$m\" in ?????w*|????????w*) why=\"is writable by others (mode $m)\";; *) why=;; esac; fi; \
         if [ -n \"$why\" ]; then \
           printf '%s\\n' \"fdl's cache $d on this worker $why: fdl runs nothing from it. Make it a directory of this user that only it can write there (chmod go-w), or remove it, then run again\" >&2; \
           exit {UNSAFE_CACHE}; \
         fi"
    )
}

/// The worker-side POSIX sh that checks fdl's cache directories there (`…/fdl` and
/// `…/fdl/bin`, where they exist) by [`refuse_unsafe_dir`], for a command that then
/// writes into them.
fn cache_dirs_check() -> String {
    format!(
        "set -f; me=$(id -u); c=\"${{XDG_CACHE_HOME:-$HOME/.cache}}/fdl\"; \
         for d in \"$c\" \"$c/bin\"; do \
           if [ -e \"$d\" ] || [ -h \"$d\" ]; then \
             set -- $(LC_ALL=C stat -c '%u %A' -- \"$d\"); u=$1; m=$2; {refuse}; \
           fi; \
         done",
        refuse = refuse_unsafe_dir(),
    )
}

impl OwnBinary {
    /// The worker-side POSIX sh that opens the controller's fdl in the worker's cache
    /// (see [`OwnBinary::remote_path_expr`]) and sets `f` to run it, or leaves `f` empty
    /// where no file is there. The one way fdl runs its cached binary on a worker: the
    /// cache directories must pass [`refuse_unsafe_dir`], and the file must be a regular
    /// file of this user that no one else may write; it is opened once as fd 9, its
    /// sha256 read from that descriptor, and `f` is `/proc/self/fd/9`, so what runs is
    /// the file that was hashed, whatever is renamed over its name in between. A file
    /// that fails any of this exits [`NOT_THIS_FDL`]: it is never run, and the controller
    /// ships its own over it (a planted file included). Hashing the 40 MB binary costs
    /// every command 0.1–0.4 s on each worker (sha256sum), so, as the controller keeps
    /// its own digest ([`crate::cache::sha256_file_kept`]), the digest found is kept
    /// beside the file (`fdl-….sum`, a file of this user only it can write, at most 256
    /// bytes) under the opened file's identity: device, inode, size, and modification and
    /// change times (any write moves the change time, which no program sets back). A
    /// record of another identity or digest, or one others could write, is passed over
    /// and the file hashed again.
    ///
    /// Every status and every shipped command pays this script on every node, three
    /// nodes often sharing a core (issue 31), so the common case forks once: one `stat`
    /// (of the entries themselves, links not followed) answers for the user (the owner of
    /// `/proc/self/`, which is that `stat`'s own euid, as `id -u` says), both directories,
    /// the file and its record, after the file is opened; `[ "$b" -ef /proc/self/fd/9 ]`
    /// then says the name still holds the opened file, so its identity is the
    /// descriptor's. The record is read by the shell itself once `stat` says it is small.
    /// Any answer of another shape (an entry gone in between) is not trusted: exit
    /// [`NOT_THIS_FDL`], and the controller ships again.
    pub fn open_there(&self) -> String {
        format!(
            "set -f; c=\"${{XDG_CACHE_HOME:-$HOME/.cache}}/fdl\"; b={b}; k=\"$b.sum\"; f=; \
             if [ -f \"$b\" ] && [ ! -h \"$b\" ] && [ -r \"$b\" ]; then exec 9< \"$b\"; fi; \
             set -- /proc/self/; h=; n=1; \
             for p in \"$c\" \"$c/bin\" \"$b\" \"$k\"; do \
               if [ -e \"$p\" ] || [ -h \"$p\" ]; then set -- \"$@\" \"$p\"; h=\"${{h}}1\"; n=$((n + 1)); else h=\"${{h}}0\"; fi; \
             done; \
             set -- $(LC_ALL=C stat -c '%u %A %d %i %s %y %z' -- \"$@\" 2>/dev/null); \
             [ $# -eq $((n * 11)) ] || exit {NOT_THIS_FDL}; \
             me=$1; shift 11; ours=; id=; kept=; \
             for d in \"$c\" \"$c/bin\"; do \
               case $h in 1*) u=$1; m=$2; shift 11; {refuse};; esac; h=${{h#?}}; \
             done; \
             case $h in 1*) \
               case \"$2\" in -????w*|-???????w*) ;; -*) [ \"$1\" = \"$me\" ] && [ \"$b\" -ef /proc/self/fd/9 ] && ours=1;; esac; \
               [ -n \"$ours\" ] || exit {NOT_THIS_FDL}; \
               id=\"$3 $4 $5 $6 $7 $8 $9 ${{10}} ${{11}}\"; shift 11;; \
             esac; h=${{h#?}}; \
             case $h in 1*) \
               case \"$2\" in -????w*|-???????w*) ;; -*) \
                 if [ \"$1\" = \"$me\" ] && [ \"$5\" -le 256 ]; then r=; read -r r < \"$k\" || :; [ \"$r\" = \"$id {sha}\" ] && kept=1; fi;; \
               esac;; \
             esac; \
             if [ -n \"$ours\" ]; then \
               if [ -z \"$kept\" ]; then \
                 [ \"$(sha256sum <&9 | cut -d' ' -f1)\" = {sha} ] || exit {NOT_THIS_FDL}; \
                 (umask 077; printf '%s\\n' \"$id {sha}\" > \"$k.$$\" && mv -f -- \"$k.$$\" \"$k\") 2>/dev/null; \
               fi; \
               f=/proc/self/fd/9; \
             fi",
            b = self.remote_path_expr(),
            refuse = refuse_unsafe_dir(),
            // A digest is hex (fdl's own, [`OwnBinary::current`]): a plain word in the
            // script, quoted or not; anything else stands for no file of ours.
            sha = if self.sha256.bytes().all(|c| c.is_ascii_hexdigit()) {
                self.sha256.as_str()
            } else {
                "not-a-digest"
            },
        )
    }
}

/// What a worker's script exiting [`UNSAFE_CACHE`] said: its cache line, for the error.
pub(super) fn unsafe_cache(out: &std::process::Output) -> Option<anyhow::Error> {
    if out.status.code() != Some(UNSAFE_CACHE) {
        return None;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .rfind(|l| l.starts_with("fdl's cache "))
        .unwrap_or("fdl's cache on this worker is not safe to run from");
    Some(anyhow!(
        "{}",
        crate::text::clean(&line.chars().take(400).collect::<String>())
    ))
}

/// The line fdl prints before the facts it asks a worker's shell for.
const FACTS: &str = "fdl-facts";

/// Exit codes of the remote script that are fdl's, not the command's.
pub(super) const NO_PATH: i32 = 97;
const NO_FDL: i32 = 96;
const BAD_UPLOAD: i32 = 95;
/// The cached fdl there is not these bytes, or not in a file only its user can change.
pub(super) const NOT_THIS_FDL: i32 = 94;
/// fdl's cache directory there is not the user's alone.
const UNSAFE_CACHE: i32 = 93;

/// The remote command that runs fdl with `args` in the worker's checkout: the
/// controller's fdl when the worker holds it, else the worker's own.
fn fdl_script(w: &Worker, own: &OwnBinary, args: &[&str]) -> String {
    format!(
        "cd -- {} 2>/dev/null || exit {NO_PATH}; {}; \
         if [ -n \"$f\" ]; then :; elif command -v fdl >/dev/null 2>&1; then f=fdl; else exit {NO_FDL}; fi; \
         exec \"$f\" --root \"$PWD\" {}",
        crate::step::single_quote(&w.path),
        own.open_there(),
        transport::words(args)
    )
}

/// What one answer of fdl on a worker says: a value, an fdl that cannot serve (none, or
/// another schema: `Ok(Err(why))`, and then the controller's is shipped), or a failure.
fn attempt<T>(
    w: &Worker,
    out: Result<std::process::Output>,
    parse: &(dyn Fn(&std::process::Output) -> std::result::Result<T, String> + Sync),
) -> Result<std::result::Result<T, String>> {
    let out = out?;
    match out.status.code() {
        Some(NO_PATH) => bail!(
            "its path {} does not exist there (or is not a directory it can enter): fix `path:` or create the checkout",
            w.path
        ),
        Some(NO_FDL) => return Ok(Err("no fdl there".into())),
        Some(NOT_THIS_FDL) => {
            return Ok(Err(
                "the fdl in its cache is not this fdl's bytes, or others may change it (it was not run)"
                    .into(),
            ))
        }
        _ => {}
    }
    if let Some(e) = unsafe_cache(&out) {
        return Err(e);
    }
    if let Some(why) = transport::banner(&out.stdout) {
        bail!("{why}");
    }
    Ok(parse(&out))
}

/// Runs fdl with `args` on every worker and reads each answer with `parse`, which says
/// `Err(why)` when the answer shows an fdl that cannot serve (none, or another schema):
/// there the controller's fdl is shipped and asked once more. Returns per worker the
/// answer and whether fdl was shipped.
pub(super) fn run_fdl_all<T: Send>(
    t: &dyn Transport,
    ws: &[&Worker],
    own: &OwnBinary,
    args: &(dyn Fn(&Worker) -> Vec<String> + Sync),
    timeout: Duration,
    parse: &(dyn Fn(&std::process::Output) -> std::result::Result<T, String> + Sync),
) -> Vec<Result<(T, bool)>> {
    let script = |w: &Worker| {
        let a = args(w);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        fdl_script(w, own, &a)
    };
    let first: Vec<Result<std::result::Result<T, String>>> = t
        .run_each(ws, &script, timeout)
        .into_iter()
        .zip(ws)
        .map(|(out, w)| attempt(w, out, parse))
        .collect();
    let mut results: Vec<Option<Result<(T, bool)>>> = Vec::new();
    let mut again: Vec<(usize, String)> = Vec::new();
    for (i, r) in first.into_iter().enumerate() {
        match r {
            Ok(Ok(v)) => results.push(Some(Ok((v, false)))),
            Ok(Err(why)) => {
                results.push(None);
                again.push((i, why));
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    if !again.is_empty() {
        let sub: Vec<&Worker> = again.iter().map(|(i, _)| ws[*i]).collect();
        let shipped = ship_binary(t, &sub, own, timeout);
        let mut retry: Vec<(usize, String)> = Vec::new();
        for ((i, why), r) in again.into_iter().zip(shipped) {
            match r {
                Ok(()) => retry.push((i, why)),
                // As context, so that a failure to reach the host stays in the chain.
                Err(e) => {
                    results[i] = Some(Err(
                        e.context(format!("{why}, and fdl could not be shipped"))
                    ))
                }
            }
        }
        let sub: Vec<&Worker> = retry.iter().map(|(i, _)| ws[*i]).collect();
        let outs = t.run_each(&sub, &script, timeout);
        for ((i, why), out) in retry.into_iter().zip(outs) {
            results[i] = Some(match attempt(ws[i], out, parse) {
                Ok(Ok(v)) => Ok((v, true)),
                Ok(Err(again)) => Err(anyhow!("{why}; after shipping fdl: {again}")),
                Err(e) => Err(e),
            });
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow!("no answer"))))
        .collect()
}

/// The last line fdl wrote to stderr: its error, for a message.
fn last_error(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .last()
        .unwrap_or("no message")
        .to_string()
}

fn blank_status(w: &Worker) -> WorkerStatus {
    WorkerStatus {
        host: w.host.clone(),
        target: w.ssh.target.clone(),
        path: w.path.clone(),
        report: None,
        error: None,
        unreached: None,
        shipped_fdl: false,
        ld_preload: w.ld_preload().map(str::to_string),
    }
}

fn self_script_args(w: &Worker, asked: Asked) -> Vec<String> {
    let mut args: Vec<String> = vec!["cluster".into(), "self".into(), "--json".into()];
    match asked.witness {
        Witnesses::None => args.push("--no-witness".into()),
        Witnesses::Loader => {}
        Witnesses::LoaderAndPython => args.push("--python-witness".into()),
    }
    match asked.process {
        Some(crate::loader::python::ProcessKind::Python) => {
            args.extend(["--process".into(), "python".into()])
        }
        Some(crate::loader::python::ProcessKind::Program) => {
            args.extend(["--process".into(), "program".into()])
        }
        None => {}
    }
    args.extend(worker_args(w, &super::host::reported_variable));
    args
}

/// What a worker-side command needs of its worker's entry: `--arch`, `--ld-preload`, and
/// `--env NAME=VALUE` for each variable of its env: block that `wanted` names.
pub(super) fn worker_args(w: &Worker, wanted: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(arch) = &w.arch {
        args.extend(["--arch".into(), arch.clone()]);
    }
    if let Some(pre) = w.ld_preload() {
        args.extend(["--ld-preload".into(), pre.to_string()]);
    }
    for (k, v) in w.env.iter().filter(|(k, _)| wanted(k)) {
        args.extend(["--env".into(), format!("{k}={v}")]);
    }
    args
}

/// Per worker, the `LD_PRELOAD` value for build `name` there: its own `fdl cluster link`
/// answers with the build's path, or the link in its per-user cache it made for it when
/// that path holds a space or a colon.
pub fn preload_on_all(
    t: &dyn Transport,
    ws: &[&Worker],
    own: &OwnBinary,
    name: &str,
    timeout: Duration,
) -> Vec<Result<String>> {
    let parse = |out: &std::process::Output| {
        let text = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<serde_json::Value>(text.trim()) {
            Ok(v) if v["ld_preload"].is_string() => {
                Ok(Ok(v["ld_preload"].as_str().unwrap_or_default().to_string()))
            }
            Ok(v) if v["error"].is_string() => {
                Ok(Err(v["error"].as_str().unwrap_or("").to_string()))
            }
            _ => Err(format!(
                "its fdl cannot make preload links ({})",
                last_error(out)
            )),
        }
    };
    // After `--`: a name starting with `-` is the build, never an option.
    let args = |_: &Worker| -> Vec<String> {
        ["cluster", "link", "--json", "--", name]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    run_fdl_all(t, ws, own, &args, timeout, &parse)
        .into_iter()
        .map(|r| r.and_then(|(answer, _)| answer.map_err(|why| anyhow!("{why}"))))
        .collect()
}

/// Makes the controller's fdl present on every worker: a cached copy is used when its
/// sha256 is this one's, else it is shipped again.
pub(super) fn ensure_fdl(
    t: &dyn Transport,
    ws: &[&Worker],
    own: &OwnBinary,
    timeout: Duration,
) -> Vec<Result<()>> {
    let script = |_: &Worker| format!("{}; [ -n \"$f\" ]", own.open_there());
    let checked = t.run_each(ws, &script, timeout);
    let mut results: Vec<Option<Result<()>>> = Vec::new();
    let mut need = Vec::new();
    for (i, r) in checked.into_iter().enumerate() {
        match r {
            Ok(out) if out.status.success() => results.push(Some(Ok(()))),
            Ok(out) if unsafe_cache(&out).is_some() => results.push(unsafe_cache(&out).map(Err)),
            Ok(_) => {
                results.push(None);
                need.push(i);
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    let sub: Vec<&Worker> = need.iter().map(|&i| ws[i]).collect();
    for (i, r) in need.into_iter().zip(ship_binary(t, &sub, own, timeout)) {
        results[i] = Some(r);
    }
    results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
}

/// Copies the controller's fdl to every worker's cache, checked by sha256 there before it
/// is renamed into place. A worker of another CPU or libc is refused: the binary would
/// not run there.
pub(super) fn ship_binary(
    t: &dyn Transport,
    ws: &[&Worker],
    own: &OwnBinary,
    timeout: Duration,
) -> Vec<Result<()>> {
    if ws.is_empty() {
        return Vec::new();
    }
    let dest = own.remote_path_expr();
    // The facts, and the cache directory made (its physical path is where the copy goes).
    let facts = |_: &Worker| {
        format!(
            "echo {FACTS}; uname -m; getconf GNU_LIBC_VERSION 2>/dev/null || echo 'no-glibc'; \
             d=$(dirname {dest}) && (umask 077 && mkdir -p \"$d\") && {{ {check}; }} && cd -P -- \"$d\" && pwd -P",
            check = cache_dirs_check(),
        )
    };
    let mut results: Vec<Option<Result<()>>> = Vec::new();
    let mut going: Vec<(usize, String)> = Vec::new();
    for (i, out) in t.run_each(ws, &facts, timeout).into_iter().enumerate() {
        match out.and_then(|out| binary_goes_to(&out)) {
            Ok(dir) => {
                results.push(None);
                going.push((i, dir));
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    let name = format!(".incoming-fdl-{}", &own.sha256[..16]);
    let hosts: Vec<(&Worker, String)> = going.iter().map(|(i, d)| (ws[*i], d.clone())).collect();
    let sent = t.send_file(&hosts, &own.path, &name, timeout);
    let mut landed: Vec<(usize, String)> = Vec::new();
    for ((i, dir), r) in going.into_iter().zip(sent) {
        match r {
            Ok(()) => landed.push((i, dir)),
            Err(e) => results[i] = Some(Err(e)),
        }
    }
    let check = |w: &Worker| {
        let dir = &landed
            .iter()
            .find(|(i, _)| std::ptr::eq(ws[*i], w))
            .map(|(_, d)| d.clone())
            .unwrap_or_default();
        format!(
            // Checked as a copy fdl made here: the file as sent may still be held open
            // by what wrote it (a binary open for writing cannot be run).
            "cd -P -- {dir} || exit 1; tmp={name}; \
             cp -- \"$tmp\" \"$tmp.x\" && rm -f -- \"$tmp\" || exit 1; \
             if [ \"$(sha256sum < \"$tmp.x\" | cut -d' ' -f1)\" = {sha} ]; then chmod 755 \"$tmp.x\" && mv -f \"$tmp.x\" {dest}; \
             else rm -f \"$tmp.x\"; exit {BAD_UPLOAD}; fi",
            dir = crate::step::single_quote(dir),
            name = crate::step::single_quote(&name),
            sha = crate::step::single_quote(&own.sha256),
        )
    };
    let sub: Vec<&Worker> = landed.iter().map(|(i, _)| ws[*i]).collect();
    // Copying and hashing a binary of tens of MiB: a copy's time, not a command's.
    let checked = t.run_each(&sub, &check, transport::copy_limit(timeout));
    for ((i, _), out) in landed.iter().zip(checked) {
        results[*i] = Some(out.and_then(|out| match out.status.code() {
            Some(0) => Ok(()),
            Some(BAD_UPLOAD) => bail!("the copy arrived damaged (sha256 differs) and was deleted"),
            _ => bail!(
                "the copy failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }));
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow!("no answer"))))
        .collect()
}

/// Reads the facts a worker gave for a binary: it must run there; the answer is the
/// cache directory the copy goes to.
fn binary_goes_to(out: &std::process::Output) -> Result<String> {
    let text = String::from_utf8_lossy(&out.stdout);
    // The answer starts after fdl's marker line; text before it is the shell's, not uname's.
    let (before, answer) = match text.split_once(&format!("{FACTS}\n")) {
        Some(parts) => parts,
        None => bail!(
            "its shell did not run `uname -m` as asked (it answered '{}')",
            crate::text::clean(&text.trim().chars().take(120).collect::<String>())
        ),
    };
    if let Some(why) = transport::shell_noise(before) {
        bail!("{why}");
    }
    let mut lines = answer.lines();
    let machine = lines.next().unwrap_or("").trim();
    let libc = lines.next().unwrap_or("").trim();
    runs_there(
        machine,
        libc,
        std::env::consts::ARCH,
        local_glibc().as_deref(),
    )?;
    if let Some(e) = unsafe_cache(out) {
        return Err(e);
    }
    match lines.next().map(str::trim) {
        Some(dir) if dir.starts_with('/') && out.status.success() => Ok(dir.to_string()),
        _ => bail!(
            "its cache directory for fdl could not be made: {}",
            crate::text::clean(String::from_utf8_lossy(&out.stderr).trim())
        ),
    }
}

/// Whether this fdl runs on a host whose `uname -m` is `machine` and whose
/// `getconf GNU_LIBC_VERSION` is `libc`: the same CPU, and a glibc at least as new as the
/// one it runs on here (its symbol versions may need it).
fn runs_there(machine: &str, libc: &str, ours: &str, our_glibc: Option<&str>) -> Result<()> {
    if machine != ours {
        bail!("it is a {machine} host and this fdl is built for {ours}: install fdl there for {machine}");
    }
    match (libc.strip_prefix("glibc "), our_glibc) {
        (Some(theirs), Some(ours)) if version_at_least(theirs, ours) => Ok(()),
        (Some(theirs), Some(ours)) => bail!(
            "it has glibc {theirs}, older than the {ours} this fdl runs with: install fdl there"
        ),
        (Some(_), None) => Ok(()),
        (None, _) => bail!("it has no GNU libc ({libc}); this fdl needs one: install fdl there"),
    }
}

fn local_glibc() -> Option<String> {
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    v.to_str().ok().map(str::to_string)
}

fn version_at_least(have: &str, need: &str) -> bool {
    let parse = |s: &str| -> Vec<u32> { s.split('.').filter_map(|p| p.parse().ok()).collect() };
    parse(have) >= parse(need)
}

/// What each worker's report is asked for: its witnesses, and which kind of process its
/// libtorch is answered for (`None`: its variant's: Python for a pip torch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    pub witness: Witnesses,
    pub process: Option<crate::loader::python::ProcessKind>,
}

impl Asked {
    /// The variant's process, with no witness (plan, build, env).
    pub const PLAIN: Asked = Asked {
        witness: Witnesses::None,
        process: None,
    };
}

/// Which witnesses each worker asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Witnesses {
    None,
    /// Its own loader (status's default: milliseconds).
    Loader,
    /// And, for a pip torch, its interpreter importing torch (`--python-witness`: seconds
    /// and half a gigabyte on every worker, so only when asked).
    LoaderAndPython,
}

/// Every worker's report, the workers reached all at once; the order is the workers'.
pub fn query_all(
    workers: &[&Worker],
    t: &dyn Transport,
    own: &OwnBinary,
    timeout: Duration,
    asked: Asked,
    on_done: &(dyn Fn(&WorkerStatus) + Sync),
) -> Vec<WorkerStatus> {
    let parse = |out: &std::process::Output| {
        let text = String::from_utf8_lossy(&out.stdout);
        match serde_json::from_str::<HostReport>(text.trim()) {
            Ok(r) if r.schema == REPORT_SCHEMA => Ok(r),
            Ok(r) => Err(format!("its fdl speaks report schema {}", r.schema)),
            Err(_) => Err(format!("its fdl gave no report ({})", last_error(out))),
        }
    };
    let args = |w: &Worker| self_script_args(w, asked);
    run_fdl_all(t, workers, own, &args, timeout, &parse)
        .into_iter()
        .zip(workers)
        .map(|(r, w)| {
            let mut status = blank_status(w);
            match r {
                Ok((r, shipped)) => {
                    status.report = Some(r);
                    status.shipped_fdl = shipped;
                }
                Err(e) => {
                    status.unreached = Unreachable::kind_in(&e);
                    status.error = Some(format!("{e:#}"));
                }
            }
            on_done(&status);
            status
        })
        .collect()
}

/// The verdicts for the cluster, in the order status prints them. A worker without a
/// report leaves every verdict at best unknown: its facts are missing.
pub fn verdicts(workers: &[WorkerStatus]) -> Vec<Verdict> {
    let silent: Vec<String> = workers
        .iter()
        .filter(|w| w.report.is_none())
        .map(|w| format!("{} did not answer", w.host))
        .collect();
    let reports: Vec<(&str, &HostReport)> = workers
        .iter()
        .filter_map(|w| w.report.as_ref().map(|r| (w.host.as_str(), r)))
        .collect();
    // Facts every verdict lacks: the workers that did not answer, or none at all.
    let mut missing_hosts = silent.clone();
    if workers.is_empty() {
        missing_hosts.push("no workers".into());
    }
    vec![
        reach(workers, &silent),
        skew(&reports, &missing_hosts),
        coverage(&reports, &missing_hosts),
        driver(&reports, &missing_hosts),
        symbols(&reports, &missing_hosts),
        bridge(workers, &missing_hosts),
        plugins_verdict(&reports, &missing_hosts),
    ]
}

/// reach: every worker answered; else the errors (or the silent workers) as said.
fn reach(workers: &[WorkerStatus], silent: &[String]) -> Verdict {
    let down: Vec<String> = workers
        .iter()
        .filter_map(|w| w.error.as_ref().map(|e| format!("{}: {e}", w.host)))
        .collect();
    Verdict::new(
        "reach",
        if down.is_empty() && silent.is_empty() {
            State::Ok
        } else {
            State::Red
        },
        if down.is_empty() && silent.is_empty() {
            format!("all {} workers answered", workers.len())
        } else if down.is_empty() {
            silent.join("; ")
        } else {
            down.join("; ")
        },
    )
}

/// skew: one effective NCCL version, exactly.
fn skew(reports: &[(&str, &HostReport)], missing_hosts: &[String]) -> Verdict {
    let mut versions: Vec<(String, &str)> = Vec::new();
    let mut unknown = missing_hosts.to_vec();
    let mut red = Vec::new();
    for (host, r) in reports {
        match &r.effective {
            Facts::Known(n) => versions.push((n.version.clone(), host)),
            Facts::Unknown(why) if r.effective_split => red.push(format!("{host}: {why}")),
            Facts::Unknown(why) => unknown.push(format!("{host}: effective NCCL unknown: {why}")),
        }
    }
    let mut distinct: Vec<&String> = versions.iter().map(|(v, _)| v).collect();
    distinct.sort();
    distinct.dedup();
    if distinct.len() > 1 {
        red.push(format!(
            "NCCL versions differ, so NCCL will refuse to form a communicator: {}",
            versions
                .iter()
                .map(|(v, h)| format!("{h} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Where a worker's own loader disagreed with fdl's model, its effective NCCL is the
    // loader's answer: said with the verdict, as fdl's own bug.
    let model_wrong: Vec<String> = reports
        .iter()
        .filter_map(|(host, r)| {
            let w = r.witness.as_ref().filter(|w| w.disagrees())?;
            Some(format!(
                "fdl's model is wrong on {host} (it says {}; the loader says {}), so its loader's answer is used",
                w.model.as_deref().unwrap_or("?"),
                w.loader
            ))
        })
        .collect();
    let state = judge(&red, &unknown);
    let mut detail = match state {
        State::Red => red.join("; "),
        State::Unknown => unknown.join("; "),
        State::Ok => format!("every worker loads NCCL {}", distinct[0]),
    };
    if !model_wrong.is_empty() {
        detail.push_str(&format!("; {}", model_wrong.join("; ")));
    }
    Verdict::new("skew", state, detail)
}

/// coverage: every GPU on every host, judged on the NCCL it really loads and on the
/// libtorch's own kernels: a rank runs both, and either lacking code fails it.
fn coverage(reports: &[(&str, &HostReport)], missing_hosts: &[String]) -> Verdict {
    let nccl_red: Vec<String> = reports
        .iter()
        .flat_map(|(host, r)| {
            r.coverage
                .iter()
                .filter(|c| !c.covered)
                .map(move |c| format!("{host} GPU {} ({})", c.index, c.arch))
        })
        .collect();
    let mut torch_red: Vec<String> = Vec::new();
    let mut unknown = missing_hosts.to_vec();
    for (h, r) in reports {
        if let Facts::Unknown(why) = &r.gpus {
            unknown.push(format!("{h}: GPUs unknown: {why}"));
        }
        if r.effective.known().is_none() {
            unknown.push(format!(
                "{h}: its effective NCCL is unknown, so is its code"
            ));
        }
        match &r.torch_coverage {
            Facts::Known(t) => torch_red.extend(
                t.gpus
                    .iter()
                    .filter(|c| !c.covered)
                    .map(|c| torch_gap(h, r, t, c)),
            ),
            // Without GPUs the line above already says why.
            Facts::Unknown(_) if r.gpus.known().is_none() => {}
            Facts::Unknown(why) => {
                unknown.push(format!("{h}: the libtorch's GPU code is unknown: {why}"))
            }
        }
    }
    let mut red = Vec::new();
    if !nccl_red.is_empty() {
        red.push(format!(
            "the effective NCCL has no code for {}",
            nccl_red.join(", ")
        ));
    }
    red.extend(torch_red);
    let state = judge(&red, &unknown);
    Verdict::new(
        "coverage",
        state,
        match state {
            State::Red => red.join("; "),
            State::Unknown => unknown.join("; "),
            State::Ok => "every GPU has code in its host's NCCL and libtorch".into(),
        },
    )
}

/// driver: each host's driver runs the CUDA its effective NCCL was built with.
fn driver(reports: &[(&str, &HostReport)], missing_hosts: &[String]) -> Verdict {
    let mut red = Vec::new();
    let mut unknown = missing_hosts.to_vec();
    let mut notes = Vec::new();
    for (host, r) in reports {
        let d = match &r.driver {
            Facts::Known(d) => d,
            Facts::Unknown(why) => {
                unknown.push(format!("{host}: driver unknown ({why})"));
                continue;
            }
        };
        let Some(n) = r.effective.known() else {
            unknown.push(format!(
                "{host}: its effective NCCL is unknown, so is its CUDA"
            ));
            continue;
        };
        let (Some(runs), Some(built)) = (d.cuda, n.cuda) else {
            unknown.push(format!(
                "{host}: the CUDA of its driver or of its NCCL is not known"
            ));
            continue;
        };
        match driver_runs(runs, built) {
            DriverFit::Yes => {}
            DriverFit::MinorCompat => notes.push(format!(
                "{host}: driver {} (CUDA {runs}) runs NCCL's CUDA {built} by minor-version compatibility",
                d.version
            )),
            DriverFit::No => red.push(format!(
                "{host}: driver {} runs CUDA up to {runs}, but its NCCL was built with CUDA {built}: update the driver",
                d.version
            )),
        }
    }
    let state = judge(&red, &unknown);
    Verdict::new(
        "driver",
        state,
        match state {
            State::Red => red.join("; "),
            State::Unknown => unknown.join("; "),
            State::Ok if notes.is_empty() => "every driver runs its NCCL's CUDA".into(),
            State::Ok => notes.join("; "),
        },
    )
}

/// symbols: what each libtorch imports, its effective NCCL exports.
fn symbols(reports: &[(&str, &HostReport)], missing_hosts: &[String]) -> Verdict {
    let red: Vec<String> = reports
        .iter()
        .filter(|(_, r)| !r.missing_symbols.is_empty())
        .map(|(h, r)| format!("{h} lacks {}", r.missing_symbols.join(", ")))
        .collect();
    let mut unknown = missing_hosts.to_vec();
    for (h, r) in reports {
        match (r.libtorch.known(), r.effective.known()) {
            (Some(lt), Some(_)) => {
                if let Facts::Unknown(why) = &lt.bridge {
                    unknown.push(format!("{h}: the libtorch's imports are unknown ({why})"));
                }
            }
            _ => unknown.push(format!(
                "{h}: its libtorch or its effective NCCL is unknown"
            )),
        }
    }
    let state = judge(&red, &unknown);
    Verdict::new(
        "symbols",
        state,
        match state {
            State::Red => red.join("; "),
            State::Unknown => unknown.join("; "),
            State::Ok => {
                "each effective NCCL exports every nccl* function its libtorch imports".into()
            }
        },
    )
}

/// bridge: where a preload is set, the libtorch's calls must reach it. The effective NCCL
/// is the loader model's answer, so a preload it loads but that does not answer the calls
/// shows as the bundled NCCL still running.
fn bridge(workers: &[WorkerStatus], missing_hosts: &[String]) -> Verdict {
    let setting: Vec<(&str, &HostReport)> = workers
        .iter()
        .filter(|w| w.ld_preload.is_some())
        .filter_map(|w| w.report.as_ref().map(|r| (w.host.as_str(), r)))
        .collect();
    let mut red = Vec::new();
    let mut unknown = missing_hosts.to_vec();
    for (h, r) in &setting {
        match r.effective.known() {
            Some(n) if n.linkage == "preload" => {}
            Some(n) => red.push(format!(
                "{h}: its libtorch's calls do not reach the preload, so the {} NCCL {} still runs{}",
                n.linkage,
                n.version,
                match r.libtorch.known().map(|lt| &lt.bridge) {
                    Some(Facts::Known(b)) if !b.takes_effect => format!(" ({})", b.why),
                    _ => String::new(),
                }
            )),
            None => unknown.push(format!("{h}: which NCCL its ranks load is unknown")),
        }
    }
    let state = judge(&red, &unknown);
    Verdict::new(
        "bridge",
        state,
        match state {
            State::Red => format!("LD_PRELOAD is set but replaces nothing: {}", red.join("; ")),
            State::Unknown => unknown.join("; "),
            State::Ok if setting.is_empty() => {
                "no worker sets LD_PRELOAD: each runs its libtorch's own NCCL".into()
            }
            State::Ok => format!("the LD_PRELOAD of {} worker(s) takes effect", setting.len()),
        },
    )
}

/// The kinds whose plugin every rank must share: the net (and GPU-initiated and remote
/// memory) transports connect ranks to each other, and the tuner picks each collective's
/// algorithm, which all ranks must pick alike. A profiler or env plugin acts on its own
/// rank alone: a difference there is said, not red.
const SHARED_PLUGINS: [&str; 4] = ["net", "tuner", "gin", "rma"];

/// plugins: the ranks load the same plugin of each shared kind, or all none.
fn plugins_verdict(reports: &[(&str, &HostReport)], missing_hosts: &[String]) -> Verdict {
    use super::host::PluginFacts;
    let mut unknown = missing_hosts.to_vec();
    // Per kind, per host: what it loads, in a word that compares (the file's name), and
    // in words for the detail.
    let mut kinds: std::collections::BTreeMap<&str, Vec<(&str, String, String)>> =
        Default::default();
    let known: Vec<(&str, &Vec<PluginFacts>)> = reports
        .iter()
        .filter_map(|(h, r)| match &r.plugins {
            Facts::Known(p) => Some((*h, p)),
            Facts::Unknown(why) => {
                unknown.push(format!("{h}: its plugins are unknown: {why}"));
                None
            }
        })
        .collect();
    for (_, ps) in &known {
        for p in ps.iter() {
            kinds.entry(p.kind.as_str()).or_default();
        }
    }
    for (kind, seen) in kinds.iter_mut() {
        for (h, ps) in &known {
            let p = ps.iter().find(|p| p.kind == *kind);
            let (same, words) = match p {
                Some(p) if p.verdict == "loaded" => {
                    let path = p.path.clone().unwrap_or_default();
                    let file = path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    (
                        file,
                        format!(
                            "loads {} (v{})",
                            path.display(),
                            p.version.unwrap_or_default()
                        ),
                    )
                }
                Some(p) if p.verdict == "unknown" => {
                    unknown.push(format!(
                        "{h}: its {kind} plugin is unknown: {}",
                        p.reason.as_deref().unwrap_or("")
                    ));
                    continue;
                }
                Some(p) => (String::new(), none_words(p)),
                None => (String::new(), "its NCCL opens none".into()),
            };
            seen.push((h, same, words));
        }
    }
    let mut red = Vec::new();
    let mut notes = Vec::new();
    for (kind, seen) in &kinds {
        let mut distinct: Vec<&str> = seen.iter().map(|(_, s, _)| s.as_str()).collect();
        distinct.sort();
        distinct.dedup();
        if distinct.len() < 2 {
            continue;
        }
        let each = seen
            .iter()
            .map(|(h, _, w)| format!("{h} {w}"))
            .collect::<Vec<_>>()
            .join(", ");
        if SHARED_PLUGINS.contains(kind) {
            let var = format!("NCCL_{}_PLUGIN", kind.to_ascii_uppercase());
            red.push(format!(
                "the ranks would load different {kind} plugins ({each}){}: put the same plugin where every worker's NCCL finds it (`fdl nccl plugins` on a worker shows where it searches), or set {var}=none in the cluster's env: block so that none loads one",
                if *kind == "net" {
                    "; a rank without it uses NCCL's internal transport, and ranks on different transports run slowly, hang or fail to connect"
                } else {
                    ""
                }
            ));
        } else {
            notes.push(format!(
                "the {kind} plugins differ ({each}); each acts on its own rank"
            ));
        }
    }
    let state = judge(&red, &unknown);
    let loaded: Vec<String> = kinds
        .iter()
        .filter_map(|(kind, seen)| {
            let (_, same, _) = seen.first()?;
            (!same.is_empty()).then(|| format!("{kind} {same}"))
        })
        .collect();
    let mut detail = match state {
        State::Red => red.join("; "),
        State::Unknown => unknown.join("; "),
        State::Ok if loaded.is_empty() => "no worker's NCCL loads a plugin".into(),
        State::Ok => format!("every worker loads the same plugins: {}", loaded.join(", ")),
    };
    if state != State::Unknown && !notes.is_empty() {
        detail.push_str(&format!("; {}", notes.join("; ")));
    }
    Verdict::new("plugins", state, detail)
}

/// What a kind that loads nothing does, in words.
fn none_words(p: &super::host::PluginFacts) -> String {
    match p.verdict.as_str() {
        "disabled" => "loads none (disabled)".into(),
        "no_common_version" => format!(
            "loads none ({} exports v{}, none this NCCL asks for, so it is ignored)",
            p.path.as_deref().unwrap_or(Path::new("?")).display(),
            p.exports
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", v")
        ),
        _ => "loads none (none found)".into(),
    }
}

// The one driver rule, shared with the build's plan, `nccl verify` and the default build.
pub use crate::gpu::{driver_runs, DriverFit};

/// Every worker as the default build's choice sees it ([`crate::nccl::pick`]): its GPUs'
/// archs and driver from its report, or why they are not known.
pub fn pick_hosts(workers: &[WorkerStatus]) -> Vec<crate::nccl::pick::Host> {
    workers
        .iter()
        .map(|w| {
            let missing = || {
                w.error
                    .clone()
                    .unwrap_or_else(|| "it did not answer".into())
            };
            let (gpus, driver) = match &w.report {
                Some(r) => (
                    match &r.gpus {
                        Facts::Known(g) => Ok(crate::gpu::distinct_archs(g)),
                        Facts::Unknown(why) => Err(why.clone()),
                    },
                    match &r.driver {
                        Facts::Known(d) => Ok(d.clone()),
                        Facts::Unknown(why) => Err(why.clone()),
                    },
                ),
                None => (Err(missing()), Err(missing())),
            };
            crate::nccl::pick::Host {
                name: w.host.clone(),
                gpus,
                driver,
            }
        })
        .collect()
}

/// A GPU the libtorch has no kernels for, in words: which libtorch, what its files hold,
/// and what would cover the GPU (a libtorch with SASS for its arch, or PTX as old).
fn torch_gap(
    host: &str,
    r: &HostReport,
    t: &super::host::TorchCoverage,
    c: &super::host::GpuCoverage,
) -> String {
    let variant = r
        .libtorch
        .known()
        .map_or_else(|| "?".to_string(), |lt| lt.variant.clone());
    let files = t
        .files
        .iter()
        .map(|f| {
            let list = |v: &[String]| {
                if v.is_empty() {
                    "none".to_string()
                } else {
                    v.join(" ")
                }
            };
            format!(
                "{} holds SASS {}, PTX {}",
                f.file.display(),
                list(&f.sass),
                list(&f.ptx)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let cover = match crate::arch::parse_arch_token(&c.arch) {
        Ok(a) => format!(
            "a libtorch built for {a} covers it (from source with TORCH_CUDA_ARCH_LIST including {}, registered with `fdl libtorch add`), as does one with PTX for {} or older",
            a.capability(),
            crate::arch::GpuTarget::generic(a).ptx_name()
        ),
        Err(_) => format!("a libtorch built for {} covers it", c.arch),
    };
    format!(
        "{host} GPU {} ({}) has no kernels in its libtorch {variant} ({files}): {cover}",
        c.index, c.arch
    )
}

/// A path a worker's report names, shown relative to its checkout when inside it.
pub fn short(path: &Path, root: &str) -> String {
    path.strip_prefix(root)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// A worker that answered: its libtorch and effective NCCL (`static`) and its GPUs, for
/// the verdict and plan tests.
#[cfg(any(test, feature = "test-support"))]
pub fn test_worker(host: &str, nccl: &str, caps: &[(u32, u32)], driver_cuda: &str) -> WorkerStatus {
    use super::host::{LibtorchFacts, NcclFacts};
    use crate::arch::Arch;
    use crate::gpu::{Driver, Gpu};
    let facts = NcclFacts {
        file: "/p/libtorch/x/lib/libtorch_cuda.so".into(),
        version: nccl.into(),
        cuda: Some("12.8".parse().unwrap()),
        linkage: "static".into(),
        sass: vec![],
        ptx: vec![],
        gpu_code: Default::default(),
    };
    WorkerStatus {
        host: host.into(),
        target: host.into(),
        path: "/p".into(),
        error: None,
        unreached: None,
        shipped_fdl: false,
        ld_preload: None,
        report: Some(HostReport {
            schema: REPORT_SCHEMA,
            fdl_version: "0".into(),
            hostname: host.into(),
            machine: "x86_64".into(),
            gpus: Facts::Known(
                caps.iter()
                    .enumerate()
                    .map(|(i, &(ma, mi))| Gpu {
                        index: i as u32,
                        name: "GPU".into(),
                        compute_cap: Arch::new(ma, mi),
                        memory_mib: 1,
                    })
                    .collect(),
            ),
            driver: Facts::Known(Driver {
                version: "570".into(),
                cuda: Some(driver_cuda.parse().unwrap()),
            }),
            libtorch: Facts::Known(LibtorchFacts {
                variant: "precompiled/cu128".into(),
                libtorch_cuda: facts.file.clone(),
                nccl: Facts::Known(facts.clone()),
                bridge: Facts::Unknown("n/a".into()),
                python: None,
            }),
            effective: Facts::Known(facts),
            effective_split: false,
            coverage: vec![],
            torch_coverage: Facts::Known(super::host::TorchCoverage {
                files: vec![],
                gpus: vec![],
            }),
            missing_symbols: vec![],
            witness: None,
            plugins: Facts::Known(vec![]),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worker's side of running the cached fdl, in this machine's /bin/sh and in
    /// bash (a worker's login shell): the genuine file runs; a file of that name with
    /// other bytes, a link, a file others may write, or a directory others may write
    /// are never run (each stand-in would leave a marker).
    #[test]
    fn only_the_checked_bytes_in_the_users_own_cache_run() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let genuine = format!("#!/bin/sh\necho genuine \"$@\" > '{}'\n", marker.display());
        let planted = format!("#!/bin/sh\necho planted > '{}'\n", marker.display());
        let exe = dir.path().join("fdl-src");
        std::fs::write(&exe, &genuine).unwrap();
        let own = OwnBinary {
            sha256: crate::digest::sha256_file(&exe).unwrap(),
            path: exe,
        };
        let cache = dir.path().join("cache");
        let bin = cache.join("fdl/bin");
        let file = bin.join(format!("fdl-{}", &own.sha256[..16]));
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        let put = |bytes: &str, m: u32| {
            let _ = std::fs::remove_file(&file);
            std::fs::write(&file, bytes).unwrap();
            mode(&file, m);
        };
        for shell in ["/bin/sh", "bash"] {
            let run = || {
                let _ = std::fs::remove_file(&marker);
                let out = std::process::Command::new(shell)
                    .arg("-c")
                    .arg(format!(
                        "{}; [ -n \"$f\" ] || exit 9; exec \"$f\" --root x",
                        own.open_there()
                    ))
                    .env("XDG_CACHE_HOME", &cache)
                    .output()
                    .unwrap();
                let ran = std::fs::read_to_string(&marker).ok();
                (
                    out.status.code(),
                    ran,
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                )
            };
            std::fs::create_dir_all(&bin).unwrap();
            mode(&cache.join("fdl"), 0o700);
            mode(&bin, 0o700);
            put(&genuine, 0o755);
            assert_eq!(run().1.as_deref(), Some("genuine --root x\n"), "{shell}");
            // Its digest is kept under its identity, and the next run trusts the record.
            let sum = bin.join(format!("fdl-{}.sum", &own.sha256[..16]));
            let record = std::fs::read_to_string(&sum).expect("the digest is kept");
            assert!(record.trim_end().ends_with(&own.sha256), "{record}");
            assert_eq!(run().1.as_deref(), Some("genuine --root x\n"), "{shell}");
            // Other bytes of the same size written in place: the record is of another
            // change time, so the file is hashed again and refused.
            std::thread::sleep(std::time::Duration::from_millis(30));
            let same_size = genuine.replace("genuine", "GENUINE");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .and_then(|mut f| std::io::Write::write_all(&mut f, same_size.as_bytes()))
                .unwrap();
            assert_eq!(run().0, Some(NOT_THIS_FDL), "{shell}: rewritten in place");
            assert_eq!(run().1, None, "{shell}: the rewritten file ran");
            // A record that names these bytes but that others may write is passed over.
            let id = std::process::Command::new("stat")
                .args(["-L", "-c", "%d %i %s %y %z"])
                .arg(&file)
                .env("LC_ALL", "C")
                .output()
                .unwrap();
            let id = String::from_utf8_lossy(&id.stdout).trim().to_string();
            std::fs::write(&sum, format!("{id} {}\n", own.sha256)).unwrap();
            mode(&sum, 0o666);
            assert_eq!(
                run().0,
                Some(NOT_THIS_FDL),
                "{shell}: a record others write"
            );
            assert_eq!(run().1, None, "{shell}: a forged record was trusted");
            std::fs::remove_file(&sum).unwrap();
            put(&genuine, 0o755);
            assert_eq!(run().1.as_deref(), Some("genuine --root x\n"), "{shell}");
            // No file: nothing to run, nothing refused.
            std::fs::remove_file(&file).unwrap();
            assert_eq!(run().0, Some(9), "{shell}");

            put(&planted, 0o755);
            assert_eq!(run().0, Some(NOT_THIS_FDL), "{shell}: a planted file");
            assert_eq!(run().1, None, "{shell}: the planted file ran");

            put(&genuine, 0o775);
            assert_eq!(
                run().0,
                Some(NOT_THIS_FDL),
                "{shell}: a group-writable file"
            );
            assert_eq!(run().1, None);

            std::fs::remove_file(&file).unwrap();
            let elsewhere = dir.path().join("elsewhere");
            std::fs::write(&elsewhere, &genuine).unwrap();
            mode(&elsewhere, 0o755);
            std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
            assert_eq!(run().0, Some(NOT_THIS_FDL), "{shell}: a link");
            assert_eq!(run().1, None);

            put(&genuine, 0o755);
            for d in [cache.join("fdl"), bin.clone()] {
                mode(&d, 0o770);
                let (code, ran, err) = run();
                assert_eq!(code, Some(UNSAFE_CACHE), "{shell}: {}: {err}", d.display());
                assert_eq!(ran, None);
                assert!(
                    err.contains(&format!(
                        "fdl's cache {} on this worker is writable by others",
                        d.display()
                    )),
                    "{err}"
                );
                mode(&d, 0o700);
                // Another user's directory (root can make one; as anyone else, chown
                // fails and mode is all these runs can change).
                if std::os::unix::fs::chown(&d, Some(4242), None).is_ok() {
                    let (code, ran, err) = run();
                    assert_eq!(code, Some(UNSAFE_CACHE), "{shell}: {err}");
                    assert_eq!(ran, None);
                    assert!(err.contains("belongs to another user (uid 4242)"), "{err}");
                    std::os::unix::fs::chown(&d, Some(unsafe { libc::geteuid() }), None).unwrap();
                }
            }
            // The bin directory a link to a directory of the user's: refused, not
            // followed.
            let real_bin = dir.path().join("real-bin");
            std::fs::rename(&bin, &real_bin).unwrap();
            std::os::unix::fs::symlink(&real_bin, &bin).unwrap();
            let (code, ran, err) = run();
            assert_eq!(code, Some(UNSAFE_CACHE), "{shell}: a linked bin: {err}");
            assert_eq!(ran, None);
            assert!(err.contains("is not a directory (a link"), "{err}");
            std::fs::remove_file(&bin).unwrap();
            std::fs::rename(&real_bin, &bin).unwrap();
            assert!(run().1.is_some(), "{shell}: the genuine file runs again");
            // The record larger than any record fdl writes: passed over, the file hashed
            // (and the record written anew).
            let sum = bin.join(format!("fdl-{}.sum", &own.sha256[..16]));
            std::fs::write(&sum, "x".repeat(100_000)).unwrap();
            mode(&sum, 0o600);
            assert_eq!(run().1.as_deref(), Some("genuine --root x\n"), "{shell}");
            let record = std::fs::read_to_string(&sum).unwrap();
            assert!(record.trim_end().ends_with(&own.sha256), "{record}");
            std::fs::remove_dir_all(&cache).unwrap();
        }
    }

    #[test]
    fn the_binary_goes_only_where_it_runs() {
        assert!(runs_there("x86_64", "glibc 2.36", "x86_64", Some("2.36")).is_ok());
        assert!(runs_there("x86_64", "glibc 2.39", "x86_64", Some("2.36")).is_ok());
        let e = runs_there("aarch64", "glibc 2.39", "x86_64", Some("2.36")).unwrap_err();
        assert!(e
            .to_string()
            .contains("it is a aarch64 host and this fdl is built for x86_64"));
        let e = runs_there("x86_64", "glibc 2.31", "x86_64", Some("2.36")).unwrap_err();
        assert!(e.to_string().contains("glibc 2.31, older than the 2.36"));
        // 2.4 is older than 2.36: versions compare by number, not text.
        assert!(runs_there("x86_64", "glibc 2.4", "x86_64", Some("2.36")).is_err());
        let e = runs_there("x86_64", "no-glibc", "x86_64", Some("2.36")).unwrap_err();
        assert!(e.to_string().contains("no GNU libc (no-glibc)"));
    }

    fn silent(host: &str) -> WorkerStatus {
        WorkerStatus {
            host: host.into(),
            target: host.into(),
            path: "/p".into(),
            report: None,
            error: Some("unreachable".into()),
            unreached: None,
            shipped_fdl: false,
            ld_preload: None,
        }
    }

    /// With no worker answering there are no facts: reach is red and every other verdict
    /// unknown, never "ok" (fdl 0.1 said `ok skew every worker loads NCCL ?`).
    #[test]
    fn no_facts_is_never_ok() {
        let v = verdicts(&[silent("a"), silent("b")]);
        assert_eq!(v[0].state, State::Red);
        for verdict in &v[1..] {
            assert_eq!(verdict.state, State::Unknown, "{verdict:?}");
            assert!(!verdict.ok);
            assert!(verdict.detail.contains("a did not answer"), "{verdict:?}");
        }
        let none = verdicts(&[]);
        assert!(
            none[1..].iter().all(|v| v.state == State::Unknown),
            "{none:?}"
        );
    }

    /// A worker whose env sets LD_PRELOAD, but whose ranks still run the bundled NCCL (the
    /// libtorch binds its calls locally): the bridge is red, not "no worker sets it".
    #[test]
    fn a_preload_that_does_not_answer_is_red() {
        let mut w = test_worker("a", "2.27.5", &[(8, 6)], "12.8");
        w.ld_preload = Some("/p/libnccl.so.2".into());
        let v = verdicts(&[w]);
        let bridge = v.iter().find(|v| v.name == "bridge").unwrap();
        assert_eq!(bridge.state, State::Red, "{bridge:?}");
        assert!(
            bridge.detail.contains("the static NCCL 2.27.5 still runs"),
            "{bridge:?}"
        );
        let w = test_worker("a", "2.27.5", &[(8, 6)], "12.8");
        let v = verdicts(&[w]);
        let bridge = v.iter().find(|v| v.name == "bridge").unwrap();
        assert_eq!(bridge.state, State::Ok, "{bridge:?}");
    }

    /// Two NCCLs in one process is a finding (skew red), said by the report's flag, not by
    /// its words: an unknown NCCL whose reason reads the same is still unknown.
    #[test]
    fn a_split_effective_nccl_is_red_by_its_flag_alone() {
        let split = |flag: bool| {
            let mut w = test_worker("a", "2.27.5", &[(8, 6)], "12.8");
            let r = w.report.as_mut().unwrap();
            r.effective = Facts::Unknown(format!("{}: a → b", super::super::host::SPLIT));
            r.effective_split = flag;
            let v = verdicts(&[w]);
            v.into_iter().find(|v| v.name == "skew").unwrap()
        };
        let skew = split(true);
        assert_eq!(skew.state, State::Red, "{skew:?}");
        assert_eq!(skew.detail, "a: two NCCLs in one process: a → b");
        let skew = split(false);
        assert_eq!(skew.state, State::Unknown, "{skew:?}");
    }

    fn with_plugins(mut w: WorkerStatus, ps: Vec<super::super::host::PluginFacts>) -> WorkerStatus {
        w.report.as_mut().unwrap().plugins = Facts::Known(ps);
        w
    }

    fn plugin(
        kind: &str,
        verdict: &str,
        path: Option<&str>,
        version: Option<u32>,
    ) -> super::super::host::PluginFacts {
        super::super::host::PluginFacts {
            kind: kind.into(),
            value: None,
            verdict: verdict.into(),
            path: path.map(PathBuf::from),
            version,
            exports: version.into_iter().collect(),
            asks: vec![10, 9],
            reason: None,
        }
    }

    /// A net plugin on one worker and none on another is red, naming both and the two
    /// ways to agree; the same plugin everywhere (at different paths, one by another
    /// ABI version) is ok; a profiler that differs is said, not red; a worker whose
    /// plugins are unknown leaves the verdict unknown.
    #[test]
    fn the_ranks_must_load_the_same_net_plugin() {
        let verdict = |ws: &[WorkerStatus]| {
            verdicts(ws)
                .into_iter()
                .find(|v| v.name == "plugins")
                .unwrap()
        };
        let a = || {
            with_plugins(
                test_worker("a", "2.27.5", &[(8, 6)], "12.8"),
                vec![plugin(
                    "net",
                    "loaded",
                    Some("/p/lib/libnccl-net.so"),
                    Some(10),
                )],
            )
        };
        let b = with_plugins(
            test_worker("b", "2.27.5", &[(8, 6)], "12.8"),
            vec![plugin("net", "not_found", None, None)],
        );
        let v = verdict(&[a(), b]);
        assert_eq!(v.state, State::Red, "{v:?}");
        assert!(
            v.detail
                .contains("a loads /p/lib/libnccl-net.so (v10), b loads none (none found)")
                && v.detail.contains("NCCL_NET_PLUGIN=none")
                && v.detail.contains("internal transport"),
            "{v:?}"
        );

        let c = with_plugins(
            test_worker("c", "2.27.5", &[(8, 6)], "12.8"),
            vec![
                plugin("net", "loaded", Some("/q/libnccl-net.so"), Some(9)),
                plugin(
                    "profiler",
                    "loaded",
                    Some("/q/libnccl-profiler.so"),
                    Some(5),
                ),
            ],
        );
        let v = verdict(&[a(), c]);
        assert_eq!(v.state, State::Ok, "{v:?}");
        assert!(
            v.detail
                .contains("every worker loads the same plugins: net libnccl-net.so")
                && v.detail.contains("the profiler plugins differ"),
            "{v:?}"
        );

        let v = verdict(&[test_worker("d", "2.27.5", &[(8, 6)], "12.8")]);
        assert_eq!(v.state, State::Ok, "{v:?}");
        assert_eq!(v.detail, "no worker's NCCL loads a plugin");

        let mut e = test_worker("e", "2.27.5", &[(8, 6)], "12.8");
        e.report.as_mut().unwrap().plugins = Facts::Unknown("its fdl is old".into());
        let v = verdict(&[a(), e]);
        assert_eq!(v.state, State::Unknown, "{v:?}");
        assert!(
            v.detail
                .contains("e: its plugins are unknown: its fdl is old"),
            "{v:?}"
        );
    }

    /// The libtorch's own kernels are judged beside the NCCL's: a GPU the libtorch has no
    /// code for is red, naming the libtorch and what would cover it; a libtorch whose
    /// code could not be read is unknown, never red and never ok.
    #[test]
    fn coverage_judges_the_libtorch_too() {
        use super::super::host::{GpuCoverage, TorchCoverage, TorchFile};
        let with_torch = |covered: bool| {
            let mut w = test_worker("pascal", "2.27.5", &[(6, 1)], "12.8");
            let r = w.report.as_mut().unwrap();
            r.torch_coverage = Facts::Known(TorchCoverage {
                files: vec![TorchFile {
                    file: "/p/lib/libtorch_cuda.so".into(),
                    sass: vec!["sm_70".into(), "sm_120".into()],
                    ptx: vec![],
                }],
                gpus: vec![GpuCoverage {
                    index: 0,
                    arch: "sm_61".into(),
                    verdict: if covered { "native sm_61" } else { "none" }.into(),
                    covered,
                }],
            });
            w
        };
        let coverage = |w: WorkerStatus| {
            verdicts(&[w])
                .into_iter()
                .find(|v| v.name == "coverage")
                .unwrap()
        };
        let v = coverage(with_torch(false));
        assert_eq!(v.state, State::Red, "{v:?}");
        assert!(
            v.detail.contains("pascal GPU 0 (sm_61) has no kernels in its libtorch precompiled/cu128 (/p/lib/libtorch_cuda.so holds SASS sm_70 sm_120, PTX none)")
                && v.detail.contains("TORCH_CUDA_ARCH_LIST including 6.1")
                && v.detail.contains("PTX for compute_61 or older"),
            "{v:?}"
        );
        assert_eq!(coverage(with_torch(true)).state, State::Ok);
        let mut w = with_torch(true);
        w.report.as_mut().unwrap().torch_coverage = Facts::Unknown("split build".into());
        let v = coverage(w);
        assert_eq!(v.state, State::Unknown, "{v:?}");
        assert!(v
            .detail
            .contains("the libtorch's GPU code is unknown: split build"));
    }

    #[test]
    fn a_driver_runs_its_cuda_or_an_older_minor_of_the_same_major() {
        let v = |s: &str| s.parse::<crate::version::CudaVersion>().unwrap();
        assert_eq!(driver_runs(v("12.8"), v("12.8")), DriverFit::Yes);
        assert_eq!(driver_runs(v("13.0"), v("12.8")), DriverFit::Yes);
        assert_eq!(driver_runs(v("12.2"), v("12.8")), DriverFit::MinorCompat);
        assert_eq!(driver_runs(v("12.8"), v("13.0")), DriverFit::No);
    }
}
