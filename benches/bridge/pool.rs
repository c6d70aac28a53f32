//! Section 8: the first call, warm-up and the pool of ready sandboxes.

use super::*;

/// The model's thinking time before a call, as the bench gives it: the warm-up and the pool's
/// refill happen in it.
pub(crate) const THINK: Duration = Duration::from_millis(1500);

/// A call's round trip in ms (after `THINK`), on a bridge whose engine and image are ready.
pub(crate) async fn first_calls(o: &Opts, pool: &str, t: &mut Table) {
    let env = [("MCP_BRIDGE_POOL_SIZE", pool)];
    let label = if pool == "0" {
        "pool_size = 0".to_string()
    } else {
        format!("pool_size = {pool}")
    };
    let mut fresh = Vec::new();
    for _ in 0..o.pool_fresh {
        let live = Live::start_with(Home::new(&[]), &env).await;
        tokio::time::sleep(THINK).await;
        fresh.push(live.ok(json!({"code": "print(1+1)"})).await.1);
        live.shutdown().await;
    }
    t.samples(
        &format!(
            "first `print(1+1)` {:.1} s after `initialize`, fresh bridge ({label})",
            THINK.as_secs_f64()
        ),
        &fresh,
        Unit::Ms,
        if pool == "0" {
            Target::None
        } else {
            Target::AtMost(50.0)
        },
    );
    let live = Live::start_with(Home::new(&[]), &env).await;
    live.ok(json!({"code": "pass"})).await;
    let tag = std::process::id();
    let (mut new, mut pandas) = (Vec::new(), Vec::new());
    for i in 0..o.pool_sessions {
        tokio::time::sleep(THINK).await;
        new.push(
            live.ok(json!({"code": "print(1+1)", "session": format!("pool-new-{tag}-{pool}-{i}")}))
                .await
                .1,
        );
        tokio::time::sleep(THINK).await;
        pandas.push(
            live.ok(
                json!({"code": "import pandas", "session": format!("pool-pd-{tag}-{pool}-{i}")}),
            )
            .await
            .1,
        );
    }
    let target = if pool == "0" {
        Target::None
    } else {
        Target::AtMost(50.0)
    };
    t.samples(
        &format!("first `print(1+1)` of a new session ({label})"),
        &new,
        Unit::Ms,
        target,
    );
    t.samples(
        &format!("`import pandas` in a new session ({label})"),
        &pandas,
        Unit::Ms,
        target,
    );
    live.shutdown().await;
}

pub(crate) async fn pool_section(o: &Opts, t: &mut Table) {
    t.section(
        8,
        &format!(
            "8. First calls: warm-up and the pool (each after {:.1} s of model think time)",
            THINK.as_secs_f64()
        ),
    );
    first_calls(o, "1", t).await;
    first_calls(o, "0", t).await;
}
