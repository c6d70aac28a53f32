//! The sandbox's byte stream arrives in chunks of any size. `LineSplitter` must give exactly the
//! lines a plain split on newlines gives, whatever the chunking: every terminated line of at most
//! `max` bytes, in order; nothing of a longer line (no piece of it may pass as a frame); nothing
//! of an unterminated tail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use bridge_core::protocol::{LineSplitter, Split};

fuzz_target!(|data: &[u8]| {
    // First byte: the limit (small, so long lines are common); second: a seed for chunk sizes.
    let [max, seed, rest @ ..] = data else { return };
    let max = *max as usize % 64;
    let mut splitter = LineSplitter::new(max);
    let (mut got, mut over) = (Vec::new(), 0usize);
    let mut input = rest;
    let mut size = (*seed as usize % 17) + 1;
    while !input.is_empty() {
        let n = size.min(input.len());
        let mut chunk = &input[..n];
        input = &input[n..];
        size = (size * 7 + 3) % 23 + 1;
        while !chunk.is_empty() {
            match splitter.feed(&mut chunk) {
                Some(Split::Line(l)) => got.push(l.to_vec()),
                Some(Split::Oversize) => over += 1,
                None => {}
            }
        }
    }
    let mut pieces: Vec<&[u8]> = rest.split(|b| *b == b'\n').collect();
    pieces.pop(); // the unterminated tail (empty when the input ends with a newline)
    let want: Vec<Vec<u8>> = pieces
        .iter()
        .filter(|l| l.len() <= max)
        .map(|l| l.to_vec())
        .collect();
    assert_eq!(got, want);
    let long_terminated = pieces.iter().filter(|l| l.len() > max).count();
    let tail_long = rest.rsplit(|b| *b == b'\n').next().is_some_and(|t| t.len() > max);
    assert_eq!(over, long_terminated + usize::from(tail_long));
});
