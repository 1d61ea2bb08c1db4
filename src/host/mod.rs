//! The host: what both wings (the exporter and the stats-server) read from the node, and
//! nothing that knows a resource manager or a metric. Cgroup trees (v1 and v2), /proc, a unit's
//! processes, the GPU device record, the command runner, and the error every parser here returns.

pub mod cgroup;
pub mod command;
pub mod ebpf;
pub mod gpu;
pub mod heap;
pub mod listeners;
pub mod perf;
pub mod processes;
pub mod procfs;
pub mod rdma;

use std::fmt;

/// What was wrong with a file or a command's output: the line (1-based; 0 when the input as a
/// whole is at fault) and what was expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl ParseError {
    pub fn new(line: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}: {}", self.line, self.message)
        } else {
            f.write_str(&self.message)
        }
    }
}

impl std::error::Error for ParseError {}
