//! How a command fails: one line on stderr and an exit code, 2 for bad input and 1 for a run
//! that failed. Every subcommand returns a [`Failure`]; `main` prints it.

/// A failure to report to the user: a one-line message and an exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Bad input (arguments, files, configuration): exit code 2.
    pub fn input(message: impl std::fmt::Display) -> Self {
        Failure { code: 2, message: message.to_string() }
    }

    /// The run itself failed: exit code 1.
    pub fn run(message: impl std::fmt::Display) -> Self {
        Failure { code: 1, message: message.to_string() }
    }
}

/// The flag a topology error is about.
pub fn topology_error(e: servesim_cluster::TopologyError) -> Failure {
    let flag = match e.field {
        "num_workers" => "--num-workers",
        "num_prefill_workers" => "--num-prefill-workers",
        "num_decode_workers" => "--num-decode-workers",
        _ => return Failure::input(e.message),
    };
    Failure::input(format!("{flag} {}", e.message))
}
