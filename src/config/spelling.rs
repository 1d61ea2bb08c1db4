//! Forgiving and helpful about how a key or flag is spelt: a list's key or flag in either
//! number (`backend` for `backends`, `--lb.backends` for `--lb.backend`), and the nearest
//! known key named when one is unknown.

use std::collections::BTreeSet;

use toml::Table;

use super::{lookup, remove_path, set_path, Kind, Opt};

/// `name` in the other grammatical number: `backends` ↔ `backend`, by its last word.
pub(super) fn other_number(name: &str) -> String {
    match name.strip_suffix('s') {
        Some(one) => one.to_owned(),
        None => format!("{name}s"),
    }
}

/// Adds to each list option the flag of its other number as an alias, unless another option
/// already has it.
pub(super) fn add_number_aliases(opts: &mut [Opt]) {
    let taken: BTreeSet<String> = opts
        .iter()
        .flat_map(|o| std::iter::once(o.flag.clone()).chain(o.aliases.iter().cloned()))
        .chain(opts.iter().flat_map(|o| o.renamed_from.iter().cloned()))
        .collect();
    for opt in opts.iter_mut().filter(|o| o.kind == Kind::List) {
        let other = other_number(&opt.flag);
        if !taken.contains(&other) {
            opt.aliases.push(other);
        }
    }
}

/// Moves a file's list values written under the other number (`backend = [...]` for
/// `backends`) to the option's key, unless the file also has that key.
pub(super) fn accept_other_numbers(table: &mut Table, opts: &[Opt]) {
    for opt in opts.iter().filter(|o| o.kind == Kind::List) {
        let other = match opt.key.rsplit_once('.') {
            Some((table, last)) => format!("{table}.{}", other_number(last)),
            None => other_number(&opt.key),
        };
        if opts.iter().any(|o| o.key == other) || lookup(table, &opt.key).is_some() {
            continue;
        }
        if let Some(v) = remove_path(table, &other) {
            set_path(table, &opt.key, v);
        }
    }
}

/// The known key nearest to an unknown `key`, when one is near enough to be a slip.
pub(super) fn nearest_key<'a>(key: &str, opts: &'a [Opt]) -> Option<&'a str> {
    opts.iter()
        .filter(|o| !o.hidden)
        .map(|o| (strsim::levenshtein(key, &o.key), o.key.as_str()))
        .filter(|(d, k)| *d <= 3.max(k.len() / 5))
        .min()
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(flag: &str) -> Opt {
        Opt::new(flag, Kind::List, "a list")
    }

    #[test]
    fn a_list_takes_its_other_number_as_flag_and_key() {
        let mut opts = vec![
            list("lb.backend").key("lb.backends"),
            list("web.admin-users"),
            // Both numbers taken: no alias crosses over.
            list("x.item"),
            list("x.items"),
        ];
        add_number_aliases(&mut opts);
        assert_eq!(opts[0].aliases, ["lb.backends"]);
        assert_eq!(opts[1].aliases, ["web.admin-user"]);
        assert!(opts[2].aliases.is_empty() && opts[3].aliases.is_empty());
        let mut file: Table = toml::from_str("[lb]\nbackend = [\"a=http://x\"]\n").unwrap();
        accept_other_numbers(&mut file, &opts);
        assert_eq!(
            lookup(&file, "lb.backends")
                .and_then(|v| v.as_array())
                .map(Vec::len),
            Some(1)
        );
        assert!(lookup(&file, "lb.backend").is_none());
    }

    #[test]
    fn an_unknown_key_names_the_nearest_known_one() {
        let opts = vec![
            Opt::new("prometheus.url", Kind::Str, "u"),
            Opt::new("storage.update-interval", Kind::Duration, "i"),
        ];
        assert_eq!(nearest_key("prometheus.ulr", &opts), Some("prometheus.url"));
        assert_eq!(
            nearest_key("storage.update_interval", &opts),
            Some("storage.update-interval")
        );
        assert_eq!(nearest_key("web.listen", &opts), None);
    }
}
