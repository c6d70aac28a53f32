//! Section 12: results that fit the client. Prints of 1 KB, 100 KB and 10 MB: the size of the
//! result on the wire and the cl100k tokens of its text (what a host puts into the model's
//! context), the time from the end of the code to the result in the client's hands (the
//! preview, the part kept whole on the host and written back into the sandbox), and the
//! bridge's RSS peak during the 10 MB case.

use super::*;

use rmcp::model::ContentBlock;

/// The code printing `bytes` bytes of numbered lines, whose value is the sandbox's clock when
/// the print has ended (the container shares the host's clock).
fn printing(bytes: usize) -> String {
    format!(
        "line = 'word ' * 10 + '\\n'\nn = {bytes} // 59 + 1\ntext = ''.join('%07d ' % i + line for i in range(n))[:{bytes}]\nprint(text, end='')\nimport time\ntime.time()"
    )
}

fn tokens(r: &CallToolResult) -> usize {
    let bpe = tiktoken_rs::cl100k_base_singleton();
    r.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(bpe.encode_ordinary(&t.text).len()),
            _ => None,
        })
        .sum()
}

/// One call of [`printing`]: (bytes of the result as JSON, its tokens, ms from the end of the
/// code to the result here).
async fn one(live: &Live, bytes: usize) -> (usize, usize, f64) {
    let r = match live
        .call(json!({"code": printing(bytes), "timeout": 120}))
        .await
    {
        Ok(r) => r,
        Err(e) => fail(&format!("print of {bytes} bytes: {e}\n{}", live.home.log())),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let end: f64 = r
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t)
                if t.meta
                    .as_ref()
                    .and_then(|m| m.0.get("mcp-code-bridge/part"))
                    == Some(&json!("value")) =>
            {
                t.text.trim().parse().ok()
            }
            _ => None,
        })
        .next()
        .unwrap_or_else(|| {
            fail(&format!(
                "no value in the result of a print of {bytes} bytes: {}",
                text(&r)
            ))
        });
    let wire = serde_json::to_string(&r).map(|s| s.len()).unwrap_or(0);
    (wire, tokens(&r), (now - end) * 1e3)
}

pub(crate) async fn results_section(o: &Opts, t: &mut Table) {
    t.section(
        12,
        "12. Results that fit the client (output_budget 8000, output_cap 4 MiB)",
    );
    let live = Live::start(Home::new(&[])).await;
    live.ok(json!({"code": "pass"})).await;
    let runs = if o.quick { 3 } else { 15 };
    let mut small_ms = 0.0;
    for (label, bytes, n) in [
        ("1 KB", 1_000, runs),
        ("100 KB", 100_000, runs),
        ("10 MB", 10_000_000, runs.min(7)),
    ] {
        let (stop, rss) = if bytes >= 10_000_000 {
            let (s, h) = sample_rss(live.pid);
            (Some(s), Some(h))
        } else {
            (None, None)
        };
        let idle = rss_mib(live.pid);
        let mut wire = Vec::new();
        let mut toks = Vec::new();
        let mut lag = Vec::new();
        for _ in 0..n {
            let (w, k, l) = one(&live, bytes).await;
            wire.push(w as f64);
            toks.push(k as f64);
            lag.push(l);
        }
        t.samples(
            &format!("print of {label}: result size on the wire"),
            &wire,
            Unit::Bytes,
            Target::None,
        );
        t.samples(
            &format!("print of {label}: cl100k tokens of the result's text"),
            &toks,
            Unit::Tokens,
            Target::AtMost(8000.0),
        );
        let med = pct(&lag, 0.5);
        if bytes == 1_000 {
            small_ms = med;
        }
        t.samples(
            &format!("print of {label}: end of the code to the result in the client"),
            &lag,
            Unit::Ms,
            if bytes >= 10_000_000 {
                Target::AtMost(small_ms + 50.0)
            } else {
                Target::None
            },
        );
        if let (Some(stop), Some(h)) = (stop, rss) {
            stop.store(true, Ordering::Relaxed);
            let peak = h.await.unwrap_or_default().into_iter().fold(idle, f64::max);
            t.row(
                "bridge RSS peak during the 10 MB prints (idle before them in the note)",
                "1".into(),
                peak,
                peak,
                Unit::MiB,
                Target::None,
            );
            t.note(format!(
                "bridge RSS before the 10 MB prints: {idle:.1} MiB; the bridge keeps at most output_cap of a call's output, a 10 MB print keeps its head and tail within 4 MiB"
            ));
        }
    }
    live.shutdown().await;
}
