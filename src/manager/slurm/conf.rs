//! What the stats-server reads of `slurm.conf`: the cluster's name, which sacct and the
//! accounting database know it by, so that a site's ids agree without being told twice.

use std::path::{Path, PathBuf};

/// Where Slurm's commands read their config: `SLURM_CONF` (the entry's `slurm-env` first,
/// then this process's environment), else Debian's and Slurm's default places.
pub fn slurm_conf_path(entry_env: &[(String, String)]) -> PathBuf {
    entry_env
        .iter()
        .find(|(k, _)| k == "SLURM_CONF")
        .map(|(_, v)| PathBuf::from(v))
        .or_else(|| std::env::var_os("SLURM_CONF").map(PathBuf::from))
        .unwrap_or_else(|| {
            ["/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
                .unwrap_or_else(|| PathBuf::from("/etc/slurm/slurm.conf"))
        })
}

/// The `ClusterName` of a slurm.conf, lowercased as slurmdbd stores it; None when the file
/// does not set one.
pub fn cluster_name(text: &str) -> Option<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case("ClusterName"))
        .map(|(_, v)| v.trim().trim_matches('"').to_ascii_lowercase())
        .rfind(|v| !v.is_empty())
}

/// The cluster name of the slurm.conf at `path`, with why there is none.
pub fn cluster_name_at(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    cluster_name(&text).ok_or_else(|| format!("{} sets no ClusterName", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_read_lowercased_past_comments_and_spaces() {
        let conf = "# ClusterName=old\nSlurmctldHost=localhost\n clustername = JeanZay # main\n";
        assert_eq!(cluster_name(conf).as_deref(), Some("jeanzay"));
        assert_eq!(cluster_name("ClusterName=\"lab\"").as_deref(), Some("lab"));
    }

    #[test]
    fn a_file_without_a_name_says_so() {
        assert_eq!(cluster_name("#ClusterName=lab\nNodeName=a CPUs=2"), None);
        assert_eq!(cluster_name("ClusterName="), None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slurm.conf");
        std::fs::write(&path, "SlurmUser=slurm\n").unwrap();
        assert!(cluster_name_at(&path)
            .unwrap_err()
            .contains("sets no ClusterName"));
        assert!(cluster_name_at(&dir.path().join("absent"))
            .unwrap_err()
            .contains("absent"));
    }

    #[test]
    fn the_entry_s_slurm_conf_wins() {
        let env = [("SLURM_CONF".to_owned(), "/etc/slurm/jz.conf".to_owned())];
        assert_eq!(slurm_conf_path(&env), PathBuf::from("/etc/slurm/jz.conf"));
    }
}
