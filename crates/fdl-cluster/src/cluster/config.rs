//! floDl's own cluster description, read as floDl reads it: `fdl.cluster.yml` deep-merged
//! onto `fdl.yml` beside it. fdl takes only what it needs (`cluster.controller`,
//! `cluster.workers[]`, `cluster.env`) and ignores everything else, since floDl owns the
//! file; it never writes it. Every node keeps its file and line, so a wrong shape is
//! reported where the user wrote it.

use anyhow::{anyhow, bail, Context, Result};
use marked_yaml::{Node, Span};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const BASE_FILE: &str = "fdl.yml";
pub const CLUSTER_FILE: &str = "fdl.cluster.yml";

/// A file this big is not a hand-written cluster description.
const MAX_FILE: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Controller {
    pub host: String,
    pub path: String,
    pub arch: Option<String>,
}

/// How to reach a worker: floDl's `ssh:` block, each field mapping to an ssh flag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SshSettings {
    /// `ssh.target`, else the worker's `host`.
    pub target: String,
    pub port: Option<u16>,
    pub user: Option<String>,
    pub identity_file: Option<String>,
    /// `-o Key=Value` directives, in the user's order.
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Worker {
    pub host: String,
    /// The project checkout on that host (its own frame: it may differ per host).
    pub path: String,
    /// The libtorch variant under `<path>/libtorch/`.
    pub arch: Option<String>,
    pub ssh: SshSettings,
    /// `cluster.env` with this worker's `env` laid over it.
    pub env: BTreeMap<String, String>,
    /// The docker-compose service of its runtime, when it has one.
    pub docker: Option<String>,
}

impl Worker {
    /// The library the worker's ranks preload, when its merged env names one.
    pub fn ld_preload(&self) -> Option<&str> {
        self.env
            .get("LD_PRELOAD")
            .map(String::as_str)
            .filter(|v| !v.trim().is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cluster {
    /// The files read, base first.
    pub files: Vec<PathBuf>,
    pub controller: Controller,
    pub workers: Vec<Worker>,
}

/// The smallest cluster file that describes two workers, one reached with a custom SSH
/// port and key: shown when there is none, quoted in the README, and parsed by the tests.
pub const MINIMAL_EXAMPLE: &str = "\
cluster:
  controller:
    host: trainer              # this machine, where fdl runs
    path: /home/me/proj        # the project checkout here
  workers:
    - host: pascal             # reached as `ssh pascal` (your ~/.ssh/config applies)
      path: /home/me/proj      # the project checkout on that host
    - host: blackwell
      path: /srv/proj
      ssh:
        target: 192.168.1.20   # address (default: host)
        port: 2222
        user: me
        identity_file: ~/.ssh/id_blackwell
";

/// Reads the cluster of the project at `root`: `fdl.cluster.yml` over `fdl.yml` (which
/// may be absent). `cluster_file` replaces the overlay's path.
pub fn load(root: &Path, cluster_file: Option<&Path>) -> Result<Cluster> {
    let overlay_path = cluster_file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join(CLUSTER_FILE));
    let base_path = overlay_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(BASE_FILE);
    let mut files = Vec::new();
    let mut sources = Vec::new();
    // Anything there is read, and what is not a small regular file (a FIFO, a device,
    // a directory) is named as such, never taken for "no file".
    let present = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    if present(&base_path) {
        sources.push((base_path.clone(), read(&base_path)?));
        files.push(base_path);
    }
    if !present(&overlay_path) {
        bail!(
            "no cluster file at {}. Write one there (or name one with --file PATH) describing the controller and each worker; the smallest one (docs/cluster.md, \"The cluster file\"):\n{}",
            overlay_path.display(),
            MINIMAL_EXAMPLE.trim_end()
        );
    }
    sources.push((overlay_path.clone(), read(&overlay_path)?));
    files.push(overlay_path);
    parse(&sources).map(|(controller, workers)| Cluster {
        files,
        controller,
        workers,
    })
}

fn read(path: &Path) -> Result<String> {
    let bytes = crate::fsread::read_regular_following(path, MAX_FILE)
        .with_context(|| format!("{} is not a cluster file", path.display()))?;
    String::from_utf8(bytes).map_err(|_| anyhow!("cannot read {} as text", path.display()))
}

/// Parses and merges `(path, text)` pairs, later files over earlier ones.
pub fn parse(sources: &[(PathBuf, String)]) -> Result<(Controller, Vec<Worker>)> {
    let names: Vec<String> = sources
        .iter()
        .map(|(p, _)| p.display().to_string())
        .collect();
    let at = Where { files: &names };
    let mut merged: Option<Node> = None;
    for (i, (_, text)) in sources.iter().enumerate() {
        // Editors on some systems start UTF-8 files with a byte-order mark: not YAML.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // An empty file (or only comments) is an empty mapping, as floDl takes it.
        let node = if text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            continue;
        } else {
            // A key written twice is a mistake to show, not a value to pick silently.
            let options = marked_yaml::LoaderOptions::default().error_on_duplicate_keys(true);
            marked_yaml::parse_yaml_with_options(i, text, options)
                .map_err(|e| anyhow!("{}: {}", names[i], load_error(&e)))?
        };
        merged = Some(match merged {
            None => node,
            Some(base) => deep_merge(base, node),
        });
    }
    let root = merged.ok_or_else(|| {
        anyhow!(
            "{}: the file is empty: describe `cluster:` with a `controller:` and `workers:`",
            names.last().cloned().unwrap_or_default()
        )
    })?;
    let root = at.mapping(&root, "the top level")?;
    let cluster = root.get_node("cluster").ok_or_else(|| {
        anyhow!(
            "{}: no `cluster:` section: describe `cluster.controller` and `cluster.workers`",
            names.last().cloned().unwrap_or_default()
        )
    })?;
    let cluster = at.mapping(cluster, "cluster")?;

    let controller = cluster.get_node("controller").ok_or_else(|| {
        at.missing(
            cluster.span(),
            "cluster",
            "controller",
            "the host fdl runs on",
        )
    })?;
    let c = at.mapping(controller, "cluster.controller")?;
    let controller = Controller {
        host: at.required(c, "cluster.controller", "host", "its address")?,
        path: at.required(c, "cluster.controller", "path", "its project root")?,
        arch: at.optional(c, "cluster.controller", "arch")?,
    };
    let cluster_env = match cluster.get_node("env") {
        Some(env) => at.env(env, "cluster.env")?,
        None => BTreeMap::new(),
    };
    let mut workers = Vec::new();
    if let Some(list) = cluster.get_node("workers") {
        let Some(seq) = list.as_sequence() else {
            return Err(at.wrong(list, "cluster.workers", "a list of workers"));
        };
        for (i, node) in seq.iter().enumerate() {
            let field = format!("cluster.workers[{i}]");
            let w = at.mapping(node, &field)?;
            let host = at.required(
                w,
                &field,
                "host",
                "the worker's name and default SSH target",
            )?;
            let path = at.required(w, &field, "path", "the project checkout on that host")?;
            // One host is one worker: twice would make two answers of one name in every
            // report, and two ships racing into one directory.
            if let Some(j) = workers.iter().position(|x: &Worker| x.host == host) {
                let node = w.get_node("host").unwrap_or(node);
                return Err(at.wrong(
                    node,
                    &format!("{field}.host"),
                    &format!("a name no other worker has (cluster.workers[{j}] is this host already: list each worker once)"),
                ));
            }
            let mut ssh = SshSettings {
                target: host.clone(),
                ..Default::default()
            };
            if let Some(block) = w.get_node("ssh") {
                let f = format!("{field}.ssh");
                let s = at.mapping(block, &f)?;
                if let Some(t) = at.optional(s, &f, "target")? {
                    ssh.target = t;
                }
                if let Some(port) = s.get_node("port") {
                    let text = at.scalar(port, &format!("{f}.port"))?;
                    if !is_null(text) {
                        ssh.port =
                            Some(text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                                at.wrong(port, &format!("{f}.port"), "a port number (1-65535)")
                            })?);
                    }
                }
                ssh.user = at.optional(s, &f, "user")?;
                ssh.identity_file = at.optional(s, &f, "identity_file")?;
                if let Some(opts) = s.get_node("options") {
                    let of = format!("{f}.options");
                    let Some(seq) = opts.as_sequence() else {
                        return Err(at.wrong(opts, &of, "a list of Key=Value strings"));
                    };
                    for (j, o) in seq.iter().enumerate() {
                        ssh.options
                            .push(at.scalar(o, &format!("{of}[{j}]"))?.to_string());
                    }
                }
            }
            let mut env = cluster_env.clone();
            if let Some(e) = w.get_node("env") {
                env.extend(at.env(e, &format!("{field}.env"))?);
            }
            workers.push(Worker {
                arch: at.optional(w, &field, "arch")?,
                docker: at.optional(w, &field, "docker")?,
                host,
                path,
                ssh,
                env,
            });
        }
    }
    if workers.is_empty() {
        bail!(
            "{}: `cluster.workers` lists no worker: add one entry per host with `host:` and `path:`",
            names.last().cloned().unwrap_or_default()
        );
    }
    Ok((controller, workers))
}

fn is_null(s: &str) -> bool {
    matches!(s.trim(), "" | "~" | "null" | "Null" | "NULL")
}

/// floDl's overlay rule: mappings merge key by key, anything else is replaced.
fn deep_merge(base: Node, over: Node) -> Node {
    match (base, over) {
        (Node::Mapping(mut b), Node::Mapping(o)) => {
            let span = *o.span();
            for (k, v) in o.iter() {
                let merged = match b.remove(k) {
                    Some(old) => deep_merge(old, v.clone()),
                    None => v.clone(),
                };
                b.insert(k.clone(), merged);
            }
            *b.span_mut() = span;
            Node::Mapping(b)
        }
        (_, over) => over,
    }
}

fn load_error(e: &marked_yaml::LoadError) -> String {
    use marked_yaml::LoadError as L;
    let (m, what) = match e {
        L::TopLevelMustBeMapping(m) => (m, "the top level must be a mapping".to_string()),
        L::TopLevelMustBeSequence(m) => (m, "the top level must be a sequence".to_string()),
        L::UnexpectedAnchor(m) => (m, "YAML anchors are not supported here".to_string()),
        L::MappingKeyMustBeScalar(m) => (m, "a mapping key must be a plain value".to_string()),
        L::UnexpectedTag(m) => (m, "YAML tags are not supported here".to_string()),
        L::ScanError(m, err) => (m, format!("not valid YAML: {err}")),
        L::DuplicateKey(d) => {
            let line = |k: &marked_yaml::types::MarkedScalarNode| {
                k.span()
                    .start()
                    .map(|m| m.line().to_string())
                    .unwrap_or_else(|| "?".into())
            };
            return format!(
                "line {}: the key `{}` appears twice in one mapping (lines {} and {}): keep one",
                line(&d.key),
                crate::text::clean(&d.key.as_str().chars().take(60).collect::<String>()),
                line(&d.prev_key),
                line(&d.key)
            );
        }
    };
    format!("line {}: {what}", m.line())
}

/// Names places in the merged tree by file, line and field.
struct Where<'a> {
    files: &'a [String],
}

impl Where<'_> {
    fn place(&self, span: &Span) -> String {
        match span.start() {
            Some(m) => format!(
                "{}:{}",
                self.files
                    .get(m.source())
                    .map(String::as_str)
                    .unwrap_or("?"),
                m.line()
            ),
            None => self.files.last().cloned().unwrap_or_default(),
        }
    }

    fn kind(node: &Node) -> &'static str {
        match node {
            Node::Scalar(_) => "a plain value",
            Node::Mapping(_) => "a mapping",
            Node::Sequence(_) => "a list",
        }
    }

    fn wrong(&self, node: &Node, field: &str, want: &str) -> anyhow::Error {
        let found = match node {
            Node::Scalar(s) => format!("'{}'", s.as_str().chars().take(60).collect::<String>()),
            other => Self::kind(other).to_string(),
        };
        anyhow!(
            "{}: {field} must be {want}, but it is {found}",
            self.place(node.span())
        )
    }

    fn missing(&self, span: &Span, parent: &str, key: &str, what: &str) -> anyhow::Error {
        anyhow!(
            "{}: {parent} has no `{key}` ({what}): add it",
            self.place(span)
        )
    }

    fn mapping<'n>(
        &self,
        node: &'n Node,
        field: &str,
    ) -> Result<&'n marked_yaml::types::MarkedMappingNode> {
        node.as_mapping()
            .ok_or_else(|| self.wrong(node, field, "a mapping of keys to values"))
    }

    fn scalar<'n>(&self, node: &'n Node, field: &str) -> Result<&'n str> {
        node.as_scalar()
            .map(|s| s.as_str())
            .ok_or_else(|| self.wrong(node, field, "a plain value"))
    }

    fn optional(
        &self,
        map: &marked_yaml::types::MarkedMappingNode,
        parent: &str,
        key: &str,
    ) -> Result<Option<String>> {
        match map.get_node(key) {
            None => Ok(None),
            Some(node) => {
                let s = self.scalar(node, &format!("{parent}.{key}"))?;
                Ok((!is_null(s)).then(|| s.to_string()))
            }
        }
    }

    fn required(
        &self,
        map: &marked_yaml::types::MarkedMappingNode,
        parent: &str,
        key: &str,
        what: &str,
    ) -> Result<String> {
        self.optional(map, parent, key)?
            .ok_or_else(|| self.missing(map.span(), parent, key, what))
    }

    fn env(&self, node: &Node, field: &str) -> Result<BTreeMap<String, String>> {
        let map = self.mapping(node, field)?;
        let mut env = BTreeMap::new();
        for (k, v) in map.iter() {
            let value = self.scalar(v, &format!("{field}.{}", k.as_str()))?;
            env.insert(k.as_str().to_string(), value.to_string());
        }
        Ok(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_one(text: &str) -> Result<(Controller, Vec<Worker>)> {
        parse(&[(PathBuf::from("fdl.cluster.yml"), text.to_string())])
    }

    const GOOD: &str = r#"# comments are kept by never writing the file
cluster:
  controller:
    host: 192.168.122.1
    port: 1337
    path: /opt/flodl
    arch: precompiled/cu128
  env:
    NCCL_DEBUG: INFO
    LD_PRELOAD: /opt/flodl/libtorch/nccl/builds/x/lib/libnccl.so.2
  workers:
    - host: node-a
      local_devices: [0]
      nccl_socket_ifname: virbr0
      path: /opt/flodl
      arch: precompiled/cu128
      docker: cuda
    - host: node-b
      ssh:
        target: 10.0.0.2
        port: 2222
        user: ubuntu
        identity_file: /home/u/.ssh/k
        options:
          - ProxyJump=bastion
          - ServerAliveInterval=7
      path: "/srv/flo dl"
      arch: builds/sm61-sm120
      env:
        LD_PRELOAD: /srv/x/libnccl.so.2
commands:
  smoke:
    cluster: true
    run: echo hi
"#;

    #[test]
    fn reads_what_fdl_needs_and_ignores_the_rest() {
        let (c, w) = parse_one(GOOD).unwrap();
        assert_eq!(c.host, "192.168.122.1");
        assert_eq!(c.path, "/opt/flodl");
        assert_eq!(c.arch.as_deref(), Some("precompiled/cu128"));
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].ssh.target, "node-a");
        assert_eq!(w[0].docker.as_deref(), Some("cuda"));
        assert_eq!(w[0].env["NCCL_DEBUG"], "INFO");
        assert_eq!(
            w[0].ld_preload(),
            Some("/opt/flodl/libtorch/nccl/builds/x/lib/libnccl.so.2")
        );
        let b = &w[1];
        assert_eq!(b.path, "/srv/flo dl");
        assert_eq!(
            b.ssh,
            SshSettings {
                target: "10.0.0.2".into(),
                port: Some(2222),
                user: Some("ubuntu".into()),
                identity_file: Some("/home/u/.ssh/k".into()),
                options: vec!["ProxyJump=bastion".into(), "ServerAliveInterval=7".into()],
            }
        );
        // A worker's env overrides the cluster's for matching keys only.
        assert_eq!(b.ld_preload(), Some("/srv/x/libnccl.so.2"));
        assert_eq!(b.env["NCCL_DEBUG"], "INFO");
    }

    #[test]
    fn the_overlay_deep_merges_onto_fdl_yml() {
        let base = "project: x\ncluster:\n  controller:\n    host: c\n    path: /base\n  env:\n    A: base\n    B: base\n";
        let over = "cluster:\n  controller:\n    path: /over\n  env:\n    B: over\n  workers:\n    - host: w\n      path: /w\n";
        let (c, w) = parse(&[
            (PathBuf::from("fdl.yml"), base.into()),
            (PathBuf::from("fdl.cluster.yml"), over.into()),
        ])
        .unwrap();
        assert_eq!((c.host.as_str(), c.path.as_str()), ("c", "/over"));
        assert_eq!(w[0].env["A"], "base");
        assert_eq!(w[0].env["B"], "over");
    }

    #[test]
    fn a_worker_listed_twice_is_named() {
        let e = parse_one("cluster:\n  controller:\n    host: c\n    path: /p\n  workers:\n    - host: a\n      path: /a\n    - host: b\n      path: /b\n    - host: a\n      path: /other\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("fdl.cluster.yml:10: cluster.workers[2].host must be a name no other worker has (cluster.workers[0] is this host already"),
            "{e}"
        );
    }

    #[test]
    fn wrong_shapes_name_the_file_line_and_field() {
        let err = |text: &str| parse_one(text).unwrap_err().to_string();
        let e = err("cluster:\n  controller:\n    host: c\n    path: /p\n  workers:\n    - host: a\n      path: /a\n    - host: b\n      arch: x\n");
        assert!(
            e.starts_with("fdl.cluster.yml:8: cluster.workers[1] has no `path`"),
            "{e}"
        );
        let e = err("cluster:\n  controller:\n    host: c\n    path: /p\n  workers:\n    - host: a\n      path:\n        nested: 1\n");
        assert!(
            e.starts_with("fdl.cluster.yml:8: cluster.workers[0].path must be a plain value, but it is a mapping"),
            "{e}"
        );
        let e = err("cluster:\n  controller:\n    host: c\n    path: /p\n  workers:\n    - host: a\n      path: /a\n      ssh:\n        port: ssh\n");
        assert!(
            e.starts_with("fdl.cluster.yml:9: cluster.workers[0].ssh.port must be a port number"),
            "{e}"
        );
        let e = err("cluster:\n  controller:\n    path: /p\n  workers: []\n");
        assert!(e.contains("cluster.controller has no `host`"), "{e}");
        let e = err("cluster:\n  controller:\n    host: c\n    path: /p\n  workers: node-a\n");
        assert!(
            e.starts_with("fdl.cluster.yml:5: cluster.workers must be a list"),
            "{e}"
        );
        let e = err("cluster: [\n");
        assert!(e.starts_with("fdl.cluster.yml: line "), "{e}");
        let e = err("cluster:\n  controller:\n    host: c\n    path: /p\n  workers:\n    - host: a\n      path: /a\n      env:\n        LD_PRELOAD: [x]\n");
        assert!(
            e.contains("cluster.workers[0].env.LD_PRELOAD must be a plain value"),
            "{e}"
        );
    }
}
