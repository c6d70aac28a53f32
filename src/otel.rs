//! Traces out of the process: the OTLP exporter (HTTP/protobuf) behind a batch processor, set up
//! once for `run` and `serve` when `otel_endpoint` or the standard `OTEL_EXPORTER_OTLP_*`
//! variables name a collector, and W3C Trace Context as the propagator, always, so a client's
//! `traceparent` reaches the audit log even with no collector. The spans themselves are made
//! by each layer through `core::trace`. See docs/observability.md.
//!
//! A collector that is slow or gone costs a call nothing: spans wait in the batch processor's
//! bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048) for its own thread to export them; when the
//! queue is full, spans are dropped, counted, the first drop logged at once and the count at
//! exit.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::global;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};

use bridge_core::config::Config;
use bridge_core::error::{Hint, Hinted};

/// The standard variables that name a collector when `otel_endpoint` does not.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long the exit waits for the last spans to be sent.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Why traces cannot be sent as configured.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The OTLP/HTTP exporter could not be built for the collector named (not a URL it
    /// takes).
    #[error("cannot send traces to {endpoint}: {why}")]
    Exporter {
        /// The collector, as configured.
        endpoint: String,
        /// What the exporter said.
        why: String,
    },
    /// An `OTEL_EXPORTER_OTLP_*PROTOCOL` variable asks for another protocol than
    /// `http/protobuf`, the one this build sends.
    #[error("{var}={value:?} asks for OTLP over {value}, which this build does not send")]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
}

impl Hinted for OtelError {
    fn hint(&self) -> Option<Hint> {
        Some(Hint::line(match self {
            OtelError::Exporter { .. } => {
                "give otel_endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) as the collector's OTLP/HTTP base URL, e.g. http://127.0.0.1:4318, or unset both to send no traces".to_string()
            }
            OtelError::Protocol { var, .. } => {
                format!("unset {var} or set it to http/protobuf, and point the endpoint at the collector's OTLP/HTTP port (4318)")
            }
        }))
    }
}

/// Where traces go: the URL the exporter is given, or `None` when the standard variables give
/// it (the exporter reads them itself).
struct Target {
    url: Option<String>,
    shown: String,
}

impl Target {
    /// `None`: no traces (no endpoint anywhere, or the standard switches turn them off).
    fn of(config: &Config) -> Option<Target> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return None;
        }
        if let Some(base) = &config.otel_endpoint {
            let url = traces_url(base);
            return Some(Target {
                shown: url.clone(),
                url: Some(url),
            });
        }
        let (name, value) = ENDPOINT_VARS
            .iter()
            .find_map(|name| var(name).map(|v| (*name, v)))?;
        Some(Target {
            url: None,
            shown: format!("{value} ({name})"),
        })
    }
}

/// The traces URL of a collector's base URL, as OTLP/HTTP has it: `/v1/traces` added, unless
/// the URL already ends so.
fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    }
}

/// Set up traces for this process: the propagator always, the exporter when a collector is
/// named. Logs where traces go. Call once, before the first request.
pub fn init(config: &Config) -> Result<(), OtelError> {
    global::set_text_map_propagator(TraceContextPropagator::new());
    let Some(target) = Target::of(config) else {
        return Ok(());
    };
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Ok(value) = std::env::var(var)
            && !value.trim().is_empty()
            && value.trim() != "http/protobuf"
        {
            return Err(OtelError::Protocol { var, value });
        }
    }
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Some(url) = &target.url {
        exporter = exporter.with_endpoint(url.clone());
    }
    let exporter = exporter.build().map_err(|e| OtelError::Exporter {
        endpoint: target.shown.clone(),
        why: e.to_string(),
    })?;
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name("mcp-code-bridge");
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        .with_resource(resource.build())
        .build();
    global::set_tracer_provider(provider.clone());
    let _ = PROVIDER.set(provider);
    tracing::info!(endpoint = %target.shown, "sending traces (OTLP over HTTP/protobuf)");
    Ok(())
}

/// Send what is still queued, for at most [`SHUTDOWN_TIMEOUT`], and stop: at the process's end,
/// off the async runtime (the processor's thread is waited for).
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT)
    {
        tracing::warn!("the last traces could not all be sent: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_to_a_base_url_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/v1/traces"),
            "https://otel.example/v1/traces"
        );
    }
}
