//! `fdl cluster rehearse`: NCCL's bootstrap rehearsed before a launch, without GPUs.
//! First every worker's own NCCL (the effective one, checked: `bootstrap`) chooses the
//! interface and address its root would listen on, in that worker's environment; then
//! the root worker listens on its address while every other worker connects to it, and
//! every other worker listens on its own while the root connects to each, within a
//! bound. The findings name the pair, the interface, the family and the likely cause.
//!
//! What it proves: each worker's NCCL gets past its bootstrap setup with the settings
//! its ranks launch with, and the addresses chosen reach each other over TCP. What it
//! cannot: anything after the bootstrap (the transports NCCL then picks, the GPUs, the
//! collective itself); docs/cluster.md says so to the user.

use super::bootstrap::{
    self, BootstrapAnswer, Checked, Interface, Outcome, ReachAnswer, Reached, BOOTSTRAP_KIND,
    BOOTSTRAP_SCHEMA, REACH_KIND, REACH_SCHEMA,
};
use super::config::Worker;
use super::status::{run_fdl_all, OwnBinary};
use super::transport::Transport;
use crate::text::clean;
use anyhow::{bail, Result};
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// What the rehearsal is asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// The worker of rank 0 (its `host:` name); `None`: the first worker.
    pub root: Option<String>,
    /// How long the listen and connect phase may take.
    pub within: Duration,
    /// How long each worker has to answer each phase, beyond `within`.
    pub timeout: Duration,
}

/// One worker's part: its answer (read as hostile), or why there is none.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerRun {
    pub host: String,
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapAnswer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub shipped_fdl: bool,
}

impl WorkerRun {
    /// The address its NCCL chose, when it chose one.
    pub fn chosen(&self) -> Option<(SocketAddr, Option<&str>)> {
        match &self.bootstrap.as_ref()?.outcome {
            Outcome::Chosen {
                address, interface, ..
            } => Some((*address, interface.as_deref())),
            _ => None,
        }
    }

    fn interfaces(&self) -> &[Interface] {
        self.bootstrap
            .as_ref()
            .map(|b| b.interfaces.as_slice())
            .unwrap_or(&[])
    }
}

/// One direction between two workers: `from` connected to `to`'s chosen address.
#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub from: String,
    pub to: String,
    pub address: SocketAddr,
    pub result: Reached,
}

/// Why a connection failed, as far as the facts tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum Cause {
    /// The address is a loopback one: every other host reaches only itself there.
    Loopback,
    /// The connecting host has no address of the family chosen (IPv6 among IPv4).
    FamilyMismatch { has: Vec<&'static str> },
    /// No interface of the connecting host is on the address's network (a router may
    /// still join them; then a firewall or the route is the cause).
    NotOnNetwork { interfaces: Vec<String> },
    /// Refused: nothing listened there, or a firewall rejected.
    NothingListening,
    /// No answer within the bound: a firewall dropping, or no route.
    Dropped,
    /// Something else answered at that address and port.
    OtherProgram,
    /// The listener could not be set up there (its error).
    NotListening { why: String },
    /// Another failure (its error).
    Other { why: String },
}

/// A finding of the rehearsal: each carries its facts, said by [`Finding::full`] and
/// [`Finding::short`].
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// A worker did not answer (unreachable, no fdl, a broken answer).
    Unanswered { host: String, why: String },
    /// fdl would not run the worker's NCCL.
    Refused { host: String, why: String },
    /// The child did not answer.
    Failed { host: String, why: String },
    /// NCCL's bootstrap setup failed there: its code and words.
    NcclError {
        host: String,
        version: String,
        code: i32,
        warn: Option<String>,
        /// The worker's `NCCL_SOCKET_*`/`NCCL_COMM_ID` settings.
        settings: Vec<String>,
        interfaces: Vec<String>,
    },
    /// A connection that a launch needs did not happen.
    Unreached {
        from: String,
        to: String,
        interface: Option<String>,
        address: SocketAddr,
        family: &'static str,
        result: Reached,
        cause: Cause,
    },
}

impl Finding {
    /// Red: a launch would fail there; else the rehearsal could not judge (unknown).
    pub fn is_red(&self) -> bool {
        matches!(self, Finding::NcclError { .. } | Finding::Unreached { .. })
    }

    /// In words, every part that came from a worker made safe to print.
    pub fn full(&self) -> String {
        clean(&self.words())
    }

    fn words(&self) -> String {
        match self {
            Finding::Unanswered { host, why } => format!("{host} did not answer: {why}"),
            Finding::Refused { host, why } => format!("{host} was not rehearsed: {why}"),
            Finding::Failed { host, why } => format!("{host}: its NCCL could not be asked: {why}"),
            Finding::NcclError {
                host,
                version,
                code,
                warn,
                settings,
                interfaces,
            } => {
                let mut s = format!(
                    "{host}: NCCL {version} failed its bootstrap setup with error {code}{}",
                    warn.as_ref().map(|w| format!(" ({w})")).unwrap_or_default()
                );
                let net: Vec<&String> = settings
                    .iter()
                    .filter(|v| v.starts_with("NCCL_SOCKET_") || v.starts_with("NCCL_COMM_ID="))
                    .collect();
                if !net.is_empty() {
                    s.push_str(&format!(
                        " with {}",
                        net.iter().map(|v| v.as_str()).collect::<Vec<_>>().join(" ")
                    ));
                }
                s.push_str(&format!(
                    "; its interfaces: {}. Name one of them in its env: block (NCCL_SOCKET_IFNAME), or remove the setting",
                    if interfaces.is_empty() {
                        "none read".to_string()
                    } else {
                        interfaces.join(", ")
                    }
                ));
                s
            }
            Finding::Unreached {
                from,
                to,
                interface,
                address,
                family,
                result,
                cause,
            } => {
                let at = match interface {
                    Some(i) => format!("{i} {address} ({family})"),
                    None => format!("{address} ({family})"),
                };
                format!(
                    "{from} cannot reach {to}'s bootstrap address {at}: {}; {}",
                    result_words(result),
                    cause_words(cause, from, to, interface.as_deref())
                )
            }
        }
    }

    /// In a few words, made safe to print.
    pub fn short(&self) -> String {
        clean(&self.short_words())
    }

    fn short_words(&self) -> String {
        match self {
            Finding::Unanswered { host, .. } => format!("{host}: no answer"),
            Finding::Refused { host, .. } => format!("{host}: not rehearsed"),
            Finding::Failed { host, .. } => format!("{host}: NCCL not asked"),
            Finding::NcclError { host, code, .. } => format!("{host}: NCCL error {code}"),
            Finding::Unreached {
                from, to, cause, ..
            } => format!("{from} -> {to}: {}", cause_word(cause)),
        }
    }
}

fn result_words(r: &Reached) -> String {
    match r {
        Reached::Yes { ms } => format!("connected in {ms} ms"),
        Reached::Refused => "the connection was refused".into(),
        Reached::TimedOut => "no answer within the bound".into(),
        Reached::Unreachable { why } => clean(why),
        Reached::Other => "another program answered there".into(),
        Reached::Error { why } => clean(why),
    }
}

fn cause_word(c: &Cause) -> &'static str {
    match c {
        Cause::Loopback => "loopback chosen",
        Cause::FamilyMismatch { .. } => "address family mismatch",
        Cause::NotOnNetwork { .. } => "not on a shared network",
        Cause::NothingListening => "nothing listening or a firewall",
        Cause::Dropped => "dropped (firewall or no route)",
        Cause::OtherProgram => "another program there",
        Cause::NotListening { .. } => "could not listen",
        Cause::Other { .. } => "failed",
    }
}

fn cause_words(c: &Cause, from: &str, to: &str, interface: Option<&str>) -> String {
    let iface = interface.unwrap_or("that interface");
    match c {
        Cause::Loopback => format!(
            "{to}'s NCCL chose the loopback interface {iface}, which every other host reaches only as itself. Set NCCL_SOCKET_IFNAME in {to}'s env: block to an interface the others reach"
        ),
        Cause::FamilyMismatch { has } => format!(
            "an address family mismatch: {from} has only {} addresses. Set the same NCCL_SOCKET_FAMILY everywhere (or none)",
            if has.is_empty() { "no".to_string() } else { has.join(" and ") }
        ),
        Cause::NotOnNetwork { interfaces } => format!(
            "{to}'s NCCL chose {iface}, on a network {from} is not on ({from}: {}). Set NCCL_SOCKET_IFNAME in {to}'s env: block to an interface on a network all hosts share",
            if interfaces.is_empty() { "no interfaces read".to_string() } else { interfaces.join(", ") }
        ),
        Cause::NothingListening => format!(
            "nothing listened there, or a firewall on {to} rejects the port: open the ports NCCL uses between the hosts"
        ),
        Cause::Dropped => format!(
            "likely a firewall dropping the packets, or no route from {from} to that network"
        ),
        Cause::OtherProgram => "another program answers at that address and port; the bootstrap would reach it, not NCCL".into(),
        Cause::NotListening { why } => format!("{to} could not listen there ({})", clean(why)),
        Cause::Other { why } => clean(why),
    }
}

pub fn family_of(a: &SocketAddr) -> &'static str {
    match a {
        SocketAddr::V4(_) => "IPv4",
        SocketAddr::V6(_) => "IPv6",
    }
}

/// Every worker's interfaces as `name address/prefix`, loopback left out.
fn interface_list(ifs: &[Interface]) -> Vec<String> {
    ifs.iter()
        .flat_map(|i| {
            i.addresses
                .iter()
                .filter(|a| !a.address.is_loopback())
                .map(move |a| format!("{} {}/{}", clean(&i.name), a.address, a.prefix))
        })
        .take(16)
        .collect()
}

/// Why `from` did not reach `address` (chosen by `to`), from the facts both gave.
pub fn cause(
    result: &Reached,
    address: &SocketAddr,
    from_ifs: &[Interface],
    listen: Option<&std::result::Result<SocketAddr, String>>,
) -> Cause {
    if address.ip().is_loopback() {
        return Cause::Loopback;
    }
    if let Some(Err(why)) = listen {
        return Cause::NotListening { why: why.clone() };
    }
    let global = |a: &IpAddr| !a.is_loopback() && !is_link_local(a);
    let families: Vec<&'static str> = {
        let mut f: Vec<&'static str> = from_ifs
            .iter()
            .flat_map(|i| i.addresses.iter())
            .filter(|a| global(&a.address))
            .map(|a| if a.address.is_ipv4() { "IPv4" } else { "IPv6" })
            .collect();
        f.sort();
        f.dedup();
        f
    };
    if !from_ifs.is_empty() && !families.contains(&family_of(address)) {
        return Cause::FamilyMismatch { has: families };
    }
    if !from_ifs.is_empty()
        && !from_ifs
            .iter()
            .flat_map(|i| i.addresses.iter())
            .any(|a| a.contains(address.ip()))
        && !matches!(result, Reached::Refused | Reached::Other)
    {
        return Cause::NotOnNetwork {
            interfaces: interface_list(from_ifs),
        };
    }
    match result {
        Reached::Refused => Cause::NothingListening,
        Reached::TimedOut => Cause::Dropped,
        Reached::Other => Cause::OtherProgram,
        Reached::Unreachable { why } | Reached::Error { why } => Cause::Other { why: why.clone() },
        Reached::Yes { .. } => Cause::Other {
            why: "it connected".into(),
        },
    }
}

fn is_link_local(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(v) => v.is_link_local(),
        IpAddr::V6(v) => v.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// The whole rehearsal, as the CLI renders it.
#[derive(Debug, Clone, Serialize)]
pub struct Rehearsal {
    pub root: String,
    pub workers: Vec<WorkerRun>,
    pub pairs: Vec<Pair>,
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Ok,
    Red,
    Unknown,
}

impl Rehearsal {
    pub fn state(&self) -> State {
        if self.findings.iter().any(Finding::is_red) {
            State::Red
        } else if !self.findings.is_empty() {
            State::Unknown
        } else {
            State::Ok
        }
    }
}

/// The root worker's index: `--root`'s, else the first.
pub fn root_index(workers: &[&Worker], root: Option<&str>) -> Result<usize> {
    match root {
        None if workers.is_empty() => bail!("no workers to rehearse: name them in fdl.cluster.yml, or run inside a Slurm allocation"),
        None => Ok(0),
        Some(name) => workers.iter().position(|w| w.host == name).ok_or_else(|| {
            anyhow::anyhow!(
                "--rank0 {} is not a worker (the workers: {}): name one of them",
                clean(name),
                workers
                    .iter()
                    .map(|w| clean(&w.host))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }),
    }
}

/// The `cluster bootstrap-self` arguments for a worker.
fn bootstrap_args(w: &Worker, limit: Duration) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "cluster".into(),
        "bootstrap-self".into(),
        "--json".into(),
        "--limit".into(),
        limit.as_secs().max(1).to_string(),
    ];
    args.extend(super::status::worker_args(
        w,
        &bootstrap::rehearsed_variable,
    ));
    args
}

/// The most entries of a worker's answer the controller keeps.
const KEEP: usize = 64;

fn parse_bootstrap(out: &std::process::Output) -> std::result::Result<BootstrapAnswer, String> {
    let mut a: BootstrapAnswer = parse_answer(out, BOOTSTRAP_SCHEMA, BOOTSTRAP_KIND, "bootstrap")?;
    a.interfaces.truncate(KEEP);
    for i in &mut a.interfaces {
        i.name = clean(&i.name.chars().take(64).collect::<String>());
        i.addresses.truncate(KEEP);
    }
    a.settings.truncate(KEEP);
    a.nccl_lines.truncate(KEEP);
    a.hostname = clean(&a.hostname.chars().take(256).collect::<String>());
    Ok(a)
}

/// A worker's answer of `schema` and `kind`; `Err` (the controller then ships its own
/// fdl there) for another fdl's answer, or none.
fn parse_answer<T: serde::de::DeserializeOwned>(
    out: &std::process::Output,
    schema: u32,
    kind: &str,
    what: &str,
) -> std::result::Result<T, String> {
    let text = String::from_utf8_lossy(&out.stdout);
    let none = || {
        format!(
            "its fdl gave no {what} answer ({})",
            clean(
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("no message")
            )
        )
    };
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|_| none())?;
    if v["schema"] != schema || v["kind"] != kind {
        return Err(format!("its fdl speaks another {what} answer"));
    }
    serde_json::from_value(v).map_err(|_| none())
}

fn parse_reach(out: &std::process::Output) -> std::result::Result<ReachAnswer, String> {
    let mut a: ReachAnswer = parse_answer(out, REACH_SCHEMA, REACH_KIND, "reach")?;
    a.connects.truncate(KEEP * 16);
    a.arrivals.truncate(KEEP * 16);
    Ok(a)
}

/// Runs the rehearsal over `t`. `on_phase` hears each phase's start (for a progress
/// line).
pub fn rehearse(
    workers: &[&Worker],
    t: &dyn Transport,
    own: &OwnBinary,
    opts: &Options,
    on_phase: &dyn Fn(&str),
) -> Result<Rehearsal> {
    let root = root_index(workers, opts.root.as_deref())?;
    on_phase("asking each worker's NCCL for its bootstrap address");
    let limit = opts.timeout.min(Duration::from_secs(60));
    let args = |w: &Worker| bootstrap_args(w, limit);
    let answers = run_fdl_all(
        t,
        workers,
        own,
        &args,
        opts.timeout + limit,
        &parse_bootstrap,
    );
    let runs: Vec<WorkerRun> = answers
        .into_iter()
        .zip(workers)
        .map(|(r, w)| {
            let mut run = WorkerRun {
                host: w.host.clone(),
                target: w.ssh.target.clone(),
                bootstrap: None,
                error: None,
                shipped_fdl: false,
            };
            match r {
                Ok((a, shipped)) => {
                    run.bootstrap = Some(a);
                    run.shipped_fdl = shipped;
                }
                Err(e) => run.error = Some(format!("{e:#}")),
            }
            run
        })
        .collect();
    let mut findings: Vec<Finding> = runs.iter().filter_map(bootstrap_finding).collect();
    let mut pairs = Vec::new();
    let root_at = runs[root].chosen().map(|(a, _)| a);
    // The reach phase: the root and every worker whose NCCL chose an address.
    let ready: Vec<usize> = (0..workers.len())
        .filter(|&i| runs[i].chosen().is_some())
        .collect();
    if let (Some(root_addr), true) = (root_at, ready.len() > 1) {
        on_phase("listening on the chosen addresses and connecting");
        let nonce = nonce();
        let within = opts.within;
        let args = |w: &Worker| -> Vec<String> {
            let i = workers
                .iter()
                .position(|x| std::ptr::eq(*x, w))
                .unwrap_or(root);
            let (mine, _) = runs[i].chosen().expect("ready");
            let mut a: Vec<String> = vec![
                "cluster".into(),
                "reach-self".into(),
                "--json".into(),
                "--as".into(),
                i.to_string(),
                "--nonce".into(),
                nonce.clone(),
                "--within-ms".into(),
                within.as_millis().to_string(),
                "--listen".into(),
                mine.to_string(),
            ];
            if i == root {
                for &j in ready.iter().filter(|&&j| j != root) {
                    let (theirs, _) = runs[j].chosen().expect("ready");
                    a.extend(["--expect".into(), j.to_string()]);
                    a.extend(["--connect".into(), format!("{j}={theirs}")]);
                }
            } else {
                a.extend(["--expect".into(), root.to_string()]);
                a.extend(["--connect".into(), format!("{root}={root_addr}")]);
            }
            a
        };
        let sub: Vec<&Worker> = ready.iter().map(|&i| workers[i]).collect();
        let reached = run_fdl_all(t, &sub, own, &args, opts.timeout + within, &parse_reach);
        let mut by_index: Vec<Option<std::result::Result<ReachAnswer, String>>> =
            (0..workers.len()).map(|_| None).collect();
        for (&i, r) in ready.iter().zip(reached) {
            by_index[i] = Some(r.map(|(a, _)| a).map_err(|e| format!("{e:#}")));
        }
        for &j in ready.iter().filter(|&&j| j != root) {
            for (from, to) in [(j, root), (root, j)] {
                let (address, interface) = runs[to].chosen().expect("ready");
                let listen = match &by_index[to] {
                    Some(Ok(a)) => a.listen.clone(),
                    _ => None,
                };
                let result = match &by_index[from] {
                    Some(Ok(a)) => a
                        .connects
                        .iter()
                        .find(|c| c.to == to.to_string())
                        .map(|c| c.result.clone())
                        .unwrap_or(Reached::Error {
                            why: "its answer names no such connection".into(),
                        }),
                    Some(Err(why)) => {
                        findings.push(Finding::Unanswered {
                            host: runs[from].host.clone(),
                            why: why.clone(),
                        });
                        continue;
                    }
                    None => continue,
                };
                if !matches!(result, Reached::Yes { .. }) {
                    findings.push(Finding::Unreached {
                        from: runs[from].host.clone(),
                        to: runs[to].host.clone(),
                        interface: interface.map(clean),
                        address,
                        family: family_of(&address),
                        cause: cause(&result, &address, runs[from].interfaces(), listen.as_ref()),
                        result: result.clone(),
                    });
                }
                pairs.push(Pair {
                    from: runs[from].host.clone(),
                    to: runs[to].host.clone(),
                    address,
                    result,
                });
            }
        }
        // A worker whose reach answer is missing is said once, however many pairs lack it.
        let mut silent: Vec<String> = Vec::new();
        findings.retain(|f| match f {
            Finding::Unanswered { host, .. } if silent.contains(host) => false,
            Finding::Unanswered { host, .. } => {
                silent.push(host.clone());
                true
            }
            _ => true,
        });
    }
    Ok(Rehearsal {
        root: workers[root].host.clone(),
        workers: runs,
        pairs,
        findings,
    })
}

/// What one worker's bootstrap answer finds, if anything.
fn bootstrap_finding(r: &WorkerRun) -> Option<Finding> {
    let host = r.host.clone();
    let Some(b) = &r.bootstrap else {
        return Some(Finding::Unanswered {
            host,
            why: r.error.clone().unwrap_or_else(|| "no answer".into()),
        });
    };
    match &b.outcome {
        Outcome::Chosen { .. } => None,
        Outcome::Refused { reason } => Some(Finding::Refused {
            host,
            why: clean(reason),
        }),
        Outcome::Failed { reason } => Some(Finding::Failed {
            host,
            why: clean(reason),
        }),
        Outcome::NcclError { code, warn } => Some(Finding::NcclError {
            host,
            version: b
                .library
                .as_ref()
                .map(|l: &Checked| clean(&l.version))
                .unwrap_or_else(|| "?".into()),
            code: *code,
            warn: warn.as_deref().map(clean),
            settings: b.settings.iter().map(|s| clean(s)).collect(),
            interfaces: interface_list(&b.interfaces)
                .into_iter()
                .chain(
                    b.interfaces
                        .iter()
                        .filter(|i| i.addresses.iter().all(|a| a.address.is_loopback()))
                        .map(|i| format!("{} (loopback)", i.name)),
                )
                .collect(),
        }),
    }
}

/// A nonce no other rehearsal shares: the time and this process.
fn nonce() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{:x}{:x}", now, std::process::id())
}

/// The rehearsal of three workers `a`, `b` and `c` (`a` the root) whose every command
/// answers with what `answer(worker, script)` gives as its stdout: for the unit tests
/// and the fuzz target, which feed it what hostile workers could send.
#[cfg(any(test, feature = "test-support"))]
pub fn canned(answer: &(dyn Fn(&Worker, &str) -> Vec<u8> + Sync)) -> Rehearsal {
    use super::transport::Canned;
    let worker = |host: &str| Worker {
        host: host.into(),
        path: "/p".into(),
        arch: None,
        ssh: Default::default(),
        env: Default::default(),
        docker: None,
    };
    let ws = [worker("a"), worker("b"), worker("c")];
    let refs: Vec<&Worker> = ws.iter().collect();
    let own = OwnBinary {
        path: "/nonexistent/fdl".into(),
        sha256: "ab".repeat(32),
    };
    let opts = Options {
        root: None,
        within: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
    };
    rehearse(&refs, &Canned(answer), &own, &opts, &|_| {})
        .expect("three workers and no --rank0 always rehearse")
}

/// [`canned`] with `data` as what every worker sends: its first line as each bootstrap
/// answer, the rest as each reach answer (the fuzz target's input and its seeds).
#[cfg(any(test, feature = "test-support"))]
pub fn canned_bytes(data: &[u8]) -> Rehearsal {
    let (bootstrap, reach) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    canned(&|_, script: &str| {
        if script.contains("bootstrap-self") {
            bootstrap.to_vec()
        } else {
            reach.to_vec()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::bootstrap::IfAddress;

    fn ifs(list: &[(&str, &str, u8)]) -> Vec<Interface> {
        list.iter()
            .map(|(n, a, p)| Interface {
                name: n.to_string(),
                addresses: vec![IfAddress {
                    address: a.parse().unwrap(),
                    prefix: *p,
                }],
            })
            .collect()
    }

    #[test]
    fn the_cause_follows_from_the_facts_both_sides_gave() {
        let b = ifs(&[("lo", "127.0.0.1", 8), ("eth0", "172.18.0.3", 16)]);
        let lo: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert_eq!(cause(&Reached::Refused, &lo, &b, None), Cause::Loopback);
        let v6: SocketAddr = "[fd77:1::4]:4000".parse().unwrap();
        assert_eq!(
            cause(&Reached::Unreachable { why: "x".into() }, &v6, &b, None),
            Cause::FamilyMismatch { has: vec!["IPv4"] }
        );
        let other_net: SocketAddr = "172.30.0.2:4000".parse().unwrap();
        assert_eq!(
            cause(&Reached::TimedOut, &other_net, &b, None),
            Cause::NotOnNetwork {
                interfaces: vec!["eth0 172.18.0.3/16".into()]
            }
        );
        let same_net: SocketAddr = "172.18.0.2:4000".parse().unwrap();
        assert_eq!(
            cause(&Reached::Refused, &same_net, &b, None),
            Cause::NothingListening
        );
        assert_eq!(
            cause(&Reached::TimedOut, &same_net, &b, None),
            Cause::Dropped
        );
        let failed = Err("cannot listen on 172.18.0.2:4000: Address in use".to_string());
        assert!(matches!(
            cause(&Reached::Refused, &same_net, &b, Some(&failed)),
            Cause::NotListening { .. }
        ));
    }

    #[test]
    fn a_workers_answer_is_read_as_hostile() {
        let out = |stdout: &str| std::process::Output {
            status: std::os::unix::process::ExitStatusExt::from_raw(0),
            stdout: stdout.as_bytes().to_vec(),
            stderr: b"last words\x1b[2J".to_vec(),
        };
        let a = parse_bootstrap(&out(
            r#"{"schema":1,"kind":"fdl-bootstrap","hostname":"h\u001b[31m","outcome":{"state":"chosen","interface":"eth0","address":"10.0.0.2:4000","comm_id":false},"interfaces":[{"name":"e\nth0","addresses":[]}]}"#,
        ))
        .unwrap();
        assert!(!a.hostname.contains('\x1b'), "{}", a.hostname);
        assert!(
            !a.interfaces[0].name.contains('\n'),
            "{}",
            a.interfaces[0].name
        );
        assert!(
            parse_bootstrap(&out(r#"{"schema":2,"kind":"fdl-bootstrap"}"#))
                .unwrap_err()
                .contains("another bootstrap answer")
        );
        let e = parse_bootstrap(&out("banner\n")).unwrap_err();
        assert!(e.contains("no bootstrap answer (last words"), "{e}");
        assert!(!e.contains('\x1b'), "{e}");
        // An address that is no address is no answer.
        assert!(parse_bootstrap(&out(
            r#"{"schema":1,"kind":"fdl-bootstrap","hostname":"h","outcome":{"state":"chosen","interface":null,"address":"10.0.0.2; rm -rf /","comm_id":false}}"#
        ))
        .is_err());
    }

    fn run(answer: fn(&str, &str) -> String) -> Rehearsal {
        canned(&|w: &Worker, script: &str| {
            let phase = if script.contains("bootstrap-self") {
                "bootstrap"
            } else {
                "reach"
            };
            answer(&w.host, phase).into_bytes()
        })
    }

    #[test]
    fn what_hostile_workers_send_reaches_no_finding_raw() {
        let r = run(|host, phase| {
            match (host, phase) {
            ("a", "bootstrap") => r#"{"schema":1,"kind":"fdl-bootstrap","hostname":"a","library":{"file":"/x","version":"2.27.5\u001b[2J","trust":{"kind":"libtorch"}},"outcome":{"state":"chosen","interface":"e\u001b]0;owned\u0007th0","address":"10.0.0.1:4000","comm_id":false},"interfaces":[{"name":"eth0","addresses":[{"address":"10.0.0.1","prefix":24}]}]}"#.into(),
            ("b", "bootstrap") => r#"{"schema":1,"kind":"fdl-bootstrap","hostname":"b","library":{"file":"/x","version":"2.27\n.5","trust":{"kind":"libtorch"}},"outcome":{"state":"nccl_error","code":5,"warn":"no \u202einterface\r\nfake line"},"settings":["NCCL_SOCKET_IFNAME=\u001b[31mx"],"interfaces":[{"name":"l\u0000o","addresses":[{"address":"127.0.0.1","prefix":8}]}]}"#.into(),
            ("c", "bootstrap") => r#"{"schema":1,"kind":"fdl-bootstrap","hostname":"c","outcome":{"state":"refused","reason":"no\u001b[2J"}}"#.into(),
            ("a", "reach") => r#"{"schema":1,"kind":"fdl-reach","listen":{"Ok":"10.0.0.1:4000"},"connects":[]}"#.into(),
            _ => "\u{1b}[2J not json".into(),
        }
        });
        // b failed and c was refused: a alone would listen, so no connection was tried.
        assert!(r.pairs.is_empty(), "{r:?}");
        assert_eq!(r.state(), State::Red);
        assert_eq!(r.findings.len(), 2, "{:?}", r.findings);
        for f in &r.findings {
            for text in [f.full(), f.short()] {
                assert!(
                    !text
                        .chars()
                        .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
                    "{text:?}"
                );
            }
        }
        assert!(
            r.findings[0].full().starts_with("b: NCCL 2.27"),
            "{}",
            r.findings[0].full()
        );
    }

    #[test]
    fn a_connection_a_worker_reports_failed_is_a_finding_and_a_missing_answer_is_named_once() {
        let r = run(|host, phase| {
            match (host, phase) {
            (h, "bootstrap") => format!(
                r#"{{"schema":1,"kind":"fdl-bootstrap","hostname":"{h}","outcome":{{"state":"chosen","interface":"eth0","address":"10.0.0.{}:4000","comm_id":false}},"interfaces":[{{"name":"eth0","addresses":[{{"address":"10.0.0.{}","prefix":24}}]}}]}}"#,
                h.as_bytes()[0] - b'a' + 1,
                h.as_bytes()[0] - b'a' + 1
            ),
            ("a", "reach") => r#"{"schema":1,"kind":"fdl-reach","listen":{"Ok":"10.0.0.1:4000"},"connects":[{"to":"1","address":"10.0.0.2:4000","result":{"state":"refused"}},{"to":"2","address":"10.0.0.3:4000","result":{"state":"yes","ms":1}}]}"#.into(),
            ("b", "reach") => r#"{"schema":1,"kind":"fdl-reach","listen":{"Ok":"10.0.0.2:4000"},"connects":[{"to":"0","address":"10.0.0.1:4000","result":{"state":"yes","ms":1}}]}"#.into(),
            _ => "no answer".into(),
        }
        });
        assert_eq!(r.pairs.len(), 3, "c's own connection is not known: {r:?}");
        let kinds: Vec<String> = r.findings.iter().map(Finding::short).collect();
        assert_eq!(
            kinds,
            ["a -> b: nothing listening or a firewall", "c: no answer"],
            "{r:?}"
        );
        assert_eq!(r.state(), State::Red);
    }

    #[test]
    fn a_finding_names_the_pair_the_interface_the_family_and_the_cause() {
        let f = Finding::Unreached {
            from: "b".into(),
            to: "a".into(),
            interface: Some("eth1".into()),
            address: "172.30.0.2:4000".parse().unwrap(),
            family: "IPv4",
            result: Reached::TimedOut,
            cause: Cause::NotOnNetwork {
                interfaces: vec!["eth0 172.18.0.3/16".into()],
            },
        };
        assert!(f.is_red());
        assert_eq!(
            f.full(),
            "b cannot reach a's bootstrap address eth1 172.30.0.2:4000 (IPv4): no answer within the bound; a's NCCL chose eth1, on a network b is not on (b: eth0 172.18.0.3/16). Set NCCL_SOCKET_IFNAME in a's env: block to an interface on a network all hosts share"
        );
        assert_eq!(f.short(), "b -> a: not on a shared network");
        let r = Finding::Refused {
            host: "c".into(),
            why: "x".into(),
        };
        assert!(!r.is_red());
    }
}
