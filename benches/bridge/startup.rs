//! Sections 1 and 2: tools/list tokens and start-up.

use super::*;

pub(crate) fn tokens(bpe: &tiktoken_rs::CoreBPE, v: &Value) -> usize {
    bpe.encode_ordinary(&serde_json::to_string(v).unwrap())
        .len()
}

/// `tools/list` result of a server started directly (what a client connected to it would get).
pub(crate) async fn direct_tools_list(command: &str, args: &[String]) -> Res<Value> {
    let mut c = Command::new(command);
    c.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut raw = Raw::spawn(c)?;
    raw.initialize().await?;
    let r = raw.request("tools/list", json!({})).await?;
    let _ = raw.child.start_kill();
    Ok(r)
}

pub(crate) struct StartupSample {
    pub(crate) init_ms: f64,
    pub(crate) list_ms: f64,
    pub(crate) result: Value,
    pub(crate) rss_idle: Option<f64>,
}

pub(crate) async fn bridge_startup(home: &Home, idle_rss: bool) -> Res<StartupSample> {
    let t0 = Instant::now();
    let mut raw = Raw::spawn(home.command())?;
    raw.initialize().await?;
    let init_ms = ms(t0.elapsed());
    let result = raw.request("tools/list", json!({})).await?;
    let list_ms = ms(t0.elapsed());
    let rss_idle = if idle_rss {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Some(rss_mib(raw.child.id().unwrap_or(0)))
    } else {
        None
    };
    raw.close().await;
    Ok(StartupSample {
        init_ms,
        list_ms,
        result,
        rss_idle,
    })
}

pub(crate) async fn context_and_startup(o: &Opts, fx: &Fixtures, t: &mut Table) {
    let bpe = tiktoken_rs::cl100k_base().expect("cl100k vocabulary");
    let real = fx.real();
    let generated = Fixtures::generated(50);
    let configs: [(&str, Vec<ServerDef>); 3] = [
        ("0", vec![]),
        ("5", real.clone()),
        ("50", generated.clone()),
    ];
    let mut toks: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut bodies = std::collections::BTreeSet::new();
    let (mut init, mut list, mut idle) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.startup {
        for (label, servers) in &configs {
            let home = Home::new(servers);
            let s = bridge_startup(&home, *label == "5")
                .await
                .unwrap_or_else(|e| fail(&format!("bridge start-up: {e}\n{}", home.log())));
            toks.entry(label)
                .or_default()
                .push(tokens(&bpe, &s.result) as f64);
            bodies.insert(serde_json::to_string(&s.result).unwrap());
            if *label == "5" {
                init.push(s.init_ms);
                list.push(s.list_ms);
                idle.extend(s.rss_idle);
            }
        }
    }
    // What the same servers' own tools/list replies cost a client connected to each directly.
    let mut direct = BTreeMap::new();
    for (label, servers) in [("5", &real), ("50", &generated)] {
        let mut sum = 0usize;
        for (name, cmd, args) in servers {
            let r = direct_tools_list(cmd, args)
                .await
                .unwrap_or_else(|e| fail(&format!("tools/list of {name} directly: {e}")));
            sum += tokens(&bpe, &r);
        }
        direct.insert(label, sum as f64);
    }

    t.section(
        1,
        "1. Context cost (cl100k tokens of the tools/list result)",
    );
    let same = if bodies.len() == 1 {
        "identical bytes for 0/5/50"
    } else {
        "DIFFERENT bytes across configurations"
    };
    for label in ["0", "5", "50"] {
        let v = &toks[label];
        t.samples(
            &format!("bridge tools/list, {label} servers configured ({same})"),
            v,
            Unit::Tokens,
            Target::AtMost(250.0),
        );
    }
    for (label, what) in [
        ("5", "5 real servers (everything, filesystem ×2, time, git)"),
        ("50", "50 generated servers (12 tools each)"),
    ] {
        let d = direct[label];
        t.fact(
            &format!("direct tools/list of {what}, summed"),
            "1 (deterministic)",
            fmt(d, Unit::Tokens),
            "",
            "",
        );
        let b = pct(&toks[label], 0.5);
        let red = 100.0 * (1.0 - b / d);
        let target = if label == "5" {
            Target::AtLeast(95.0)
        } else {
            Target::None
        };
        t.row(
            &format!("reduction, {label} servers"),
            toks[label].len().to_string(),
            red,
            100.0 * (1.0 - pct(&toks[label], 0.95) / d),
            Unit::Pct,
            target,
        );
    }

    t.section(2, "2. Start-up (5 servers configured, none started)");
    t.samples(
        "process start → initialize reply",
        &init,
        Unit::Ms,
        Target::AtMost(50.0),
    );
    t.samples(
        "process start → first tools/list reply",
        &list,
        Unit::Ms,
        Target::None,
    );
    // Cold: a fresh bridge's first run_python (engine connect: its own podman service, orphan
    // reaping, image check, container start, runtime injection).
    let mut cold = Vec::new();
    for _ in 0..o.cold {
        let t0 = Instant::now();
        let live = Live::start(Home::new(&[])).await;
        let (_, _) = live.ok(json!({"code": "pass"})).await;
        cold.push(ms(t0.elapsed()));
        live.shutdown().await;
    }
    t.samples(
        "process start → first run_python reply (cold: engine connect + container)",
        &cold,
        Unit::Ms,
        Target::None,
    );
    t.section(5, "5. Footprint");
    t.samples(
        "bridge RSS idle (after initialize + tools/list, 5 servers configured)",
        &idle,
        Unit::MiB,
        Target::AtMost(20.0),
    );
}
