//! Frames from the sandbox are untrusted: `protocol::decode` must never panic, must refuse
//! oversize lines before parsing them, and must decode every line the runtime could send.
#![no_main]

use libfuzzer_sys::fuzz_target;
use bridge_core::protocol::{FrameError, MAX_FRAME_BYTES, SandboxFrame, decode};

fuzz_target!(|data: &[u8]| {
    // The whole input as one line, then split on newlines as the reader task splits the stream.
    check(data);
    for line in data.split(|b| *b == b'\n') {
        check(line);
    }
});

fn check(line: &[u8]) {
    match decode(line) {
        Ok(frame) => {
            assert!(line.len() <= MAX_FRAME_BYTES);
            // A decoded frame is valid JSON with a string "type".
            let v: serde_json::Value = serde_json::from_slice(line).expect("decoded but not JSON");
            assert!(v.get("type").and_then(|t| t.as_str()).is_some(), "{frame:?}");
            if let SandboxFrame::Output { data, .. } = frame {
                // Text handed on to the model is always valid UTF-8 (it is a String).
                let _ = data.len();
            }
        }
        Err(FrameError::TooLarge(n)) => assert!(n > MAX_FRAME_BYTES && n == line.len()),
        Err(FrameError::Malformed(msg)) => assert!(!msg.is_empty()),
    }
}
