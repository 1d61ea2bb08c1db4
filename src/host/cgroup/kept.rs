//! Cgroup files kept open between scrapes and re-read with `pread`, which costs about a
//! quarter of opening, reading and closing them again.
//!
//! - Bounded: every kept descriptor is counted against a [`DescriptorBudget`], a share of
//!   `RLIMIT_NOFILE`. Files that do not fit are opened at each scrape, as before, and the
//!   exporter says so once.
//! - Never stale: a unit's descriptors belong to its directory, which is held open with them
//!   so that its inode number cannot be given to another. Discovery lists the directory at
//!   each scrape, and the inode it lists comes free with the name: when it is not the held
//!   one, the directory was removed and made again under the same name, and the old
//!   descriptors are closed before anything is read. The kernel also fails reads of a removed
//!   cgroup's files (ENODEV); any failed read closes the unit's descriptors and reads that
//!   file by path.
//! - Closed at once: units not read in a scrape lose their descriptors at its end.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// How many descriptors the kept files of the whole process may hold.
#[derive(Debug)]
pub struct DescriptorBudget {
    limit: usize,
    held: AtomicUsize,
    warned: AtomicBool,
}

impl DescriptorBudget {
    pub fn new(limit: usize) -> Arc<DescriptorBudget> {
        Arc::new(DescriptorBudget {
            limit,
            held: AtomicUsize::new(0),
            warned: AtomicBool::new(false),
        })
    }

    /// The process's budget: three quarters of the soft `RLIMIT_NOFILE` as it is when first
    /// asked (raise it first with [`raise_nofile_limit`]); the rest stays free for sockets,
    /// other collectors and the files that do not fit.
    pub fn process() -> Arc<DescriptorBudget> {
        static PROCESS: OnceLock<Arc<DescriptorBudget>> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let soft = nofile_limits().map(|(soft, _)| soft).unwrap_or(1024);
                let soft = usize::try_from(soft).unwrap_or(usize::MAX);
                DescriptorBudget::new(soft / 4 * 3)
            })
            .clone()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Descriptors held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Whether the budget has ever been full.
    pub fn was_full(&self) -> bool {
        self.warned.load(Ordering::Relaxed)
    }

    /// Counts `file` against the budget until the returned guard drops; None (and `file`
    /// closed) when the budget is spent.
    fn keep(self: &Arc<Self>, file: File) -> Option<Held> {
        self.take().then(|| Held {
            file,
            budget: Arc::clone(self),
        })
    }

    fn take(&self) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                (h < self.limit).then_some(h + 1)
            })
            .is_ok();
        if !taken && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                limit = self.limit,
                "cgroup files kept open reached their share of the open-file limit; the files \
                 beyond it are opened at each scrape, which costs more CPU. Raise LimitNOFILE \
                 in the exporter's systemd unit to keep them all open"
            );
        }
        taken
    }

    /// Only a [`Held`] or a unit's files dropping give back, what they took.
    fn give_back(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A file or directory kept open, counted against its budget until dropped.
#[derive(Debug)]
pub struct Held {
    file: File,
    budget: Arc<DescriptorBudget>,
}

impl Held {
    /// Opens a directory to stat it and its children without walking their whole paths;
    /// None when the budget is spent or the directory cannot be opened.
    pub fn open_dir(path: &Path, budget: &Arc<DescriptorBudget>) -> Option<Held> {
        budget.keep(File::open(path).ok()?)
    }

    /// (inode, link count).
    pub fn stamp(&self) -> Option<(u64, u64)> {
        let st = nix::sys::stat::fstat(&self.file).ok()?;
        #[allow(clippy::unnecessary_cast)]
        Some((st.st_ino as u64, st.st_nlink as u64))
    }

    /// (inode, link count) of the entry `name` in this directory, not following links.
    pub fn child_stamp(&self, name: &OsStr) -> Option<(u64, u64)> {
        use nix::fcntl::AtFlags;
        let st = nix::sys::stat::fstatat(&self.file, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        #[allow(clippy::unnecessary_cast)]
        Some((st.st_ino as u64, st.st_nlink as u64))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(1);
    }
}

/// The soft and hard `RLIMIT_NOFILE`.
pub fn nofile_limits() -> io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, Resource};
    getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one, which needs no privilege, and returns
/// (old soft, new soft).
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    use nix::sys::resource::{setrlimit, Resource};
    let (soft, hard) = nofile_limits()?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    }
    Ok((soft, soft.max(hard)))
}

/// What [`KeptFiles::read_kept`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeptRead {
    /// Read through a kept descriptor: this many bytes.
    Read(usize),
    /// Known not to exist in this unit's directory.
    Missing,
    /// Not kept (or no longer valid): open it by its path with [`KeptFiles::open`].
    ByPath,
}

/// The kept files of one unit; dropping it closes them and returns their budget.
#[derive(Debug)]
struct UnitFiles {
    /// The unit's directory, held so that its inode number stays its own.
    dir: Held,
    ino: u64,
    /// Each file by its name's place in [`KeptFiles::names`]: open, or None when it does not
    /// exist in this unit's directory. Eight bytes a file: with a thousand jobs, a boxed name
    /// and a budget handle for each file held about half a megabyte more.
    files: Vec<(u16, Option<File>)>,
    /// Where the next file read is expected in `files`: a scrape reads a unit's files in the
    /// order the last one did, so one comparison finds most.
    next: usize,
    generation: u64,
    /// When it was entered in its scrape: the units are put back in that order after it.
    seq: u32,
}

impl UnitFiles {
    fn descriptors(&self) -> usize {
        1 + self.open_files()
    }

    fn open_files(&self) -> usize {
        self.files.iter().filter(|(_, f)| f.is_some()).count()
    }
}

impl Drop for UnitFiles {
    fn drop(&mut self) {
        // The directory's own descriptor is given back by its `Held`.
        self.dir.budget.give_back(self.open_files());
    }
}

/// Kept files of many units, read one unit at a time: [`KeptFiles::enter`], then
/// [`KeptFiles::read`] for each file, and [`KeptFiles::end_scrape`] after the last unit.
#[derive(Debug)]
pub struct KeptFiles {
    /// In the order the last scrape entered them, so the next unit is found with one
    /// comparison past the last (taking each out of a map and back cost more than reading its
    /// files). None where a unit's descriptors were dropped during this scrape.
    units: Vec<(Box<[u8]>, Option<UnitFiles>)>,
    /// Where each unit is in `units`, by its path as bytes, for those entered out of order.
    index: HashMap<Box<[u8]>, usize, foldhash::fast::RandomState>,
    /// The unit being read: its place in `units`.
    current: Option<usize>,
    /// Where the next unit entered is expected in `units`.
    cursor: usize,
    /// Units entered this scrape so far.
    entered: u32,
    /// Whether `units` is put back in the order of entry and compacted at the scrape's end.
    reorder: bool,
    budget: Arc<DescriptorBudget>,
    /// The names of the files read, once for all units.
    names: Vec<Box<str>>,
    generation: u64,
    /// Where a file that must be opened is named, reused.
    path: PathBuf,
}

fn dir_ino(dir: &Path) -> Option<u64> {
    std::fs::symlink_metadata(dir).ok().map(|m| m.ino())
}

/// Reads the whole file from offset 0 into `buf` in one `pread` where it fits. cgroup files
/// are seq_files, which fill a read as far as the buffer goes, so a short read is the end.
fn pread_all(file: &File, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut len = 0;
    loop {
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if len < buf.len() || n == 0 {
            return Ok(len);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

impl KeptFiles {
    pub fn new(budget: Arc<DescriptorBudget>) -> KeptFiles {
        KeptFiles {
            units: Vec::new(),
            index: HashMap::default(),
            current: None,
            cursor: 0,
            entered: 0,
            reorder: false,
            budget,
            names: Vec::new(),
            generation: 0,
            path: PathBuf::new(),
        }
    }

    /// Starts reading the unit `key`, whose directory is `dir`, listed by discovery with
    /// inode `listed` (when it is not known, `dir` is stat'ed). The unit's descriptors are
    /// closed first if `dir` is gone or is not the directory they were opened in.
    pub fn enter(&mut self, key: &Path, dir: &Path, listed: Option<u64>) {
        if self.is_current(key) {
            return;
        }
        let key = key.as_os_str().as_bytes();
        self.current = None;
        let seq = self.entered;
        self.entered = self.entered.saturating_add(1);
        let place = match self.units.get(self.cursor) {
            Some((k, _)) if &**k == key => Some(self.cursor),
            _ => {
                self.reorder = true;
                self.index.get(key).copied()
            }
        };
        let Some(place) = place else {
            // New: after the others until the scrape ends; the next unit is still expected
            // where the cursor is.
            if let Some(unit) = self.open_unit(dir, seq) {
                self.index.insert(key.into(), self.units.len());
                self.units.push((key.into(), Some(unit)));
                self.current = Some(self.units.len() - 1);
            }
            return;
        };
        self.cursor = place + 1;
        let generation = self.generation;
        if let Some(unit) = &mut self.units[place].1 {
            if listed.or_else(|| dir_ino(dir)) == Some(unit.ino) {
                unit.generation = generation;
                unit.next = 0;
                unit.seq = seq;
                self.current = Some(place);
                return;
            }
        }
        // Stale (dropped here, which closes its files) or dropped earlier: opened afresh.
        self.units[place].1 = None;
        self.units[place].1 = self.open_unit(dir, seq);
        if self.units[place].1.is_some() {
            self.current = Some(place);
        } else {
            self.reorder = true;
        }
    }

    fn open_unit(&self, dir: &Path, seq: u32) -> Option<UnitFiles> {
        let held = Held::open_dir(dir, &self.budget)?;
        let (ino, _) = held.stamp()?;
        Some(UnitFiles {
            dir: held,
            ino,
            files: Vec::new(),
            next: 0,
            generation: self.generation,
            seq,
        })
    }

    /// Whether `key` is the unit being read.
    pub fn is_current(&self, key: &Path) -> bool {
        let key = key.as_os_str().as_bytes();
        self.current
            .and_then(|i| self.units.get(i))
            .is_some_and(|(k, _)| &**k == key)
    }

    /// Drops the current unit's descriptors.
    fn drop_current(&mut self) {
        if let Some(i) = self.current.take() {
            self.units[i].1 = None;
            self.reorder = true;
        }
    }

    /// Reads the current unit's file `name` (at `path`) into `buf` and returns its length;
    /// `None` when the file does not exist.
    pub fn read(
        &mut self,
        name: &str,
        path: &Path,
        buf: &mut Vec<u8>,
    ) -> io::Result<Option<usize>> {
        self.read_with(name, buf, |p| p.push(path))
    }

    /// [`KeptFiles::read`], with the path written by `path_of` only when the file must be
    /// opened: most reads of a scrape go through a kept descriptor, and building 10,000 paths
    /// a scrape for them cost more than their parsing.
    pub fn read_with(
        &mut self,
        name: &str,
        buf: &mut Vec<u8>,
        path_of: impl FnOnce(&mut PathBuf),
    ) -> io::Result<Option<usize>> {
        match self.read_kept(name, buf) {
            KeptRead::Read(n) => Ok(Some(n)),
            KeptRead::Missing => Ok(None),
            KeptRead::ByPath => {
                let mut path = std::mem::take(&mut self.path);
                path.clear();
                path_of(&mut path);
                let read = self.open(name, &path, buf);
                self.path = path;
                read
            }
        }
    }

    /// A read through the current unit's kept descriptor of `name`, if it has one.
    fn read_kept(&mut self, name: &str, buf: &mut Vec<u8>) -> KeptRead {
        let Some(unit) = self
            .current
            .and_then(|i| self.units.get_mut(i))
            .and_then(|(_, u)| u.as_mut())
        else {
            return KeptRead::ByPath;
        };
        let names = &self.names;
        let is = |id: u16| names.get(usize::from(id)).is_some_and(|n| &**n == name);
        let found = match unit.files.get(unit.next) {
            Some((id, _)) if is(*id) => Some(unit.next),
            _ => unit.files.iter().position(|(id, _)| is(*id)),
        };
        let Some(pos) = found else {
            return KeptRead::ByPath;
        };
        unit.next = pos + 1;
        match &unit.files[pos].1 {
            None => KeptRead::Missing,
            Some(file) => match pread_all(file, buf) {
                Ok(n) if n > 0 => KeptRead::Read(n),
                // An empty seq_file read once answers empty for good: open it again.
                Ok(_) => {
                    unit.files.swap_remove(pos);
                    self.budget.give_back(1);
                    KeptRead::ByPath
                }
                // Removed under us (ENODEV): this unit's descriptors are all stale.
                Err(_) => {
                    self.drop_current();
                    KeptRead::ByPath
                }
            },
        }
    }

    /// Opens the current unit's file `name` at `path` (after [`KeptFiles::read_kept`] said
    /// so), reads it into `buf` and keeps it open when the budget allows.
    fn open(&mut self, name: &str, path: &Path, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
        let Some(unit) = self
            .current
            .and_then(|i| self.units.get_mut(i))
            .and_then(|(_, u)| u.as_mut())
        else {
            return read_by_path(path, buf);
        };
        // Past 65,535 names (never: cgroup files are a fixed few) a file is read by its path.
        let id = match self.names.iter().position(|n| &**n == name) {
            Some(id) => u16::try_from(id).ok(),
            None => u16::try_from(self.names.len()).ok().inspect(|_| {
                self.names.push(name.into());
            }),
        };
        match File::open(path) {
            Ok(file) => {
                let n = pread_all(&file, buf)?;
                if let Some(id) = id.filter(|_| self.budget.take()) {
                    unit.files.push((id, Some(file)));
                    unit.next = unit.files.len();
                }
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(id) = id {
                    unit.files.push((id, None));
                    unit.next = unit.files.len();
                }
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Forgets the current unit's descriptors: it vanished while it was read.
    pub fn forget_current(&mut self) {
        self.drop_current();
    }

    /// Closes the files of every unit not entered since the last call.
    pub fn end_scrape(&mut self) {
        self.current = None;
        let generation = self.generation;
        let before = self.units.len();
        self.units
            .retain(|(_, u)| u.as_ref().is_some_and(|u| u.generation == generation));
        if self.reorder || self.units.len() != before {
            self.units
                .sort_by_key(|(_, u)| u.as_ref().map_or(0, |u| u.seq));
            self.rebuild_index();
        }
        self.reorder = false;
        self.cursor = 0;
        self.entered = 0;
        self.generation += 1;
    }

    /// Closes the files of the units `keep` says are gone.
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.current = None;
        let before = self.units.len();
        self.units
            .retain(|(k, _)| keep(Path::new(OsStr::from_bytes(k))));
        if self.units.len() != before {
            self.rebuild_index();
        }
    }

    fn rebuild_index(&mut self) {
        self.index.clear();
        for (i, (key, _)) in self.units.iter().enumerate() {
            self.index.insert(key.clone(), i);
        }
    }

    /// Descriptors this store holds.
    pub fn descriptors(&self) -> usize {
        self.units
            .iter()
            .filter_map(|(_, u)| u.as_ref())
            .map(UnitFiles::descriptors)
            .sum()
    }
}

fn read_by_path(path: &Path, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
    match File::open(path) {
        Ok(file) => pread_all(&file, buf).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn read(kept: &mut KeptFiles, dir: &Path, name: &str, buf: &mut Vec<u8>) -> Option<String> {
        let n = kept.read(name, &dir.join(name), buf).unwrap()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    #[test]
    fn rereads_kept_files_and_closes_them_when_the_unit_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("job_1");
        fs::create_dir(&job).unwrap();
        fs::write(job.join("memory.current"), "10\n").unwrap();
        let budget = DescriptorBudget::new(100);
        let mut kept = KeptFiles::new(budget.clone());
        let mut buf = Vec::new();
        kept.enter(Path::new("job_1"), &job, None);
        assert_eq!(
            read(&mut kept, &job, "memory.current", &mut buf).as_deref(),
            Some("10\n")
        );
        assert_eq!(read(&mut kept, &job, "memory.peak", &mut buf), None);
        kept.end_scrape();
        // The file and its directory.
        assert_eq!(budget.held(), 2);
        // Written in place, as the kernel's values change: the kept descriptor sees it.
        fs::write(job.join("memory.current"), "2000\n").unwrap();
        kept.enter(Path::new("job_1"), &job, None);
        assert_eq!(
            read(&mut kept, &job, "memory.current", &mut buf).as_deref(),
            Some("2000\n")
        );
        kept.end_scrape();
        // A scrape without the unit closes its files.
        kept.end_scrape();
        assert_eq!((budget.held(), kept.descriptors()), (0, 0));
    }

    #[test]
    fn a_recreated_directory_is_never_read_through_old_descriptors() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("job_1");
        fs::create_dir(&job).unwrap();
        fs::write(job.join("cpu.stat"), "user_usec 1\n").unwrap();
        let budget = DescriptorBudget::new(100);
        let mut kept = KeptFiles::new(budget.clone());
        let mut buf = Vec::new();
        kept.enter(Path::new("job_1"), &job, None);
        read(&mut kept, &job, "cpu.stat", &mut buf);
        kept.end_scrape();
        // Removed and made again under the same name: the old descriptor still reads "1",
        // whether discovery lists the new inode or the directory is stat'ed.
        for listed in [true, false] {
            fs::remove_dir_all(&job).unwrap();
            fs::create_dir(&job).unwrap();
            let text = format!("user_usec {}\n", 2 + u8::from(listed));
            fs::write(job.join("cpu.stat"), &text).unwrap();
            let ino = listed.then(|| fs::metadata(&job).unwrap().ino());
            kept.enter(Path::new("job_1"), &job, ino);
            assert_eq!(read(&mut kept, &job, "cpu.stat", &mut buf), Some(text));
            kept.end_scrape();
            assert_eq!(budget.held(), 2);
        }
        // Gone: nothing read, nothing held.
        fs::remove_dir_all(&job).unwrap();
        kept.enter(Path::new("job_1"), &job, None);
        assert_eq!(read(&mut kept, &job, "cpu.stat", &mut buf), None);
        kept.end_scrape();
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn files_beyond_the_budget_are_read_by_path() {
        let tmp = tempfile::tempdir().unwrap();
        let budget = DescriptorBudget::new(3);
        let mut kept = KeptFiles::new(budget.clone());
        let mut buf = Vec::new();
        for scrape in 0..2 {
            for j in 0..4 {
                let job = tmp.path().join(format!("job_{j}"));
                fs::create_dir_all(&job).unwrap();
                fs::write(job.join("memory.current"), format!("{}\n", j * 10 + scrape)).unwrap();
                kept.enter(Path::new(&format!("job_{j}")), &job, None);
                let want = format!("{}\n", j * 10 + scrape);
                assert_eq!(
                    read(&mut kept, &job, "memory.current", &mut buf),
                    Some(want)
                );
            }
            kept.end_scrape();
            // The first job's directory and file, and the second's directory: the rest by path.
            assert_eq!(budget.held(), 3);
            assert!(budget.was_full());
        }
    }

    #[test]
    fn files_read_in_another_order_or_emptied_keep_their_count() {
        let tmp = tempfile::tempdir().unwrap();
        let job = tmp.path().join("job_1");
        fs::create_dir(&job).unwrap();
        for name in ["a.stat", "b.stat", "c.stat"] {
            fs::write(job.join(name), format!("{name}\n")).unwrap();
        }
        let budget = DescriptorBudget::new(100);
        let mut kept = KeptFiles::new(budget.clone());
        let mut buf = Vec::new();
        for order in [
            ["a.stat", "b.stat", "c.stat"],
            ["c.stat", "a.stat", "b.stat"],
        ] {
            kept.enter(Path::new("job_1"), &job, None);
            for name in order {
                let want = format!("{name}\n");
                assert_eq!(read(&mut kept, &job, name, &mut buf), Some(want));
            }
            kept.end_scrape();
            assert_eq!((budget.held(), kept.descriptors()), (4, 4));
        }
        // A file read empty through its descriptor is opened again, counted once.
        fs::write(job.join("b.stat"), "").unwrap();
        kept.enter(Path::new("job_1"), &job, None);
        assert_eq!(
            read(&mut kept, &job, "b.stat", &mut buf),
            Some(String::new())
        );
        kept.end_scrape();
        assert_eq!((budget.held(), kept.descriptors()), (4, 4));
        kept.end_scrape();
        assert_eq!(budget.held(), 0);
    }

    /// Units entered in another order from scrape to scrape, new ones among them, one gone
    /// and one made again: each read gives its own unit's file, and the count stays exact.
    #[test]
    fn units_entered_in_another_order_come_and_go_each_read_as_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = |j: &str| tmp.path().join(j);
        for j in ["a", "b", "c", "d"] {
            fs::create_dir(dir(j)).unwrap();
            fs::write(dir(j).join("memory.current"), format!("{j}\n")).unwrap();
        }
        let budget = DescriptorBudget::new(100);
        let mut kept = KeptFiles::new(budget.clone());
        let mut buf = Vec::new();
        for (round, order) in [
            &["a", "b", "c"][..],
            &["c", "a", "d"],
            &["c", "a", "d"],
            &["d", "b", "c", "a"],
        ]
        .into_iter()
        .enumerate()
        {
            if round == 2 {
                // Made again under the same name: its old descriptors must not be read.
                fs::remove_dir_all(dir("a")).unwrap();
                fs::create_dir(dir("a")).unwrap();
                fs::write(dir("a").join("memory.current"), "a again\n").unwrap();
            }
            for j in order {
                kept.enter(Path::new(j), &dir(j), None);
                let want = if *j == "a" && round >= 2 {
                    "a again\n".to_owned()
                } else {
                    format!("{j}\n")
                };
                let got = read(&mut kept, &dir(j), "memory.current", &mut buf);
                assert_eq!(got, Some(want), "round {round}, unit {j}");
            }
            kept.end_scrape();
            // A directory and a file for each unit of the round, none for the others.
            assert_eq!(
                (budget.held(), kept.descriptors()),
                (2 * order.len(), 2 * order.len()),
                "round {round}"
            );
        }
    }

    #[test]
    fn large_files_are_read_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let text = "nr_something 12345\n".repeat(1000);
        fs::write(tmp.path().join("memory.stat"), &text).unwrap();
        let mut kept = KeptFiles::new(DescriptorBudget::new(10));
        let mut buf = Vec::new();
        for _ in 0..2 {
            kept.enter(Path::new("u"), tmp.path(), None);
            assert_eq!(
                read(&mut kept, tmp.path(), "memory.stat", &mut buf),
                Some(text.clone())
            );
            kept.end_scrape();
        }
    }
}
