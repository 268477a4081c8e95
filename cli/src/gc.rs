//! `silo gc`: remove sandboxes whose idle TTL expired long ago, and
//! containers of this home that no sandbox owns.

use std::time::Duration;

use anyhow::Context;
use silo::Silo;

use super::output::Output;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only sandboxes whose TTL expired at least this long ago, and blobs of
    /// a fleet's shared store put there at least this long ago (e.g. 90s,
    /// 30m, 12h, 7d).
    #[arg(long, value_name = "AGE", default_value = "1d", value_parser = parse_age)]
    older_than: Duration,
    /// Show what would be removed, and remove nothing.
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(silo: &Silo, out: &Output, args: Args) -> anyhow::Result<i32> {
    let report = silo
        .gc(args.older_than, args.dry_run)
        .await
        .context("collecting expired sandboxes")?;
    out.gc(&report)?;
    Ok(0)
}

/// `90`, `90s`, `30m`, `12h` or `7d`.
fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last() {
        Some((at, c)) if c.is_ascii_alphabetic() => (&text[..at], c),
        _ => (text, 's'),
    };
    let scale = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}; use s, m, h or d"
            ));
        }
    };
    let value: u64 = number.parse().map_err(|_| {
        format!("expected a number of seconds, or one with s, m, h or d, got {text:?}")
    })?;
    value
        .checked_mul(scale)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(604_800)));
        assert!(parse_age("3w").is_err());
        assert!(parse_age("h").is_err());
    }
}
