//! A [`CgroupReader`] on a thread with a descriptor table of its own.
//!
//! A thousand jobs are some nine thousand `pread`s a scrape. While a process has more than
//! one thread, the kernel takes and drops a reference on the file at each of them, because
//! another thread could close it meanwhile; a table that only one thread uses skips that. The
//! reader's thread makes its own table at start (`close_range` with `CLOSE_RANGE_UNSHARE`,
//! closing the copies of the process's sockets and files at once), builds its reader there and
//! opens every kept file in it, and uses no descriptor from elsewhere. Its kept files are then
//! not in `/proc/<pid>/fd` (they are in `/proc/<pid>/task/<tid>/fd`), as in CEEMS, which
//! keeps none.

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;

use super::CgroupReader;

type Job = Box<dyn FnOnce(&mut CgroupReader) + Send>;

/// Runs work on a [`CgroupReader`] that lives on its own thread; the thread ends when this is
/// dropped.
pub struct ReaderThread {
    jobs: mpsc::Sender<Job>,
}

/// The reader's thread could not be started, or is gone.
#[derive(Debug, thiserror::Error)]
pub enum ReaderThreadError {
    #[error("cannot start the cgroup reader's thread: {0}")]
    Spawn(std::io::Error),
    #[error("the cgroup reader's thread stopped while reading (see the log for its panic)")]
    Gone,
}

impl ReaderThread {
    /// Starts the thread, which builds its reader with `make`: after a panic in a job it
    /// builds a new one, so a bad scrape does not leave half-entered units behind.
    pub fn spawn(
        make: impl Fn() -> CgroupReader + Send + 'static,
    ) -> Result<ReaderThread, ReaderThreadError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ceems-cgroups".to_owned())
            .spawn(move || {
                let private = own_descriptor_table();
                tracing::debug!(private, "cgroup reader thread started");
                let mut reader = make();
                for job in queue {
                    let ran = std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut reader)));
                    if ran.is_err() {
                        reader = make();
                    }
                }
            })
            .map_err(ReaderThreadError::Spawn)?;
        Ok(ReaderThread { jobs })
    }

    /// Runs `work` on the reader's thread and waits for its result. Whatever `work` needs is
    /// moved in and comes back in its result, so that no borrowed path crosses threads.
    pub fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut CgroupReader) -> T + Send + 'static,
    ) -> Result<T, ReaderThreadError> {
        let (done, result) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |reader| {
            let _ = done.send(work(reader));
        });
        self.jobs.send(job).map_err(|_| ReaderThreadError::Gone)?;
        result.recv().map_err(|_| ReaderThreadError::Gone)
    }
}

/// Gives the calling thread a descriptor table of its own with only 0, 1 and 2 open in it;
/// false where that is refused (Linux before 5.9, or a seccomp filter answering EPERM), and
/// the thread then shares the process's table as any other thread does.
fn own_descriptor_table() -> bool {
    use nix::libc;
    // SAFETY: close_range takes plain integers and touches only this thread's table, which
    // from now on holds no descriptor another part of the process relies on.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup::{CgroupVersion, HostMemory, ReadOptions};
    use std::path::{Path, PathBuf};

    /// Where the descriptors of a table point that lie under `under`.
    fn open_under(fd_dir: &str, under: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(fd_dir)
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.starts_with(under))
            .collect()
    }

    /// The reader's kept files are in its thread's own table, not the process's; the files
    /// the process opens are not in the reader's.
    #[test]
    fn kept_files_live_in_the_reader_threads_own_table() {
        let tmp = tempfile::tempdir().unwrap();
        let unit = tmp.path().join("job_1");
        std::fs::create_dir_all(&unit).unwrap();
        std::fs::write(
            unit.join("cpu.stat"),
            "usage_usec 10\nuser_usec 7\nsystem_usec 3\n",
        )
        .unwrap();
        std::fs::write(unit.join("memory.current"), "4096\n").unwrap();
        let root = tmp.path().to_owned();
        let thread = ReaderThread::spawn(move || {
            CgroupReader::new(&root, CgroupVersion::V2, HostMemory::default())
        })
        .unwrap();
        let processes_file = tmp.path().join("opened-by-the-process");
        std::fs::write(&processes_file, "").unwrap();
        let _held = std::fs::File::open(&processes_file).unwrap();
        let under = tmp.path().to_owned();
        let (cpu_user, kept, in_reader) = thread
            .run(move |reader| {
                let rel = PathBuf::from("job_1");
                let dir = under.join(&rel);
                reader.enter_unit(&rel, &dir, None);
                let stats = reader.read_unit(&rel, ReadOptions::default(), &mut Vec::new());
                let tid = nix::unistd::gettid();
                let in_reader = open_under(&format!("/proc/self/task/{tid}/fd"), &under);
                let user = stats.map(|s| s.cpu_user_seconds).ok();
                (user, reader.kept_descriptors(), in_reader)
            })
            .unwrap();
        assert_eq!(cpu_user, Some(7e-6));
        assert!(kept > 0, "nothing kept");
        assert!(
            in_reader.iter().any(|p| p.ends_with("cpu.stat")),
            "{in_reader:?}"
        );
        assert!(!in_reader.contains(&processes_file), "{in_reader:?}");
        let in_process = open_under("/proc/self/fd", tmp.path());
        assert_eq!(in_process, [processes_file]);
    }

    /// A job that panics fails its caller only; the next job gets a fresh reader, without the
    /// files the reader held when it panicked.
    #[test]
    fn a_panicking_job_fails_only_its_caller() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("job_1")).unwrap();
        std::fs::write(tmp.path().join("job_1/memory.current"), "4096\n").unwrap();
        let root = tmp.path().to_owned();
        let thread = ReaderThread::spawn(move || {
            CgroupReader::new(&root, CgroupVersion::V2, HostMemory::default())
        })
        .unwrap();
        let dir = tmp.path().join("job_1");
        // Checked outside the job: a failed assertion inside it would look like the panic below.
        let kept = thread
            .run(move |reader| {
                let rel = PathBuf::from("job_1");
                reader.enter_unit(&rel, &dir, None);
                let _ = reader.read_unit(&rel, ReadOptions::default(), &mut Vec::new());
                reader.kept_descriptors()
            })
            .unwrap();
        assert!(kept > 0, "nothing kept before the panic");
        let failed = thread.run(|_| -> usize { panic!("a bad scrape") });
        assert!(matches!(failed, Err(ReaderThreadError::Gone)));
        assert_eq!(thread.run(|r| r.kept_descriptors()).unwrap(), 0);
    }
}
