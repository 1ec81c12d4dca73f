//! Running short-lived helper commands (ip, openssl, kubectl, helm) and checking their result.

use crate::{Error, Result};
use std::io::Write;
use std::process::{Command, Output, Stdio};

/// The command line of `command`, for messages.
pub(crate) fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `command` with `input` on its standard input and collects its output, whatever its
/// exit status.
pub(crate) fn output(command: &mut Command, input: Option<&[u8]>) -> Result<Output> {
    let what = describe(command);
    command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| Error::io(format!("spawning `{what}`"), e))?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // A command that exits without reading its input is reported by its status below.
        let _ = stdin.write_all(input);
    }
    child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for `{what}`"), e))
}

/// Runs `command` and returns its standard output; a non-zero exit is an error carrying
/// standard error.
pub(crate) fn run(command: &mut Command, input: Option<&[u8]>) -> Result<String> {
    let out = output(command, input)?;
    check(command, out)
}

/// Turns an unsuccessful `out` into [`Error::Command`]; returns standard output otherwise.
pub(crate) fn check(command: &Command, out: Output) -> Result<String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: describe(command),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Shorthand for `Command::new(program).args(args)`.
pub(crate) fn cmd<S: AsRef<std::ffi::OsStr>>(program: &str, args: &[S]) -> Command {
    let mut command = Command::new(program);
    command.args(args);
    command
}
