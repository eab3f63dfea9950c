//! `--only-funcs`: NCCL's ONLY_FUNCS filter, checked against the grammar NCCL's
//! `src/device/generate.py` gives it before it can reach make.
//!
//! NCCL's `src/device/Makefile` runs `generate.py $@ "$(ONLY_FUNCS)"` in a shell recipe,
//! so anything beyond that grammar — a quote, `$`, a backtick — would run on the build
//! host. The grammar: function strings of the forms `SendRecv`, `<coll> <algo> <proto>`
//! and `<coll> <redop> <type> <algo> <proto>`, matched case-insensitively as a regex in
//! which `*` is a glob within a word, `(x)` groups and `a|b` is a union. So a valid
//! expression holds only names, `*`, parentheses, `|` and spaces, and every name either
//! is one NCCL knows or is a glob fragment next to a `*`.

/// The names `generate.py` enumerates (its `all_colls`, `all_redops`, `all_tys`,
/// `all_protos`, `all_algos`), as of NCCL 2.30.
const NAMES: &[&str] = &[
    "Broadcast",
    "Reduce",
    "AllGather",
    "AllGatherV",
    "ReduceScatter",
    "AllReduce",
    "SendRecv",
    "Sum",
    "Prod",
    "MinMax",
    "PreMulSum",
    "SumPostDiv",
    "i8",
    "u8",
    "i32",
    "u32",
    "i64",
    "u64",
    "f16",
    "f32",
    "f64",
    "bf16",
    "f8e4m3",
    "f8e5m2",
    "LL",
    "LL128",
    "SIMPLE",
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OnlyFuncsError {
    #[error("--only-funcs is empty: give an NCCL ONLY_FUNCS expression, e.g. \"AllReduce Sum f32 RING SIMPLE\"")]
    Empty,
    #[error("--only-funcs may hold only NCCL names, `*`, `(`, `)`, `|` and spaces, but it has {0:?}: it is passed to NCCL's generate.py through a shell, so nothing else is accepted")]
    Character(char),
    #[error("--only-funcs has unbalanced parentheses")]
    Parentheses,
    #[error("--only-funcs has an empty alternative (`||`, `(|` or a `|` at an end)")]
    EmptyAlternative,
    #[error("--only-funcs names '{0}', which is not a collective, reduction, type, algorithm or protocol NCCL knows ({known}); add `*` to make it a glob", known = NAMES.join(" "))]
    UnknownName(String),
}

/// Checks an ONLY_FUNCS expression; the value is then safe inside NCCL's double-quoted
/// shell recipe and means what NCCL's generator will read.
pub fn check(expr: &str) -> Result<(), OnlyFuncsError> {
    if expr.trim().is_empty() {
        return Err(OnlyFuncsError::Empty);
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_*()| ".contains(c);
    if let Some(c) = expr.chars().find(|&c| !allowed(c)) {
        return Err(OnlyFuncsError::Character(c));
    }
    let mut depth = 0i32;
    for c in expr.chars() {
        depth += match c {
            '(' => 1,
            ')' => -1,
            _ => 0,
        };
        if depth < 0 {
            return Err(OnlyFuncsError::Parentheses);
        }
    }
    if depth != 0 {
        return Err(OnlyFuncsError::Parentheses);
    }
    let compact: String = expr.chars().filter(|c| *c != ' ').collect();
    if compact.starts_with('|')
        || compact.ends_with('|')
        || ["||", "(|", "|)", "()"].iter().any(|p| compact.contains(p))
    {
        return Err(OnlyFuncsError::EmptyAlternative);
    }
    // Words are runs of name characters; one touching a `*` is a glob fragment.
    let bytes = expr.as_bytes();
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !is_name(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_name(bytes[i]) {
            i += 1;
        }
        let word = &expr[start..i];
        let globbed = (start > 0 && bytes[start - 1] == b'*') || bytes.get(i) == Some(&b'*');
        if !globbed && !NAMES.iter().any(|n| n.eq_ignore_ascii_case(word)) {
            return Err(OnlyFuncsError::UnknownName(word.chars().take(40).collect()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccls_own_examples_pass() {
        for ok in [
            "SendRecv",
            "AllGather * *|Broadcast * *|SendRecv",
            "AllReduce Sum f32 * *",
            "AllReduce MinMax i32 NVLS *",
            "AllReduce Sum f32 RING LL128",
            "(AllReduce|ReduceScatter) Sum (f32|bf16) RING SIMPLE",
            "allreduce sum f8* ring ll",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    /// Shell and make payloads never pass: each is refused for its first bad character.
    #[test]
    fn payloads_are_refused() {
        for (bad, c) in [
            ("x\"; touch /tmp/p; \"", '"'),
            ("$(shell touch /tmp/p)", '$'),
            ("AllReduce `id`", '`'),
            ("AllReduce Sum; rm -rf ~", ';'),
            ("SendRecv\nall:", '\n'),
            ("AllReduce\\", '\\'),
            ("AllReduce 'x'", '\''),
        ] {
            assert_eq!(check(bad), Err(OnlyFuncsError::Character(c)), "{bad:?}");
        }
        assert_eq!(check("  "), Err(OnlyFuncsError::Empty));
        assert_eq!(check("(AllReduce"), Err(OnlyFuncsError::Parentheses));
        assert_eq!(check(")AllReduce("), Err(OnlyFuncsError::Parentheses));
        assert_eq!(
            check("AllReduce||SendRecv"),
            Err(OnlyFuncsError::EmptyAlternative)
        );
        assert_eq!(check("|SendRecv"), Err(OnlyFuncsError::EmptyAlternative));
        assert_eq!(
            check("AllReduce Summ f32"),
            Err(OnlyFuncsError::UnknownName("Summ".into()))
        );
    }
}
