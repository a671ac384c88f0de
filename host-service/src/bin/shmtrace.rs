//! The `shmtrace` command-line tool.

fn main() {
    eprintln!("shmtrace: the CLI lands with its own issue; nothing to run yet");
    std::process::exit(2);
}
