use std::process::ExitCode;

fn main() -> ExitCode {
    ceems::cmd::main(std::env::args_os().collect())
}
