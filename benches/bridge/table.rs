//! Statistics and the one Markdown table.

use super::*;

/// Nearest-rank percentile of `v` (`p` in 0..=1).
pub(crate) fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

pub(crate) struct Row {
    pub(crate) metric: String,
    pub(crate) n: String,
    pub(crate) median: String,
    pub(crate) p95: String,
    pub(crate) target: String,
    pub(crate) met: String,
}

/// Rows grouped by section number, printed in section order whatever order they were measured in;
/// then the side-by-side tables and the notes, in the order they were added.
#[derive(Default)]
pub(crate) struct Table {
    pub(crate) cur: u32,
    pub(crate) rows: Vec<(u32, Row)>,
    pub(crate) wide: Vec<Wide>,
    pub(crate) notes: Vec<String>,
}

/// A table of its own, for figures that read best side by side (one row per configuration, one
/// column per figure), printed after the main one.
pub(crate) struct Wide {
    pub(crate) title: String,
    pub(crate) head: Vec<String>,
    pub(crate) rows: Vec<Vec<String>>,
}

/// How a figure is printed.
#[derive(Clone, Copy)]
pub(crate) enum Unit {
    Ms,
    Us,
    S,
    MiB,
    Bytes,
    Tokens,
    Pct,
    PerSec,
}

pub(crate) fn fmt(v: f64, u: Unit) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    match u {
        Unit::Ms if v < 10.0 => format!("{v:.2} ms"),
        Unit::Ms => format!("{v:.1} ms"),
        Unit::Us => format!("{v:.0} µs"),
        Unit::S => format!("{v:.2} s"),
        Unit::MiB => format!("{v:.1} MiB"),
        Unit::Bytes => format!("{v:.0} B"),
        Unit::Tokens => format!("{v:.0}"),
        Unit::Pct => format!("{v:.1} %"),
        Unit::PerSec => format!("{v:.0}/s"),
    }
}

/// A target: the limit and whether lower is better.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    None,
    AtMost(f64),
    AtLeast(f64),
}

impl Table {
    /// Make `sec` the current section, adding its heading once.
    pub(crate) fn section(&mut self, sec: u32, title: &str) {
        self.cur = sec;
        if self.rows.iter().any(|(s, r)| *s == sec && r.n.is_empty()) {
            return;
        }
        self.push(Row {
            metric: format!("**{title}**"),
            n: String::new(),
            median: String::new(),
            p95: String::new(),
            target: String::new(),
            met: String::new(),
        });
    }

    pub(crate) fn push(&mut self, r: Row) {
        self.rows.push((self.cur, r));
    }

    /// A row from samples (median and p95 over them); the target is judged on the median.
    pub(crate) fn samples(&mut self, metric: &str, v: &[f64], u: Unit, target: Target) {
        let med = pct(v, 0.5);
        self.row(metric, v.len().to_string(), med, pct(v, 0.95), u, target);
    }

    pub(crate) fn row(
        &mut self,
        metric: &str,
        n: String,
        med: f64,
        p95: f64,
        u: Unit,
        target: Target,
    ) {
        let (t, met) = match target {
            Target::None => (String::new(), String::new()),
            Target::AtMost(x) => (
                format!("≤ {}", fmt(x, u)),
                if med <= x { "yes" } else { "**no**" }.into(),
            ),
            Target::AtLeast(x) => (
                format!("≥ {}", fmt(x, u)),
                if med >= x { "yes" } else { "**no**" }.into(),
            ),
        };
        self.push(Row {
            metric: metric.into(),
            n,
            median: fmt(med, u),
            p95: fmt(p95, u),
            target: t,
            met,
        });
    }

    /// A row whose value is a fact, not a distribution (same text in both columns).
    pub(crate) fn fact(&mut self, metric: &str, n: &str, value: String, target: &str, met: &str) {
        self.push(Row {
            metric: metric.into(),
            n: n.into(),
            median: value.clone(),
            p95: value,
            target: target.into(),
            met: met.into(),
        });
    }

    /// A side-by-side table: its title, the column heads (the first is left-aligned, the others
    /// right-aligned) and its rows.
    pub(crate) fn wide(&mut self, title: &str, head: &[&str], rows: Vec<Vec<String>>) {
        self.wide.push(Wide {
            title: title.into(),
            head: head.iter().map(|h| h.to_string()).collect(),
            rows,
        });
    }

    /// A line printed under the tables (what a refusal said, which settings were in force).
    pub(crate) fn note(&mut self, text: String) {
        self.notes.push(text);
    }

    pub(crate) fn print(&self) {
        println!("| metric | N | median | p95 | target | met |");
        println!("|---|---:|---:|---:|---|---|");
        let mut rows: Vec<&(u32, Row)> = self.rows.iter().collect();
        rows.sort_by_key(|(s, _)| *s);
        for (_, r) in rows {
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                r.metric, r.n, r.median, r.p95, r.target, r.met
            );
        }
        for w in &self.wide {
            println!();
            println!("{}", w.title);
            println!();
            println!("| {} |", w.head.join(" | "));
            let align: Vec<&str> = (0..w.head.len())
                .map(|i| if i == 0 { "---" } else { "---:" })
                .collect();
            println!("|{}|", align.join("|"));
            for r in &w.rows {
                println!("| {} |", r.join(" | "));
            }
        }
        if !self.notes.is_empty() {
            println!();
            for n in &self.notes {
                println!("- {n}");
            }
        }
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
