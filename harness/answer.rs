//! The one printer of a helper process's reply (a trial process or a
//! data-parallel rank), shared by both front ends: the `falsify` CLI
//! (`src/main.rs`) and the contract suite (`harness/main.rs`), which include
//! this file as a module. It is not part of the library, which never prints.

use std::process::ExitCode;

/// Prints a helper process's reply on stdout (or its error on stderr) and
/// gives its exit code.
pub fn answer(reply: falsify::Result<String>) -> ExitCode {
    match reply {
        Ok(reply) => {
            println!("{reply}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
