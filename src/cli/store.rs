//! `fdl store list|remove|gc`: the machine-wide build store ([`crate::store`]).

use super::common::print_json;
use crate::context::Context;
use crate::lock::Wait;
use crate::store::{Key, Listed, Store};
use crate::text::clean;
use anyhow::{bail, Result};
use clap::Subcommand;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// List the entries: key, size, key inputs, and the project builds that use each
    #[command(after_help = "Example:\n  fdl store list --json")]
    List {
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Remove an entry (a project that uses it keeps its build; its next build of that
    /// key compiles again)
    #[command(after_help = "Example:\n  fdl store remove 3f9a1c --yes")]
    Remove {
        /// The entry's key, or a prefix of it that names one entry
        key: String,
        /// Fail instead of waiting when a build holds the entry
        #[arg(long)]
        no_wait: bool,
        /// Do not ask for confirmation when project builds use the entry
        #[arg(long)]
        yes: bool,
    },
    /// Remove every entry no project build uses
    #[command(after_help = "Example:\n  fdl store gc --yes")]
    Gc {
        /// Do not ask for confirmation
        #[arg(long)]
        yes: bool,
    },
}

impl StoreCommand {
    pub fn wants_json(&self) -> bool {
        matches!(self, StoreCommand::List { json: true })
    }
}

pub fn run(ctx: &Context, cmd: StoreCommand) -> Result<()> {
    let cache = ctx.cache()?;
    match cmd {
        StoreCommand::List { json } => list(&Store::at(&cache)?, json),
        StoreCommand::Remove { key, no_wait, yes } => {
            let store = Store::at(&cache)?;
            let key = store.resolve(&key)?;
            let wait = if no_wait { Wait::No } else { Wait::Yes };
            let lock = store.lock(&key, wait, &|msg| crate::eprintln_safe!("{msg}"))?;
            // Asked as `store gc` and `nccl remove` ask: an entry project builds use is
            // removed only after --yes or a prompt (they keep their builds either way).
            let users = store.prune_users(&lock, &key)?;
            if !users.is_empty() && !yes {
                for u in &users {
                    crate::eprintln_safe!("  used by  {}", clean(&u.path().display().to_string()));
                }
                let question = format!(
                    "Remove store entry {}, which {} project build{} use{}? They keep their builds; their next build of this plan compiles again",
                    key.short(),
                    users.len(),
                    if users.len() == 1 { "" } else { "s" },
                    if users.len() == 1 { "s" } else { "" }
                );
                if !super::common::confirm(&question)? {
                    crate::eprintln_safe!("Nothing was removed.");
                    return Ok(());
                }
            }
            store.remove(&lock, &key)?;
            outln!("Removed store entry {key}");
            Ok(())
        }
        StoreCommand::Gc { yes } => gc(&Store::at(&cache)?, yes),
    }
}

fn list(store: &Store, json_out: bool) -> Result<()> {
    let entries = store.list(true)?;
    if json_out {
        print_json(&json!({ "store": store.dir, "entries": entries }));
        return Ok(());
    }
    if entries.is_empty() {
        outln!(
            "The build store ({}) is empty.",
            clean(&store.dir.display().to_string())
        );
        return Ok(());
    }
    outln!("Build store: {}", clean(&store.dir.display().to_string()));
    for e in &entries {
        outln!();
        outln!("{}  {}", e.key, size(e.size_bytes));
        match &e.record {
            Some(r) => {
                outln!(
                    "  made     {} for {}",
                    r.created_at,
                    clean(&r.made_for.display().to_string())
                );
                for (k, v) in &r.inputs.0 {
                    // Multi-line inputs (the make variables) on one line.
                    outln!(
                        "  {:<22} {}",
                        clean(k),
                        clean(&v.trim_end().replace('\n', "; "))
                    );
                }
            }
            None => outln!(
                "  unreadable: {}",
                clean(e.why.as_deref().unwrap_or("no record"))
            ),
        }
        if e.users.is_empty() {
            outln!("  used by  no project (`fdl store gc` removes it)");
        }
        for u in &e.users {
            outln!("  used by  {}", clean(&u.path().display().to_string()));
        }
    }
    Ok(())
}

fn size(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn gc(store: &Store, yes: bool) -> Result<()> {
    // One gc at a time: a second one waits for the first and then lists what is left,
    // so an entry it finds locked is a running build's, never the other gc's.
    let _one_gc = store.lock_gc(&|holder| {
        crate::eprintln_safe!("{holder}");
    })?;
    let entries = store.list(true)?;
    // Whose store this is: a user with several caches (XDG_CACHE_HOME) knows which.
    let dir = clean(&store.dir.display().to_string());
    if entries.is_empty() {
        outln!("The build store ({dir}) is empty: nothing to remove.");
        return Ok(());
    }
    let unused: Vec<Listed> = entries.into_iter().filter(|e| e.users.is_empty()).collect();
    if unused.is_empty() {
        outln!(
            "Every entry of the build store ({dir}) is used by a project build: nothing to remove."
        );
        return Ok(());
    }
    let total: u64 = unused.iter().map(|e| e.size_bytes).sum();
    let keys: Vec<&Key> = unused.iter().map(|e| &e.key).collect();
    if !yes {
        for k in &keys {
            crate::eprintln_safe!("  {k}");
        }
        if !super::common::confirm(&format!(
            "Remove these {} store entries no project uses ({})?",
            keys.len(),
            size(total)
        ))? {
            crate::eprintln_safe!("Nothing was removed.");
            return Ok(());
        }
    }
    let mut removed = 0;
    let mut busy = Vec::new();
    for key in keys {
        // An entry being made or installed right now is left for the next gc.
        let Ok(lock) = store.lock(key, Wait::No, &|_| {}) else {
            busy.push(key.clone());
            continue;
        };
        // Checked again under the lock: a build may have started using it since.
        if !store.prune_users(&lock, key)?.is_empty() {
            continue;
        }
        store.remove(&lock, key)?;
        outln!("Removed store entry {key}");
        removed += 1;
    }
    outln!(
        "Removed {removed} unused entr{} of the build store ({dir}).",
        if removed == 1 { "y" } else { "ies" }
    );
    if !busy.is_empty() {
        bail!(
            "{} entr{} in use by a running build and kept: {}. Run `fdl store gc` again when it has finished",
            busy.len(),
            if busy.len() == 1 { "y is" } else { "ies are" },
            busy.iter().map(|k| k.short().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}
