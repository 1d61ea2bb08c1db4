//! The process's own heap: glibc keeps what a program frees for its next allocations, in an
//! arena per thread that met contention, and hands little back unless asked.

/// Hands the heap's free pages back to the kernel. Each thread that allocates may get its own
/// glibc arena, and each keeps its freed pages until asked: when the next phase of the work
/// allocates on other threads, their peaks add up (the stats-server's first update of
/// 3,000,000 jobs and its API: 153 MiB, 113 MiB with this after each phase and each time the
/// API's cache starts over). Walks the free lists; a few milliseconds on a 100 MiB heap.
pub fn hand_back_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory; it is safe from any thread.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}
