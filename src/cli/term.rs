//! What the commands show a person besides their own output: a failure, the one way
//! ([`fail`], and [`Usage`] for the command line's own), colour on a terminal ([`Paint`]), and
//! the bar of an image load ([`load_bar`]).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use bridge_core::config::Config;
use bridge_core::error::Hinted;

/// What a command that failed prints, the one way: `error: ` and what happened, then what to
/// do on a `hint:` line of its own ([`Hinted::report`]); and its exit status (2 for a set-up
/// that could not be made, 1 otherwise).
#[allow(clippy::print_stderr)]
pub(super) fn fail(e: &dyn Hinted, status: u8) -> ExitCode {
    eprintln!("error: {}", e.report());
    ExitCode::from(status)
}

/// A failure of the command line's own (its flags, what it was given), with what to do.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub(super) struct Usage {
    what: String,
    hint: Option<String>,
}

impl Usage {
    /// The failure `what`, with no hint.
    pub(super) fn new(what: impl Into<String>) -> Usage {
        Usage {
            what: what.into(),
            hint: None,
        }
    }

    /// The same failure, with what to do about it.
    pub(super) fn hint(mut self, hint: impl Into<String>) -> Usage {
        self.hint = Some(hint.into());
        self
    }
}

impl Hinted for Usage {
    fn hint(&self) -> Option<bridge_core::error::Hint> {
        self.hint
            .as_ref()
            .map(|h| bridge_core::error::Hint::line(h.clone()))
    }
}

/// Colour for a terminal, plain text otherwise.
pub(super) struct Paint {
    /// Whether to colour: the stream is a terminal.
    pub(super) on: bool,
}

impl Paint {
    /// `s` in red.
    pub(super) fn red(&self, s: &str) -> String {
        if self.on {
            format!("\x1b[31m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    /// `s` dimmed.
    pub(super) fn dim(&self, s: &str) -> String {
        if self.on {
            format!("\x1b[2m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

/// A progress bar for loading the image archive, on a terminal only.
pub(super) fn load_bar(
    config: &Config,
) -> Option<(indicatif::ProgressBar, bridge_sandbox::LoadProgress)> {
    use std::os::unix::fs::PermissionsExt;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    // A stream script (executable archive) has no size to show: a spinner with bytes then.
    let total = config
        .image_archive
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .filter(|m| m.permissions().mode() & 0o111 == 0);
    let style = |t: &str| {
        indicatif::ProgressStyle::with_template(t)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    };
    let bar = match total {
        Some(m) => indicatif::ProgressBar::new(m.len()).with_style(style(
            "loading sandbox image {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )),
        None => indicatif::ProgressBar::new_spinner().with_style(style(
            "{spinner} loading sandbox image {bytes} ({bytes_per_sec})",
        )),
    };
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    let b = bar.clone();
    Some((bar, Arc::new(move |bytes| b.set_position(bytes))))
}
