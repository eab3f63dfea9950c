//! The machine-wide build store: `<fdl cache>/store/<key>/`, one verified NCCL install
//! tree per [`Key`], shared by every project of this user on this machine. A build whose
//! key is there is installed from it (reflink, else a byte copy; never a hard link, so
//! no project shares a writable inode with the entry or with another project) instead
//! of compiled; a build that is not is added once it passed verification.
//!
//! Not to be confused with `nccl::store`, a project's `libtorch/nccl/builds/`, which sits
//! above this module and records the [`StoreRecord`] of the entry a build came from.
//!
//! An entry is `entry.json` (key, inputs, digest), `tree/` (the install tree as the
//! build staged it, before fdl's manifest and `nccl.pc` prefix), `build.log`, and
//! `users.json` (which project builds use it). It is written like a project build: in a
//! `.staging-<key>-…` directory beside it, renamed into place when complete, so a killed
//! write leaves no entry. Every change to an entry is made under the key's lock
//! ([`crate::lock`]), which also makes two builds of one key build it once. Entries are
//! checked against their digest whenever they are installed, every byte read again (the
//! fast BLAKE3 tree digest of [`digest`]; an entry made before it, by its SHA-256
//! digest): a modified one is refused, and the build replaces it.
//!
//! What a worker needs to be served from its own store (`fdl cluster receive`): the
//! build's manifest names its [`Key`] (`store.key`); [`Store::at`] and [`Store::has`]
//! answer whether the key is there without changing anything; [`Store::open_in`],
//! [`Store::lock`] and [`Store::install`] put the entry, digest-checked, into the
//! staging directory of the worker's own install transaction, which then verifies and
//! commits it as usual; [`Store::add_user`] records the worker's build as a user.

mod clone;
pub mod digest;
pub mod key;

pub use clone::{clone_tree, Method};
pub use digest::{content_digest, PKG_CONFIG};
pub use key::{Key, KeyInputs};

use crate::lock::{self, BuildLock, Wait};
use crate::txn::Transaction;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The record of an entry, written once with it.
pub const ENTRY: &str = "entry.json";
/// The projects' builds that use an entry; rewritten under the key's lock.
pub const USERS: &str = "users.json";
/// The entry's install tree.
pub const TREE: &str = "tree";
/// The log of the build that made the entry.
pub const LOG: &str = "build.log";
const STAGING_PREFIX: &str = ".staging-";
const REMOVING_PREFIX: &str = ".removing-";
/// What an entry's record may weigh; larger is not one.
const RECORD_MAX_BYTES: u64 = 1 << 20;
/// The format of `entry.json` and `users.json`.
pub const ENTRY_SCHEMA: u32 = 1;

/// `entry.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    pub key: Key,
    pub inputs: KeyInputs,
    /// [`content_digest`] of `tree/` (every file but `nccl.pc`).
    pub digest: String,
    /// SHA-256 of `tree/lib/pkgconfig/nccl.pc`, which the digest leaves out.
    pub pc_sha256: String,
    /// [`digest::tree_blake3`] of all of `tree/`: what an install checks. Absent in an
    /// entry made before it, which is checked by `digest` and `pc_sha256` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_blake3: Option<String>,
    pub fdl_version: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// The build that made it, as `<builds dir>/<name>`.
    pub made_for: PathBuf,
}

/// One project build that uses an entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct User {
    pub builds_dir: PathBuf,
    pub name: String,
}

impl User {
    pub fn path(&self) -> PathBuf {
        self.builds_dir.join(&self.name)
    }
}

/// Why an entry was not installed: its files are not those it recorded.
#[derive(Debug, thiserror::Error)]
#[error("the store entry {key} was modified since it was made ({what}): it is not installed")]
pub struct Damaged {
    pub key: Key,
    pub what: String,
}

/// What [`Store::install`] did.
#[derive(Debug, Clone)]
pub struct Installed {
    pub method: Method,
    pub record: Record,
    /// The installed files' digests as the copy hashed them (none for reflinked files):
    /// the manifest's per-file record takes them instead of reading the files again.
    pub digests: crate::digest::FileDigests,
}

/// One entry as `fdl store list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub key: Key,
    pub size_bytes: u64,
    /// `None` when `entry.json` cannot be read (`why` says why).
    pub record: Option<Record>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    pub users: Vec<User>,
}

/// The store of this user on this machine.
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
    /// fdl's cache, where the key locks live.
    pub cache: PathBuf,
}

impl Store {
    /// The store under the cache directory `cache`: both are made when missing, and
    /// both must be this user's own real directories (never a link fdl did not make).
    pub fn open_in(cache: &Path) -> Result<Store> {
        crate::cache::own_dir(cache)?;
        let dir = cache.join("store");
        crate::cache::own_dir(&dir)?;
        Ok(Store {
            dir,
            cache: cache.to_path_buf(),
        })
    }

    /// The store under the cache directory `cache`, without making anything: for a
    /// dry run's lookup and the `fdl store` commands. Where the store exists it must be
    /// this user's own real directory, as [`Store::open_in`] requires; where it does not,
    /// it is empty ([`Store::has`] is false for every key).
    pub fn at(cache: &Path) -> Result<Store> {
        let dir = cache.join("store");
        if std::fs::symlink_metadata(&dir).is_ok() {
            crate::cache::own_dir(&dir)?;
        }
        Ok(Store {
            dir,
            cache: cache.to_path_buf(),
        })
    }

    /// Where the entry of `key` lives (whether or not it exists).
    pub fn path_of(&self, key: &Key) -> PathBuf {
        self.dir.join(key.as_str())
    }

    /// Whether an entry of `key` is there: cheap (two `lstat`s), no digest. What a
    /// worker answers before anything is copied to it; [`Store::install`] still checks.
    pub fn has(&self, key: &Key) -> bool {
        let dir = self.path_of(key);
        std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(dir.join(ENTRY)).is_ok_and(|m| m.is_file())
    }

    /// Takes the lock of `key`: held while the entry is looked up, made, installed
    /// from, or removed.
    pub fn lock(&self, key: &Key, wait: Wait, on_wait: &dyn Fn(&str)) -> Result<BuildLock> {
        lock::acquire(
            &self.cache,
            &self.dir,
            &format!("store-{}", key.as_str()),
            wait,
            on_wait,
        )
    }

    /// The store-wide lock `fdl store gc` holds while it lists and removes: another gc
    /// waits for it (`on_wait` says for whom, once).
    pub fn lock_gc(&self, on_wait: &dyn Fn(&str)) -> Result<BuildLock> {
        lock::acquire(&self.cache, &self.dir, "store-gc", Wait::Yes, on_wait)
    }

    /// The record of `key`'s entry; `None` when there is no entry.
    pub fn lookup(&self, key: &Key) -> Result<Option<Record>> {
        if !self.has(key) {
            return Ok(None);
        }
        let record = read_record(&self.path_of(key))?;
        if &record.key != key {
            bail!(
                "the store entry {key} records the key {}: it was moved or edited",
                record.key
            );
        }
        Ok(Some(record))
    }

    /// Removes what killed writes of `key` left (staging and removal directories). The
    /// lock proves no live run owns them.
    pub fn sweep(&self, lock: &BuildLock, key: &Key) -> Vec<String> {
        let mut done = Vec::new();
        if !self.guards(lock, key) {
            return done;
        }
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return done;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = [STAGING_PREFIX, REMOVING_PREFIX].iter().any(|p| {
                name.strip_prefix(p)
                    .and_then(|r| r.strip_prefix(key.as_str()))
                    .is_some_and(|r| r.starts_with('-'))
            });
            if ours
                && e.file_type().is_ok_and(|t| t.is_dir())
                && std::fs::remove_dir_all(e.path()).is_ok()
            {
                done.push(format!(
                    "removed {}, left by a killed write to the store",
                    e.path().display()
                ));
            }
        }
        done
    }

    fn guards(&self, lock: &BuildLock, key: &Key) -> bool {
        lock.builds_dir == self.dir && lock.name == format!("store-{}", key.as_str())
    }

    fn check_guard(&self, lock: &BuildLock, key: &Key) -> Result<()> {
        if !self.guards(lock, key) {
            bail!(
                "the lock {} does not guard the store entry {key}",
                lock.name
            );
        }
        Ok(())
    }

    /// Installs the entry of `key` into `dest` (an existing, empty staging directory),
    /// then checks that what arrived is what the entry recorded. A [`Damaged`] error
    /// means the entry's files were changed: the caller removes it and builds.
    pub fn install(&self, lock: &BuildLock, key: &Key, dest: &Path) -> Result<Installed> {
        self.check_guard(lock, key)?;
        let record = self
            .lookup(key)?
            .ok_or_else(|| anyhow!("no store entry {key}"))?;
        let tree = self.path_of(key).join(TREE);
        if !std::fs::symlink_metadata(&tree).is_ok_and(|m| m.is_dir()) {
            return Err(Damaged {
                key: key.clone(),
                what: format!("{} is not a directory", tree.display()),
            }
            .into());
        }
        let (method, copied) = clone::clone_tree_hashed(&tree, dest)
            .with_context(|| format!("cannot install the store entry {key}"))?;
        // What is checked is what will be installed: the copy, not the entry. Every byte
        // is read and hashed, once: a byte copy hashed what it wrote; a reflinked file is
        // read here. No timestamp stands in for that.
        if let Some(recorded) = &record.tree_blake3 {
            let found = digest::tree_blake3_knowing(dest, &copied)?;
            if &found != recorded {
                return Err(Damaged {
                    key: key.clone(),
                    what: format!("its files' digest is {found}, it recorded {recorded}"),
                }
                .into());
            }
            return Ok(Installed {
                method,
                record,
                digests: copied,
            });
        }
        let (digest, pc) = digests(dest)?;
        if digest != record.digest || pc != record.pc_sha256 {
            return Err(Damaged {
                key: key.clone(),
                what: if digest != record.digest {
                    format!(
                        "its files' digest is {digest}, it recorded {}",
                        record.digest
                    )
                } else {
                    "its nccl.pc differs from the one it recorded".to_string()
                },
            }
            .into());
        }
        Ok(Installed {
            method,
            record,
            digests: copied,
        })
    }

    /// Adds the verified install tree at `tree` (a staged build, before fdl's manifest)
    /// as the entry of `key`, replacing a damaged one. All or nothing: a killed write
    /// leaves a `.staging-<key>-…` directory, which the next holder of the lock removes.
    // The entry's parts one by one, as the build has them, and the run's context.
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &self,
        ctx: &crate::context::Context,
        lock: &BuildLock,
        key: &Key,
        inputs: &KeyInputs,
        tree: &Path,
        log: Option<&Path>,
        made_for: &Path,
    ) -> Result<Record> {
        self.check_guard(lock, key)?;
        let target = self.path_of(key);
        if std::fs::symlink_metadata(&target).is_ok() {
            self.remove(lock, key)?;
        }
        let txn = Transaction::begin(
            ctx,
            target.clone(),
            &format!("{STAGING_PREFIX}{}-", key.as_str()),
            "store",
        )?;
        let dest = txn.path().join(TREE);
        std::fs::create_dir(&dest)?;
        clone_tree(tree, &dest)?;
        let (digest, pc_sha256) = digests(&dest)?;
        let tree_blake3 = Some(digest::tree_blake3(&dest)?);
        if let Some(log) = log {
            let mut from = crate::fsread::open_regular(log, true)?;
            crate::fswrite::create_new(&txn.path().join(LOG), &mut from)?;
        }
        let record = Record {
            schema: ENTRY_SCHEMA,
            key: key.clone(),
            inputs: inputs.clone(),
            digest,
            pc_sha256,
            tree_blake3,
            fdl_version: env!("CARGO_PKG_VERSION").to_string(),
            created_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            made_for: made_for.to_path_buf(),
        };
        write_json(&txn.path().join(USERS), &Vec::<User>::new())?;
        // The record last: a staging directory without one was never a whole entry.
        write_json(&txn.path().join(ENTRY), &record)?;
        txn.commit()?;
        Ok(record)
    }

    /// Removes the entry of `key`: renamed away first, so it is gone at once, then deleted.
    pub fn remove(&self, lock: &BuildLock, key: &Key) -> Result<()> {
        self.check_guard(lock, key)?;
        let target = self.path_of(key);
        match std::fs::symlink_metadata(&target) {
            Err(_) => bail!("no store entry {key}. See `fdl store list`"),
            Ok(m) if !m.is_dir() => {
                // Not fdl's: an entry is a directory. The name alone is removed.
                std::fs::remove_file(&target)
                    .with_context(|| format!("cannot remove {}", target.display()))?;
                return Ok(());
            }
            Ok(_) => {}
        }
        let aside = tempfile::Builder::new()
            .prefix(&format!("{REMOVING_PREFIX}{}-", key.as_str()))
            .tempdir_in(&self.dir)?
            .keep();
        std::fs::remove_dir(&aside)?;
        std::fs::rename(&target, &aside)
            .with_context(|| format!("cannot remove {}", target.display()))?;
        std::fs::remove_dir_all(&aside).with_context(|| {
            format!(
                "the entry {key} is gone from the store, but {} could not be deleted",
                aside.display()
            )
        })
    }

    /// The recorded users of `key`'s entry (none when it has no `users.json`).
    pub fn users(&self, key: &Key) -> Result<Vec<User>> {
        let path = self.path_of(key).join(USERS);
        match crate::fsread::read_regular_if_present(&path, RECORD_MAX_BYTES)? {
            None => Ok(Vec::new()),
            Some(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not a list of users", path.display())),
        }
    }

    /// Records that the project build `user` uses `key`'s entry.
    pub fn add_user(&self, lock: &BuildLock, key: &Key, user: User) -> Result<()> {
        self.check_guard(lock, key)?;
        // A damaged list is started again: it only decides what `gc` may remove.
        let mut users = self.users(key).unwrap_or_default();
        if !users.contains(&user) {
            users.push(user);
            users.sort();
        }
        write_json(&self.path_of(key).join(USERS), &users)
    }

    /// Drops the users whose build is gone or no longer has this key; returns those left.
    pub fn prune_users(&self, lock: &BuildLock, key: &Key) -> Result<Vec<User>> {
        self.check_guard(lock, key)?;
        let users = self.users(key).unwrap_or_default();
        let live: Vec<User> = users.iter().filter(|u| uses(u, key)).cloned().collect();
        if live != users {
            write_json(&self.path_of(key).join(USERS), &live)?;
        }
        Ok(live)
    }

    /// The keys of every entry (a directory named like a key), sorted.
    pub fn keys(&self) -> Result<Vec<Key>> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", self.dir.display())),
        };
        let mut keys: Vec<Key> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| Key::parse(&e.file_name().to_string_lossy()).ok())
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// The one key that starts with `prefix` (at least 4 hex digits).
    pub fn resolve(&self, prefix: &str) -> Result<Key> {
        let shown = crate::text::clean(&prefix.chars().take(80).collect::<String>());
        if prefix.len() < 4
            || prefix.len() > 64
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            bail!("'{shown}' is not a store key: give a key as `fdl store list` shows it, or at least its first 4 hex digits");
        }
        let found: Vec<Key> = self
            .keys()?
            .into_iter()
            .filter(|k| k.as_str().starts_with(prefix))
            .collect();
        match found.len() {
            1 => Ok(found.into_iter().next().unwrap_or_else(|| unreachable!())),
            0 => bail!("no store entry has a key starting with {shown}. See `fdl store list`"),
            n => bail!("{n} store entries have a key starting with {shown}: give more of the key"),
        }
    }

    /// Every entry, its size and its users. With `prune`, users whose build is gone or
    /// has another key are dropped from the record first (under the key's lock, skipped
    /// for an entry being written).
    pub fn list(&self, prune: bool) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        for key in self.keys()? {
            let dir = self.path_of(&key);
            let (record, why) = match read_record(&dir) {
                Ok(r) => (Some(r), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            };
            let users = match prune
                .then(|| self.lock(&key, Wait::No, &|_| {}))
                .and_then(Result::ok)
            {
                Some(lock) => self.prune_users(&lock, &key)?,
                None => self
                    .users(&key)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|u| uses(u, &key))
                    .collect(),
            };
            out.push(Listed {
                size_bytes: crate::fsread::dir_size(&dir.join(TREE)),
                key,
                record,
                why,
                users,
            });
        }
        Ok(out)
    }
}

/// The file of a project build that records, under `store`, the [`StoreRecord`] of the
/// entry it came from or made (the build's manifest, `nccl::tree::MANIFEST`; a test
/// there holds the two names together).
pub const USER_MANIFEST: &str = "fdl-build.json";

/// Manifests are small; anything larger is not one, and is not read into memory.
const USER_MANIFEST_MAX_BYTES: u64 = 4 << 20;

/// Whether the project build `user` is there and was made with (or from) `key`: its
/// manifest is JSON whose `store` is a record of `key`. Only that part is read, the
/// part of the manifest this module defines.
fn uses(user: &User, key: &Key) -> bool {
    #[derive(Deserialize)]
    struct Part {
        store: Option<StoreRecord>,
    }
    crate::fsread::read_regular(&user.path().join(USER_MANIFEST), USER_MANIFEST_MAX_BYTES)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Part>(&bytes).ok())
        .and_then(|part| part.store)
        .is_some_and(|s| &s.key == key)
}

/// The digest of a tree as the store records it, and its `nccl.pc`'s SHA-256.
fn digests(tree: &Path) -> Result<(String, String)> {
    let digest = content_digest(tree)?;
    let pc = tree.join(PKG_CONFIG);
    let pc = if std::fs::symlink_metadata(&pc).is_ok() {
        crate::digest::sha256_file(&pc)?
    } else {
        "none".to_string()
    };
    Ok((digest, pc))
}

fn read_record(dir: &Path) -> Result<Record> {
    let path = dir.join(ENTRY);
    let bytes = crate::fsread::read_regular(&path, RECORD_MAX_BYTES)?;
    let record: Record = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a store entry's record", path.display()))?;
    if record.schema > ENTRY_SCHEMA {
        bail!(
            "{} was written by a newer fdl (schema {}); this fdl reads up to {ENTRY_SCHEMA}",
            path.display(),
            record.schema
        );
    }
    Ok(record)
}

/// Writes `value` as JSON through a temporary file and a rename: never through a link.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    crate::fswrite::replace_file(path, text.as_bytes())
}

/// What a build recorded of the store in its manifest: the key, its inputs, and whether
/// it was installed from the store or built (and then stored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreRecord {
    pub key: Key,
    pub inputs: KeyInputs,
    /// `true`: installed from the entry; `false`: compiled here.
    pub from_store: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dir: &Path, lib: &[u8]) {
        std::fs::create_dir_all(dir.join("lib/pkgconfig")).unwrap();
        std::fs::create_dir_all(dir.join("include")).unwrap();
        std::fs::write(dir.join("lib/libnccl.so.2.27.5"), lib).unwrap();
        std::os::unix::fs::symlink("libnccl.so.2.27.5", dir.join("lib/libnccl.so.2")).unwrap();
        std::fs::write(dir.join("lib/pkgconfig/nccl.pc"), "prefix=/x\n").unwrap();
        std::fs::write(dir.join("include/nccl.h"), "#define NCCL_MAJOR 2\n").unwrap();
    }

    fn key(n: u8) -> (Key, KeyInputs) {
        let inputs = KeyInputs([("n".to_string(), n.to_string())].into());
        (Key::of(&inputs), inputs)
    }

    #[test]
    fn add_install_detect_damage_remove() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open_in(&t.path().join("cache")).unwrap();
        let src = t.path().join("built");
        tree(&src, b"library bytes");
        let (k, inputs) = key(1);
        assert!(!store.has(&k));
        let lock = store.lock(&k, Wait::No, &|_| {}).unwrap();
        let rec = store
            .add(
                &crate::context::Context::from_process(),
                &lock,
                &k,
                &inputs,
                &src,
                None,
                Path::new("/p/b/x"),
            )
            .unwrap();
        assert!(store.has(&k));
        assert_eq!(store.lookup(&k).unwrap().unwrap(), rec);
        // Nothing but the entry is left in the store.
        let names: Vec<_> = std::fs::read_dir(&store.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(k.as_str())]);

        let dest = t.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        store.install(&lock, &k, &dest).unwrap();
        assert_eq!(
            std::fs::read(dest.join("lib/libnccl.so.2.27.5")).unwrap(),
            b"library bytes"
        );

        // A changed file in the entry: the copy is refused, named as damaged.
        let lib = store.path_of(&k).join("tree/lib/libnccl.so.2.27.5");
        std::fs::remove_file(&lib).unwrap();
        std::fs::write(&lib, b"other bytes!!").unwrap();
        let dest2 = t.path().join("dest2");
        std::fs::create_dir(&dest2).unwrap();
        let e = store.install(&lock, &k, &dest2).unwrap_err();
        assert!(e.downcast_ref::<Damaged>().is_some(), "{e:#}");
        assert!(format!("{e:#}").contains("blake3:"), "{e:#}");
        // So is a changed nccl.pc, which the content digest leaves out.
        store
            .add(
                &crate::context::Context::from_process(),
                &lock,
                &k,
                &inputs,
                &src,
                None,
                Path::new("/p"),
            )
            .unwrap();
        let pc = store.path_of(&k).join("tree/lib/pkgconfig/nccl.pc");
        std::fs::remove_file(&pc).unwrap();
        std::fs::write(&pc, "prefix=/evil\nLibs: -L/evil\n").unwrap();
        let dest3 = t.path().join("dest3");
        std::fs::create_dir(&dest3).unwrap();
        let e = store.install(&lock, &k, &dest3).unwrap_err();
        assert!(e.downcast_ref::<Damaged>().is_some(), "{e:#}");

        store.remove(&lock, &k).unwrap();
        assert!(!store.has(&k));
        assert_eq!(std::fs::read_dir(&store.dir).unwrap().count(), 0);
    }

    #[test]
    fn an_entry_without_a_blake3_digest_is_checked_by_its_sha256() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open_in(&t.path().join("cache")).unwrap();
        let src = t.path().join("built");
        tree(&src, b"library bytes");
        let (k, inputs) = key(3);
        let lock = store.lock(&k, Wait::No, &|_| {}).unwrap();
        let rec = store
            .add(
                &crate::context::Context::from_process(),
                &lock,
                &k,
                &inputs,
                &src,
                None,
                Path::new("/p"),
            )
            .unwrap();
        assert!(rec
            .tree_blake3
            .as_deref()
            .is_some_and(|d| d.starts_with("blake3:")));
        // The record as an fdl before the BLAKE3 digest wrote it: no such field.
        let entry = store.path_of(&k).join(ENTRY);
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&entry).unwrap()).unwrap();
        json.as_object_mut().unwrap().remove("tree_blake3").unwrap();
        std::fs::remove_file(&entry).unwrap();
        std::fs::write(&entry, serde_json::to_vec(&json).unwrap()).unwrap();
        assert_eq!(store.lookup(&k).unwrap().unwrap().tree_blake3, None);
        let dest = t.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        store.install(&lock, &k, &dest).unwrap();
        // A changed byte is still found, by the SHA-256 digest.
        let lib = store.path_of(&k).join("tree/lib/libnccl.so.2.27.5");
        std::fs::remove_file(&lib).unwrap();
        std::fs::write(&lib, b"library bytez").unwrap();
        let dest2 = t.path().join("dest2");
        std::fs::create_dir(&dest2).unwrap();
        let e = store.install(&lock, &k, &dest2).unwrap_err();
        let damaged = e.downcast_ref::<Damaged>().expect("a Damaged error");
        assert!(!damaged.what.contains("blake3"), "{}", damaged.what);
    }

    #[test]
    fn prefixes_resolve_only_when_unique_and_bad_keys_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open_in(&t.path().join("cache")).unwrap();
        let src = t.path().join("built");
        tree(&src, b"x");
        let (k, inputs) = key(7);
        let lock = store.lock(&k, Wait::No, &|_| {}).unwrap();
        store
            .add(
                &crate::context::Context::from_process(),
                &lock,
                &k,
                &inputs,
                &src,
                None,
                Path::new("/p"),
            )
            .unwrap();
        assert_eq!(store.resolve(&k.as_str()[..6]).unwrap(), k);
        assert!(store.resolve("abc").is_err());
        assert!(store.resolve("zzzz").is_err());
        let other = if k.as_str().starts_with('0') {
            "1111"
        } else {
            "0000"
        };
        assert!(store
            .resolve(other)
            .unwrap_err()
            .to_string()
            .contains("no store entry"));
        assert!(Key::parse("../etc").is_err());
    }

    #[test]
    fn a_link_in_place_of_the_store_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        std::fs::create_dir(&cache).unwrap();
        // Absent: read as empty, and nothing is made.
        let store = Store::at(&cache).unwrap();
        assert!(store.keys().unwrap().is_empty());
        assert!(!cache.join("store").exists());
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, cache.join("store")).unwrap();
        let e = Store::open_in(&cache).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
        let e = Store::at(&cache).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }
}
