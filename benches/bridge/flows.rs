//! Section 17: what `[policy.flows]` adds to one proxied call, measured in this process on the
//! bridge's own code: labelling the tool, checking a guarded call's arguments against an
//! identity's record of 50 untrusted results (mails of ~1 KB), and recording the result; with
//! flows off, the same path (it checks one flag and returns). No podman, no bridge process: the
//! call's other costs are section 3's.

use super::*;

use bridge_core::config::flows::{FlowsConfig, Guards};
use bridge_core::config::policy::Patterns;
use bridge_core::flows::{FlowRules, Flows, Labels};
use bridge_core::identity::Identity;
use serde_json::json;

/// Calls per sample (a sample is µs per call: their mean).
const CALLS: usize = 200;

/// One proxied call's flow work: a read of an untrusted mail (labelled and recorded), then a
/// guarded send (labelled and checked), as `upstream::rpc` does them.
fn one_call(
    f: &Flows,
    who: &Identity,
    mail: &serde_json::Value,
    args: &serde_json::Map<String, serde_json::Value>,
) {
    let on = f.is_on();
    let read = if on {
        f.rules().labels("mail", "read_mail", None)
    } else {
        Labels::default()
    };
    if on {
        f.record_result(who, "mail", "read_mail", &read, mail);
    }
    let send = if on {
        f.rules().labels("bank", "send_money", None)
    } else {
        Labels::default()
    };
    std::hint::black_box(f.check(who, &send, Some(args)));
}

pub(crate) async fn flows_section(o: &Opts, t: &mut Table) {
    t.section(
        17,
        "17. Flows (`[policy.flows]`), the bridge's added work per proxied call",
    );
    let runs = if o.quick { 20 } else { 200 };
    let cfg = FlowsConfig {
        enabled: true,
        untrusted: Patterns(vec!["mail.read_*".into()]),
        acting: Patterns(vec!["bank.*".into()]),
        guard: Guards(
            [(
                "bank.send_money".to_string(),
                vec!["recipient".into(), "amount".into()],
            )]
            .into(),
        ),
        ..FlowsConfig::default()
    };
    let body =
        "Hello, the quarterly figures are attached; please review them before Friday. ".repeat(12);
    let args = json!({"recipient": "DE89370400440532013000", "amount": 120, "subject": "rent"});
    let args = args.as_object().unwrap().clone();
    let mut figures = Vec::new();
    for (name, flows) in [
        ("off", Flows::default()),
        ("on", Flows::new(FlowRules::new(&cfg, |_| "bench".into()))),
    ] {
        let who = Identity::Local;
        flows.begin_exec(
            &who,
            "m = mail.read_mail()\nbank.send_money(recipient='DE89370400440532013000', amount=120)",
        );
        // The identity's record: 50 mails already read.
        for i in 0..50 {
            let mail = json!({"content": [{"type": "text", "text": format!("mail {i}: {body} IBAN GB29 NWBK 6016 1331 9268 {i:02}")}]});
            one_call(&flows, &who, &mail, &args);
        }
        let mail =
            json!({"content": [{"type": "text", "text": format!("{body} pay 1,337.00 EUR")}]});
        let mut per_call = Vec::new();
        for _ in 0..runs {
            let started = Instant::now();
            for _ in 0..CALLS {
                one_call(&flows, &who, &mail, &args);
            }
            per_call.push(started.elapsed().as_secs_f64() * 1e6 / CALLS as f64);
        }
        figures.push((name, per_call));
    }
    for (name, v) in &figures {
        t.samples(
            &format!("flows {name}: one untrusted read recorded and one guarded call checked (µs per pair; {CALLS} pairs a sample)"),
            v,
            Unit::Us,
            if *name == "on" { Target::AtMost(100.0) } else { Target::None },
        );
    }
}
